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
//
// soak.go ties together the parts, each a package of its own: supervisor
// (the subscriber processes, their restarts and exits), faultmix (the fault
// schedule), peakrss (the processes' peak memory) and logscrape (what the
// subscribers' logs say: started, receives retried).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/cli"
	"github.com/vramq/vramq/internal/envflag"
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
	fs.DurationVar(&o.visibility, "visibility-timeout", 10*time.Second,
		"the subscribers' visibility timeout (a killed one's messages come back after it)")
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
