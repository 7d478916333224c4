package overhead

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
	"github.com/vramq/vramq/publisher"
	pubjobs "github.com/vramq/vramq/publisher/jobs"
)

// publishSends is the publisher's SendMessageBatch calls in flight for one
// job (Config.SendConcurrency, default 4).
const publishSends = 4

// publishConfig is the publisher comparison's shape: Clients post jobs at
// once, each job's chunks going out publishSends calls at a time, so the
// bare loops get Clients*publishSends calls in flight.
type publishConfig struct {
	Clients int
}

// publishSettings describes the publisher comparison for the report; what
// depends on the number of clients is in publishConfig.heading.
var publishSettings = fmt.Sprintf("publisher: publisher.New with its defaults "+
	"(no payload bucket; %d SendMessageBatch calls in flight per job; 256 KiB messages), "+
	"its http.Handler on an httptest server (a real loopback TCP listener), each client posting one job at a time, "+
	"request bodies encoded before the clock starts, JSON logs at info to a discard writer; "+
	"bare loops: SendMessageBatch of the same chunks with the same attributes, %d calls in flight per client; "+
	"*prebuilt*: the bodies the publisher's own planner makes, built before the clock starts (nothing but SQS calls is timed); "+
	"*encoding*: each chunk's job.Work marshalled as it is sent, as a program holding the items would; "+
	"*job by job*: a job's calls all answered before its client starts the next job, as a POST is; "+
	"*continuous*: one stream of calls with as many in flight as all the clients' jobs would have",
	publishSends, publishSends)

func (pc publishConfig) heading() string {
	if pc.Clients == 1 {
		return fmt.Sprintf("One client (%d SendMessageBatch calls in flight at most)", publishSends)
	}
	return fmt.Sprintf("%d clients at once (%d SendMessageBatch calls in flight at most)", pc.Clients, pc.Clients*publishSends)
}

// publishJob is one job, prepared for every side before any clock runs.
type publishJob struct {
	post    []byte                                 // the POST /v1/jobs body
	works   []job.Work                             // its chunks, for the encoding loop
	batches [][]types.SendMessageBatchRequestEntry // its chunks as planned by the publisher, in tens
}

type publishLoad struct {
	messages int
	jobs     []publishJob
}

func preparePublishLoad(jobs, items, chunkItems, words int) (*publishLoad, error) {
	l := &publishLoad{}
	planner := pubjobs.Planner{MaxMessageBytes: 256 << 10, MaxItemBytes: 64 << 10}
	load := workload.Load{
		JobID: "overhead", Jobs: jobs, Items: items, ChunkItems: chunkItems,
		Sizes: workload.Sizes{Kind: workload.Fixed, Words: words},
	}
	for j := range jobs {
		var id [16]byte
		_, _ = rand.Read(id[:])
		jobID := hex.EncodeToString(id[:]) // as long as the publisher's ids
		pj := publishJob{works: load.Job(j)}
		var req pubjobs.JobRequest
		for i := range pj.works {
			pj.works[i].JobID = jobID
			for _, it := range pj.works[i].Items {
				req.Items = append(req.Items, pubjobs.RequestItem{ID: it.ID, Text: it.Text})
			}
		}
		req.Options = &pubjobs.JobOptions{ChunkItems: chunkItems}
		body, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		pj.post = body

		plan, apiErr := planner.Plan(jobID, req.Items, chunkItems)
		if apiErr != nil {
			return nil, apiErr
		}
		if len(plan.Chunks) != len(pj.works) {
			return nil, fmt.Errorf("the publisher's planner cut job %d into %d chunks, the workload into %d", j, len(plan.Chunks), len(pj.works))
		}
		for i, c := range plan.Chunks {
			if i%10 == 0 {
				pj.batches = append(pj.batches, nil)
			}
			b := &pj.batches[len(pj.batches)-1]
			*b = append(*b, sqscodec.Entry(i%10, sqscodec.Message{Body: c.Body, Attributes: job.Attributes(job.Key{JobID: jobID, Chunk: c.Index})}))
		}
		l.jobs = append(l.jobs, pj)
		l.messages += len(plan.Chunks)
	}
	return l, nil
}

// producer sends the whole load to urls.Work and returns how long it took.
type producer struct {
	name string
	run  func(ctx context.Context, e *benchEnv, urls localstack.URLs, l *publishLoad) (time.Duration, error)
}

