package overhead

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http/httptrace"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/vramq/vramq/harness/cmd/bench/stats"
	"github.com/vramq/vramq/internal/testenv/cputime"
)

// A timeline records every SQS call a consumer run makes (as the caller
// sees it: SDK retries included), with the process's CPU time and the
// machine's over the run, so that runs of the subscriber and of the bare
// loops can be compared call by call: how the calls are spaced, how many
// are in flight, what each costs in CPU. The overhead comparison is bound
// by the endpoint's latency and the machine's CPU, not by any one call, so
// this is how to see where a variant spends its time.
type timeline struct {
	// serverPID is the endpoint's process (the emulator), whose CPU time
	// over each run is reported too; 0 for none.
	serverPID int
	cur       atomic.Pointer[timelineRun]
	mu        sync.Mutex
	runs      []*timelineRun
}

// timelineRun is one run of one variant.
type timelineRun struct {
	Variant string        `json:"variant"`
	Trial   int           `json:"trial"`
	Start   time.Time     `json:"start"`
	Took    time.Duration `json:"took_ns"`
	// Discarded: thrown away (and run again) for a retried receive.
	Discarded bool           `json:"discarded,omitempty"`
	Summary   *runSummary    `json:"summary,omitempty"`
	Calls     []timelineCall `json:"calls"`

	mu       sync.Mutex
	cpu0     time.Duration
	server0  time.Duration
	machine0 cpuTimes
}

// timelineCall is one SQS call: when it started and ended relative to the
// run's start, how many entries (messages) it carried, and whether it had
// to open a new connection.
type timelineCall struct {
	Action  string        `json:"action"`
	Start   time.Duration `json:"start_ns"`
	End     time.Duration `json:"end_ns"`
	Entries int           `json:"entries"`
	NewConn bool          `json:"new_conn,omitempty"`
	// Wait is from the request written to the first byte of the answer:
	// the endpoint's time, and the wait for the reading goroutine to run.
	Wait time.Duration `json:"wait_ns"`
	Err  bool          `json:"err,omitempty"`
}

// runSummary is what a run's calls and CPU add up to.
type runSummary struct {
	Messages int `json:"messages"`
	// CPU of this process over the run, per 1,000 messages.
	CPUPerK time.Duration `json:"cpu_per_1000_messages_ns"`
	// ServerCPUPerK is the endpoint's process's CPU over the run per
	// 1,000 messages, and ServerBusy that CPU over the run's time (1 is a
	// whole core); both 0 when its process is not known.
	ServerCPUPerK time.Duration `json:"server_cpu_per_1000_messages_ns,omitempty"`
	ServerBusy    float64       `json:"server_busy,omitempty"`
	// MachineBusy is the share of all the machine's cores busy over the
	// run (this process, the emulator and anything else).
	MachineBusy float64                   `json:"machine_busy"`
	Actions     map[string]*actionSummary `json:"actions"`
	// ReceiveIdle is the share of the run with no ReceiveMessage in
	// flight; ReceiveGapP50/P90 the time from one receive's answer to the
	// next receive's start.
	ReceiveIdle   float64       `json:"receive_idle"`
	ReceiveGapP50 time.Duration `json:"receive_gap_p50_ns"`
	ReceiveGapP90 time.Duration `json:"receive_gap_p90_ns"`
	NewConns      int           `json:"new_connections"`
	// MaxInFlight is the most calls, of all actions together, in flight
	// at once: above the HTTP client's idle pool (10 connections per host
	// by default) connections would be closed after use and new ones
	// opened (NewConns).
	MaxInFlight int `json:"max_in_flight"`
}

type actionSummary struct {
	Calls   int           `json:"calls"`
	Entries float64       `json:"mean_entries"`
	P50     time.Duration `json:"latency_p50_ns"`
	P90     time.Duration `json:"latency_p90_ns"`
	// WaitP50 is the median time from request written to first byte back.
	WaitP50 time.Duration `json:"wait_p50_ns"`
	// InFlight is the mean number of calls of this action in flight over
	// the run.
	InFlight float64 `json:"mean_in_flight"`
}

