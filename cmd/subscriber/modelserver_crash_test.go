package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

// Issue 27: the real binary, its model the fake model server, killed with
// SIGKILL mid-batch (requests out at the server, results already sent for
// other chunks), then a successor on the same queues. Every item of a job of
// chat completions and one of embeddings ends with exactly one stored answer
// (results/{job}/{chunk}.json, first write wins), nothing is dead-lettered
// or lost, and the work queue empties. Delivery is at least once per
// message: the items of the messages the killed process held are asked of
// the server again by the successor (their requests in flight when it died,
// and those it had answered but not yet delivered), and only those: an item
// of a chunk that was not redelivered was asked for exactly once.
func TestModelServerCrashMidBatch(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	fake := fakeoai.New(fakeoai.Config{TokenLatency: 100 * time.Millisecond})
	defer fake.Close()
	rec := fakeoai.NewRecorder(t, fake)
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	s3c := sqstest.S3(t)
	bucket := sqstest.Bucket(t, s3c)
	store := payload.New(s3c, bucket)

	// Chat chunk c's answers are 4+8c tokens long (0.4 s to 6 s of the
	// fake's generation), so early chunks finish while late ones run.
	var works []job.Work
	const chatChunks, embChunks, perChunk = 8, 4, 3
	var keys []string // every item's request content, by which the log knows it
	for c := range chatChunks {
		w := job.Work{V: job.Version, JobID: "chat", Chunk: c, Chunks: chatChunks, Endpoint: job.EndpointChatCompletions}
		for j := range perChunk {
			text := fmt.Sprintf("chat %d.%d [[len=%d]]", c, j, 4+8*c)
			keys = append(keys, text)
			w.Items = append(w.Items, job.Item{ID: fmt.Sprintf("c%d.%d", c, j), Body: json.RawMessage(fmt.Sprintf(
				`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":80}`, text))})
		}
		works = append(works, w)
	}
	for c := range embChunks {
		w := job.Work{V: job.Version, JobID: "emb", Chunk: c, Chunks: embChunks, Endpoint: job.EndpointEmbeddings}
		for j := range perChunk {
			text := fmt.Sprintf("passage %d.%d", c, j)
			keys = append(keys, text)
			w.Items = append(w.Items, job.Item{ID: fmt.Sprintf("e%d.%d", c, j),
				Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","input":%q}`, text))})
		}
		works = append(works, w)
	}
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	results := newResultLog()
	env := []string{"VRAMQ_MODEL_SERVER=" + rec.URL(), "VRAMQ_MODEL_SERVER_MODELS=fake-model", "VRAMQ_VRAM=", "VRAMQ_VRAM_RESERVE=",
		"PAYLOAD_BUCKET=" + bucket, "VRAMQ_VISIBILITY_TIMEOUT=4s"}

	a := startSubscriber(t, "killed", urls, env...)
	a.waitFor(t, "chunks finished (deleted) with requests still at the server", func(m metrics) bool {
		return m.get("vramq_subscriber_messages_deleted_total") >= 3 && fake.Stats().Running > 0
	})
	m := a.scrape(t)
	held, deleted := m.get("vramq_subscriber_messages_held"), m.get("vramq_subscriber_messages_deleted_total")
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := a.wait(30 * time.Second); err == nil {
		t.Fatal("the subscriber exited cleanly after SIGKILL")
	}
	before := rec.Answers()

	b := startSubscriber(t, "successor", urls, env...)
	for deadline := time.Now().Add(2 * time.Minute); results.chunks() < len(works); {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d chunks have a result after 2 minutes", results.chunks(), len(works))
		}
		if err := results.poll(t, client, urls.Results); err != nil {
			t.Fatal(err)
		}
	}
	// The queue empties (the successor has run every redelivered message),
	// and the results of those whose result the killed process had already
	// sent come in.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		visible, inflight, err := jobq.Counts(t.Context(), client, urls.Work)
		if err != nil {
			t.Fatal(err)
		}
		if visible == 0 && inflight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("work queue not empty a minute after every result: %d visible, %d in flight", visible, inflight)
			break
		}
	}
	for {
		n := results.messages()
		if err := results.poll(t, client, urls.Results); err != nil {
			t.Fatal(err)
		}
		if results.messages() == n {
			break
		}
	}
	if d, err := jobq.DrainDLQ(t.Context(), client, urls.DLQ); err != nil || len(d) != 0 {
		t.Errorf("dead letters: %+v (%v); want none", d, err)
	}

	// Exactly one stored answer per item, each the server's.
	for _, w := range works {
		body, err := store.Read(t.Context(), job.ResultKey(w.JobID, w.Chunk))
		if err != nil {
			t.Errorf("%s/%d: no stored result: %v", w.JobID, w.Chunk, err)
			continue
		}
		var r job.Result
		if err := json.Unmarshal(body, &r); err != nil {
			t.Errorf("%s/%d: stored result: %v", w.JobID, w.Chunk, err)
			continue
		}
		var ids []string
		for _, o := range r.Outputs {
			ids = append(ids, o.ID)
			if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 {
				t.Errorf("%s/%d item %s: %+v; want the server's answer", w.JobID, w.Chunk, o.ID, o)
			}
		}
		var want []string
		for _, it := range w.Items {
			want = append(want, it.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("%s/%d: stored outputs for %q; want %q, once each", w.JobID, w.Chunk, ids, want)
		}
	}

	// Only the redelivered chunks were asked for again.
	redelivered := results.redelivered()
	if len(redelivered) == 0 || float64(len(redelivered)) > held || float64(len(works)-len(redelivered)) < deleted {
		t.Errorf("%d of %d chunks redelivered; want at least one (killed mid-batch), at most the %v held, "+
			"and none of the %v finished", len(redelivered), len(works), held, deleted)
	}
	after := rec.Answers()
	repeated := 0
	for i, key := range keys {
		k := chunkOfKey(i, chatChunks, perChunk)
		oks := count(after[key], 200)
		if !redelivered[k] {
			if oks != 1 || len(after[key]) != 1 {
				t.Errorf("%q of %v, not redelivered: answers %v; want one request, answered 200", key, k, after[key])
			}
			continue
		}
		if oks < 1 {
			t.Errorf("%q of redelivered %v: answers %v; want a 200", key, k, after[key])
		}
		if count(before[key], 200) > 0 && len(after[key]) > len(before[key]) {
			repeated++
		}
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(30 * time.Second); err != nil {
		t.Fatalf("successor's exit after SIGTERM: %v", err)
	}
	t.Logf("killed with %v chunks finished and %v messages held; %d chunks redelivered (%d duplicate result messages); "+
		"%d requests answered before the kill asked again (at least once per message)",
		deleted, held, len(redelivered), results.duplicates(), repeated)
}

// chunkOfKey is the chunk of the i-th item content of the test's works.
func chunkOfKey(i, chatChunks, perChunk int) job.Key {
	if i < chatChunks*perChunk {
		return job.Key{JobID: "chat", Chunk: i / perChunk}
	}
	return job.Key{JobID: "emb", Chunk: (i - chatChunks*perChunk) / perChunk}
}

func count(xs []int, x int) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

// resultLog reads result messages and keeps each one's attempt (the
// receive count of the work message it answers), by chunk.
type resultLog struct {
	attempts map[job.Key][]int
}

func newResultLog() *resultLog { return &resultLog{attempts: map[job.Key][]int{}} }

func (r *resultLog) poll(t *testing.T, client *sqs.Client, url string) error {
	out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
	if err != nil {
		return err
	}
	var del []string
	for _, m := range out.Messages {
		var res job.Result
		if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &res); err != nil {
			return fmt.Errorf("result message %s: %w", aws.ToString(m.MessageId), err)
		}
		r.attempts[res.Key()] = append(r.attempts[res.Key()], res.Attempt)
		del = append(del, aws.ToString(m.ReceiptHandle))
	}
	if len(del) > 0 {
		_, err = client.DeleteMessageBatch(t.Context(), &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: sqscodec.DeleteEntries(del)})
	}
	return err
}

func (r *resultLog) chunks() int { return len(r.attempts) }

func (r *resultLog) messages() int {
	n := 0
	for _, as := range r.attempts {
		n += len(as)
	}
	return n
}

// redelivered are the chunks with a result from a second or later receive.
func (r *resultLog) redelivered() map[job.Key]bool {
	out := map[job.Key]bool{}
	for k, as := range r.attempts {
		if slices.ContainsFunc(as, func(a int) bool { return a > 1 }) {
			out[k] = true
		}
	}
	return out
}

func (r *resultLog) duplicates() int {
	n := 0
	for _, as := range r.attempts {
		n += len(as) - 1
	}
	return n
}
