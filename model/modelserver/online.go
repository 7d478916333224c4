package modelserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Online is online-first mode: the server also serves traffic this
// subscriber does not send (a product's), and the batch takes only what
// that leaves. Every Interval the backend reads the server's signals and
// sets how many of its requests may be in flight with an additive-increase,
// multiplicative-decrease rule: an interval in which the server shows more
// than TargetWaiting requests waiting, a time to first token past
// TargetTTFT at the 99th percentile, or its KV cache at KVHigh or more,
// multiplies the bound by Decrease (the batch gives way within one
// interval); an interval without, in which the batch used the whole bound,
// adds Increase (it takes the slack back). The bound never passes the
// concurrency bound (Config.MaxConcurrency and its overload halving).
//
// Online traffic that grows finds its slots held by the batch, and waits,
// before any of that shows: so a slack gate keeps Headroom of the server's
// sequences free. The server's capacity is learned as the most requests it
// ran at a reading when others waited (it was full); an interval that ran
// more than capacity less Headroom gives the excess back, and an increase
// stops short of it.
//
// The signals are vLLM's (docs/usage/metrics.md: vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, the vllm:time_to_first_token_seconds
// histogram), TGI's tgi_queue_size and TEI's te_queue_size. A server that
// serves none of them (Ollama, a gateway) is followed by the latency of the
// backend's own requests instead: an interval whose median is past
// LatencySlack times the lowest median seen is congested.
//
// Requests already sent are not called back: vLLM's engine does not
// preempt a running request for a waiting one, so the headroom online
// traffic finds is what the bound kept free. Where the server orders its
// queue by priority (vLLM's --scheduling-policy priority), Priority marks
// every generation the batch sends, so that online requests waiting beside
// them go first.
type Online struct {
	// Interval is the control interval. 0: the mode is off.
	Interval time.Duration
	// TargetWaiting is how many requests may wait in the server's queue
	// before the batch gives way: 0, none.
	TargetWaiting int
	// TargetTTFT is the 99th percentile of the time to first token, over
	// an interval, past which the batch gives way. 0: not followed. The
	// server's histogram counts the batch's requests too.
	TargetTTFT time.Duration
	// KVHigh is the KV cache usage, 0 to 1, from which the batch gives
	// way. Default 0.95.
	KVHigh float64
	// Decrease multiplies the bound in a congested interval, 0 to 1.
	// Default 0.5.
	Decrease float64
	// Increase is what an uncongested interval adds. Default
	// MaxConcurrency/8, at least 1.
	Increase int
	// Priority, when not 0, is sent as every generation's "priority"
	// (replacing a body's own, which an untrusted client could set to go
	// ahead of the product's traffic): above the online traffic's (vLLM's
	// default is 0; lower values go first).
	Priority int
	// LatencySlack is, for a server without those metrics, the factor over
	// the lowest median latency seen past which an interval is congested.
	// Default 1.5.
	LatencySlack float64
	// Headroom is the server's sequences kept free for online traffic to
	// grow into between two intervals. Default MaxConcurrency/32, at
	// least 1.
	Headroom int
}

func (o Online) validate() error {
	var errs []error
	if o.Interval < 0 || o.TargetWaiting < 0 || o.TargetTTFT < 0 || o.Increase < 0 || o.Headroom < 0 {
		errs = append(errs, fmt.Errorf("modelserver: online: interval %v, target waiting %d, target TTFT %v, increase %d, headroom %d: want 0 or more",
			o.Interval, o.TargetWaiting, o.TargetTTFT, o.Increase, o.Headroom))
	}
	if o.KVHigh < 0 || o.KVHigh > 1 || o.Decrease < 0 || o.Decrease >= 1 || o.LatencySlack < 0 || (o.LatencySlack > 0 && o.LatencySlack <= 1) {
		errs = append(errs, fmt.Errorf("modelserver: online: KV high %v, decrease %v, latency slack %v: want KV high and decrease in [0, 1), slack above 1",
			o.KVHigh, o.Decrease, o.LatencySlack))
	}
	return errors.Join(errs...)
}

func (o *Online) setDefaults(maxConcurrency int) {
	if o.KVHigh == 0 {
		o.KVHigh = 0.95
	}
	if o.Decrease == 0 {
		o.Decrease = 0.5
	}
	if o.Increase == 0 {
		o.Increase = max(1, maxConcurrency/8)
	}
	if o.LatencySlack == 0 {
		o.LatencySlack = 1.5
	}
	if o.Headroom == 0 {
		o.Headroom = max(1, maxConcurrency/32)
	}
}

