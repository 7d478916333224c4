// Command soak runs the pipeline at volume under random faults and checks
// that nothing is lost. It sends -messages small work messages, runs
// -subscribers subscriber processes (bin/subscriber) behind the fault proxy of
// internal/testenv/faultproxy, changes the proxy's fault mix every -fault-interval,
// restarts a random subscriber with SIGKILL or SIGTERM about every
// -restart-every, and accounts for every chunk with internal/testenv/accounting. It
// prints the figures (messages, faults injected by kind, restarts by signal,
// duplicates, DLQ by reason, lost, peak RSS of the subscribers, wall time)
// and exits 1 when the invariant does not hold: a chunk lost, a DLQ entry
// without a reason, a message left on the work queue, a subscriber that did
// not exit 0 on SIGTERM or exited on its own.
//
// With no -endpoint (and no AWS_ENDPOINT_URL) it starts its own emulator on a
// free port with localstack/emulator.sh and stops it at the end. Every flag
// has an environment variable of the same meaning; -h lists them.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/internal/testenv/accounting"
	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/procmem"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/localstack"
)

func main() {
	cli.Main("soak", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

// Summary is what a soak measured; -json writes it.
type Summary struct {
	Workload    string `json:"workload"`
	Messages    int    `json:"messages"`
	Subscribers int    `json:"subscribers"`
	Seed        uint64 `json:"seed"`
	Endpoint    string `json:"endpoint"`

	Results      int            `json:"results"`
	Duplicates   int            `json:"duplicates"`
	Redelivered  int            `json:"redelivered"` // chunks with a result from a second or later receive
	DeadLettered int            `json:"dead_lettered"`
	DLQReasons   map[string]int `json:"dlq_reasons"`
	Lost         int            `json:"lost"`
	LeftOnQueue  int            `json:"left_on_queue"` // work messages visible or in flight at the end
	Violations   string         `json:"violations,omitempty"`

	Faults        map[string]int64 `json:"faults_injected"`
	FaultMixes    int              `json:"fault_mixes"`
	ProxyRequests int64            `json:"proxy_requests"`
	Restarts      map[string]int   `json:"restarts"`
	UncleanExits  int              `json:"unclean_exits"` // SIGTERM not answered by exit 0, or an exit nobody asked for
	PeakRSSBytes  int64            `json:"peak_rss_bytes"`
	WallSeconds   float64          `json:"wall_seconds"`
	LogDir        string           `json:"log_dir"`
}

type options struct {
	messages, subscribers, words, maxReceive int
	seed                                     uint64
	bin, endpoint, emulator, logDir          string
	faultEvery, restartEvery, visibility     time.Duration
	timeout                                  time.Duration
	json                                     bool
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.messages, "messages", 100_000, "work messages to send")
	fs.IntVar(&o.subscribers, "subscribers", 2, "subscriber processes at once")
	fs.IntVar(&o.words, "words", 4, "words in each message's one item (the reference model is slow on a CPU: keep them small)")
	fs.IntVar(&o.maxReceive, "max-receive-count", 5, "the work queue's maxReceiveCount (redrive to the DLQ)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the fault mixes and the restarts")
	fs.StringVar(&o.bin, "subscriber-bin", "bin/subscriber", "the subscriber binary (make build)")
	fs.StringVar(&o.endpoint, "endpoint", getenv("AWS_ENDPOINT_URL"), "SQS endpoint (an emulator); empty: start one with -emulator")
	fs.StringVar(&o.emulator, "emulator", "localstack/emulator.sh", "script that starts the emulator when no -endpoint is given")
	fs.StringVar(&o.logDir, "log-dir", "", "folder for the subscribers' logs (empty: a new one under the temporary folder)")
	fs.DurationVar(&o.faultEvery, "fault-interval", 5*time.Second, "how long each random fault mix lasts")
	fs.DurationVar(&o.restartEvery, "restart-every", 20*time.Second, "mean time between subscriber restarts (exponential); 0: none")
	fs.DurationVar(&o.visibility, "visibility-timeout", 10*time.Second, "the subscribers' visibility timeout (a killed one's messages come back after it)")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Hour, "give up accounting after this long")
	fs.BoolVar(&o.json, "json", false, "print the summary as JSON")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%w: unexpected arguments %q", cli.ErrUsage, fs.Args())
	case o.messages < 1 || o.subscribers < 1 || o.words < 1 || o.maxReceive < 1:
		return fmt.Errorf("%w: -messages, -subscribers, -words and -max-receive-count must be at least 1", cli.ErrUsage)
	case o.faultEvery <= 0 || o.restartEvery < 0 || o.timeout <= 0:
		return fmt.Errorf("%w: -fault-interval and -timeout must be positive, -restart-every not negative", cli.ErrUsage)
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("%w: -subscriber-bin: %v (make build makes it)", cli.ErrUsage, err)
	}
	s, err := newSoak(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	sum, err := s.run(ctx)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		printSummary(stdout, sum)
	}
	if sum.Violations != "" {
		return errors.New(sum.Violations)
	}
	return nil
}

