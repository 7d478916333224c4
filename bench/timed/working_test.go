package timed

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

// watched is an gpu.Allocator that calls check whenever memory is about to be
// allocated or has just been handed back, the instants at which a model's
// Working must not be above what it really holds.
type watched struct {
	mem   gpu.Allocator
	check func(at string)
}

func (w watched) Alloc(n int64) (func(), error) {
	w.check("before alloc")
	free, err := w.mem.Alloc(n)
	if err != nil {
		return nil, err
	}
	w.check("after alloc")
	return func() {
		w.check("before free")
		free()
		w.check("after free")
	}, nil
}

// workingModel is a model that reports its working set.
type workingModel interface {
	gpu.Model
	gpu.WorkingSet
}

// The working set of both CPU-side models is what their batches really hold
// on the device, never more, at every allocation and free, and nothing
// between batches.
func TestWorkingNeverAboveAllocated(t *testing.T) {
	cfg := refembed.DefaultConfig()
	items := []job.Item{{ID: "a", Text: "the quick brown fox"}, {ID: "b", Text: "jumps over the lazy dog again and again"}}
	for _, tc := range []struct {
		name string
		load func(gpu.Allocator) (workingModel, error)
	}{
		{"embedder", func(mem gpu.Allocator) (workingModel, error) {
			return refembed.NewEmbedder(refembed.GenerateWeights(cfg), cfg, mem)
		}},
		{"timed", func(mem gpu.Allocator) (workingModel, error) { return New(cfg, testTiming, mem) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim := gpu.NewSim(1 << 30)
			var m workingModel
			checks, peak := 0, int64(0)
			check := func(at string) {
				if m == nil {
					return // loading the weights
				}
				checks++
				used, _ := sim.MemInfo()
				held := used.Used - m.Weights()
				if w := m.Working(); w > held || w < 0 {
					t.Errorf("%s: Working %d with %d allocated for work", at, w, held)
				}
				peak = max(peak, m.Working())
			}
			loaded, err := tc.load(watched{sim, check})
			if err != nil {
				t.Fatal(err)
			}
			m = loaded
			if _, err := m.Run(context.Background(), items); err != nil {
				t.Fatal(err)
			}
			if w := m.Working(); w != 0 {
				t.Errorf("Working %d after the batch", w)
			}
			// The checks see each buffer just before it counts and just
			// after it stops: a batch of several buffers shows some.
			if checks == 0 || (tc.name == "embedder" && peak == 0) {
				t.Errorf("%d checks, peak working %d", checks, peak)
			}
		})
	}
}

// While a Model's batch works, Working is its whole cost.
func TestTimedModelWorkingDuringBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := refembed.DefaultConfig()
		m, err := New(cfg, testTiming, gpu.NewSim(1<<30))
		if err != nil {
			t.Fatal(err)
		}
		items := []job.Item{{ID: "a", Text: "the quick brown fox"}}
		done := make(chan error, 1)
		go func() {
			_, err := m.Run(context.Background(), items)
			done <- err
		}()
		time.Sleep(testTiming.Launch) // past the launch: the batch is working
		synctest.Wait()
		if got, want := m.Working(), m.Cost(items); got != want {
			t.Errorf("Working %d while the batch works, want its cost %d", got, want)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := m.Working(); got != 0 {
			t.Errorf("Working %d after the batch", got)
		}
	})
}

// A batch that runs out of memory part way holds nothing afterwards.
func TestWorkingAfterOutOfMemory(t *testing.T) {
	cfg := refembed.DefaultConfig()
	w := refembed.GenerateWeights(cfg)
	items := []job.Item{{ID: "a", Text: "a b c d e f g h"}}
	e, err := refembed.NewEmbedder(w, cfg, gpu.NewSim(w.Bytes()+1000))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Run(context.Background(), items)
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Run: %v, want out of memory", err)
	}
	if got := e.Working(); got != 0 {
		t.Errorf("Working %d after a failed batch", got)
	}
}