// online is the controller. Its methods are safe on a nil *online (the mode
// off), so that call sites need no test.
type online struct {
	cfg  Online
	max  int
	conc *concurrency

	mu       sync.Mutex
	limit    int
	inflight int
	peak     int             // most in flight this interval
	lat      []time.Duration // of this interval's answers
	best     time.Duration   // lowest interval median seen
	ttft     []histBucket    // the histogram at the last reading
	why      string          // the last interval's congestion, for the log
	capacity float64         // most running seen while others waited; 0: not yet

	bound     prometheus.Gauge
	givenWays prometheus.Counter
}

// histBucket is one cumulative histogram bucket.
type histBucket struct {
	le    float64
	count float64
}

// signals are one reading of the server.
type signals struct {
	metrics          bool // false: the server serves none; latency rules
	waiting, kvUsage float64
	running          float64       // the most at a reading of the interval
	full             float64       // the most running at a reading that found others waiting
	ttftP99          time.Duration // 0: no first token in the interval
}

func newOnline(cfg Online, maxConcurrency int, conc *concurrency) *online {
	if cfg.Interval == 0 {
		return nil
	}
	cfg.setDefaults(maxConcurrency)
	o := &online{cfg: cfg, max: maxConcurrency, conc: conc, limit: maxConcurrency,
		bound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vramq_subscriber_model_server_online_bound",
			Help: "Requests the batch may have in flight in online-first mode.",
		}),
		givenWays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vramq_subscriber_model_server_online_give_ways_total",
			Help: "Control intervals in which the batch gave way to the server's other traffic.",
		}),
	}
	o.bound.Set(float64(o.limit))
	return o
}

// sending and took count one of the batch's requests in flight, and its
// latency once answered.
func (o *online) sending() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.inflight++
	o.peak = max(o.peak, o.inflight)
	o.mu.Unlock()
}

func (o *online) took(d time.Duration) {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.inflight--
	if len(o.lat) < 4096 {
		o.lat = append(o.lat, d)
	}
	o.mu.Unlock()
}

// mark sets a generation's priority, when one is configured, and takes out
// any priority the request carried otherwise: on a server started with
// --scheduling-policy priority (vLLM) a lower number is served first, so a
// client's own "priority" would let one tenant's items jump ahead of
// another's and of the product's online traffic. Which work goes first is
// the operator's to say, not a request's.
func (o *online) mark(body []byte) []byte {
	prio := 0
	if o != nil {
		prio = o.cfg.Priority
	}
	if prio == 0 && !bytes.Contains(body, []byte(`"priority"`)) {
		return body // nothing to set or take out: no decode on the hot path
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body // refused already by the rule: not sent
	}
	if prio == 0 {
		if _, ok := fields["priority"]; !ok {
			return body // the bytes were inside a string
		}
		delete(fields, "priority")
	} else {
		fields["priority"] = json.RawMessage(strconv.Itoa(prio))
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return b
}

// step ends an interval with its reading: the new bound.
func (o *online) step(sig signals) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	why := ""
	switch {
	case sig.metrics && sig.waiting > float64(o.cfg.TargetWaiting):
		why = fmt.Sprintf("%v requests waiting", sig.waiting)
	case sig.metrics && o.cfg.TargetTTFT > 0 && sig.ttftP99 > o.cfg.TargetTTFT:
		why = fmt.Sprintf("TTFT p99 %v", sig.ttftP99)
	case sig.metrics && sig.kvUsage >= o.cfg.KVHigh:
		why = fmt.Sprintf("KV cache %.0f%% used", 100*sig.kvUsage)
	case !sig.metrics && len(o.lat) >= 3:
		slices.Sort(o.lat)
		med := o.lat[len(o.lat)/2]
		if o.best == 0 || med < o.best {
			o.best = med
		}
		if float64(med) > o.cfg.LatencySlack*float64(o.best) {
			why = fmt.Sprintf("median latency %v, lowest %v", med, o.best)
		}
	}
	o.capacity = max(o.capacity, sig.full)
	slack := math.Inf(1) // sequences the server may still take before the headroom
	if sig.metrics && o.capacity > 0 {
		slack = o.capacity - float64(o.cfg.Headroom) - sig.running
	}
	switch {
	case why != "":
		o.limit = max(1, int(float64(o.limit)*o.cfg.Decrease))
		o.givenWays.Inc()
	case slack < 0:
		why = fmt.Sprintf("%v running, within %d of the %v the server runs", sig.running, o.cfg.Headroom, o.capacity)
		o.limit = max(1, o.limit-int(math.Ceil(-slack)))
		o.givenWays.Inc()
	case o.peak >= o.limit:
		o.limit = min(o.max, o.limit+int(math.Min(float64(o.cfg.Increase), slack)))
	}
	o.why = why
	o.peak, o.lat = o.inflight, o.lat[:0]
	o.bound.Set(float64(o.limit))
	o.conc.setCeiling(o.limit)
	return o.limit
}

// onlineReadings is how many times an interval reads the server: a request
// waits in the queue until the engine's next step, so one reading that
// finds the batch's own requests just arrived says nothing; requests
// waiting at every reading do.
const onlineReadings = 4

