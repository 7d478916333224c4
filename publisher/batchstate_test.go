package publisher_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/s3cond"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/publisher"
	"github.com/vramq/vramq/publisher/publishertest"
)

// Issue 32, item 5: a batch advances itself. Its record is moved by one
// owner with conditional writes, which the emulator ignores; these tests
// put s3cond in front of it, which honours them as S3 does and counts the
// requests.

// condStore is a store of e's bucket through an s3cond proxy.
func condStore(t *testing.T, e *env) (*payload.Store, *s3cond.Proxy) {
	t.Helper()
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	proxy := s3cond.New(t, endpoint)
	c := sqstest.S3(t)
	opts := c.Options()
	opts.BaseEndpoint = aws.String(proxy.URL)
	return payload.New(s3.New(opts), e.store.Bucket()), proxy
}

// record reads a batch's record from the bucket, as no client can.
func record(t *testing.T, e *env, id string) map[string]any {
	t.Helper()
	raw, err := e.store.Read(t.Context(), job.BatchKey("", id))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// getAll GETs batch id with n clients at once, and returns the statuses.
func getAll(t *testing.T, c *apiClient, id string, n int) []string {
	t.Helper()
	got := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			b, err := c.getBatch(t.Context(), id)
			if err != nil {
				t.Errorf("Get: %s", apiError(err))
				return
			}
			got[i] = b.Status
		})
	}
	wg.Wait()
	return got
}

// Twelve clients reading a settled batch of 16 chunks at once read no
// result and write nothing (before, each finalized it: 96 to 192 result
// reads); then four sweeps racing with twelve more reads finalize it once:
// 16 result reads, one output file. The record's claim is a conditional
// write, and the losers' 412 leaves the batch to the winner.
func TestBatchSettledReadsFinalizeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	store, proxy := condStore(t, e)
	s := e.serveUnswept(publisher.Config{Payloads: store, Jobs: publisher.Jobs{ChunkItems: 1}})
	c := s.client("")
	bt := newBatch(t, c, upload(t, c, "settled.jsonl", embeddingLines(16)).ID, "/v1/embeddings", s.sweep(t))
	publishertest.PutResults(t, e.store, bt.ID, 0, 16)
	bucket := store.Bucket()

	proxy.Reset()
	for i, st := range getAll(t, c, bt.ID, 12) {
		if st != "finalizing" {
			t.Errorf("reader %d saw %s; want finalizing", i, st)
		}
	}
	if n := proxy.Count("GET", bucket, "results/"); n != 0 {
		t.Errorf("12 reads read %d results; want none", n)
	}
	if n := proxy.Count("PUT", bucket, ""); n != 0 {
		t.Errorf("12 reads wrote %d objects; want none", n)
	}

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := s.pub.Sweep(t.Context()); err != nil {
				t.Errorf("Sweep: %v", err)
			}
		})
	}
	wg.Go(func() { getAll(t, c, bt.ID, 12) })
	wg.Wait()
	if n := proxy.Count("GET", bucket, "results/"); n != 16 {
		t.Errorf("the batch's 16 results were read %d times; want once each (one finalization)", n)
	}
	done, err := c.getBatch(t.Context(), bt.ID)
	if err != nil || done.Status != "completed" || done.RequestCounts.Completed != 16 || done.ErrorFileID != "" {
		t.Fatalf("after the sweeps: %v %s", err, done.RawJSON())
	}
	if out := fileLines(t, c, done.OutputFileID); len(out) != 16 {
		t.Errorf("the output file has %d lines; want 16", len(out))
	}
	if _, err := e.store.Read(t.Context(), job.OpenBatchKey("", bt.ID)); err == nil {
		t.Error("the batch ended, and its open marker is still there")
	}
	if n := counterWith(t, s, "vramq_publisher_batches_ended_total", "status", "completed"); n != 1 {
		t.Errorf("batches_ended_total{status=completed} is %v; want 1", n)
	}
}

