package overhead

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// consumeConfig is the subscriber's settings in the comparison. Prefetch
// and in-flight default to the subscriber's defaults; a batch of 10 (default
// 8) lets its result sends and deletes go in tens, as the bare loops' do.
// Its logs are formatted as in production (JSON, info) and thrown away. The
// pipelined bare loops settle up to MaxInflight/10 batches at once.
type consumeConfig struct {
	Prefetch, MaxInflight, MaxBatch int
}

// settings describes the comparison for the report.
func (cc consumeConfig) settings() string {
	return fmt.Sprintf("subscriber: admission vram (budget far above the work: admission never waits), prefetch %d, "+
		"max-inflight %d, max-batch %d, max-batch-delay 10ms (default), wait-time 1s, visibility 30s, JSON logs at info to a discard writer; "+
		"bare loops: ReceiveMessage of 10 with a 1 s long poll, visibility 30 s, all message attributes "+
		"and ApproximateReceiveCount (as the subscriber asks), "+
		"DeleteMessageBatch of what it received; the result variants send one result body per message, with the job id and chunk attributes, "+
		"in one SendMessageBatch before the delete, precomputed or, in the json variant, made by decoding the work message "+
		"and encoding its result with encoding/json; the pipelined ones settle up to %d received batches at once, "+
		"the subscriber's in-flight bound",
		cc.Prefetch, cc.MaxInflight, cc.MaxBatch, cc.MaxInflight/10)
}

// consumer consumes n pre-loaded messages from urls.Work and returns how
// long it took; extra reports what else it measured, for the log.
type consumer struct {
	key  string // its name in -consumers
	name string
	run  func(ctx context.Context, e *benchEnv, urls localstack.URLs, n int) (took time.Duration, extra string, err error)
}

// allConsumers is -consumers' default: the subscriber and every bare loop.
const allConsumers = "subscriber,inline,inline-results,pipelined,pipelined-results,pipelined-json"

// consumers returns those of keys (a comma-separated list) in the report's
// order: the subscriber first, whose rate the others' ratios divide. One
// alone serves a CPU or allocation profile of that consumer only.
func (cc consumeConfig) consumers(keys string) ([]consumer, error) {
	all := []consumer{
		{"subscriber", "subscriber (no-op model)", cc.subscriber},
		{"inline", "bare, in line: receive, delete", cc.bare(noResults, false)},
		{"inline-results", "bare, in line: receive, send results, delete", cc.bare(prebuiltResults, false)},
		{"pipelined", "bare, pipelined: receive; delete alongside", cc.bare(noResults, true)},
		{"pipelined-results", "bare, pipelined: receive; send results, delete alongside", cc.bare(prebuiltResults, true)},
		{"pipelined-json", "bare, pipelined: receive; decode, encode and send results, delete alongside", cc.bare(encodedResults, true)},
	}
	want := map[string]bool{}
	for _, k := range strings.Split(keys, ",") {
		k = strings.TrimSpace(k)
		if !slices.ContainsFunc(all, func(c consumer) bool { return c.key == k }) {
			return nil, fmt.Errorf("-consumers: unknown consumer %q; want some of %s", k, allConsumers)
		}
		want[k] = true
	}
	return slices.DeleteFunc(all, func(c consumer) bool { return !want[c.key] }), nil
}

