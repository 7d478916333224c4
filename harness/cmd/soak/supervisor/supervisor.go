// Package supervisor runs the soak's subscriber processes: it starts them,
// restarts a random one with SIGKILL or SIGTERM now and then, replaces any
// that exits unasked, and counts the exits that were not clean.
package supervisor

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vramq/vramq/harness/cmd/soak/logscrape"
)

// Supervisor runs subscriber processes of Bin with Env, each logging to a
// file of its own in LogDir.
type Supervisor struct {
	Bin    string
	Env    []string
	LogDir string
	// Seed draws the restarts; RestartEvery is their mean interval
	// (exponential), 0 for none.
	Seed         uint64
	RestartEvery time.Duration
	Logf         func(format string, args ...any)
	// BeforeSignal, when set, is called with a process's id before it is
	// signalled (the soak reads its peak memory while /proc still has it).
	BeforeSignal func(pid int)

	mu       sync.Mutex
	procs    map[*proc]bool // live subscribers
	restarts map[string]int
	unclean  int
	nextID   int
	exited   chan *proc // subscribers that exited unasked
}

// New is a Supervisor with no process yet; set Logf (and BeforeSignal) on
// it before Start.
func New(bin string, env []string, logDir string, seed uint64, restartEvery time.Duration) *Supervisor {
	return &Supervisor{Bin: bin, Env: env, LogDir: logDir, Seed: seed, RestartEvery: restartEvery,
		procs: map[*proc]bool{}, restarts: map[string]int{"SIGKILL": 0, "SIGTERM": 0}, exited: make(chan *proc, 16)}
}

// Pids are the process ids of the live subscribers.
func (s *Supervisor) Pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for p := range s.procs {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}

// Restarts are the restarts so far by signal.
func (s *Supervisor) Restarts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.restarts)
}

// Unclean is how many exits were not clean: a SIGTERM not answered by exit
// 0, or an exit nobody asked for.
func (s *Supervisor) Unclean() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unclean
}

// Kill ends every live subscriber with SIGKILL and waits for it.
func (s *Supervisor) Kill() {
	s.mu.Lock()
	procs := slices.Collect(maps.Keys(s.procs))
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// proc is one subscriber process.
type proc struct {
	id        int
	cmd       *exec.Cmd
	log       *logscrape.Writer
	done      chan struct{}
	err       error
	signalled atomic.Bool
}

// Start starts one more subscriber.
func (s *Supervisor) Start() error {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	f, err := os.Create(filepath.Join(s.LogDir, fmt.Sprintf("subscriber-%03d.log", id)))
	if err != nil {
		return err
	}
	p := &proc{id: id, log: logscrape.New(f), done: make(chan struct{})}
	// No /metrics: the processes would contend for its port.
	p.cmd = exec.Command(s.Bin, "-metrics-addr=")
	p.cmd.Env = s.Env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", s.Bin, err)
	}
	s.mu.Lock()
	s.procs[p] = true
	s.mu.Unlock()
	go func() {
		p.err = p.cmd.Wait()
		p.log.Close()
		s.mu.Lock()
		delete(s.procs, p)
		s.mu.Unlock()
		close(p.done)
		if !p.signalled.Load() {
			s.exited <- p
		}
	}()
	return nil
}

// Run restarts a random subscriber about every RestartEvery with SIGKILL
// or SIGTERM, and replaces any that exits unasked (counted unclean), until
// ctx ends.
func (s *Supervisor) Run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.Seed, 2))
	next := func() <-chan time.Time {
		if s.RestartEvery == 0 {
			return nil
		}
		return time.After(time.Duration(rng.ExpFloat64() * float64(s.RestartEvery)))
	}
	timer := next()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-s.exited:
			s.mu.Lock()
			s.unclean++
			s.mu.Unlock()
			s.Logf("subscriber %d exited unasked: %v; starting another in a second", p.id, p.err)
			// A second's pause keeps a subscriber that cannot start at all
			// from spinning; the soak fails on any such exit anyway.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if err := s.Start(); err != nil {
				s.Logf("%v", err)
			}
		case <-timer:
			timer = next()
			// Only subscribers that have started: a signal that comes before
			// the Go runtime has installed the process's handlers takes the
			// default action (SIGTERM ends it by the signal), while it holds
			// nothing yet. That is not the shutdown under test.
			s.mu.Lock()
			var procs []*proc
			for p := range s.procs {
				if p.log.Started() {
					procs = append(procs, p)
				}
			}
			s.mu.Unlock()
			slices.SortFunc(procs, func(a, b *proc) int { return a.id - b.id })
			if len(procs) == 0 {
				continue
			}
			p := procs[rng.IntN(len(procs))]
			sig, name := syscall.SIGKILL, "SIGKILL"
			if rng.IntN(2) == 0 {
				sig, name = syscall.SIGTERM, "SIGTERM"
			}
			s.stop(p, sig, name)
			if err := s.Start(); err != nil {
				s.Logf("%v", err)
			}
		}
	}
}

// stop signals p and waits for it to exit: SIGTERM must bring exit 0 within
// the shutdown grace and some.
func (s *Supervisor) stop(p *proc, sig syscall.Signal, name string) {
	if s.BeforeSignal != nil {
		s.BeforeSignal(p.cmd.Process.Pid)
	}
	p.signalled.Store(true)
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		s.Logf("subscriber %d still running a minute after %s; killing it", p.id, name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restarts[name]++
	if sig == syscall.SIGTERM && p.err != nil {
		s.unclean++
		s.Logf("subscriber %d: %s brought %v, not exit 0", p.id, name, p.err)
	}
}

// StopAll stops every subscriber with SIGTERM and returns how many receives
// their SDKs retried since quiet: each may have stranded ten messages, which
// stay invisible until their visibility ends.
func (s *Supervisor) StopAll(quiet time.Time) int {
	s.mu.Lock()
	procs := slices.Collect(maps.Keys(s.procs))
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { s.stop(p, syscall.SIGTERM, "final SIGTERM") })
	}
	wg.Wait()
	s.mu.Lock()
	delete(s.restarts, "final SIGTERM") // not a restart
	s.mu.Unlock()
	n := 0
	for _, p := range procs {
		n += p.log.RetriesSince(quiet)
	}
	return n
}