type soak struct {
	o       options
	log     io.Writer
	client  *sqs.Client
	urls    localstack.URLs
	proxy   *faultproxy.Proxy
	cleanup []func()
	logDir  string
	env     []string // the subscribers' environment

	mu       sync.Mutex
	procs    map[*proc]bool // live subscribers
	restarts map[string]int
	unclean  int
	peakRSS  int64
	nextID   int
	exited   chan *proc  // subscribers that exited unasked
	down     atomic.Bool // the proxy's Down now, for the progress lines
}

func newSoak(ctx context.Context, o options, stderr io.Writer) (s *soak, err error) {
	s = &soak{o: o, log: stderr, procs: map[*proc]bool{}, restarts: map[string]int{"SIGKILL": 0, "SIGTERM": 0}, exited: make(chan *proc, 16)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if o.endpoint == "" {
		if err := s.startEmulator(ctx); err != nil {
			return nil, err
		}
	}
	// The emulator takes any credentials; the SDK wants some.
	for k, v := range map[string]string{"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
	cfg, err := awsconfig.Load(ctx, nil)
	if err != nil {
		return nil, err
	}
	s.client = sqs.NewFromConfig(cfg, func(so *sqs.Options) { so.BaseEndpoint = aws.String(s.o.endpoint) })
	var b [3]byte
	_, _ = rand.Read(b[:])
	s.urls, err = localstack.Create(ctx, s.client, localstack.Options{Prefix: "soak-" + hex.EncodeToString(b[:]) + "-",
		MaxReceiveCount: o.maxReceive, VisibilityTimeout: o.visibility})
	if s.urls.Work != "" || s.urls.Results != "" || s.urls.DLQ != "" {
		urls := s.urls
		s.cleanup = append(s.cleanup, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := localstack.Delete(ctx, s.client, urls); err != nil {
				fmt.Fprintf(s.log, "soak: deleting the queues: %v\n", err)
			}
		})
	}
	if err != nil {
		return nil, fmt.Errorf("creating the queues: %w", err)
	}
	s.proxy, err = faultproxy.New(s.o.endpoint, faultproxy.Faults{Seed: o.seed})
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, func() { _ = s.proxy.Close() })
	s.logDir = o.logDir
	if s.logDir == "" {
		if s.logDir, err = os.MkdirTemp("", "vramq-soak-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(s.logDir, 0o755); err != nil {
		return nil, err
	}
	s.env = append(os.Environ(), "AWS_ENDPOINT_URL="+s.proxy.URL(),
		"QUEUE_URL="+s.urls.Work, "RESULTS_QUEUE_URL="+s.urls.Results, "DLQ_URL="+s.urls.DLQ,
		"VRAMQ_VISIBILITY_TIMEOUT="+o.visibility.String(), "VRAMQ_WAIT_TIME=1s", "VRAMQ_SHUTDOWN_GRACE=10s",
		"VRAMQ_LOG_FORMAT=text", "VRAMQ_LOG_LEVEL=warn", "VRAMQ_TASK_PROTECTION=off")
	return s, nil
}

// startEmulator runs the emulator script on a free port, as make test does,
// and stops it at close.
func (s *soak) startEmulator(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	script := func(verb string) error {
		cmd := exec.CommandContext(ctx, s.o.emulator, verb)
		cmd.Env = append(os.Environ(), "FAUXQS_PORT="+port)
		cmd.Stdout, cmd.Stderr = s.log, s.log
		return cmd.Run()
	}
	if err := script("up"); err != nil {
		return fmt.Errorf("starting the emulator with %s up: %w", s.o.emulator, err)
	}
	s.cleanup = append(s.cleanup, func() {
		cmd := exec.Command(s.o.emulator, "down")
		cmd.Env = append(os.Environ(), "FAUXQS_PORT="+port)
		cmd.Stdout, cmd.Stderr = s.log, s.log
		_ = cmd.Run()
	})
	s.o.endpoint = "http://127.0.0.1:" + port
	return nil
}

func (s *soak) close() {
	s.mu.Lock()
	procs := slices.Collect(maps.Keys(s.procs))
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "soak: "+format+"\n", args...)
}

