// Package faultmix is the soak's fault schedule: a new random mix of faults
// on the fault proxy every interval, drawn from a seed.
package faultmix

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/vramq/vramq/internal/testenv/faultproxy"
)

// Schedule sets the mixes on Proxy, one every Every, drawn from Seed.
type Schedule struct {
	Proxy *faultproxy.Proxy
	Seed  uint64
	Every time.Duration
	// Logf reports a mix the proxy refused.
	Logf func(format string, args ...any)

	down  atomic.Bool
	mixes atomic.Int64
}

// Run sets a new random fault mix every s.Every until ctx ends: now and
// then calm, now and then the endpoint down for the whole interval, else one
// to three kinds of fault at random rates.
func (s *Schedule) Run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.Seed, 1))
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		f := faultproxy.Faults{}
		down := false
		switch x := rng.Float64(); {
		case x < 0.15: // calm
		case x < 0.25:
			down = true
		default:
			kinds := rng.Perm(6)[:1+rng.IntN(3)]
			for _, k := range kinds {
				switch k {
				case 0:
					f.Throttle = rng.Float64() * 0.2
				case 1:
					f.ServerError = rng.Float64() * 0.1
				case 2:
					f.Slow, f.SlowDelay = rng.Float64()*0.3, time.Duration(100+rng.IntN(1900))*time.Millisecond
				case 3:
					f.DropBefore = rng.Float64() * 0.05
				case 4:
					f.DropAfter = rng.Float64() * 0.05
				case 5:
					f.PartialBatch = rng.Float64() * 0.3
				}
			}
		}
		if err := s.Proxy.Set(f); err != nil {
			s.Logf("fault mix %+v: %v", f, err) // cannot happen: the rates add up to 0.7 at most
		}
		s.Proxy.Down(down)
		s.down.Store(down)
		s.mixes.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Down reports whether the mix in force has the endpoint down.
func (s *Schedule) Down() bool { return s.down.Load() }

// Mixes is how many mixes have been set.
func (s *Schedule) Mixes() int64 { return s.mixes.Load() }