// apiOption makes the SDK client report its calls to t.
func (t *timeline) apiOption(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("benchTimeline",
		func(ctx context.Context, in middleware.InitializeInput,
			next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			r := t.cur.Load()
			if r == nil {
				return next.HandleInitialize(ctx, in)
			}
			var newConn atomic.Bool
			var wrote, firstByte atomic.Int64 // unix nanos of the last attempt's
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					if !info.Reused {
						newConn.Store(true)
					}
				},
				WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Store(time.Now().UnixNano()) },
				GotFirstResponseByte: func() { firstByte.Store(time.Now().UnixNano()) },
			})
			start := time.Now()
			out, md, err := next.HandleInitialize(ctx, in)
			end := time.Now()
			c := timelineCall{Action: awsmiddleware.GetOperationName(ctx), Start: start.Sub(r.Start), End: end.Sub(r.Start),
				NewConn: newConn.Load(), Err: err != nil}
			if w, f := wrote.Load(), firstByte.Load(); w != 0 && f > w {
				c.Wait = time.Duration(f - w)
			}
			switch p := in.Parameters.(type) {
			case *sqs.SendMessageBatchInput:
				c.Entries = len(p.Entries)
			case *sqs.DeleteMessageBatchInput:
				c.Entries = len(p.Entries)
			case *sqs.ChangeMessageVisibilityBatchInput:
				c.Entries = len(p.Entries)
			}
			if o, ok := out.Result.(*sqs.ReceiveMessageOutput); ok && o != nil {
				c.Entries = len(o.Messages)
			}
			r.mu.Lock()
			r.Calls = append(r.Calls, c)
			r.mu.Unlock()
			return out, md, err
		}), middleware.Before)
}

// begin starts recording a run and returns its start; a nil timeline only
// returns the time.
func (t *timeline) begin(variant string, trial int) time.Time {
	now := time.Now()
	if t == nil {
		return now
	}
	r := &timelineRun{Variant: variant, Trial: trial, Start: now, cpu0: cputime.Process(), server0: pidCPU(t.serverPID), machine0: machineCPU()}
	t.cur.Store(r)
	return now
}

// end stops recording the run begun last, n messages in took, and returns
// its summary as a line for the log ("" for a nil timeline).
func (t *timeline) end(took time.Duration, n int) string {
	if t == nil {
		return ""
	}
	r := t.cur.Swap(nil)
	if r == nil {
		return ""
	}
	cpu := cputime.Process() - r.cpu0
	server := pidCPU(t.serverPID) - r.server0
	m := machineCPU()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Took = took
	s := summarize(r.Calls, took, n)
	s.CPUPerK = time.Duration(float64(cpu) * 1000 / float64(n))
	if t.serverPID != 0 {
		s.ServerCPUPerK = time.Duration(float64(server) * 1000 / float64(n))
		s.ServerBusy = float64(server) / float64(took)
	}
	if total := m.total - r.machine0.total; total > 0 {
		s.MachineBusy = 1 - float64(m.idle-r.machine0.idle)/float64(total)
	}
	r.Summary = s
	t.mu.Lock()
	t.runs = append(t.runs, r)
	t.mu.Unlock()
	return s.String()
}

