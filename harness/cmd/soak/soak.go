package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/sync/errgroup"

	"github.com/vramq/vramq/harness/cmd/soak/faultmix"
	"github.com/vramq/vramq/harness/cmd/soak/peakrss"
	"github.com/vramq/vramq/harness/cmd/soak/supervisor"
	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/testenv/accounting"
	"github.com/vramq/vramq/internal/testenv/faultproxy"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/workload"
	"github.com/vramq/vramq/localstack"
)

// soak is one soak run: the queues on the endpoint, the fault proxy in front
// of it, and the subscriber processes behind the proxy.
type soak struct {
	o       options
	log     io.Writer
	client  *sqs.Client
	urls    localstack.URLs
	proxy   *faultproxy.Proxy
	cleanup []func()
	logDir  string

	sup *supervisor.Supervisor // the subscriber processes
	mix *faultmix.Schedule     // the proxy's faults
	mem peakrss.Sampler        // the subscribers' peak memory
}

func newSoak(ctx context.Context, o options, stderr io.Writer) (s *soak, err error) {
	s = &soak{o: o, log: stderr}
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
	s.mix = &faultmix.Schedule{Proxy: s.proxy, Seed: o.seed, Every: o.faultEvery, Logf: s.logf}
	s.logDir = o.logDir
	if s.logDir == "" {
		if s.logDir, err = os.MkdirTemp("", "vramq-soak-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(s.logDir, 0o755); err != nil {
		return nil, err
	}
	env := append(os.Environ(), "AWS_ENDPOINT_URL="+s.proxy.URL(),
		"QUEUE_URL="+s.urls.Work, "RESULTS_QUEUE_URL="+s.urls.Results, "DLQ_URL="+s.urls.DLQ,
		"VRAMQ_VISIBILITY_TIMEOUT="+o.visibility.String(), "VRAMQ_WAIT_TIME=1s", "VRAMQ_SHUTDOWN_GRACE=10s",
		"VRAMQ_LOG_FORMAT=text", "VRAMQ_LOG_LEVEL=warn", "VRAMQ_TASK_PROTECTION=off")
	s.sup = supervisor.New(o.bin, env, s.logDir, o.seed, o.restartEvery)
	s.sup.Logf, s.sup.BeforeSignal = s.logf, s.mem.Note
	return s, nil
}

func (s *soak) close() {
	if s.sup != nil {
		s.sup.Kill()
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
	spec := workload.Spec{JobID: fmt.Sprintf("soak-%d", s.o.seed), Messages: s.o.messages, SmallItems: 1, SmallWords: s.o.words,
		Seed: s.o.seed}
	works := spec.Works()
	books := accounting.New()
	books.Expect(works...)
	sum := &Summary{Workload: fmt.Sprintf("%d messages of 1 item of %d words, one job", s.o.messages, s.o.words),
		Messages: s.o.messages, Subscribers: s.o.subscribers, Seed: s.o.seed, Endpoint: s.o.endpoint, LogDir: s.logDir}
	s.logf("%s; %d subscribers behind the fault proxy on %s; logs in %s", sum.Workload, s.o.subscribers, s.o.endpoint, s.logDir)

	for range s.o.subscribers {
		if err := s.sup.Start(); err != nil {
			return nil, err
		}
	}

	// Faults and restarts run until every chunk is accounted for.
	chaos, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	var bg sync.WaitGroup
	bg.Go(func() { s.mix.Run(chaos) })
	bg.Go(func() { s.sup.Run(chaos) })
	bg.Go(func() { s.mem.Run(chaos, s.sup.Pids) })
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
	s.logf("every chunk accounted for (or -timeout passed) after %v; faults off, waiting for the work queue to empty",
		time.Since(start).Round(time.Second))

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
	stranded := s.sup.StopAll(quiet)
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
	sum.FaultMixes = int(s.mix.Mixes())
	sum.ProxyRequests = s.proxy.Requests()
	sum.Restarts = s.sup.Restarts()
	sum.UncleanExits = s.sup.Unclean()
	sum.PeakRSSBytes = s.mem.Peak()
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
		restarts := fmt.Sprint(s.sup.Restarts())
		s.logf("%4.0fs: %d of %d accounted for; faults so far %v; restarts %s; mix now down=%v throttle=%.2f 500=%.2f slow=%.2f "+
			"drop_before=%.2f drop_after=%.2f partial=%.2f",
			time.Since(start).Seconds(), s.o.messages-books.Pending(), s.o.messages, s.proxy.Injected(), restarts,
			s.mix.Down(), f.Throttle, f.ServerError, f.Slow, f.DropBefore, f.DropAfter, f.PartialBatch)
	}
}
