package modelserver

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vramq/vramq/model/backend"
)

// KV is the model server's KV cache as the Memory that bounds its
// admission (backend.Memory, Model.Memory), in tokens (backend.KVTokens,
// Model.Cost's unit): the blocks vllm:cache_config_info names × their
// size in tokens, or Config.KVCacheTokens, or, knowing neither,
// Config.TokensInFlight. What a token takes in bytes on the server's
// device is the server's business: it sizes its pool in blocks and reports
// its use as a share of them. Without vLLM's metrics it is all free,
// always: the budget is then the capacity, a bound on the tokens vramq has
// in flight.
//
// With vLLM's metrics, it follows the cache, and its free memory is
// what admission may still fill: the pool, scaled by the retraction, less
// what the cache holds (vllm:kv_cache_usage_perc). With the model's working
// set (Model.Working: the least of its charges and the cache in use), a
// reading of the subscriber's budget, free + working, has admission take a
// request while the larger of the charges in flight and the KV allocated,
// plus its charge, is within that: the charges (Model.Cost) are what
// requests hold on average with a headroom for their spread, and the live
// usage lowers the reading when they turn out to hold more, or when another
// client fills the cache. The subscriber takes a reading only when the next
// agrees with it, so what holds still (a retraction) reaches admission, and
// a usage that moves between readings mostly does not.
//
// Two signals from the server say admission went too far. Requests
// waiting (vllm:num_requests_waiting) while the cache is above kvHigh are
// vLLM's queue holding them for blocks it lacks: the cache counts as full
// then, a reading in which nothing more fits. (Requests wait in vLLM
// with blocks free too, from their arrival to the next step: that says
// nothing of the cache.) A rise of vllm:num_preemptions_total means vLLM
// freed a running sequence's blocks, to recompute it later: the charges
// were too low for what ran, and the share of the pool admission may fill
// is halved (retraction), down to retractFloor, then given back by
// retractStep at most every retractHoldAges × Config.MetricsMaxAge without
// another preemption, so that each share holds long enough for the
// subscriber's budget, which waits for two readings that agree, to take it.
//
// The rate limits are not memory: they bound admission as a resource of
// their own (Model.Offers, backend.RateTokens), in tokens.
type KV struct {
	m        *Model
	name     string
	capacity int64
	live     bool // follows /metrics

	mu      sync.Mutex
	snap    metricsSnap
	read    time.Time
	share   float64   // of the pool admission may fill: 1, lowered by retraction
	changed time.Time // when share last changed
	retract int       // retractions so far
}

// Admission's share of a followed cache and its retraction.
const (
	kvHigh          = 0.97 // usage from which waiting requests wait for blocks
	retractFloor    = 1.0 / 8
	retractStep     = 1.0 / 8
	retractHoldAges = 4
)

// Name is "model-server" and the server's host.
func (d *KV) Name() string { return d.name }

// Unit is backend.KVTokens.
func (d *KV) Unit() backend.Unit { return backend.KVTokens }

// Simulated is true when nothing is read from the server: the memory is
// vramq's own account of what it has in flight.
func (d *KV) Simulated() bool { return !d.live }

// Read reads the server's KV cache, through a reading of /metrics at
// most Config.MetricsMaxAge old.
func (d *KV) Read() (backend.Reading, error) {
	if !d.live {
		return backend.Reading{Total: d.capacity, Free: d.capacity}, nil
	}
	d.mu.Lock()
	stale := time.Since(d.read) >= d.m.cfg.MetricsMaxAge
	d.mu.Unlock()
	if stale {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := d.m.readMetrics(ctx)
		cancel()
		if err != nil {
			return backend.Reading{}, err
		}
		d.mu.Lock()
		d.follow(snap)
		d.mu.Unlock()
	}
	d.mu.Lock()
	used := d.usedTokens()
	room := int64(d.share * float64(d.capacity))
	d.mu.Unlock()
	// Below 0 while retraction holds admission to less than the cache
	// holds already: free + working then stays the share less what the
	// requests in flight hold beyond their charges, a reading that holds
	// still enough for the subscriber's budget to take it, as 0 and the
	// ever-moving working set would not.
	return backend.Reading{Total: d.capacity, Free: room - used, Used: used, Process: d.m.Working()}, nil
}