func (cc consumeConfig) subscriber(ctx context.Context, e *benchEnv, urls localstack.URLs, n int) (time.Duration, string, error) {
	reg := prometheus.NewRegistry()
	sub, err := subscriber.New(subscriber.Config{
		Queue:       sqsqueue.New(e.Client, urls.Work),
		Results:     sqsqueue.New(e.Client, urls.Results),
		DLQ:         sqsqueue.New(e.Client, urls.DLQ),
		Backend:     backend.InProcess{Model: timed.Noop{}},
		Device:      sqsenv.NoopDevice(),
		VRAMReserve: 1 << 20,
		Prefetch:    cc.Prefetch,
		MaxInflight: cc.MaxInflight,
		MaxBatch:    cc.MaxBatch,
		WaitTime:    time.Second,
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:  reg,
	})
	if err != nil {
		return 0, "", err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	start := e.begin()
	go func() { done <- sub.Run(runCtx) }()
	// Done when SQS has confirmed the delete of every message: the same
	// end as the bare loops'. Polled often, so the poll adds little.
	for sub.Ledger().Deleted < int64(n) {
		select {
		case err := <-done:
			return 0, "", fmt.Errorf("subscriber stopped after %d of %d deletes: %v", sub.Ledger().Deleted, n, err)
		case <-ctx.Done():
			stop()
			<-done
			return 0, "", fmt.Errorf("after %d of %d deletes: %w", sub.Ledger().Deleted, n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	took := e.end(start, n)
	stop()
	if err := <-done; err != nil {
		return 0, "", err
	}
	return took, "SQS calls per message: " + requestsPerMessage(reg, n), nil
}

// requestsPerMessage reads the subscriber's SQS call counter by action.
func requestsPerMessage(reg *prometheus.Registry, n int) string {
	mfs, err := reg.Gather()
	if err != nil {
		return err.Error()
	}
	var parts []string
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != "vramq_subscriber_sqs_requests_total" {
			continue
		}
		byAction := map[string]float64{}
		var actions []string
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "action" {
					if _, seen := byAction[l.GetValue()]; !seen {
						actions = append(actions, l.GetValue())
					}
					byAction[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
		for _, a := range actions {
			parts = append(parts, fmt.Sprintf("%s %.3f", a, byAction[a]/float64(n)))
			total += byAction[a]
		}
	}
	return strings.Join(append(parts, fmt.Sprintf("total %.3f", total/float64(n))), ", ")
}

// resultBody stands in for a result message: the size and shape of the
// subscriber's result for a one-item message of the no-op model, built once
// so that the bare loop spends nothing on it.
var resultBody = `{"v":1,"job_id":"overhead","chunk":0,"model":"noop","outputs":[{"id":"0-0","data":0}],"attempt":1,"worker_ms":0}`

// resultMode is what a bare loop does for results.
type resultMode int

const (
	noResults       resultMode = iota
	prebuiltResults            // one precomputed body per message (resultBody)
	// encodedResults decodes each work message and encodes its result with
	// encoding/json, as any consumer of these messages must: the work a
	// subscriber with a no-op model does that a prebuilt body skips.
	encodedResults
)

// bare is the loop a user would write on the SDK alone. In line, one
// goroutine receives, sends the results and deletes, then receives again.
// Pipelined, one goroutine receives, as the subscriber's poller does, and
// each received batch's results and delete go on in a goroutine of its own,
// up to the subscriber's in-flight bound.
func (cc consumeConfig) bare(
	results resultMode, pipelined bool,
) func(context.Context, *benchEnv, localstack.URLs, int) (time.Duration, string, error) {
	return func(ctx context.Context, e *benchEnv, urls localstack.URLs, n int) (time.Duration, string, error) {
		settle := func(ctx context.Context, msgs []types.Message) error {
			if results != noResults {
				entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
				for i, m := range msgs {
					body := &resultBody
					if results == encodedResults {
						b, err := encodeResult(m)
						if err != nil {
							return err
						}
						body = &b
					}
					attrs := make(map[string]string, 2)
					for _, k := range []string{job.AttrJobID, job.AttrChunk} {
						if v, ok := m.MessageAttributes[k]; ok {
							attrs[k] = aws.ToString(v.StringValue)
						}
					}
					entries[i] = sqscodec.Entry(i, sqscodec.Message{Body: *body, Attributes: attrs})
				}
				out, err := e.Client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &urls.Results, Entries: entries})
				if err != nil {
					return err
				}
				if len(out.Failed) > 0 {
					return fmt.Errorf("%d results not sent", len(out.Failed))
				}
			}
			entries := make([]types.DeleteMessageBatchRequestEntry, len(msgs))
			for i, m := range msgs {
				entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
			}
			out, err := e.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &urls.Work, Entries: entries})
			if err != nil {
				return err
			}
			if len(out.Failed) > 0 {
				return fmt.Errorf("%d deletes failed", len(out.Failed))
			}
			return nil
		}
		receive := func(ctx context.Context) ([]types.Message, error) {
			out, err := e.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
				QueueUrl: &urls.Work, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30,
				MessageAttributeNames:       []string{"All"},
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
			})
			if err != nil {
				return nil, err
			}
			return out.Messages, nil
		}

		start := e.begin()
		if !pipelined {
			for got := 0; got < n; {
				msgs, err := receive(ctx)
				if err != nil {
					return 0, "", err
				}
				if len(msgs) == 0 {
					continue
				}
				if err := settle(ctx, msgs); err != nil {
					return 0, "", err
				}
				got += len(msgs)
			}
			return e.end(start, n), "", nil
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(max(cc.MaxInflight/10, 1))
		var recvErr error
		for got := 0; got < n && gctx.Err() == nil; {
			msgs, err := receive(gctx)
			if err != nil {
				recvErr = err
				break
			}
			if len(msgs) == 0 {
				continue
			}
			got += len(msgs)
			// Blocks while ten batches are being settled: the in-flight
			// bound, as the subscriber's stops its receives.
			g.Go(func() error { return settle(gctx, msgs) })
		}
		err := g.Wait()
		took := e.end(start, n)
		if err != nil {
			return 0, "", err
		}
		if recvErr != nil {
			return 0, "", recvErr
		}
		if err := ctx.Err(); err != nil {
			return 0, "", err
		}
		return took, "", nil
	}
}

// encodeResult is what a consumer written on encoding/json does for one
// message with the no-op model: decode the work, encode a result of one
// tiny output per item.
func encodeResult(m types.Message) (string, error) {
	var w job.Work
	if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &w); err != nil {
		return "", fmt.Errorf("decoding message %s: %w", aws.ToString(m.MessageId), err)
	}
	r := job.Result{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, Model: "noop", Attempt: 1,
		Outputs: make([]job.Output, len(w.Items))}
	for i, it := range w.Items {
		r.Outputs[i] = job.Output{ID: it.ID, Data: json.RawMessage("0")}
	}
	b, err := json.Marshal(r)
	return string(b), err
}
