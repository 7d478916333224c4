// Package accounting checks the pipeline's invariant after a run, however
// rough: every chunk of every accepted job ends with exactly one recorded
// result (duplicates counted and de-duplicated by job id and chunk) or in the
// dead-letter queue with a reason, and no work message is left on the queue,
// visible or invisible.
//
// A test or the soak Expects the chunks it got accepted, Collects the results
// queue and the DLQ (it may Collect more than once, or while the run goes on),
// then Checks the work queue and reads the Report.
package accounting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/job"
)

// RedriveReason is the reason recorded for a DLQ message that the work
// queue's redrive policy moved there: a raw work message, without the reason
// and source attributes the subscriber puts on the copies it sends.
const RedriveReason = "redrive:maxReceiveCount"

// resultPollers receive from the results queue at once: one receive brings at
// most ten messages, and a soak's hundred thousand results must not wait on a
// single round trip at a time.
const resultPollers = 4

// receiveVisibility is how long a message we received stays invisible. We
// delete at once, so it only matters for a receive whose response was lost
// (the SDK retried it): those messages come back this soon rather than after
// the queue's 30 s default, and are read again within a Collect.
const receiveVisibility = 10

// Books holds the chunks that were accepted (sent to the work queue or
// accepted by the publisher) and what became of each: results (de-duplicated
// by job.Key, duplicates counted) and dead letters (with reasons). It is safe
// for concurrent use.
type Books struct {
	mu       sync.Mutex
	expected map[job.Key]struct{}
	results  map[job.Key]int      // distinct result messages per chunk
	dead     map[job.Key][]string // reason of each distinct DLQ message per chunk
	// seen holds the ids of the messages already counted, per queue: a
	// message we read twice (a lost receive response, a failed delete) is
	// one message sent, not a duplicate result.
	seen map[string]struct{}
	// accounted is how many expected chunks have a result or a DLQ entry,
	// kept as they come so that Collect's "all in?" is cheap at 100,000.
	accounted   int
	unexpected  int
	malformed   []string             // why each unreadable message is unreadable
	messages    int                  // distinct result messages
	redelivered map[job.Key]struct{} // chunks with a result from a second or later receive
	letters     int                  // distinct DLQ messages
}

func New() *Books {
	return &Books{expected: map[job.Key]struct{}{}, results: map[job.Key]int{}, dead: map[job.Key][]string{}, seen: map[string]struct{}{},
		redelivered: map[job.Key]struct{}{}}
}

// Expect records chunks as accepted. Call it before their work is sent: a
// result read before its chunk is expected counts as Unexpected.
func (b *Books) Expect(works ...job.Work) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range works {
		b.expect(works[i].Key())
	}
}

func (b *Books) expect(k job.Key) {
	if _, ok := b.expected[k]; !ok {
		b.expected[k] = struct{}{}
	}
}

// Pending is how many expected chunks have neither a result nor a DLQ entry
// yet.
func (b *Books) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending()
}

func (b *Books) pending() int { return len(b.expected) - b.accounted }

// outcome notes that expected chunk k has a result or DLQ entry; call it
// before recording one. b.mu must be held.
func (b *Books) outcome(k job.Key) {
	if b.results[k] == 0 && len(b.dead[k]) == 0 {
		b.accounted++
	}
}