// follow takes a new reading of the server's metrics, retracting or
// giving back admission's share. d.mu is held.
func (d *KV) follow(snap metricsSnap) {
	prev := d.snap
	now := time.Now()
	d.snap, d.read = snap, now
	switch {
	case snap.preemptions > prev.preemptions && prev.blocks > 0:
		from := d.share
		d.share, d.changed = max(retractFloor, d.share/2), now
		d.retract++
		d.m.log.Warn("the model server preempted requests: admitting to less of its KV cache",
			"preemptions", snap.preemptions-prev.preemptions, "kv_cache_usage", snap.usage, "share_from", from, "share_to", d.share)
	case d.share < 1 && snap.usage < kvHigh && now.Sub(d.changed) >= retractHoldAges*d.m.cfg.MetricsMaxAge:
		d.share, d.changed = min(1, d.share+retractStep), now
	}
}

// usedTokens is the KV cache in use at the last reading: all of it while
// requests wait for blocks. d.mu is held.
func (d *KV) usedTokens() int64 {
	if d.snap.waiting > 0 && d.snap.usage >= kvHigh {
		return d.capacity
	}
	return min(d.capacity, int64(math.Round(d.snap.usage*float64(d.capacity))))
}

// blockSize is the server's KV block in tokens; 0 when not followed.
func (d *KV) blockSize() int64 {
	if !d.live {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snap.blockSize
}

// metricsSnap is what /metrics says of the KV cache.
type metricsSnap struct {
	blocks, blockSize int64   // vllm:cache_config_info's num_gpu_blocks, block_size
	usage             float64 // vllm:kv_cache_usage_perc, 0 to 1
	waiting           float64 // vllm:num_requests_waiting
	preemptions       float64 // vllm:num_preemptions_total
}

// readMetrics reads vLLM's metrics (docs/usage/metrics.md): the cache's
// configuration, its usage (kv_cache_usage_perc, or the older name
// gpu_cache_usage_perc) and the requests waiting, the largest of each over
// the engines a server runs, and the preemptions, summed over them.
func (m *Model) readMetrics(ctx context.Context) (metricsSnap, error) {
	var s metricsSnap
	fams, err := m.scrape(ctx)
	if err != nil {
		return s, err
	}
	for _, mt := range family(fams, "vllm:cache_config_info") {
		for _, l := range mt.GetLabel() {
			v, err := strconv.ParseInt(l.GetValue(), 10, 64)
			if err != nil {
				continue
			}
			switch l.GetName() {
			case "num_gpu_blocks":
				s.blocks = max(s.blocks, v)
			case "block_size":
				s.blockSize = max(s.blockSize, v)
			}
		}
	}
	if s.blocks <= 0 || s.blockSize <= 0 {
		return metricsSnap{}, fmt.Errorf("GET /metrics: no vllm:cache_config_info with num_gpu_blocks and block_size")
	}
	usage := family(fams, "vllm:kv_cache_usage_perc")
	if usage == nil {
		usage = family(fams, "vllm:gpu_cache_usage_perc")
	}
	// A NaN would pass every comparison below as if it were not there and
	// read as an empty cache (math.Max(0, NaN) is NaN, and so is the
	// usage in tokens); an Inf as a full or an endless one. A reading that
	// holds one is no reading: it fails, as an unreachable /metrics does.
	var bad error
	read := func(mt *dto.Metric, name string) float64 {
		v := value(mt)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			bad = fmt.Errorf("GET /metrics: vllm:%s is %v: not a reading", name, v)
		}
		return v
	}
	for _, mt := range usage {
		s.usage = math.Max(s.usage, read(mt, "kv_cache_usage_perc"))
	}
	for _, mt := range family(fams, "vllm:num_requests_waiting") {
		s.waiting = math.Max(s.waiting, read(mt, "num_requests_waiting"))
	}
	for _, mt := range family(fams, "vllm:num_preemptions_total") {
		s.preemptions += read(mt, "num_preemptions_total")
	}
	if bad != nil {
		return metricsSnap{}, bad
	}
	s.usage = math.Min(1, math.Max(0, s.usage))
	return s, nil
}

// scrape reads the server's GET /metrics, for the KV cache (readMetrics)
// and online-first mode (online.go).
func (m *Model) scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	if m.auth != "" {
		req.Header.Set("Authorization", m.auth)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", clipErr(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", clip(resp.Status, maxServerString))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		// The parser's error quotes the line it stopped at.
		return nil, fmt.Errorf("GET /metrics: %s", clip(err.Error(), maxServerMessage))
	}
	return fams, nil
}

func family(fams map[string]*dto.MetricFamily, name string) []*dto.Metric {
	if f := fams[name]; f != nil {
		return f.GetMetric()
	}
	return nil
}

func value(mt *dto.Metric) float64 {
	switch {
	case mt.GetGauge() != nil:
		return mt.GetGauge().GetValue()
	case mt.GetCounter() != nil:
		return mt.GetCounter().GetValue()
	case mt.GetUntyped() != nil:
		return mt.GetUntyped().GetValue()
	}
	return 0
}
