// Package promsum sums the series of a Prometheus counter or gauge, for
// tests that read a registry.
package promsum

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sum is the sum of every series of the counter or gauge name in g.
func Sum(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return Labelled(t, g, name, "", "")
}

// Labelled sums the series of the counter or gauge name in g whose label
// has value; with label "", every series.
func Labelled(t testing.TB, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				match = match || (lp.GetName() == label && lp.GetValue() == value)
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