// summarize adds up the calls that started within the run's took.
func summarize(calls []timelineCall, took time.Duration, n int) *runSummary {
	s := &runSummary{Messages: n, Actions: map[string]*actionSummary{}}
	lat := map[string][]time.Duration{}
	wait := map[string][]time.Duration{}
	var recv []timelineCall
	for _, c := range calls {
		if c.Start > took {
			continue
		}
		a := s.Actions[c.Action]
		if a == nil {
			a = &actionSummary{}
			s.Actions[c.Action] = a
		}
		a.Calls++
		a.Entries += float64(c.Entries)
		end := min(c.End, took)
		a.InFlight += float64(end-c.Start) / float64(took)
		lat[c.Action] = append(lat[c.Action], c.End-c.Start)
		wait[c.Action] = append(wait[c.Action], c.Wait)
		if c.NewConn {
			s.NewConns++
		}
		if c.Action == "ReceiveMessage" {
			recv = append(recv, c)
		}
	}
	type event struct {
		at    time.Duration
		delta int
	}
	var events []event
	for _, c := range calls {
		if c.Start <= took {
			events = append(events, event{c.Start, 1}, event{c.End, -1})
		}
	}
	// Ends before starts at the same instant.
	slices.SortFunc(events, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
	})
	inFlight := 0
	for _, e := range events {
		inFlight += e.delta
		s.MaxInFlight = max(s.MaxInFlight, inFlight)
	}
	for name, a := range s.Actions {
		a.Entries /= float64(a.Calls)
		a.P50, a.P90 = durationPercentile(lat[name], 0.5), durationPercentile(lat[name], 0.9)
		a.WaitP50 = durationPercentile(wait[name], 0.5)
	}
	// Receives may overlap (the SDK retries inside one call, never two
	// calls at once from one poller, but be safe): merge the intervals.
	slices.SortFunc(recv, func(a, b timelineCall) int { return cmp.Compare(a.Start, b.Start) })
	var covered time.Duration
	var gaps []time.Duration
	var until time.Duration // end of the merged interval so far
	for i, c := range recv {
		if i > 0 {
			gaps = append(gaps, max(c.Start-recv[i-1].End, 0))
		}
		end := min(c.End, took)
		switch {
		case c.Start >= until:
			covered += end - c.Start
			until = end
		case end > until:
			covered += end - until
			until = end
		}
	}
	if took > 0 {
		s.ReceiveIdle = 1 - float64(covered)/float64(took)
	}
	s.ReceiveGapP50, s.ReceiveGapP90 = durationPercentile(gaps, 0.5), durationPercentile(gaps, 0.9)
	return s
}

// String is the summary as one line for the log.
func (s *runSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cpu %v/1000 msgs, ", s.CPUPerK.Round(time.Millisecond))
	if s.ServerCPUPerK > 0 {
		fmt.Fprintf(&b, "server cpu %v/1000 msgs (%.0f%% of a core), ", s.ServerCPUPerK.Round(time.Millisecond), 100*s.ServerBusy)
	}
	fmt.Fprintf(&b, "machine busy %.0f%%, receive idle %.0f%% (gap p50 %v p90 %v), new conns %d, most calls in flight %d;",
		100*s.MachineBusy, 100*s.ReceiveIdle,
		s.ReceiveGapP50.Round(10*time.Microsecond), s.ReceiveGapP90.Round(10*time.Microsecond), s.NewConns, s.MaxInFlight)
	for _, name := range slices.Sorted(maps.Keys(s.Actions)) {
		a := s.Actions[name]
		fmt.Fprintf(&b, " %s: %d calls of %.1f, p50 %v p90 %v (write to answer p50 %v), %.1f in flight;", name, a.Calls, a.Entries,
			a.P50.Round(10*time.Microsecond), a.P90.Round(10*time.Microsecond), a.WaitP50.Round(10*time.Microsecond), a.InFlight)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// durationPercentile is percentile for durations.
func durationPercentile(xs []time.Duration, q float64) time.Duration {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return time.Duration(stats.Percentile(f, q))
}

// discardLast marks the run ended last as thrown away.
func (t *timeline) discardLast() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.runs); n > 0 {
		t.runs[n-1].Discarded = true
	}
}

// write saves every run recorded, calls included, as JSON.
func (t *timeline) write(path string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, err := json.Marshal(t.runs)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// pidCPU is the user and system CPU time of process pid so far, from
// /proc/<pid>/stat; 0 for pid 0 or where it cannot be read.
func pidCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after it. utime and stime are fields 14 and 15, in clock ticks.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// platform Go supports.
const clockTicks = 100

// cpuTimes are the machine's CPU times from /proc/stat, in clock ticks.
type cpuTimes struct{ idle, total int64 }

func machineCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var c cpuTimes
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		c.total += n
		if i == 3 || i == 4 { // idle, iowait
			c.idle += n
		}
	}
	return c
}
