package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/modelserver"
)

// The load the engine run puts on a real server: a batch sent through the
// model-server backend (modelserver.Model, as the subscriber runs it), an
// online load of its own beside it, and the server's /metrics read
// throughout. The batch here has no queue: its callers stand in for the
// subscriber's admitted messages, as TestBenchModelServer's do against the
// fake. TestBenchOnline's driver cannot be pointed at a URL (its online
// load is generated inside fakeoai), so the online load is generated here,
// in the same shape: a closed loop whose requests in flight move between
// 20% and 90% of the server's max_num_seqs and back.

// driveOpts say what one run of the phases sends.
type driveOpts struct {
	base, model string
	seqs        int           // the server's max_num_seqs
	phase       time.Duration // each phase's length
	period      time.Duration // the online load's cycle, 20% → 90% → 20%
	workers     int           // batch callers, each with a Run of batchItems
	batchItems  int
	maxTokens   int    // a batch item's max_tokens
	onlineMax   int    // an online request's max_tokens
	stream      bool   // online requests stream, so that TTFT is their first event
	extra       string // JSON members every generation carries (vLLM's "ignore_eos":true)
	priority    int    // online-first's priority for the batch; 0 for a server without priorities
	// A phase runs on past its length until it has this many batch items
	// and online answers, where it has either: tests end phases by count.
	minBatch, minOnline int64
	// overrun bounds how long past its length a phase waits for those
	// counts (a server that stopped answering); default 2m.
	overrun time.Duration
	logger  *slog.Logger
}

// phaseResult is one phase's figures; -1 where the server exports no
// metrics.
type phaseResult struct {
	phase
	seconds                float64
	batchOK, batchFailed   int64
	batchTokens            int64   // prompt + completion tokens of the batch's answers (usage)
	serverTokens           float64 // prompt + generation tokens by the server's counters, -1 unknown
	kvMean, kvMax          float64 // vllm:kv_cache_usage_perc, -1 unknown
	preemptions            float64 // vllm:num_preemptions_total's increase, -1 unknown
	s429, s503, sOther     int64   // answers by status, every request of the phase's
	onlineOK, onlineFailed int64
	ttft                   []time.Duration // online: to the first event, or the whole answer unstreamed
	batchSlots, idleSlots  float64         // mean batch requests in flight; mean max_num_seqs less online's
	bound, giveWays        float64         // online-first: its bound at the end, its give-ways; -1 off
	cut                    bool            // ended by overrun, its counts not reached
}

// phase is one of the four runs.
type phase struct {
	name        string
	online      bool
	batch       bool
	onlineFirst bool
}

var phases = []phase{
	{name: "online alone", online: true},
	{name: "batch alone, fixed concurrency", batch: true},
	{name: "online + batch, fixed concurrency", online: true, batch: true},
	{name: "online + batch, online-first", online: true, batch: true, onlineFirst: true},
}

// counting counts a client's answers by status and its requests in flight.
type counting struct {
	next                        http.RoundTripper
	s429, s503, other, inflight atomic.Int64
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	gen := r.Method == http.MethodPost
	if gen {
		c.inflight.Add(1)
		defer c.inflight.Add(-1)
	}
	resp, err := c.next.RoundTrip(r)
	if err != nil || !gen {
		return resp, err
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		c.s429.Add(1)
	case resp.StatusCode == http.StatusServiceUnavailable:
		c.s503.Add(1)
	case resp.StatusCode/100 != 2:
		c.other.Add(1)
	}
	return resp, nil
}

