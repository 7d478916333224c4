package accounting_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/internal/testenv/accounting"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
)

func works(id string, n int) []job.Work {
	w := make([]job.Work, n)
	for i := range w {
		w[i] = job.Work{V: job.Version, JobID: id, Chunk: i, Chunks: n, Items: []job.Item{{ID: "a", Text: "a few words"}}}
	}
	return w
}

func result(k job.Key) string {
	return `{"v":1,"job_id":"` + k.JobID + `","chunk":` + strconv.Itoa(k.Chunk) + `,"model":"m","outputs":[{"id":"a","embedding":[1]}],"attempt":1,"worker_ms":1}`
}

func mustJSON(t *testing.T, w job.Work) string {
	t.Helper()
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func send(t *testing.T, client *sqs.Client, url, body string, attrs map[string]string) {
	t.Helper()
	if _, err := client.SendMessage(t.Context(),
		&sqs.SendMessageInput{QueueUrl: &url, MessageBody: &body, MessageAttributes: sqscodec.Attributes(attrs)}); err != nil {
		t.Fatal(err)
	}
}

// A clean run: a result for every chunk, nothing else. The report counts
// them all and finds no violation, and Collect stops as soon as all are in
// rather than waiting out its limit.
func TestCleanRunReportsNoViolation(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	w := works("clean", 8)
	b := accounting.New()
	b.Expect(w...)
	if err := jobq.Send(t.Context(), client, urls.Work, w); err != nil {
		t.Fatal(err)
	}
	// Play the subscriber: take every work message, answer it, delete it.
	for done := 0; done < len(w); {
		out, err := client.ReceiveMessage(t.Context(),
			&sqs.ReceiveMessageInput{QueueUrl: &urls.Work, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			wk, err := job.DecodeWork([]byte(*m.Body))
			if err != nil {
				t.Fatal(err)
			}
			send(t, client, urls.Results, result(wk.Key()), nil)
			if _, err := client.DeleteMessage(t.Context(),
				&sqs.DeleteMessageInput{QueueUrl: &urls.Work, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
			done++
		}
	}
	start := time.Now()
	if err := b.Collect(t.Context(), client, urls.Results, urls.DLQ, time.Minute); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 45*time.Second {
		t.Errorf("Collect took %v with every chunk in: it should stop when all are accounted for", took)
	}
	r, err := b.Check(t.Context(), client, urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Err(); err != nil {
		t.Errorf("clean run: %v (%s)", err, r)
	}
	if r.Chunks != 8 || r.Results != 8 || r.Duplicates != 0 || r.DeadLettered != 0 || r.Lost() != 0 || r.ResultMessages != 8 {
		t.Errorf("clean run: %s", r)
	}

	// A late duplicate, after Collect has seen every chunk: Drain reads it
	// and the queues empty.
	send(t, client, urls.Results, result(w[3].Key()), nil)
	if err := b.Drain(t.Context(), client, urls.Results, urls.DLQ, time.Minute); err != nil {
		t.Fatal(err)
	}
	if r := b.Report(); r.Duplicates != 1 || r.ResultMessages != 9 || r.Err() != nil {
		t.Errorf("after a late duplicate and Drain: %s (%v)", r, r.Err())
	}
	if v, f, err := jobq.Counts(t.Context(), client, urls.Results); err != nil || v+f != 0 {
		t.Errorf("results queue after Drain: %d visible, %d in flight, %v", v, f, err)
	}
}

// Every kind of violation, each faked on the queues with the real SDK, is
// reported by Check and named by Err.
func TestEveryViolationIsReported(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	w := works("v", 8)
	b := accounting.New()
	b.Expect(w...)
	k := func(i int) job.Key { return w[i].Key() }

	send(t, client, urls.Results, result(k(0)), nil) // fine
	send(t, client, urls.Results, result(k(1)), nil) // and a duplicate
	send(t, client, urls.Results, result(k(1)), nil)
	// chunk 2: dead-lettered by the subscriber, with a reason
	send(t, client, urls.DLQ, mustJSON(t, w[2]), map[string]string{job.AttrReason: "poison: decoding: bad", job.AttrSource: "m-2"})
	// chunk 3: sent to the DLQ by the subscriber without a reason
	send(t, client, urls.DLQ, mustJSON(t, w[3]), map[string]string{job.AttrReason: "", job.AttrSource: "m-3"})
	// chunk 4: a result and a DLQ entry
	send(t, client, urls.Results, result(k(4)), nil)
	send(t, client, urls.DLQ, mustJSON(t, w[4]), map[string]string{job.AttrReason: "timeout: inference", job.AttrSource: "m-4"})
	// chunk 5: a malformed body dead-lettered, known by its attributes
	send(t, client, urls.DLQ, "{not json", map[string]string{job.AttrReason: "poison: malformed", job.AttrSource: "m-5",
		job.AttrJobID: "v", job.AttrChunk: "5"})
	// chunks 6 and 7: missing, one of them left on the work queue
	if err := jobq.Send(t.Context(), client, urls.Work, w[6:7]); err != nil {
		t.Fatal(err)
	}
	// never expected, and unreadable
	send(t, client, urls.Results, result(job.Key{JobID: "stranger"}), nil)
	send(t, client, urls.Results, "garbage", nil)

	if err := b.Collect(t.Context(), client, urls.Results, urls.DLQ, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r, err := b.Check(t.Context(), client, urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	check := func(what string, got, want any) {
		t.Helper()
		if s, w := fmt.Sprint(got), fmt.Sprint(want); s != w {
			t.Errorf("%s = %s, want %s", what, s, w)
		}
	}
	check("Chunks", r.Chunks, 8)
	check("Results", r.Results, 3)
	check("Duplicates", r.Duplicates, 1)
	check("DeadLettered", r.DeadLettered, 4)
	check("Reasons", r.Reasons, map[string]int{"poison": 2, "timeout": 1})
	check("NoReason", r.NoReason, []job.Key{k(3)})
	check("Both", r.Both, []job.Key{k(4)})
	check("Missing", r.Missing, []job.Key{k(6), k(7)})
	check("Unexpected", r.Unexpected, 1)
	check("Malformed", len(r.Malformed), 1)
	check("Visible", r.Visible, 1)

	err = r.Err()
	if err == nil {
		t.Fatal("Err() = nil with every violation present")
	}
	for _, want := range []string{"2 chunks lost", "v/6 v/7", "without a reason: v/3", "both with a result and in the DLQ: v/4",
		"1 results or DLQ entries for chunks never accepted", "1 unreadable", "1 work messages still visible"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Err() does not say %q: %v", want, err)
		}
	}

	// Each violation alone is enough, and the allowances work.
	for name, f := range map[string]func(*accounting.Report){
		"missing":    func(r *accounting.Report) { r.Missing = []job.Key{k(6)} },
		"no reason":  func(r *accounting.Report) { r.NoReason = []job.Key{k(3)} },
		"both":       func(r *accounting.Report) { r.Both = []job.Key{k(4)} },
		"unexpected": func(r *accounting.Report) { r.Unexpected = 1 },
		"malformed":  func(r *accounting.Report) { r.Malformed = []string{"x"} },
		"visible":    func(r *accounting.Report) { r.Visible = 1 },
		"in flight":  func(r *accounting.Report) { r.InFlight = 11; r.StrandedAllowance = 10 },
		"duplicates": func(r *accounting.Report) { r.Duplicates = 3; r.MaxDuplicates = 2 },
	} {
		var one accounting.Report
		f(&one)
		if one.Err() == nil {
			t.Errorf("%s alone: Err() = nil", name)
		}
	}
	ok := accounting.Report{Both: []job.Key{k(4)}, AllowBoth: true, InFlight: 10, StrandedAllowance: 10, Duplicates: 2, MaxDuplicates: 2}
	if err := ok.Err(); err != nil {
		t.Errorf("within the allowances: %v", err)
	}
}

// A message the work queue's redrive policy moved to the DLQ carries no
// reason of ours: it is recorded with RedriveReason, and a message left
// invisible on the work queue is reported as in flight.
func TestRedriveAndInFlight(t *testing.T) {
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 1)
	w := works("rd", 2)
	b := accounting.New()
	b.Expect(w...)
	if err := jobq.Send(t.Context(), client, urls.Work, w[:1]); err != nil {
		t.Fatal(err)
	}
	// Receive it once and hand it back: with maxReceiveCount 1 the next
	// receive moves it to the DLQ.
	out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &urls.Work, WaitTimeSeconds: 1})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(out.Messages))
	}
	if _, err := client.ChangeMessageVisibility(t.Context(), &sqs.ChangeMessageVisibilityInput{QueueUrl: &urls.Work,
		ReceiptHandle: out.Messages[0].ReceiptHandle, VisibilityTimeout: 0}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("the redrive policy never moved the message to the DLQ")
		}
		if _, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &urls.Work, WaitTimeSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		if v, _, err := jobq.Counts(t.Context(), client, urls.DLQ); err != nil {
			t.Fatal(err)
		} else if v > 0 {
			break
		}
	}
	// The second chunk: received and held, so invisible at Check.
	if err := jobq.Send(t.Context(), client, urls.Work, w[1:]); err != nil {
		t.Fatal(err)
	}
	if out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &urls.Work, WaitTimeSeconds: 1, VisibilityTimeout: 60}); err != nil || len(out.Messages) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(out.Messages))
	}

	if err := b.Collect(t.Context(), client, urls.Results, urls.DLQ, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r, err := b.Check(t.Context(), client, urls.Work)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.DeadLettered != 1 || r.Reasons[accounting.RedriveReason] != 1 || len(r.NoReason) != 0 {
		t.Errorf("redriven message: %s; want it dead-lettered with reason %s", r, accounting.RedriveReason)
	}
	if r.InFlight != 1 || r.Lost() != 1 {
		t.Errorf("held message: %s; want 1 in flight and 1 missing", r)
	}
	r.StrandedAllowance = 1
	r.Missing = nil
	if err := r.Err(); err != nil {
		t.Errorf("within the allowance: %v", err)
	}
	r.StrandedAllowance = 0
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "1 work messages still invisible") {
		t.Errorf("beyond the allowance: %v", err)
	}
}
