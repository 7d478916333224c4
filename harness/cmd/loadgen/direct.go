package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/job"
)

// directRun sends work messages straight to the work queue and reads every
// result from the results queue, timing each message from its send to its
// first result.
type directRun struct {
	client                  *sqs.Client
	workURL, resultsURL     string
	dlqURL                  string // empty: dead letters are not looked for
	works                   []job.Work
	limiter                 *rate.Limiter // nil: as fast as possible
	batch                   int           // messages per SendMessageBatch, at most 10
	senders, collectors     int
	stderr                  io.Writer
	maxDeadLetterReasonsLog int

	mu         sync.Mutex
	sentAt     map[job.Key]time.Time
	done       map[job.Key]bool // a result came
	dead       map[job.Key]bool // dead-lettered, and no result came
	latencies  []time.Duration
	duplicates int // result messages for a chunk already done
	retried    int // chunks whose first result came from a redelivery
	strays     int // results of chunks not in this workload
	outputs    int
	reasons    int // dead-letter reasons logged
	last       time.Time
	bar        *progress
}

func (r *directRun) run(ctx context.Context, s *Summary) error {
	r.sentAt = make(map[job.Key]time.Time, len(r.works))
	r.done = make(map[job.Key]bool, len(r.works))
	r.dead = map[job.Key]bool{}
	r.bar = newProgress(r.stderr, len(r.works), "results")
	start := time.Now()
	r.last = start
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.send(gctx) })
	for i := range r.collectors {
		g.Go(func() error { return r.collect(gctx, i == 0) })
	}
	err := g.Wait()
	r.bar.finish()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("after %d results and %d dead letters of %d messages: %w", len(r.done), len(r.dead), len(r.works), err)
	}
	if r.strays > 0 {
		fmt.Fprintf(r.stderr, "loadgen: %d result messages of chunks not in this workload were read and deleted\n", r.strays)
	}
	s.Results, s.Duplicates, s.DeadLettered, s.RetriedResults = len(r.done), r.duplicates, len(r.dead), r.retried
	s.Seconds = r.last.Sub(start).Seconds()
	s.MessagesPerS = float64(s.Results) / s.Seconds
	s.ItemsPerS = float64(r.outputs) / s.Seconds
	s.Latency = summarize(r.latencies)
	return nil
}

// send puts the messages on the work queue, paced by the limiter, with up
// to r.senders calls in flight.
func (r *directRun) send(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(r.senders)
	var paceErr error
	for i := 0; i < len(r.works); i += r.batch {
		b := r.works[i:min(i+r.batch, len(r.works))]
		if r.limiter != nil {
			if paceErr = r.limiter.WaitN(ctx, len(b)); paceErr != nil {
				break
			}
		}
		g.Go(func() error {
			// Stamped before the call, so a result can never come before
			// its send time; the call's own time counts as latency.
			now := time.Now()
			r.mu.Lock()
			for _, w := range b {
				r.sentAt[w.Key()] = now
			}
			r.mu.Unlock()
			return jobq.Send(ctx, r.client, r.workURL, b)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return paceErr
}

func (r *directRun) settled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)+len(r.dead) >= len(r.works)
}

// collect reads results until every message has one or is dead-lettered.
// The first collector also reads the DLQ, when results stall and every
// couple of seconds: each read ends in a long poll of its own, and doing it
// every round would pace the results.
func (r *directRun) collect(ctx context.Context, readsDLQ bool) error {
	lastDLQ := time.Now()
	for !r.settled() {
		out, err := r.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &r.resultsURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			return fmt.Errorf("receiving results: %w", err)
		}
		now := time.Now()
		var del []string
		for _, m := range out.Messages {
			var res job.Result
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &res); err != nil {
				return fmt.Errorf("result message %s is not a result: %w", aws.ToString(m.MessageId), err)
			}
			r.result(&res, now)
			del = append(del, aws.ToString(m.ReceiptHandle))
		}
		if len(del) > 0 {
			d, err := r.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &r.resultsURL, Entries: sqscodec.DeleteEntries(del)})
			if err != nil {
				return fmt.Errorf("deleting results: %w", err)
			}
			if len(d.Failed) > 0 {
				// Not fatal: a result left behind comes back and counts as
				// a duplicate.
				fmt.Fprintf(r.stderr, "loadgen: %d result deletes failed, first %s\n", len(d.Failed), aws.ToString(d.Failed[0].Code))
			}
		}
		if readsDLQ && r.dlqURL != "" && (len(out.Messages) == 0 || time.Since(lastDLQ) > 2*time.Second) {
			lastDLQ = time.Now()
			dead, err := jobq.DrainDLQ(ctx, r.client, r.dlqURL)
			if err != nil {
				return err
			}
			r.deadLetters(dead)
		}
	}
	return nil
}

func (r *directRun) result(res *job.Result, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := res.Key()
	sent, ours := r.sentAt[k]
	switch {
	case !ours:
		r.strays++
		return
	case r.done[k]:
		r.duplicates++
		return
	}
	r.done[k] = true
	delete(r.dead, k)
	r.latencies = append(r.latencies, now.Sub(sent))
	r.outputs += len(res.Outputs)
	if res.Attempt > 1 {
		r.retried++
	}
	r.last = now
	r.bar.set(len(r.done) + len(r.dead))
}

func (r *directRun) deadLetters(dead []jobq.DeadLetter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range dead {
		if r.reasons < r.maxDeadLetterReasonsLog {
			r.reasons++
			fmt.Fprintf(r.stderr, "loadgen: dead-lettered: %s\n", d.Reason)
		}
		chunk, err := strconv.Atoi(d.Attrs[job.AttrChunk])
		k := job.Key{JobID: d.Attrs[job.AttrJobID], Chunk: chunk}
		if _, ours := r.sentAt[k]; err != nil || !ours || r.done[k] {
			continue
		}
		r.dead[k] = true
		r.last = time.Now()
	}
	r.bar.set(len(r.done) + len(r.dead))
}