// counterWith is the value of the publisher's counter name where label is
// value.
func counterWith(t *testing.T, s *server, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A batch nobody reads expires at its window: the sweeper cancels its job,
// the subscriber deletes its chunks unrun, and the sweeper then ends it
// expired, every line batch_expired in its error file, without a single
// read of the batch by a client. (Its window is shortened by moving its
// record's expires_at into the past, as 24 hours would.)
func TestBatchNobodyReadsExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 2}})
	c := s.client("")
	bx := newBatch(t, c, upload(t, c, "expire.jsonl", embeddingLines(4)).ID, "/v1/embeddings", s.sweep(t))
	key := job.BatchKey("", bx.ID)
	raw, err := e.store.Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	raw = []byte(strings.Replace(string(raw), fmt.Sprintf(`"expires_at":%d`, bx.ExpiresAt), fmt.Sprintf(`"expires_at":%d`, time.Now().Unix()-1), 1))
	if _, err := e.store.Put(t.Context(), key, raw); err != nil {
		t.Fatal(err)
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Read(t.Context(), job.CancelKey(bx.ID)); err != nil {
		t.Fatalf("the sweep did not cancel the expired batch's job: %v", err)
	}
	e.runSubscriber()
	deadline := time.Now().Add(time.Minute)
	for record(t, e, bx.ID)["status"] != "expired" {
		if time.Now().After(deadline) {
			t.Fatalf("the batch is %v a minute after its window; want expired", record(t, e, bx.ID)["status"])
		}
		if err := s.pub.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	expired, err := c.getBatch(t.Context(), bx.ID)
	if err != nil || expired.ExpiredAt == 0 || expired.RequestCounts.Failed != 4 || expired.OutputFileID != "" {
		t.Fatalf("expired: %v %s", err, expired.RawJSON())
	}
	lines := fileLines(t, c, expired.ErrorFileID)
	if len(lines) != 4 {
		t.Errorf("the error file has %d lines; want 4", len(lines))
	}
	for i, l := range lines {
		if l.Error == nil || l.Error.Code != "batch_expired" || l.CustomID != fmt.Sprintf("e-%d", i) {
			t.Errorf("line %d: %+v", i, l)
		}
	}
}

// A finalizer that fails (here, the bucket refusing its output file) gives
// its claim back, and the next pass finalizes the batch. One that dies after
// its claim (a restart, a Lambda invocation cut off) leaves the record
// finalizing: the sweeper leaves a fresh claim to its holder, and takes one
// older than finalizeStale (10 minutes) over, writing the files and ending
// the batch.
func TestBatchFinalizationResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	store, proxy := condStore(t, e)
	s := e.serveUnswept(publisher.Config{Payloads: store, Jobs: publisher.Jobs{ChunkItems: 1}})
	c := s.client("")
	bt := newBatch(t, c, upload(t, c, "resume.jsonl", embeddingLines(3)).ID, "/v1/embeddings", s.sweep(t))
	publishertest.PutResults(t, e.store, bt.ID, 0, 3)
	ended := func(b *batch) {
		t.Helper()
		done, err := c.getBatch(t.Context(), b.ID)
		if err != nil || done.Status != "completed" || done.RequestCounts.Completed != 3 {
			t.Fatalf("%v %s; want completed", err, done.RawJSON())
		}
		if out := fileLines(t, c, done.OutputFileID); len(out) != 3 {
			t.Errorf("the output file has %d lines; want 3", len(out))
		}
	}

	proxy.Refuse("PUT", store.Bucket(), "files/")
	proxy.Refuse("POST", store.Bucket(), "files/")
	if err := s.pub.Sweep(t.Context()); err == nil {
		t.Fatal("the sweep wrote the output file where the bucket refused it")
	}
	proxy.Reset()
	if st := record(t, e, bt.ID)["status"]; st != "in_progress" {
		t.Fatalf("a finalizer that failed left the record %v; want its claim given back (in_progress)", st)
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	ended(bt)

	// A finalizer that died: its claim, as it left it.
	bd := newBatch(t, c, upload(t, c, "died.jsonl", embeddingLines(3)).ID, "/v1/embeddings", s.sweep(t))
	publishertest.PutResults(t, e.store, bd.ID, 0, 3)
	claim := func(at time.Time) {
		t.Helper()
		m := record(t, e, bd.ID)
		m["status"], m["finalizing_at"] = "finalizing", at.Unix()
		raw, _ := json.Marshal(m)
		if _, err := e.store.Put(t.Context(), job.BatchKey("", bd.ID), raw); err != nil {
			t.Fatal(err)
		}
	}
	claim(time.Now())
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := record(t, e, bd.ID)["status"]; st != "finalizing" {
		t.Fatalf("a fresh claim: the sweep made the batch %v; want it left finalizing", st)
	}
	claim(time.Now().Add(-11 * time.Minute))
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	ended(bd)
}

// A cancel of a running batch writes its job's cancel record and nothing
// else; reads show it cancelling, then finalizing once the subscriber has
// deleted its chunks unrun, and write nothing; the sweeper ends it
// cancelled, the finished chunk in the output file and the rest
// batch_cancelled.
func TestBatchCancelEndedByOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	store, proxy := condStore(t, e)
	s := e.serveUnswept(publisher.Config{Payloads: store, Jobs: publisher.Jobs{ChunkItems: 2}})
	c := s.client("")
	bt := newBatch(t, c, upload(t, c, "cancel.jsonl", embeddingLines(6)).ID, "/v1/embeddings", s.sweep(t))
	body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"ref","usage":{"prompt_tokens":3,"total_tokens":3}}`
	res := `{"v":1,"job_id":"` + bt.ID + `","chunk":0,"model":"ref","outputs":[` +
		`{"id":"e-0","response":{"status_code":200,"body":` + body + `}},{"id":"e-1","response":{"status_code":200,"body":` + body + `}}],"attempt":1,"worker_ms":1}`
	if _, err := e.store.Put(t.Context(), job.ResultKey(bt.ID, 0), []byte(res)); err != nil {
		t.Fatal(err)
	}
	bucket := store.Bucket()
	proxy.Reset()
	cb, err := c.cancelBatch(t.Context(), bt.ID)
	if err != nil || cb.Status != "cancelling" || cb.CancellingAt == 0 {
		t.Fatalf("cancel: %v %s", err, cb.RawJSON())
	}
	e.runSubscriber() // deletes the two chunks unrun
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := c.getBatch(t.Context(), bt.ID)
		if err != nil {
			t.Fatal(apiError(err))
		}
		if b.Status == "finalizing" {
			break
		}
		if b.Status != "cancelling" || time.Now().After(deadline) {
			t.Fatalf("the cancelled batch reads %s; want cancelling, then finalizing", b.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n, all := proxy.Count("PUT", bucket, "cancel/"), proxy.Count("PUT", bucket, ""); n != 1 || all != 1 {
		t.Errorf("the cancel and the reads wrote %d objects, %d of them the cancel record; want the cancel record alone", all, n)
	}
	if err := s.pub.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := record(t, e, bt.ID)["status"]; st != "cancelled" {
		t.Fatalf("after the sweep the record is %v; want cancelled", st)
	}
	cancelled, err := c.getBatch(t.Context(), bt.ID)
	if err != nil || cancelled.CancelledAt == 0 || cancelled.RequestCounts.Completed != 2 || cancelled.RequestCounts.Failed != 4 {
		t.Fatalf("cancelled: %v %s", err, cancelled.RawJSON())
	}
	for i, l := range fileLines(t, c, cancelled.ErrorFileID) {
		if l.CustomID != fmt.Sprintf("e-%d", i+2) || l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Errorf("error line %d: %+v", i, l)
		}
	}
}

// Under Lambda, the completion event of a batch's job (SNS, subscribed to
// the publisher's function) finalizes it at once, without a sweep; an event
// of a batch that has ended already changes nothing.
func TestBatchCompletionEventFinalizes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.serveUnswept(publisher.Config{Jobs: publisher.Jobs{ChunkItems: 1}})
	c := s.client("")
	bt := newBatch(t, c, upload(t, c, "event.jsonl", embeddingLines(2)).ID, "/v1/embeddings", s.sweep(t))
	publishertest.PutResults(t, e.store, bt.ID, 0, 2)
	fn := publisher.LambdaEvents(s.pub.Handler(), s.pub)
	ev := snsEvent(fmt.Sprintf(`{"v":1,"event":"job.completed","job_id":%q,"batch_id":%q,"revision":1,"status":"completed"}`, bt.ID, bt.ID))
	if _, err := fn(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	if st := record(t, e, bt.ID)["status"]; st != "completed" {
		t.Fatalf("after its completion event the batch is %v; want completed", st)
	}
	if _, err := fn(t.Context(), ev); err != nil {
		t.Errorf("the event again: %v", err)
	}
}