// Collect reads the results queue and the DLQ (deleting what it reads) until
// every expected chunk is accounted for or limit passes. It returns an error
// only for SQS errors or ctx ending, not for missing chunks: Check reports
// those. A DLQ message that is a raw work message moved by the queue's
// redrive policy is recorded with RedriveReason.
//
// The limit is checked between receives, so Collect may return up to one
// receive (a second's long poll) after it: a long poll cancelled in flight
// can strand the messages the queue hands it until their visibility ends.
func (b *Books) Collect(ctx context.Context, client *sqs.Client, resultsURL, dlqURL string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var stop atomic.Bool // set when every chunk is in or a poller failed
	var g errgroup.Group
	poll := func(url string, record func(types.Message)) func() error {
		return func() error {
			for !stop.Load() && ctx.Err() == nil && time.Now().Before(deadline) {
				if b.Pending() == 0 {
					break
				}
				if err := receive(ctx, client, url, record); err != nil {
					stop.Store(true)
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return err
				}
			}
			stop.Store(true)
			return nil
		}
	}
	for range resultPollers {
		g.Go(poll(resultsURL, b.recordResult))
	}
	g.Go(poll(dlqURL, b.recordDeadLetter))
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// Drain reads the results queue and the DLQ (deleting what it reads) until
// both are empty, visible and in flight, or limit passes (checked between
// receives, as in Collect). After a run whose chunks are all accounted for,
// it picks up the late duplicates Collect, which stops at the last first
// outcome, leaves behind. Like Collect it returns an error only for SQS
// errors or ctx ending.
func (b *Books) Drain(ctx context.Context, client *sqs.Client, resultsURL, dlqURL string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		empty := true
		for _, q := range []struct {
			url    string
			record func(types.Message)
		}{{resultsURL, b.recordResult}, {dlqURL, b.recordDeadLetter}} {
			if err := receive(ctx, client, q.url, q.record); err != nil {
				return err
			}
			visible, inflight, err := jobq.Counts(ctx, client, q.url)
			if err != nil {
				return fmt.Errorf("reading the counts of %s: %w", q.url, err)
			}
			empty = empty && visible == 0 && inflight == 0
		}
		if empty {
			return nil
		}
	}
	return ctx.Err()
}

// receive takes one batch from url, records each message and deletes them.
func receive(ctx context.Context, client *sqs.Client, url string, record func(types.Message)) error {
	out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: job.MaxBatch,
		WaitTimeSeconds: 1, VisibilityTimeout: receiveVisibility, MessageAttributeNames: []string{"All"}})
	if err != nil {
		return fmt.Errorf("receiving from %s: %w", url, err)
	}
	if len(out.Messages) == 0 {
		return nil
	}
	del := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
	for i, m := range out.Messages {
		record(m)
		del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
	}
	// An entry that fails to delete is left be: the message comes back after
	// its visibility and is recognised by its id, counted once, deleted again.
	if _, err := client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: del}); err != nil {
		return fmt.Errorf("deleting from %s: %w", url, err)
	}
	return nil
}

// firstSeen reports whether the message with this id on queue q is new to
// the books, and marks it seen. b.mu must be held.
func (b *Books) firstSeen(q, id string) bool {
	k := q + "\x00" + id
	if _, ok := b.seen[k]; ok {
		return false
	}
	b.seen[k] = struct{}{}
	return true
}

func (b *Books) recordResult(m types.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.firstSeen("results", aws.ToString(m.MessageId)) {
		return
	}
	b.messages++
	var r job.Result
	if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &r); err != nil || r.JobID == "" {
		b.malformed = append(b.malformed, fmt.Sprintf("result message %s is not a result (%v)", aws.ToString(m.MessageId), err))
		return
	}
	if _, ok := b.expected[r.Key()]; !ok {
		b.unexpected++
		return
	}
	b.outcome(r.Key())
	b.results[r.Key()]++
	if r.Attempt > 1 {
		b.redelivered[r.Key()] = struct{}{}
	}
}

func (b *Books) recordDeadLetter(m types.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.firstSeen("dlq", aws.ToString(m.MessageId)) {
		return
	}
	b.letters++
	attrs := map[string]string{}
	for k, v := range m.MessageAttributes {
		attrs[k] = aws.ToString(v.StringValue)
	}
	key, ok := deadLetterKey(aws.ToString(m.Body), attrs)
	if !ok {
		b.malformed = append(b.malformed, fmt.Sprintf("DLQ message %s names no chunk", aws.ToString(m.MessageId)))
		return
	}
	if _, ok := b.expected[key]; !ok {
		b.unexpected++
		return
	}
	b.outcome(key)
	b.dead[key] = append(b.dead[key], deadLetterReason(attrs))
}

