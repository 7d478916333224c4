package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/job"
)

// The publisher API's bodies, as far as loadgen reads them.
type (
	jobRequest struct {
		Items   []job.Item  `json:"items"`
		Options *jobOptions `json:"options,omitempty"`
	}
	jobOptions struct {
		ChunkItems int `json:"chunk_items,omitempty"`
	}
	jobAccepted struct {
		JobID        string `json:"job_id"`
		Chunks       int    `json:"chunks"`
		Items        int    `json:"items"`
		ClaimChecked int    `json:"claim_checked"`
	}
	jobStatus struct {
		JobID        string `json:"job_id"`
		Status       string `json:"status"`
		Chunks       int    `json:"chunks"`
		ChunksDone   int    `json:"chunks_done"`
		ChunksFailed int    `json:"chunks_failed"`
		Failed       []struct {
			Chunk  int    `json:"chunk"`
			Reason string `json:"reason"`
		} `json:"failed"`
		Results []struct {
			Chunk   int          `json:"chunk"`
			Outputs []job.Output `json:"outputs"`
		} `json:"results"`
		NextPageToken string `json:"next_page_token"`
	}
)

type publisherRun struct {
	url, apiKey string
	load        workload.Load
	chunkItems  int // the jobs' chunk_items option; 0 for the publisher's default
	hugeItem    int // bytes of one extra item in the first job, to go through S3; 0 for none
	limiter     *rate.Limiter
	stderr      io.Writer
	client      *http.Client

	mu     sync.Mutex
	posted []*postedJob
}

// postedJob is a job the publisher accepted, as followed by GET /v1/jobs/{id}.
type postedJob struct {
	jobAccepted
	at   time.Time  // when its POST began: every chunk's send time
	done int        // chunks done at the last look
	st   *jobStatus // once settled
}

// statusPoll is how often a job's status is read: the resolution of the
// latencies measured in this mode.
const statusPoll = 200 * time.Millisecond

