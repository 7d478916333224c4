package gpu

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSimAccounts(t *testing.T) {
	s := NewSim(1000)
	if s.Name() != "sim" || !s.Simulated() {
		t.Errorf("Name() = %q, Simulated() = %v", s.Name(), s.Simulated())
	}
	checkMem := func(used int64) {
		t.Helper()
		got, err := s.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		want := MemInfo{Total: 1000, Free: 1000 - used, Used: used, Process: used}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("MemInfo (-want +got):\n%s", diff)
		}
	}
	checkMem(0)

	free600, err := s.Alloc(600)
	if err != nil {
		t.Fatal(err)
	}
	free400, err := s.Alloc(400) // exactly full is fine
	if err != nil {
		t.Fatal(err)
	}
	checkMem(1000)
	free400()
	checkMem(600)

	_, err = s.Alloc(401)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Alloc(401) with 400 free: err = %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{"401", "600", "1000"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("OOM error %q does not mention %s", err, want)
		}
	}
	checkMem(600) // a failed Alloc takes nothing

	free600()
	free600() // idempotent: must not free someone else's memory
	checkMem(0)

	if got := s.Peak(); got != 1000 {
		t.Errorf("Peak() = %d, want 1000", got)
	}
	if got := s.OOMs(); got != 1 {
		t.Errorf("OOMs() = %d, want 1", got)
	}
}

func TestSimEdgeCases(t *testing.T) {
	s := NewSim(100)
	free, err := s.Alloc(0)
	if err != nil {
		t.Fatalf("Alloc(0): %v", err)
	}
	free()
	if _, err := s.Alloc(-1); err == nil || errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Alloc(-1): err = %v, want a non-OOM error", err)
	}
	// A size near the int64 limit must not wrap around and succeed.
	if _, err := s.Alloc(1<<63 - 1); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Alloc(MaxInt64): err = %v, want ErrOutOfMemory", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestSimConcurrent(t *testing.T) {
	const (
		workers = 8
		rounds  = 2000
		size    = 10
	)
	// Room for half the workers at once, so some allocations must fail.
	s := NewSim(workers / 2 * size)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		oks int
	)
	for range workers {
		wg.Go(func() {
			for range rounds {
				free, err := s.Alloc(size)
				if err != nil {
					if !errors.Is(err, ErrOutOfMemory) {
						t.Error(err)
					}
					continue
				}
				if m, _ := s.MemInfo(); m.Used > m.Total || m.Free < 0 {
					t.Errorf("over capacity: %+v", m)
				}
				mu.Lock()
				oks++
				mu.Unlock()
				free()
				free()
			}
		})
	}
	wg.Wait()

	m, _ := s.MemInfo()
	if m.Used != 0 {
		t.Errorf("after every free, Used = %d", m.Used)
	}
	if got := int64(oks) + s.OOMs(); got != workers*rounds {
		t.Errorf("successes + OOMs = %d, want %d", got, workers*rounds)
	}
	if p := s.Peak(); p > workers/2*size {
		t.Errorf("Peak() = %d beyond capacity", p)
	}
}