// run reads the server onlineReadings times an interval until ctx ends,
// and sets the bound at the end of each.
func (o *online) run(ctx context.Context, m *Model) {
	if o == nil {
		return
	}
	t := time.NewTicker(o.cfg.Interval / onlineReadings)
	defer t.Stop()
	var acc signals
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, o.cfg.Interval)
		sig, hist, err := o.read(rctx, m)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.log.Debug("online-first mode: no server signals; following latency", "err", err)
		}
		if n == 0 {
			acc = sig
		} else {
			acc.metrics = acc.metrics && sig.metrics
			acc.waiting = math.Min(acc.waiting, sig.waiting)
			acc.kvUsage = math.Max(acc.kvUsage, sig.kvUsage)
			acc.running = math.Max(acc.running, sig.running)
			acc.full = math.Max(acc.full, sig.full)
		}
		if n++; n < onlineReadings {
			continue
		}
		n = 0
		o.mu.Lock()
		acc.ttftP99 = p99(o.ttft, hist)
		o.ttft = hist
		o.mu.Unlock()
		from := o.current()
		if to := o.step(acc); to != from {
			m.log.Debug("online-first mode: batch bound", "from", from, "to", to, "because", o.reason())
		}
	}
}

func (o *online) current() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.limit
}

func (o *online) reason() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.why
}

// read takes the server's signals from GET /metrics: the requests waiting
// and running (summed over the engines and routes that report them:
// vLLM's num_requests_running, TGI's and TEI's batch_current_size), the KV cache's
// usage (the fullest engine's), and the TTFT histogram.
func (o *online) read(ctx context.Context, m *Model) (signals, []histBucket, error) {
	fams, err := m.scrape(ctx)
	if err != nil {
		return signals{}, nil, err
	}
	sig := signals{}
	finite := true
	for _, name := range []string{"vllm:num_requests_waiting", "tgi_queue_size", "te_queue_size"} {
		for _, mt := range family(fams, name) {
			sig.metrics = true
			v := value(mt)
			finite = finite && !math.IsNaN(v) && !math.IsInf(v, 0)
			sig.waiting += v
		}
	}
	for _, name := range []string{"vllm:num_requests_running", "tgi_batch_current_size", "te_batch_current_size"} {
		for _, mt := range family(fams, name) {
			v := value(mt)
			finite = finite && !math.IsNaN(v) && !math.IsInf(v, 0)
			sig.running += v
		}
	}
	if sig.waiting > 0 {
		sig.full = sig.running
	}
	for _, mt := range family(fams, "vllm:kv_cache_usage_perc") {
		v := value(mt)
		finite = finite && !math.IsNaN(v) && !math.IsInf(v, 0)
		sig.kvUsage = math.Max(sig.kvUsage, v)
	}
	if !finite {
		return signals{}, nil, errors.New("GET /metrics: a signal that is not a finite number")
	}
	if !sig.metrics {
		return signals{}, nil, errors.New("GET /metrics: no queue metric (vllm:num_requests_waiting, tgi_queue_size, te_queue_size)")
	}
	return sig, histogram(family(fams, "vllm:time_to_first_token_seconds")), nil
}

// histogram sums a histogram's series, bucket by bucket, with the count
// of all as a last bucket of bound +Inf; nil when there is none, or the
// series disagree on their buckets.
func histogram(ms []*dto.Metric) []histBucket {
	var out []histBucket
	for _, mt := range ms {
		h := mt.GetHistogram()
		if h == nil {
			continue
		}
		bs := h.GetBucket()
		if out == nil {
			out = make([]histBucket, len(bs)+1)
			for i, b := range bs {
				out[i].le = b.GetUpperBound()
			}
			out[len(bs)].le = math.Inf(1)
		}
		if len(bs)+1 != len(out) {
			return nil
		}
		for i, b := range bs {
			if b.GetUpperBound() != out[i].le {
				return nil
			}
			out[i].count += float64(b.GetCumulativeCount())
		}
		out[len(bs)].count += float64(h.GetSampleCount())
	}
	return out
}

// p99 is the upper bound of the bucket that holds the 99th percentile of
// what was counted between two readings; 0 when nothing was, or the
// buckets changed. Past the last finite bound it is twice that bound.
func p99(prev, now []histBucket) time.Duration {
	if len(now) == 0 || len(prev) != len(now) {
		return 0
	}
	total := now[len(now)-1].count - prev[len(prev)-1].count
	if total <= 0 {
		return 0
	}
	last := 0.0
	for i, b := range now {
		if !math.IsInf(b.le, 1) {
			last = b.le
		}
		if b.count-prev[i].count >= 0.99*total {
			le := b.le
			if math.IsInf(le, 1) {
				le = 2 * last
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return 0
}