func (pc publishConfig) producers() []producer {
	return []producer{
		{"publisher (HTTP POST /v1/jobs)", pc.publisher},
		{"bare SendMessageBatch, prebuilt, job by job", pc.bare(true, false)},
		{"bare SendMessageBatch, encoding, job by job", pc.bare(true, true)},
		{"bare SendMessageBatch, prebuilt, continuous", pc.bare(false, false)},
	}
}

// eachJob runs f on every job of l from pc.Clients goroutines, each taking
// the next job when done with its last.
func (pc publishConfig) eachJob(ctx context.Context, l *publishLoad, f func(context.Context, int, *publishJob) error) error {
	g, ctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for range pc.Clients {
		g.Go(func() error {
			for j := int(next.Add(1)) - 1; j < len(l.jobs); j = int(next.Add(1)) - 1 {
				if err := f(ctx, j, &l.jobs[j]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func (pc publishConfig) publisher(ctx context.Context, e *benchEnv, urls localstack.URLs, l *publishLoad) (time.Duration, error) {
	p, err := publisher.New(publisher.Config{
		Queue: pubjobs.NewSQSQueue(e.Client, urls.Work),
		Jobs:  publisher.Jobs{SendConcurrency: publishSends},
		API: publisher.API{
			Logger:     slog.New(slog.NewJSONHandler(io.Discard, nil)),
			Registerer: prometheus.NewRegistry(),
		},
	})
	if err != nil {
		return 0, err
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	client := srv.Client()
	if t, ok := client.Transport.(*http.Transport); ok {
		t.MaxIdleConnsPerHost = pc.Clients // one kept-alive connection per client
	}
	start := time.Now()
	err = pc.eachJob(ctx, l, func(ctx context.Context, j int, pj *publishJob) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/jobs", bytes.NewReader(pj.post))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("job %d: %s: %s", j, resp.Status, answer)
		}
		return nil
	})
	return time.Since(start), err
}

// bare sends the jobs' chunks with SendMessageBatch alone. Job by job, each
// client sends a job's calls, publishSends at a time, and waits for them
// all before its next job, as a POST does; otherwise one stream of calls
// keeps Clients*publishSends in flight. Encoding, each chunk's body is
// marshalled from its items as it is sent; otherwise it is the planner's,
// built in advance.
func (pc publishConfig) bare(byJob, encode bool) func(context.Context, *benchEnv, localstack.URLs, *publishLoad) (time.Duration, error) {
	send := func(ctx context.Context, e *benchEnv, url string, entries []types.SendMessageBatchRequestEntry) error {
		out, err := e.Client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &url, Entries: entries})
		if err != nil {
			return err
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("%d entries failed, first %s", len(out.Failed), aws.ToString(out.Failed[0].Code))
		}
		return nil
	}
	batches := func(pj *publishJob) ([][]types.SendMessageBatchRequestEntry, error) {
		if !encode {
			return pj.batches, nil
		}
		var out [][]types.SendMessageBatchRequestEntry
		for i := range pj.works {
			if i%10 == 0 {
				out = append(out, nil)
			}
			body, err := json.Marshal(&pj.works[i])
			if err != nil {
				return nil, err
			}
			b := &out[len(out)-1]
			*b = append(*b, sqscodec.Entry(i%10, sqscodec.Message{Body: string(body), Attributes: job.Attributes(pj.works[i].Key())}))
		}
		return out, nil
	}
	return func(ctx context.Context, e *benchEnv, urls localstack.URLs, l *publishLoad) (time.Duration, error) {
		start := time.Now()
		if byJob {
			err := pc.eachJob(ctx, l, func(ctx context.Context, _ int, pj *publishJob) error {
				bs, err := batches(pj)
				if err != nil {
					return err
				}
				g, ctx := errgroup.WithContext(ctx)
				g.SetLimit(publishSends)
				for _, b := range bs {
					g.Go(func() error { return send(ctx, e, urls.Work, b) })
				}
				return g.Wait()
			})
			return time.Since(start), err
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(pc.Clients * publishSends)
		for i := range l.jobs {
			bs, err := batches(&l.jobs[i])
			if err != nil {
				return 0, err
			}
			for _, b := range bs {
				g.Go(func() error { return send(gctx, e, urls.Work, b) })
			}
		}
		err := g.Wait()
		return time.Since(start), err
	}
}
