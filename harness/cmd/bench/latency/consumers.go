package latency

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vramq/vramq/bench/timed"
	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/refembed"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// echo is the transport alone: what any consumer on the SDK must do to
// answer a message, and nothing else. It long-polls the work queue as the
// subscriber does (ten at a time, its wait time and visibility, every
// attribute) and sends each body straight to the results queue in one
// SendMessageBatch per receive; the delete goes alongside, off the path
// the load generator times, as the subscriber's does. Each send's time
// goes in sends, to set beside the subscriber's send stage. With bodies, it
// sends the body there for the message's job and chunk instead: the
// subscriber's result, made before the run, so that both send the same
// bytes. It runs until ctx ends.
func echo(ctx context.Context, client *sqs.Client, urls localstack.URLs, wait time.Duration, bodies map[job.Key]string,
	pipelined bool, sends *[]time.Duration) error {
	var deletes sync.WaitGroup
	defer deletes.Wait()
	var mu sync.Mutex
	var sendErr error
	for ctx.Err() == nil {
		mu.Lock()
		if sendErr != nil {
			mu.Unlock()
			return sendErr
		}
		mu.Unlock()
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &urls.Work, MaxNumberOfMessages: 10, WaitTimeSeconds: int32(wait / time.Second), VisibilityTimeout: 30,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("echo: receiving: %w", err)
		}
		if len(out.Messages) == 0 {
			continue
		}
		msgs := make([]sqscodec.Message, len(out.Messages))
		handles := make([]string, len(out.Messages))
		for i, m := range out.Messages {
			attrs := make(map[string]string, len(m.MessageAttributes))
			for k, v := range m.MessageAttributes {
				attrs[k] = aws.ToString(v.StringValue)
			}
			body := aws.ToString(m.Body)
			if bodies != nil {
				k, err := keyOf(body)
				if err != nil {
					return err
				}
				body = bodies[k]
			}
			msgs[i] = sqscodec.Message{Body: body, Attributes: attrs}
			handles[i] = aws.ToString(m.ReceiptHandle)
		}
		send := func() error {
			start := time.Now()
			sent, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &urls.Results, Entries: sqscodec.Entries(msgs)})
			mu.Lock()
			*sends = append(*sends, time.Since(start))
			mu.Unlock()
			if err != nil {
				return fmt.Errorf("echo: sending: %w", err)
			}
			if len(sent.Failed) > 0 {
				return fmt.Errorf("echo: %d of %d sends failed, first %s", len(sent.Failed), len(msgs), aws.ToString(sent.Failed[0].Code))
			}
			_, _ = client.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: &urls.Work,
				Entries: sqscodec.DeleteEntries(handles)})
			return nil
		}
		if !pipelined {
			if err := send(); err != nil {
				return err
			}
			continue
		}
		deletes.Go(func() {
			if err := send(); err != nil && ctx.Err() == nil {
				mu.Lock()
				sendErr = err
				mu.Unlock()
			}
		})
	}
	return nil
}

// keyOf reads the job and chunk a work or result body names.
func keyOf(body string) (job.Key, error) {
	var named struct {
		JobID string `json:"job_id"`
		Chunk int    `json:"chunk"`
	}
	if err := json.Unmarshal([]byte(body), &named); err != nil {
		return job.Key{}, fmt.Errorf("a message that names no job and chunk: %w", err)
	}
	return job.Key{JobID: named.JobID, Chunk: named.Chunk}, nil
}

// newModel is the model on a simulated device of vram bytes: under cpu,
// bin/subscriber -device=sim's, the reference embedder generated with its
// default seed, which works on this machine's CPU; under timed, the
// benchmarks' timed model (bench/timed, its default timing), which takes a
// GPU's time and leaves the CPU free, as a batch on a GPU does.
func newModel(kind string, vram int64) (*gpu.Sim, gpu.Model, error) {
	dev := gpu.NewSim(vram)
	mcfg := refembed.DefaultConfig()
	if kind == "timed" {
		m, err := timed.New(mcfg, timed.DefaultTiming(), dev)
		return dev, m, err
	}
	m, err := refembed.NewEmbedder(refembed.GenerateWeights(mcfg), mcfg, dev)
	return dev, m, err
}

