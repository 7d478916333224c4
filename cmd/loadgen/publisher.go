package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/vramq/vramq/internal/workload"
	"github.com/vramq/vramq/job"
)

// The publisher API's bodies, as far as loadgen reads them.
type (
	jobRequest struct {
		Items []job.Item `json:"items"`
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
	jobs        int
	perJob      int // messages' worth of items per job, from the mixed workload
	hugeItem    int // bytes of one extra item in the first job, to go through S3; 0 for none
	stderr      io.Writer
	client      *http.Client
}

// runPublisher posts jobs to the publisher, follows them with GET
// /v1/jobs/{id} until each is settled, and fills s.
func (r *publisherRun) run(ctx context.Context, s *Summary) ([]string, error) {
	r.client = &http.Client{Timeout: time.Minute}
	start := time.Now()
	var accepted []jobAccepted
	for j := range r.jobs {
		var items []job.Item
		for _, w := range workload.Mixed(fmt.Sprintf("j%d", j), r.perJob).Works() {
			items = append(items, w.Items...)
		}
		if j == 0 && r.hugeItem > 0 {
			items = append(items, job.Item{ID: "huge", Text: strings.Repeat("vramq claim check ", r.hugeItem/18+1)})
		}
		var a jobAccepted
		if err := r.do(ctx, http.MethodPost, "/v1/jobs", jobRequest{Items: items}, http.StatusAccepted, &a); err != nil {
			return nil, fmt.Errorf("posting job %d: %w", j, err)
		}
		accepted = append(accepted, a)
		s.Messages += a.Chunks
		s.Items += a.Items
		s.ClaimChecked += a.ClaimChecked
	}
	fmt.Fprintf(r.stderr, "loadgen: posted %d jobs: %d items in %d chunks, %d item(s) claim-checked through S3\n",
		len(accepted), s.Items, s.Messages, s.ClaimChecked)

	bar := newProgress(r.stderr, s.Messages)
	done := map[string]*jobStatus{}
	for len(done) < len(accepted) {
		settled := 0
		for _, a := range accepted {
			if st := done[a.JobID]; st != nil {
				settled += st.ChunksDone + st.ChunksFailed
				continue
			}
			var st jobStatus
			if err := r.do(ctx, http.MethodGet, "/v1/jobs/"+a.JobID+"?page_size=100", nil, http.StatusOK, &st); err != nil {
				return nil, err
			}
			settled += st.ChunksDone + st.ChunksFailed
			if st.Status == "complete" || st.Status == "partial" {
				if err := r.rest(ctx, &st); err != nil {
					return nil, err
				}
				done[a.JobID] = &st
			}
		}
		bar.set(settled)
		if len(done) < len(accepted) {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%d of %d jobs settled: %w", len(done), len(accepted), ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	bar.finish()
	s.Seconds = time.Since(start).Seconds()

	var samples []string
	for _, a := range accepted {
		st := done[a.JobID]
		s.Results += st.ChunksDone
		s.DeadLettered += st.ChunksFailed
		for _, f := range st.Failed {
			fmt.Fprintf(r.stderr, "loadgen: job %s chunk %d failed: %s\n", a.JobID, f.Chunk, f.Reason)
		}
		for _, c := range st.Results {
			for _, o := range c.Outputs {
				s.Outputs++
				if len(samples) < 4 && len(o.Embedding) >= 3 && (len(samples) < 3 || o.ID == "huge") {
					samples = append(samples, fmt.Sprintf("%s item %-8s chunk %d: [%.4f %.4f %.4f ...] (%d dims)",
						a.JobID[:min(8, len(a.JobID))], o.ID, c.Chunk, o.Embedding[0], o.Embedding[1], o.Embedding[2], len(o.Embedding)))
				}
			}
		}
	}
	s.MessagesPerS = float64(s.Results) / s.Seconds
	s.ItemsPerS = float64(s.Outputs) / s.Seconds
	return samples, nil
}

// rest reads the remaining pages of a settled job's results into st.
func (r *publisherRun) rest(ctx context.Context, st *jobStatus) error {
	for st.NextPageToken != "" {
		var page jobStatus
		if err := r.do(ctx, http.MethodGet, "/v1/jobs/"+st.JobID+"?page_size=100&page_token="+st.NextPageToken, nil, http.StatusOK, &page); err != nil {
			return err
		}
		st.Results = append(st.Results, page.Results...)
		st.NextPageToken = page.NextPageToken
	}
	return nil
}

func (r *publisherRun) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(r.url, "/")+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}

// progress is a bar on a terminal, and a line every few seconds elsewhere
// (CI logs, pipes), where a bar's redraws would be noise.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	total int
	last  time.Time
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, last: time.Now()}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("chunks"),
				progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond))
		}
	}
	return p
}

func (p *progress) set(n int) {
	if p.bar != nil {
		_ = p.bar.Set(n)
		return
	}
	if time.Since(p.last) > 2*time.Second {
		fmt.Fprintf(p.w, "loadgen: %d/%d chunks settled\n", n, p.total)
		p.last = time.Now()
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}
