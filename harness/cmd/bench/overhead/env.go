package overhead

import (
	"context"
	"io"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/vramq/vramq/harness/cmd/bench/sqsenv"
)

// benchEnv is the endpoint under test as the overhead runs use it: the
// shared sqsenv.Env, the runs thrown away for a retried receive, and the
// timeline the consumer runs report to.
type benchEnv struct {
	*sqsenv.Env
	discarded int // runs thrown away for a retried receive
	// tl records the consumer runs' calls when -timeline is set; nil
	// otherwise. run names the run in progress for it.
	tl  *timeline
	run struct {
		variant string
		trial   int
		summary string // the timeline's summary of the run last ended
	}
}

// newBenchEnv reaches the endpoint as sqsenv.New does, with every call
// recorded in tl when it is not nil.
func newBenchEnv(ctx context.Context, stderr io.Writer, tl *timeline, latency time.Duration) (*benchEnv, error) {
	var record func(*middleware.Stack) error
	if tl != nil {
		record = tl.apiOption
	}
	env, err := sqsenv.New(ctx, stderr, record, latency)
	if err != nil {
		return nil, err
	}
	return &benchEnv{Env: env, tl: tl}, nil
}

// begin is a consumer run's start: its clock, and the timeline's.
func (e *benchEnv) begin() time.Time { return e.tl.begin(e.run.variant, e.run.trial) }

// end is a consumer run's end after n messages: the time since start. The
// timeline's summary of the run is left in e.run.summary.
func (e *benchEnv) end(start time.Time, n int) time.Duration {
	took := time.Since(start)
	e.run.summary = e.tl.end(took, n)
	return took
}
