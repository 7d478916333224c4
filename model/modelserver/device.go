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

	"github.com/vramq/vramq/gpu"
)

// Device is the model server as a gpu.Device. Its memory is the server's KV
// cache in device bytes (Model.Cost's unit): the blocks vllm:cache_config_info
// names × their size × KV bytes per token, or Config.KVCacheTokens of them,
// or, knowing neither, Config.TokensInFlight. With vLLM's metrics its free
// memory follows vllm:kv_cache_usage_perc, and is none while requests wait
// (vllm:num_requests_waiting): the server has run out of room for what it
// was given. Without them it is all free, always: the budget is then the
// capacity, a bound on the tokens vramq has in flight.
//
// The configured rate limits (Config.TPM, RPM) bound its free memory too:
// to what they admit in half of Config.MaxWait, less what its requests
// hold. The subscriber admits no more than its budget (free memory plus the
// working set). A batch admitted beyond what the limits pass before its
// MaxWait ends backs off partway, its finished requests' answers lost and
// their tokens spent again; with a queue's worth held, every batch would,
// over and over (bench/modelserver.md, "Through the subscriber").
type Device struct {
	m        *Model
	name     string
	capacity int64
	live     bool // follows /metrics

	mu   sync.Mutex
	snap metricsSnap
	read time.Time
}

// Name is "model-server" and the server's host.
func (d *Device) Name() string { return d.name }

// Simulated is true when nothing is read from the server: the memory is
// vramq's own account of what it has in flight.
func (d *Device) Simulated() bool { return !d.live }

// MemInfo reads the server's KV cache, through a reading of /metrics at
// most Config.MetricsMaxAge old, its free memory bounded by the configured
// rate limits.
func (d *Device) MemInfo() (gpu.MemInfo, error) {
	mem, err := d.kvInfo()
	if err != nil {
		return mem, err
	}
	if tokens, ok := d.m.rates.ownWithin(d.m.cfg.MaxWait/rateHorizonDiv, float64(d.m.cfg.MaxOutputTokens)); ok {
		rate := int64(math.Min(tokens*float64(d.m.unit), math.MaxInt64/2))
		mem.Free = max(0, min(mem.Free, rate-d.m.Working()))
	}
	return mem, nil
}

// rateHorizonDiv makes the rate limits' bound on free memory what they
// admit in MaxWait/2: a batch admitted with that much ahead of it finishes
// within MaxWait, the other half left for the margin the mirrors keep and
// a limiter slower than it says.
const rateHorizonDiv = 2

// kvInfo is MemInfo of the KV cache alone.
func (d *Device) kvInfo() (gpu.MemInfo, error) {
	if !d.live {
		return gpu.MemInfo{Total: d.capacity, Free: d.capacity}, nil
	}
	d.mu.Lock()
	stale := time.Since(d.read) >= d.m.cfg.MetricsMaxAge
	d.mu.Unlock()
	if stale {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := d.m.readMetrics(ctx)
		cancel()
		if err != nil {
			return gpu.MemInfo{}, err
		}
		d.mu.Lock()
		d.snap, d.read = snap, time.Now()
		d.mu.Unlock()
	}
	d.mu.Lock()
	used := d.usedBytes()
	d.mu.Unlock()
	return gpu.MemInfo{Total: d.capacity, Free: d.capacity - used, Used: used, Process: d.m.Working()}, nil
}

// usedBytes is the KV cache in use at the last reading. d.mu is held.
func (d *Device) usedBytes() int64 {
	if d.snap.waiting > 0 {
		return d.capacity
	}
	return min(d.capacity, int64(math.Round(d.snap.usage*float64(d.capacity))))
}

// Close closes the model's idle connections.
func (d *Device) Close() error { return d.m.Close() }

// metricsSnap is what /metrics says of the KV cache.
type metricsSnap struct {
	blocks, blockSize int64   // vllm:cache_config_info's num_gpu_blocks, block_size
	usage             float64 // vllm:kv_cache_usage_perc, 0 to 1
	waiting           float64 // vllm:num_requests_waiting
}

// readMetrics reads vLLM's metrics (docs/usage/metrics.md): the cache's
// configuration, its usage (kv_cache_usage_perc, or the older name
// gpu_cache_usage_perc) and the requests waiting, the largest of each over
// the engines a server runs.
func (m *Model) readMetrics(ctx context.Context) (metricsSnap, error) {
	var s metricsSnap
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+"/metrics", nil)
	if err != nil {
		return s, err
	}
	if m.auth != "" {
		req.Header.Set("Authorization", m.auth)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return s, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return s, fmt.Errorf("GET /metrics: %w", err)
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
	for _, mt := range usage {
		s.usage = math.Max(s.usage, value(mt))
	}
	for _, mt := range family(fams, "vllm:num_requests_waiting") {
		s.waiting = math.Max(s.waiting, value(mt))
	}
	s.usage = math.Min(1, math.Max(0, s.usage))
	return s, nil
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
