package timed

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/job"
)

// lengthModel costs a MiB per byte of text: a stand-in for a model whose
// cost is not the reference model's.
type lengthModel struct{ Noop }

func (lengthModel) Name() string   { return "by-length" }
func (lengthModel) Weights() int64 { return 3 << 20 }
func (lengthModel) Cost(items []job.Item) int64 {
	var c int64
	for _, it := range items {
		c += int64(len(it.Text)) << 20
	}
	return c
}

// NewFor takes the other model's name, weights and cost: it loads
// its weights, costs and allocates what that model costs, for the time the
// timing gives, and answers outputs of the width asked.
func TestTimedModelFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := gpu.NewSim(64 << 20)
		m, err := NewFor(lengthModel{}, 5, testTiming, sim)
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := sim.MemInfo(); info.Used != 3<<20 || m.Weights() != 3<<20 || m.Name() != "timed-by-length" {
			t.Fatalf("loaded %s: %d bytes on the device, weights %d; want timed-by-length with 3 MiB", m.Name(), info.Used, m.Weights())
		}
		items := []job.Item{{ID: "a", Text: "four"}, {ID: "b", Text: "sixsix"}}
		if c := m.Cost(items); c != 10<<20 {
			t.Fatalf("Cost %d, want the other model's 10 MiB", c)
		}
		start := time.Now()
		out, err := m.Run(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := time.Since(start), testTiming.Alone(10<<20); !within(got, want) {
			t.Errorf("batch took %v, want %v", got, want)
		}
		if sim.Peak() != 13<<20 {
			t.Errorf("peak %d, want weights and cost, %d", sim.Peak(), 13<<20)
		}
		if len(out) != 2 || len(out[1].Embedding) != 5 || out[1].ID != "b" {
			t.Errorf("outputs %+v, want two of 5 values", out)
		}
		if _, err := calibrate.Calibrate(context.Background(), m, "sim", calibrate.DefaultSweep(4)); err == nil {
			t.Error("Calibrate of a timed stand-in succeeded; it has no configuration to sweep")
		}
		m.Close()
		if _, err := NewFor(lengthModel{}, 5, testTiming, gpu.NewSim(1<<20)); err == nil {
			t.Error("a stand-in whose weights do not fit loaded")
		}
	})
}