// runPhase runs p for o.phase and returns its figures.
func runPhase(ctx context.Context, o driveOpts, p phase) (phaseResult, error) {
	res := phaseResult{phase: p, bound: -1, giveWays: -1}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batchRT := &counting{next: http.DefaultTransport.(*http.Transport).Clone()}
	onlineRT := &counting{next: http.DefaultTransport.(*http.Transport).Clone()}
	var onlineInFlight atomic.Int64
	var batchOK, batchFailed, batchTokens, online, onlineFailed atomic.Int64
	var mu sync.Mutex
	var ttft []time.Duration
	var wg sync.WaitGroup
	reg := prometheus.NewRegistry()

	if p.batch {
		cfg := modelserver.Config{BaseURL: o.base, Models: []string{o.model}, Logger: o.logger, MaxConcurrency: o.seqs,
			MaxOutputTokens: o.maxTokens, HTTPClient: &http.Client{Transport: batchRT},
			Registerer: reg}
		if p.onlineFirst {
			// docs/models.md's example for a vLLM fleet that also serves a
			// product: no online request left waiting, a TTFT p99 of 500 ms,
			// and the batch's generations behind the product's in the queue.
			cfg.Online = modelserver.Online{Interval: 2 * time.Second, TargetTTFT: 500 * time.Millisecond, Priority: o.priority}
		}
		m, err := modelserver.Open(ctx, cfg)
		if err != nil {
			return res, fmt.Errorf("%s: opening the model-server backend: %w", p.name, err)
		}
		defer m.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		var rngMu sync.Mutex
		for w := range o.workers {
			wg.Go(func() {
				for n := 0; ctx.Err() == nil; n++ {
					items := make([]job.Item, o.batchItems)
					for i := range items {
						rngMu.Lock()
						words := 20 + rng.IntN(60)
						rngMu.Unlock()
						items[i] = genItem(fmt.Sprintf("b%d-%d-%d", w, n, i), o.model, words, o.maxTokens, o.extra)
					}
					outs, err := m.Run(ctx, job.EndpointChatCompletions, items)
					if err != nil {
						// As the subscriber would hand the messages back: the
						// batch is not counted, and the caller tries anew.
						sleep(ctx, 200*time.Millisecond)
						continue
					}
					for _, out := range outs {
						if out.Error != nil || out.Response == nil || out.Response.StatusCode/100 != 2 {
							batchFailed.Add(1)
							continue
						}
						batchOK.Add(1)
						batchTokens.Add(usageTokens(out.Response.Body))
					}
				}
			})
		}
	}
	if p.online {
		client := &http.Client{Transport: onlineRT, Timeout: 5 * time.Minute}
		t0 := time.Now()
		most := max(1, o.seqs*9/10)
		for g := range most {
			wg.Go(func() {
				for n := 0; ctx.Err() == nil; n++ {
					if g >= onlineShare(time.Since(t0), o.period, o.seqs) {
						sleep(ctx, 50*time.Millisecond)
						continue
					}
					onlineInFlight.Add(1)
					d, err := onlineRequest(ctx, client, o, fmt.Sprintf("o%d-%d", g, n))
					onlineInFlight.Add(-1)
					switch {
					case ctx.Err() != nil:
					case err != nil:
						onlineFailed.Add(1)
						sleep(ctx, 100*time.Millisecond)
					default:
						online.Add(1)
						mu.Lock()
						ttft = append(ttft, d)
						mu.Unlock()
					}
				}
			})
		}
	}

	// The server's metrics and the requests in flight, four times a second.
	first, err := scrape(ctx, o.base)
	haveMetrics := err == nil
	var kvSum, kvMax, batchSum, idleSum float64
	var samples int
	t0 := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last map[string]*dto.MetricFamily
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
		samples++
		batchSum += float64(batchRT.inflight.Load())
		idleSum += float64(o.seqs) - float64(onlineInFlight.Load())
		if haveMetrics {
			if f, err := scrape(ctx, o.base); err == nil {
				last = f
				kv := gauge(f, "vllm:kv_cache_usage_perc")
				kvSum += kv
				kvMax = max(kvMax, kv)
			}
		}
		counted := (!p.batch || batchOK.Load()+batchFailed.Load() >= o.minBatch) &&
			(!p.online || online.Load()+onlineFailed.Load() >= o.minOnline)
		res.cut = !counted && time.Since(t0) >= o.phase+cmp.Or(o.overrun, 2*time.Minute)
		done = time.Since(t0) >= o.phase && counted || res.cut
	}
	res.seconds = time.Since(t0).Seconds()
	if p.onlineFirst {
		if fams, err := reg.Gather(); err == nil {
			for _, f := range fams {
				switch f.GetName() {
				case "vramq_subscriber_model_server_online_bound":
					res.bound = sum(f)
				case "vramq_subscriber_model_server_online_give_ways_total":
					res.giveWays = sum(f)
				}
			}
		}
	}
	cancel()
	wg.Wait()

	res.batchOK, res.batchFailed, res.batchTokens = batchOK.Load(), batchFailed.Load(), batchTokens.Load()
	res.onlineOK, res.onlineFailed, res.ttft = online.Load(), onlineFailed.Load(), ttft
	res.s429 = batchRT.s429.Load() + onlineRT.s429.Load()
	res.s503 = batchRT.s503.Load() + onlineRT.s503.Load()
	res.sOther = batchRT.other.Load() + onlineRT.other.Load()
	res.batchSlots, res.idleSlots = batchSum/float64(samples), idleSum/float64(samples)
	res.serverTokens, res.kvMean, res.kvMax, res.preemptions = -1, -1, -1, -1
	if haveMetrics && last != nil {
		delta := func(name string) float64 { return gauge(last, name) - gauge(first, name) }
		res.serverTokens = delta("vllm:prompt_tokens_total") + delta("vllm:generation_tokens_total")
		res.kvMean, res.kvMax = kvSum/float64(samples), kvMax
		res.preemptions = delta("vllm:num_preemptions_total")
	}
	return res, nil
}