// resultBodies are the subscriber's result bodies for works, as it
// encodes them (job.Result, escaped for SQS), from the same model run
// here, before any run is timed.
func resultBodies(ctx context.Context, works []job.Work, kind string, vram int64) (map[job.Key]string, error) {
	_, model, err := newModel(kind, vram)
	if err != nil {
		return nil, err
	}
	out := make(map[job.Key]string, len(works))
	for _, w := range works {
		outs, err := model.Run(ctx, w.Items)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(job.Result{V: job.Version, JobID: w.JobID, Chunk: w.Chunk, Model: model.Name(), Outputs: outs,
			Attempt: 1, WorkerMS: 5})
		if err != nil {
			return nil, err
		}
		out[w.Key()] = string(job.EncodeForSQS(b))
	}
	return out, nil
}

// subscriberRun is the real subscriber, in this process, with the
// defaults of bin/subscriber -device=sim, its model newModel's. Its registry holds the stage histograms
// read after the run; batches holds each batch's own time, the `took` of
// its debug "batch" line.
type subscriberRun struct {
	sub     *subscriber.Subscriber
	reg     *prometheus.Registry
	batches *batchTimes
}

func newSubscriber(client *sqs.Client, urls localstack.URLs, kind string, vram int64, delay time.Duration,
	stderr io.Writer) (*subscriberRun, error) {
	dev, model, err := newModel(kind, vram)
	if err != nil {
		return nil, err
	}
	r := &subscriberRun{reg: prometheus.NewRegistry(), batches: &batchTimes{}}
	r.batches.warn = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	cfg := subscriber.DefaultConfig()
	cfg.Queue, cfg.Results, cfg.DLQ = sqsqueue.New(client, urls.Work), sqsqueue.New(client, urls.Results), sqsqueue.New(client, urls.DLQ)
	cfg.Backend, cfg.Device, cfg.Registerer, cfg.Logger = backend.InProcess{Model: model}, dev, r.reg, slog.New(r.batches)
	if delay >= 0 {
		cfg.MaxBatchDelay = delay
	}
	if r.sub, err = subscriber.New(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// batchTimes is a log handler that keeps the took of every "batch" line
// (logged at debug, one per batch run) and passes warnings and errors on.
type batchTimes struct {
	warn slog.Handler
	mu   sync.Mutex
	took []time.Duration
}

func (h *batchTimes) Enabled(_ context.Context, l slog.Level) bool { return true }

func (h *batchTimes) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "batch" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "took" {
				h.mu.Lock()
				h.took = append(h.took, a.Value.Duration())
				h.mu.Unlock()
				return false
			}
			return true
		})
		return nil
	}
	if r.Level >= slog.LevelWarn && r.Message != "the device is SIMULATED: memory is accounted by vramq, the model runs on the CPU" {
		return h.warn.Handle(ctx, r)
	}
	return nil
}

func (h *batchTimes) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *batchTimes) WithGroup(string) slog.Handler      { return h }

func (h *batchTimes) durations() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.took)
}

// histogramQuantile is the q-quantile of the histogram named name in mfs
// whose labels include want (nil: any), interpolated within its bucket
// as Prometheus's histogram_quantile does; NaN when it has no
// observations.
func histogramQuantile(mfs []*dto.MetricFamily, name string, want map[string]string, q float64) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsMatch(m.GetLabel(), want) {
				continue
			}
			return bucketQuantile(m.GetHistogram(), q)
		}
	}
	return math.NaN()
}

func labelsMatch(ls []*dto.LabelPair, want map[string]string) bool {
	n := 0
	for _, l := range ls {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// bucketQuantile interpolates linearly within the bucket the q-quantile
// falls in, from the bucket below's upper bound (0 for the first); past
// the last finite bound, that bound.
func bucketQuantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, count := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if count >= rank {
			if math.IsInf(upper, 1) {
				return lower
			}
			if count == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(count-below)
		}
		lower, below = upper, count
	}
	return lower
}