func (s *soak) run(ctx context.Context) (*Summary, error) {
	start := time.Now()
	spec := workload.Spec{JobID: fmt.Sprintf("soak-%d", s.o.seed), Messages: s.o.messages, SmallItems: 1, SmallWords: s.o.words, Seed: s.o.seed}
	works := spec.Works()
	books := accounting.New()
	books.Expect(works...)
	sum := &Summary{Workload: fmt.Sprintf("%d messages of 1 item of %d words, one job", s.o.messages, s.o.words),
		Messages: s.o.messages, Subscribers: s.o.subscribers, Seed: s.o.seed, Endpoint: s.o.endpoint, LogDir: s.logDir}
	s.logf("%s; %d subscribers behind the fault proxy on %s; logs in %s", sum.Workload, s.o.subscribers, s.o.endpoint, s.logDir)

	for range s.o.subscribers {
		if err := s.startProc(); err != nil {
			return nil, err
		}
	}

	// Faults and restarts run until every chunk is accounted for.
	chaos, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	var bg sync.WaitGroup
	var mixes atomic.Int64
	bg.Go(func() { s.faults(chaos, &mixes) })
	bg.Go(func() { s.supervise(chaos) })
	bg.Go(func() { s.sampleRSS(chaos) })
	bg.Go(func() { s.progress(chaos, books, start) })

	// Send straight to the emulator: the faults are between the subscribers
	// and the queues. Four senders, as one round trip at a time would make
	// the sending the slow part.
	g, gctx := errgroup.WithContext(ctx)
	const senders = 4
	for i := range senders {
		part := works[i*len(works)/senders : (i+1)*len(works)/senders]
		g.Go(func() error { return jobq.Send(gctx, s.client, s.urls.Work, part) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	s.logf("sent %d messages in %v", len(works), time.Since(start).Round(time.Millisecond))

	if err := books.Collect(ctx, s.client, s.urls.Results, s.urls.DLQ, s.o.timeout); err != nil {
		return nil, err
	}
	stopChaos()
	bg.Wait()
	if err := s.proxy.Set(faultproxy.Faults{}); err != nil {
		return nil, err
	}
	s.proxy.Down(false)
	s.logf("every chunk accounted for (or -timeout passed) after %v; faults off, waiting for the work queue to empty", time.Since(start).Round(time.Second))

	// Messages stranded by a fault (a receive answered but its response
	// dropped) or by a killed subscriber come back after their visibility
	// and are done again: wait for the queue to empty before stopping.
	quiet := time.Now()
	for deadline := time.Now().Add(3*s.o.visibility + time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		visible, inflight, err := jobq.Counts(ctx, s.client, s.urls.Work)
		if err != nil {
			return nil, err
		}
		if visible == 0 && inflight == 0 {
			break
		}
	}
	if err := books.Drain(ctx, s.client, s.urls.Results, s.urls.DLQ, 3*s.o.visibility+time.Minute); err != nil {
		return nil, err
	}
	stranded := s.stopAll(quiet)
	r, err := books.Check(ctx, s.client, s.urls.Work)
	if err != nil {
		return nil, err
	}
	r.StrandedAllowance = 10 * stranded
	s.logf("%s", r)

	sum.Results, sum.Duplicates, sum.Redelivered = r.Results, r.Duplicates, r.Redelivered
	sum.DeadLettered, sum.DLQReasons, sum.Lost = r.DeadLettered, r.Reasons, r.Lost()
	sum.LeftOnQueue = r.Visible + r.InFlight
	sum.Faults = s.proxy.Injected()
	sum.FaultMixes = int(mixes.Load())
	sum.ProxyRequests = s.proxy.Requests()
	s.mu.Lock()
	sum.Restarts = maps.Clone(s.restarts)
	sum.UncleanExits = s.unclean
	sum.PeakRSSBytes = s.peakRSS
	s.mu.Unlock()
	sum.WallSeconds = time.Since(start).Seconds()
	var violations []string
	if err := r.Err(); err != nil {
		violations = append(violations, err.Error())
	}
	if sum.UncleanExits > 0 {
		violations = append(violations, fmt.Sprintf("%d subscriber exits were not clean (see the logs in %s)", sum.UncleanExits, s.logDir))
	}
	sum.Violations = strings.Join(violations, "; ")
	return sum, nil
}

// faults sets a new random fault mix every -fault-interval: now and then
// calm, now and then the endpoint down for the whole interval, else one to
// three kinds of fault at random rates.
func (s *soak) faults(ctx context.Context, mixes *atomic.Int64) {
	rng := mrand.New(mrand.NewPCG(s.o.seed, 1))
	t := time.NewTicker(s.o.faultEvery)
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
		if err := s.proxy.Set(f); err != nil {
			s.logf("fault mix %+v: %v", f, err) // cannot happen: the rates add up to 0.7 at most
		}
		s.proxy.Down(down)
		s.down.Store(down)
		mixes.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// proc is one subscriber process.
type proc struct {
	id        int
	cmd       *exec.Cmd
	log       *logWriter
	done      chan struct{}
	err       error
	signalled atomic.Bool
}

func (s *soak) startProc() error {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	f, err := os.Create(filepath.Join(s.logDir, fmt.Sprintf("subscriber-%03d.log", id)))
	if err != nil {
		return err
	}
	p := &proc{id: id, log: &logWriter{f: f}, done: make(chan struct{})}
	// No /metrics: the processes would contend for its port.
	p.cmd = exec.Command(s.o.bin, "-metrics-addr=")
	p.cmd.Env = s.env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", s.o.bin, err)
	}
	s.mu.Lock()
	s.procs[p] = true
	s.mu.Unlock()
	go func() {
		p.err = p.cmd.Wait()
		p.log.close()
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

// supervise restarts a random subscriber about every -restart-every with
// SIGKILL or SIGTERM, and replaces any that exits unasked (counted unclean).
func (s *soak) supervise(ctx context.Context) {
	rng := mrand.New(mrand.NewPCG(s.o.seed, 2))
	next := func() <-chan time.Time {
		if s.o.restartEvery == 0 {
			return nil
		}
		return time.After(time.Duration(rng.ExpFloat64() * float64(s.o.restartEvery)))
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
			s.logf("subscriber %d exited unasked: %v; starting another in a second", p.id, p.err)
			// A second's pause keeps a subscriber that cannot start at all
			// from spinning; the soak fails on any such exit anyway.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if err := s.startProc(); err != nil {
				s.logf("%v", err)
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
				if p.log.started() {
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
			if err := s.startProc(); err != nil {
				s.logf("%v", err)
			}
		}
	}
}

// stop signals p and waits for it to exit: SIGTERM must bring exit 0 within
// the shutdown grace and some.
func (s *soak) stop(p *proc, sig syscall.Signal, name string) {
	s.noteRSS(p)
	p.signalled.Store(true)
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		s.logf("subscriber %d still running a minute after %s; killing it", p.id, name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restarts[name]++
	if sig == syscall.SIGTERM && p.err != nil {
		s.unclean++
		s.logf("subscriber %d: %s brought %v, not exit 0", p.id, name, p.err)
	}
}

// stopAll stops every subscriber with SIGTERM and returns how many receives
// their SDKs retried since quiet: each may have stranded ten messages, which
// stay invisible until their visibility ends.
func (s *soak) stopAll(quiet time.Time) int {
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
		n += p.log.retriesSince(quiet)
	}
	return n
}

func (s *soak) sampleRSS(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.mu.Lock()
		procs := slices.Collect(maps.Keys(s.procs))
		s.mu.Unlock()
		for _, p := range procs {
			s.noteRSS(p)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// noteRSS records p's peak resident set size so far (VmHWM), read while
// it runs: /proc forgets a process once it is reaped.
func (s *soak) noteRSS(p *proc) {
	hwm, err := procmem.Peak(p.cmd.Process.Pid)
	if err != nil {
		return // gone already
	}
	s.mu.Lock()
	s.peakRSS = max(s.peakRSS, hwm)
	s.mu.Unlock()
}

func (s *soak) progress(ctx context.Context, books *accounting.Books, start time.Time) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f := s.proxy.Faults()
		s.mu.Lock()
		restarts := fmt.Sprint(s.restarts)
		s.mu.Unlock()
		s.logf("%4.0fs: %d of %d accounted for; faults so far %v; restarts %s; mix now down=%v throttle=%.2f 500=%.2f slow=%.2f drop_before=%.2f drop_after=%.2f partial=%.2f",
			time.Since(start).Seconds(), s.o.messages-books.Pending(), s.o.messages, s.proxy.Injected(), restarts,
			s.down.Load(), f.Throttle, f.ServerError, f.Slow, f.DropBefore, f.DropAfter, f.PartialBatch)
	}
}

// logWriter writes a subscriber's log to its file and notes when its SDK
// retried a receive.
type logWriter struct {
	mu      sync.Mutex
	f       *os.File
	partial []byte
	retries []time.Time
	lines   int
}

// started reports whether the process has written a line: the subscriber's
// first is written after its signal handlers are in place.
func (w *logWriter) started() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lines > 0
}

const retryMark = "retrying request SQS/ReceiveMessage"

func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Lines may arrive split across writes: look at whole ones only.
	w.partial = append(w.partial, b...)
	for {
		i := slices.Index(w.partial, '\n')
		if i < 0 {
			break
		}
		w.lines++
		if strings.Contains(string(w.partial[:i]), retryMark) {
			w.retries = append(w.retries, time.Now())
		}
		w.partial = w.partial[i+1:]
	}
	return w.f.Write(b)
}

func (w *logWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f.Close()
}

func (w *logWriter) retriesSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.retries {
		if !r.Before(t) {
			n++
		}
	}
	return n
}

func printSummary(w io.Writer, s *Summary) {
	fmt.Fprintf(w, "workload       %s, %d subscriber processes, seed %d\n", s.Workload, s.Subscribers, s.Seed)
	fmt.Fprintf(w, "messages       %d\n", s.Messages)
	fmt.Fprintf(w, "results        %d (%d after a redelivery)\n", s.Results, s.Redelivered)
	fmt.Fprintf(w, "duplicates     %d\n", s.Duplicates)
	fmt.Fprintf(w, "DLQ            %d %s\n", s.DeadLettered, formatCounts(s.DLQReasons))
	fmt.Fprintf(w, "lost           %d\n", s.Lost)
	fmt.Fprintf(w, "left on queue  %d\n", s.LeftOnQueue)
	fmt.Fprintf(w, "faults         %s in %d mixes, %d requests through the proxy\n", formatCounts(s.Faults), s.FaultMixes, s.ProxyRequests)
	fmt.Fprintf(w, "restarts       %s, %d unclean exits\n", formatCounts(s.Restarts), s.UncleanExits)
	fmt.Fprintf(w, "peak RSS       %.1f MiB (highest VmHWM of the subscriber processes)\n", float64(s.PeakRSSBytes)/(1<<20))
	fmt.Fprintf(w, "wall time      %s\n", (time.Duration(s.WallSeconds * float64(time.Second))).Round(time.Second))
	if s.Violations != "" {
		fmt.Fprintf(w, "VIOLATIONS     %s\n", s.Violations)
	}
}

func formatCounts[V int | int64](m map[string]V) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