// onlineShare is how many online requests may be in flight at t: a
// triangle between 20% and 90% of seqs over period.
func onlineShare(t, period time.Duration, seqs int) int {
	x := float64(t%period) / float64(period) // 0..1
	tri := 1 - 2*abs(x-0.5)                  // 0 → 1 → 0
	return int(float64(seqs) * (0.2 + 0.7*tri))
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// genItem is a chat item of about words words asking for up to maxTokens.
func genItem(id, modelName string, words, maxTokens int, extra string) job.Item {
	text := "item " + id + strings.Repeat(" the batch queue", words/3)
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d%s}`,
		modelName, text, maxTokens, members(extra))
	return job.Item{ID: id, Body: json.RawMessage(body)}
}

func members(extra string) string {
	if extra == "" {
		return ""
	}
	return "," + extra
}

// onlineRequest sends one online chat request and returns the time to its
// first streamed event, or to the whole answer when o.stream is off.
func onlineRequest(ctx context.Context, c *http.Client, o driveOpts, id string) (time.Duration, error) {
	stream := ""
	if o.stream {
		stream = `,"stream":true`
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d%s%s}`,
		o.model, "online "+id+strings.Repeat(" a user of the product asks", 8), o.onlineMax, stream, members(o.extra))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, fmt.Errorf("online request: %s", resp.Status)
	}
	if !o.stream {
		_, err := io.Copy(io.Discard, resp.Body)
		return time.Since(t0), err
	}
	var first time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if first == 0 && bytes.HasPrefix(sc.Bytes(), []byte("data:")) {
			first = time.Since(t0)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if first == 0 {
		return 0, fmt.Errorf("online request: a stream without events")
	}
	return first, nil
}

// usageTokens is an answer's usage.total_tokens, 0 when it has none.
func usageTokens(body []byte) int64 {
	var a struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &a) != nil {
		return 0
	}
	return a.Usage.TotalTokens
}

func scrape(ctx context.Context, base string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
}

// gauge is a family's value summed over its series (vLLM labels each by
// model and engine), 0 when absent.
func gauge(fams map[string]*dto.MetricFamily, name string) float64 {
	if f := fams[name]; f != nil {
		return sum(f)
	}
	return 0
}

func sum(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Gauge != nil:
			s += m.GetGauge().GetValue()
		case m.Counter != nil:
			s += m.GetCounter().GetValue()
		case m.Untyped != nil:
			s += m.GetUntyped().GetValue()
		}
	}
	return s
}

// drain waits until the server shows no request running or waiting, at
// most limit; a server without metrics is given a few seconds.
func drain(ctx context.Context, base string, limit time.Duration) {
	t0 := time.Now()
	for time.Since(t0) < limit && ctx.Err() == nil {
		f, err := scrape(ctx, base)
		if err != nil {
			sleep(ctx, 5*time.Second)
			return
		}
		if gauge(f, "vllm:num_requests_running")+gauge(f, "vllm:num_requests_waiting") == 0 {
			return
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// quantile is the q-quantile of ds (sorted in place), 0 when empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[int(q*float64(len(ds)-1))]
}
