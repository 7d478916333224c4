package subscriber

import (
	"context"
	"time"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/model/backend"
)

// budgetTolerance is how far apart two budget readings may be and still
// agree, and how far one must move from the budget in force to change it:
// an eighth of the reserve, at least 1 MiB, or less where the device is
// small: a 1024th of its memory (total), and an eighth of the budget
// (scale: the larger of the readings and the budget in force). The reserve
// is the headroom kept for what admission does not account (a framework's
// own allocations, fragmentation), so a drift of a fraction of it is
// absorbed there; acting on it would only resize admission, and log, every
// few seconds as other processes' caches breathe. A reading skewed by one
// of this process's batches starting or ending between the reads of free
// memory and of the working set is off by that batch's memory, megabytes
// at least, so it does not agree with a clean one. The 1 MiB floor is
// above allocation granularity, for very small reserves; it holds on any
// GPU (1 GiB or more, and a budget of 8 MiB or more). A memory whose unit
// is not a byte is smaller: a model server's KV cache counts tokens
// (backend.KVTokens), maybe thirty thousand of them, a few messages' worth;
// a 1 MiB floor would be more than all of it, and its budget would never
// move after the first reading. Its floor is a 4096th of the pool (unit):
// its usage moves by whole requests, and readings that agree within a
// 1024th (32 tokens of a 32,768-token pool) let more of that movement into
// admission; the subscriber's KV benchmark preempted in 2 of 6 runs so,
// and in none of 4 at a 4096th (8 tokens, what 1 MiB was at 128 KiB a
// token when the pool was counted in bytes; bench/modelserver.md).
func budgetTolerance(unit backend.Unit, reserve, total, scale int64) int64 {
	floor := int64(1 << 20)
	if total > 0 { // a device that does not say keeps the floor for GPUs
		div := int64(1024)
		if unit == backend.KVTokens {
			div = 4096
		}
		floor = min(floor, total/div)
	}
	floor = max(1, min(floor, scale/8))
	return max(floor, reserve/8)
}

// budgetReads is how many times one refresh tries for a reading during
// which this process's working set stayed put.
const budgetReads = 3

// budgetReading is what the device would have free for work, less the
// reserve, if this process's batches were done: free memory plus the model's
// working set.
type budgetReading struct {
	budget  int64
	mem     backend.Reading
	working int64
}

// budgetFrom is free memory plus what this process's work holds, less the
// reserve, capped by VRAMLimit: the budget's one formula, for New's first
// reading and every refresh.
func budgetFrom(cfg Config, free, working int64) int64 {
	b := free + working - cfg.VRAMReserve
	if cfg.VRAMLimit > 0 {
		b = min(b, cfg.VRAMLimit)
	}
	return b
}

// readBudget reads device memory and the working set. Free memory and the
// working set are read at different instants, so it reads the working set on
// both sides of MemInfo and takes the reading only when the two agree. A
// model that does not report its working set is read only while none of
// this process's work is admitted: then none of it is on the device. ok is
// false when no reading was clean; mem is the last MemInfo read either way.
func (s *Subscriber) readBudget() (r budgetReading, ok bool, err error) {
	ws, reports := capabilities(s.cfg.Backend).(gpu.WorkingSet)
	for range budgetReads {
		var w1, acq1 int64
		if reports {
			w1 = ws.Working()
		} else {
			w1, acq1 = s.adm.held.Load(), s.adm.acquires.Load()
		}
		mem, err := s.mem.Read()
		if err != nil {
			return budgetReading{}, false, err
		}
		r = budgetReading{mem: mem, working: w1}
		if reports {
			ok = ws.Working() == w1
		} else {
			ok = w1 == 0 && s.adm.held.Load() == 0 && s.adm.acquires.Load() == acq1
			r.working = 0
		}
		if ok {
			r.budget = budgetFrom(s.cfg, mem.Free, r.working)
			return r, true, nil
		}
		if !reports {
			break // busy; trying again at once would find it busy still
		}
	}
	return r, false, nil
}

// budgetState is what the refresh carries from one tick to the next.
type budgetState struct {
	last    *budgetReading  // the previous clean reading, nil after a failure
	failing bool            // reading device memory failed last time
	offers  *backend.Vector // the model's previous offer, nil before the first
}

