package latency

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// histogramQuantile reads a quantile as Prometheus's histogram_quantile
// does: linear within the bucket the rank falls in, from the bound below
// (0 under the first); the last finite bound for a rank in +Inf; NaN with
// no observations. The figures are worked by hand from the observations.
func TestHistogramQuantile(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h", Buckets: []float64{1, 2, 4}}, []string{"stage"})
	reg.MustRegister(h)
	for _, v := range []float64{0.5, 1.5, 1.5, 3} {
		h.WithLabelValues("a").Observe(v)
	}
	for _, v := range []float64{3, 9, 9} {
		h.WithLabelValues("b").Observe(v)
	}
	h.WithLabelValues("empty")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		stage string
		q     float64
		want  float64
	}{
		{"a", 0.25, 1},  // rank 1: all of the first bucket (0, 1]
		{"a", 0.5, 1.5}, // rank 2: halfway through (1, 2], which holds ranks 2 and 3
		{"a", 0.75, 2},  // rank 3: the top of (1, 2]
		{"a", 1, 4},     // rank 4: the top of (2, 4]
		{"b", 0.2, 3.2}, // rank 0.6 of (2, 4]'s one: 2 + 2·0.6
		{"b", 0.5, 4},   // rank 1.5 in +Inf: the last finite bound
		{"c", 0.5, math.NaN()},
	} {
		got := histogramQuantile(mfs, "h", map[string]string{"stage": c.stage}, c.q)
		if math.IsNaN(c.want) != math.IsNaN(got) || (!math.IsNaN(c.want) && math.Abs(got-c.want) > 1e-12) {
			t.Errorf("stage %s q %.2f: %v, want %v", c.stage, c.q, got, c.want)
		}
	}
	if got := histogramQuantile(mfs, "h", map[string]string{"stage": "empty"}, 0.5); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}
	if got := histogramQuantile(mfs, "other", nil, 0.5); !math.IsNaN(got) {
		t.Errorf("no such histogram: %v, want NaN", got)
	}
}

// keyOf reads the job and chunk from a work body and a result body alike,
// and refuses a body that is not JSON.
func TestKeyOf(t *testing.T) {
	for _, body := range []string{`{"v":1,"job_id":"j","chunk":3,"items":[]}`, `{"v":1,"job_id":"j","chunk":3,"outputs":[]}`} {
		k, err := keyOf(body)
		if err != nil || k.JobID != "j" || k.Chunk != 3 {
			t.Errorf("keyOf(%s) = %+v, %v; want j/3", body, k, err)
		}
	}
	if _, err := keyOf("not json"); err == nil {
		t.Error("keyOf(not json): no error")
	}
}
