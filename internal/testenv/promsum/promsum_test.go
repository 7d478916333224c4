package promsum

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSumAndLabelled(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"kind"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.Set(7)
	for _, tc := range []struct {
		name, label, value string
		want               float64
	}{
		{"c_total", "", "", 5},
		{"c_total", "kind", "b", 3},
		{"c_total", "kind", "z", 0},
		{"g", "", "", 7},
		{"absent", "", "", 0},
	} {
		if got := Labelled(t, reg, tc.name, tc.label, tc.value); got != tc.want {
			t.Errorf("Labelled(%s, %s=%s) = %v, want %v", tc.name, tc.label, tc.value, got, tc.want)
		}
	}
	if got := Sum(t, reg, "c_total"); got != 5 {
		t.Errorf("Sum(c_total) = %v, want 5", got)
	}
}