// refreshBudget reads the device every BudgetRefresh until ctx ends: it
// exports free and per-process memory, and under vram admission resizes the
// budget when two consecutive clean readings agree on a new one, so that
// another process taking memory on the same GPU shrinks it and giving it
// back grows it again.
func (s *Subscriber) refreshBudget(ctx context.Context) {
	if s.cfg.BudgetRefresh <= 0 {
		return
	}
	tick := time.NewTicker(s.cfg.BudgetRefresh)
	defer tick.Stop()
	var st budgetState
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.refreshOnce(&st)
	}
}

func (s *Subscriber) refreshOnce(st *budgetState) {
	s.refreshOffers(st)
	r, ok, err := s.readBudget()
	if err != nil {
		if !st.failing {
			s.log.Warn("reading device memory failed; keeping the budget until it answers again",
				"budget", s.amount(s.adm.budget()), "err", err)
		}
		st.failing, st.last = true, nil
		return
	}
	if st.failing {
		s.log.Info("reading device memory again")
		st.failing = false
	}
	s.m.deviceFree.Set(float64(r.mem.Free))
	s.m.deviceProcess.Set(float64(r.mem.Process))
	if s.adm.strategy != AdmitVRAM || !ok {
		return
	}
	prev := st.last
	st.last = &r
	if prev == nil {
		return // wait for a reading that agrees
	}
	tol := budgetTolerance(s.mem.Unit(), s.cfg.VRAMReserve, r.mem.Total, max(prev.budget, r.budget, s.adm.budget()))
	target, ok := agreed(prev.budget, r.budget, s.adm.budget(), tol, 0, s.adm.size)
	if !ok {
		return
	}
	// Logged and exported before admission changes, so that whoever sees
	// the new budget in effect finds it in the logs and metrics too.
	old := s.adm.budget()
	attrs := []any{"old", s.amount(old), "new", s.amount(target),
		"free", s.amount(r.mem.Free), "working", s.amount(r.working),
		"process", s.amount(r.mem.Process), "inflight", s.amount(s.inflight.Load())}
	switch {
	case target == 0:
		s.log.Warn("budget changed: no device memory left for work; messages wait and are released after the admit timeout", attrs...)
	case target < old:
		s.log.Info("budget changed: shrinking; nothing new is admitted until in-flight work is under it", attrs...)
	default:
		s.log.Info("budget changed", attrs...)
	}
	s.m.budget.Set(float64(target))
	s.adm.resize(target)
	if target > old {
		s.state.budgetGrew(target)
	}
}

// agreed is the target two readings a and b agree on, and whether it
// replaces now: none when they are more than tol apart; else the lesser,
// within lo..hi, when it is more than tol from now. Two readings that
// agree are what holds still (a shrink or a growth that lasts), not a
// moment's noise, and a change within tol is not worth a resize.
func agreed(a, b, now, tol, lo, hi int64) (int64, bool) {
	if absDiff(a, b) > tol {
		return 0, false
	}
	target := min(max(min(a, b), lo), hi)
	return target, absDiff(target, now) > tol
}

// refreshOffers resizes the pools of the resources the model offers
// (backend.Offerer) as the budget is resized: to what two offers in a row
// agree on (agreed, within the tolerance of a device that does not say
// its size), never below one (offered). A shrink waits for admitted
// messages to let go, as the budget's does.
func (s *Subscriber) refreshOffers(st *budgetState) {
	if s.adm.offerer == nil {
		return
	}
	now, _ := s.adm.offerer.Offers()
	prev := st.offers
	st.offers = &now
	if prev == nil {
		return // wait for an offer that agrees
	}
	for r, p := range s.adm.pools {
		if p == nil {
			continue
		}
		cur := p.budget()
		tol := budgetTolerance(backend.DeviceBytes, 0, 0, max(prev[r], now[r], cur))
		if target, ok := agreed(prev[r], now[r], cur, tol, 1, s.adm.most[r]); ok {
			p.resize(target)
			s.log.Debug("the model's offer changed", "resource", backend.Resource(r).String(), "old", cur, "new", target)
		}
	}
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// amount is n of the memory's unit as logs and errors show it: device
// bytes, or a model server's KV tokens.
func (a *admitting) amount(n int64) string { return a.mem.Unit().Format(n) }

// memoryOf is what bounds cfg.Backend: the Memory it owns, else
// cfg.Device's; nil when neither is there (Validate refuses it).
func memoryOf(cfg Config) backend.Memory {
	if o, ok := cfg.Backend.(backend.MemoryOwner); ok {
		if m := o.Memory(); m != nil {
			return m
		}
	}
	if cfg.Device == nil {
		return nil
	}
	return backend.DeviceMemory(cfg.Device)
}