// deadLetterKey finds the chunk a DLQ message stands for: from its body, a
// work message (the subscriber copies it unchanged, and a redrive moves it),
// or, when the body is not one (the poison path takes malformed bodies too),
// from the job id and chunk attributes the original carried.
func deadLetterKey(body string, attrs map[string]string) (job.Key, bool) {
	var w job.Work
	if err := json.Unmarshal([]byte(body), &w); err == nil && w.JobID != "" {
		return w.Key(), true
	}
	id, chunk := attrs[job.AttrJobID], attrs[job.AttrChunk]
	c, err := strconv.Atoi(chunk)
	if id == "" || err != nil {
		return job.Key{}, false
	}
	return job.Key{JobID: id, Chunk: c}, true
}

// deadLetterReason is the reason a DLQ message records, "" for none. The
// subscriber's copies carry the reason and the source message id together;
// a message with neither was moved by the redrive policy, which adds no
// message attribute of ours.
func deadLetterReason(attrs map[string]string) string {
	if r, ok := attrs[job.AttrReason]; ok {
		return r
	}
	if _, ours := attrs[job.AttrSource]; ours {
		return "" // sent by the subscriber without a reason: a violation
	}
	return RedriveReason
}

// reasonKind is the part of a reason before its detail: the subscriber writes
// "kind: detail", and details (error texts) would make every reason unique.
func reasonKind(r string) string {
	kind, _, _ := strings.Cut(r, ": ")
	return kind
}

// Check reads the work queue's counts and returns the report of the
// invariant over what was collected so far.
func (b *Books) Check(ctx context.Context, client *sqs.Client, workURL string) (Report, error) {
	visible, inflight, err := jobq.Counts(ctx, client, workURL)
	if err != nil {
		return Report{}, fmt.Errorf("reading the work queue's counts: %w", err)
	}
	r := b.Report()
	r.Visible, r.InFlight = visible, inflight
	return r, nil
}

// Report is the invariant's figures over what was collected so far, without
// the work queue's counts (Check adds them).
func (b *Books) Report() Report {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := Report{Chunks: len(b.expected), Reasons: map[string]int{}, Unexpected: b.unexpected,
		Malformed: slices.Clone(b.malformed), ResultMessages: b.messages, DeadLetters: b.letters, Redelivered: len(b.redelivered)}
	for _, k := range slices.SortedFunc(maps.Keys(b.expected), compareKeys) {
		n, dead := b.results[k], b.dead[k]
		if n > 0 {
			r.Results++
			r.Duplicates += n - 1
		}
		if len(dead) > 0 {
			r.DeadLettered++
			r.DeadDuplicates += len(dead) - 1
		}
		for _, reason := range dead {
			if reason == "" {
				r.NoReason = append(r.NoReason, k)
			} else {
				r.Reasons[reasonKind(reason)]++
			}
		}
		switch {
		case n > 0 && len(dead) > 0:
			r.Both = append(r.Both, k)
		case n == 0 && len(dead) == 0:
			r.Missing = append(r.Missing, k)
		}
	}
	return r
}

func compareKeys(a, b job.Key) int {
	if c := strings.Compare(a.JobID, b.JobID); c != 0 {
		return c
	}
	return a.Chunk - b.Chunk
}