// run posts the jobs to the publisher, paced by the limiter, and follows
// them with GET /v1/jobs/{id} until each is settled, and fills s. A chunk's
// latency is from its job's POST to the first status that counts it done.
func (r *publisherRun) run(ctx context.Context, s *Summary) ([]string, error) {
	r.client = &http.Client{Timeout: time.Minute}
	start := time.Now()
	var latencies []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	posting := make(chan struct{})
	g.Go(func() error {
		defer close(posting)
		return r.post(gctx, s)
	})
	g.Go(func() error {
		bar := newProgress(r.stderr, 0, "chunks")
		defer bar.finish()
		for {
			postingDone := false
			select {
			case <-posting:
				postingDone = true
			default:
			}
			r.mu.Lock()
			jobs := slices.Clone(r.posted)
			r.mu.Unlock()
			total, settled, open := 0, 0, 0
			for _, pj := range jobs {
				total += pj.Chunks
				if pj.st == nil {
					var st jobStatus
					if err := r.do(gctx, http.MethodGet, "/v1/jobs/"+pj.JobID+"?page_size=100", nil, http.StatusOK, &st); err != nil {
						return err
					}
					for range st.ChunksDone - pj.done {
						latencies = append(latencies, time.Since(pj.at))
					}
					pj.done = st.ChunksDone
					if st.Status == "complete" || st.Status == "partial" {
						if err := r.rest(gctx, &st); err != nil {
							return err
						}
						pj.st = &st
					}
				}
				if pj.st != nil {
					settled += pj.st.ChunksDone + pj.st.ChunksFailed
				} else {
					open++
					settled += pj.done
				}
			}
			if total > 0 {
				bar.setTotal(total)
				bar.set(settled)
			}
			if postingDone && open == 0 {
				return nil
			}
			select {
			case <-gctx.Done():
				return fmt.Errorf("%d of %d jobs settled: %w", len(jobs)-open, len(jobs), gctx.Err())
			case <-time.After(statusPoll):
			}
		}
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	s.Seconds = time.Since(start).Seconds()
	s.Latency = summarize(latencies)
	s.LatencySource = fmt.Sprintf("job status read every %v, from the job's POST", statusPoll)

	var samples []string
	for _, pj := range r.posted {
		st := pj.st
		s.Results += st.ChunksDone
		s.DeadLettered += st.ChunksFailed
		for _, f := range st.Failed {
			fmt.Fprintf(r.stderr, "loadgen: job %s chunk %d failed: %s\n", pj.JobID, f.Chunk, f.Reason)
		}
		for _, c := range st.Results {
			for _, o := range c.Outputs {
				s.Outputs++
				if len(samples) < 4 && len(o.Embedding) >= 3 && (len(samples) < 3 || o.ID == "huge") {
					samples = append(samples, fmt.Sprintf("%s item %-8s chunk %d: [%.4f %.4f %.4f ...] (%d dims)",
						pj.JobID[:min(8, len(pj.JobID))], o.ID, c.Chunk, o.Embedding[0], o.Embedding[1], o.Embedding[2], len(o.Embedding)))
				}
			}
		}
	}
	s.MessagesPerS = float64(s.Results) / s.Seconds
	s.ItemsPerS = float64(s.Outputs) / s.Seconds
	return samples, nil
}

// post sends the jobs, each followed by a wait for as many tokens as it
// made chunks.
func (r *publisherRun) post(ctx context.Context, s *Summary) error {
	jobs := max(r.load.Jobs, 1)
	for j := range jobs {
		var items []job.Item
		for _, w := range r.load.Job(j) {
			items = append(items, w.Items...)
		}
		if j == 0 && r.hugeItem > 0 {
			items = append(items, job.Item{ID: "huge", Text: strings.Repeat("vramq claim check ", r.hugeItem/18+1)})
		}
		req := jobRequest{Items: items}
		if r.chunkItems > 0 {
			req.Options = &jobOptions{ChunkItems: r.chunkItems}
		}
		pj := &postedJob{at: time.Now()}
		if err := r.do(ctx, http.MethodPost, "/v1/jobs", req, http.StatusAccepted, &pj.jobAccepted); err != nil {
			return fmt.Errorf("posting job %d: %w", j, err)
		}
		r.mu.Lock()
		r.posted = append(r.posted, pj)
		s.Messages += pj.Chunks
		s.Items += pj.Items
		s.ClaimChecked += pj.ClaimChecked
		r.mu.Unlock()
		if r.limiter != nil {
			for n := pj.Chunks; n > 0; n -= r.limiter.Burst() {
				if err := r.limiter.WaitN(ctx, min(n, r.limiter.Burst())); err != nil {
					return err
				}
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.stderr, "loadgen: posted %d jobs: %d items in %d chunks, %d item(s) claim-checked through S3\n",
		len(r.posted), s.Items, s.Messages, s.ClaimChecked)
	return nil
}

// rest reads the remaining pages of a settled job's results into st.
func (r *publisherRun) rest(ctx context.Context, st *jobStatus) error {
	for st.NextPageToken != "" {
		var page jobStatus
		if err := r.do(ctx, http.MethodGet, "/v1/jobs/"+st.JobID+"?page_size=100&page_token="+st.NextPageToken,
			nil, http.StatusOK, &page); err != nil {
			return err
		}
		st.Results = append(st.Results, page.Results...)
		st.NextPageToken = page.NextPageToken
	}
	return nil
}

func (r *publisherRun) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var payload []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		payload = b
	}
	// A 429 means this client is over the publisher's rate limit: wait as
	// long as Retry-After says and try again, as a well-behaved client does.
	for attempt := 1; ; attempt++ {
		status, b, retryAfter, err := r.once(ctx, method, path, payload)
		if err != nil {
			return err
		}
		if status == http.StatusTooManyRequests && attempt < maxRateLimitedAttempts {
			t := time.NewTimer(retryAfter)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			continue
		}
		if status != want {
			return fmt.Errorf("%s %s: %d %s: %s", method, path, status, http.StatusText(status), bytes.TrimSpace(b))
		}
		return json.Unmarshal(b, out)
	}
}

// maxRateLimitedAttempts bounds the tries of one request that keeps being
// rate limited.
const maxRateLimitedAttempts = 20

// once sends one request and returns the status, the body and, for a 429,
// how long Retry-After asks to wait (1s when it says nothing usable).
func (r *publisherRun) once(ctx context.Context, method, path string, payload []byte) (int, []byte, time.Duration, error) {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(r.url, "/")+path, body)
	if err != nil {
		return 0, nil, 0, err
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, 0, err
	}
	wait := time.Second
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		wait = time.Duration(secs) * time.Second
	}
	return resp.StatusCode, b, wait, nil
}