// Report is the invariant's figures after a run.
type Report struct {
	Chunks       int            // expected
	Results      int            // chunks with at least one result
	Duplicates   int            // result messages beyond the first per chunk
	DeadLettered int            // chunks in the DLQ
	Reasons      map[string]int // DLQ messages by reason kind (the reason up to its first ": ")
	NoReason     []job.Key      // DLQ entries without a reason (violation)
	Both         []job.Key      // chunks with a result and a DLQ entry (reported; violation unless AllowBoth)
	Missing      []job.Key      // neither result nor DLQ (violation)
	Unexpected   int            // results/DLQ entries for chunks never expected (violation)
	Visible      int            // work messages still visible after the run (violation)
	InFlight     int            // work messages still invisible after the run (violation beyond StrandedAllowance)
	// StrandedAllowance is how many in-flight messages are tolerated: 10 per
	// receive the SDK retried (its first response was lost, so nobody holds
	// those messages until their visibility ends), set by the caller.
	StrandedAllowance int
	AllowBoth         bool

	// Additions to the figures above.
	Malformed      []string // results/DLQ messages that name no chunk (violation)
	ResultMessages int      // distinct result messages read
	DeadLetters    int      // distinct DLQ messages read
	DeadDuplicates int      // DLQ messages beyond the first per chunk
	// Redelivered is how many chunks have a result from a second or later
	// receive of their work message (job.Result.Attempt above 1).
	Redelivered int
	// MaxDuplicates, when above 0, bounds Duplicates: more is a violation.
	MaxDuplicates int
}

// Lost is how many chunks have neither a result nor a DLQ entry.
func (r Report) Lost() int { return len(r.Missing) }

// Err is nil when the invariant holds, else one error naming every violation
// (first few keys of each).
func (r Report) Err() error {
	var v []string
	if len(r.Missing) > 0 {
		v = append(v, fmt.Sprintf("%d chunks lost (neither result nor DLQ): %s", len(r.Missing), firstKeys(r.Missing)))
	}
	if len(r.NoReason) > 0 {
		v = append(v, fmt.Sprintf("%d DLQ entries without a reason: %s", len(r.NoReason), firstKeys(r.NoReason)))
	}
	if len(r.Both) > 0 && !r.AllowBoth {
		v = append(v, fmt.Sprintf("%d chunks both with a result and in the DLQ: %s", len(r.Both), firstKeys(r.Both)))
	}
	if r.Unexpected > 0 {
		v = append(v, fmt.Sprintf("%d results or DLQ entries for chunks never accepted", r.Unexpected))
	}
	if len(r.Malformed) > 0 {
		v = append(v, fmt.Sprintf("%d unreadable messages, first: %s", len(r.Malformed), r.Malformed[0]))
	}
	if r.Visible > 0 {
		v = append(v, fmt.Sprintf("%d work messages still visible", r.Visible))
	}
	if r.InFlight > r.StrandedAllowance {
		v = append(v, fmt.Sprintf("%d work messages still invisible (%d tolerated)", r.InFlight, r.StrandedAllowance))
	}
	if r.MaxDuplicates > 0 && r.Duplicates > r.MaxDuplicates {
		v = append(v, fmt.Sprintf("%d duplicate results, more than the %d allowed", r.Duplicates, r.MaxDuplicates))
	}
	if len(v) == 0 {
		return nil
	}
	return errors.New("invariant violated: " + strings.Join(v, "; "))
}

func firstKeys(keys []job.Key) string {
	const show = 5
	parts := make([]string, 0, show+1)
	for _, k := range keys[:min(len(keys), show)] {
		parts = append(parts, k.JobID+"/"+strconv.Itoa(k.Chunk))
	}
	if len(keys) > show {
		parts = append(parts, "...")
	}
	return strings.Join(parts, " ")
}

// String is one line of figures for logs.
func (r Report) String() string {
	reasons := make([]string, 0, len(r.Reasons))
	for _, k := range slices.Sorted(maps.Keys(r.Reasons)) {
		reasons = append(reasons, fmt.Sprintf("%s=%d", k, r.Reasons[k]))
	}
	return fmt.Sprintf("chunks=%d results=%d duplicates=%d dead_lettered=%d reasons={%s} no_reason=%d both=%d "+
		"missing=%d unexpected=%d malformed=%d visible=%d in_flight=%d (allowed %d)",
		r.Chunks, r.Results, r.Duplicates, r.DeadLettered, strings.Join(reasons, ","), len(r.NoReason), len(r.Both),
		len(r.Missing), r.Unexpected, len(r.Malformed), r.Visible, r.InFlight, r.StrandedAllowance)
}
