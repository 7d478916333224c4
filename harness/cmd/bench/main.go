// Command bench measures vramq against its baselines on this machine, each
// figure a ratio to a baseline measured in the same run:
//
//	bench strategies   every admission strategy on one workload and one
//	                   simulated device, against the offline bound
//	bench sweep        every admission strategy over workload shapes (the
//	                   large share, heavy-tailed sizes), each against its bound
//	bench overhead     the subscriber against a bare SDK receive/delete loop,
//	                   the publisher against a bare SendMessageBatch loop
//	bench rss          the subscriber's memory with a large backlog
//	bench latency      the subscriber's latency at light load against a bare
//	                   SDK echo loop's (the transport alone) and its batches' own time
//
// It needs an SQS endpoint (AWS_ENDPOINT_URL, as make bench sets up). Each
// subcommand is a package of its own under harness/cmd/bench; this file only picks
// one.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/vramq/vramq/harness/cmd/bench/latency"
	"github.com/vramq/vramq/harness/cmd/bench/overhead"
	"github.com/vramq/vramq/harness/cmd/bench/rss"
	"github.com/vramq/vramq/harness/cmd/bench/strategies"
	"github.com/vramq/vramq/harness/cmd/bench/sweep"
	"github.com/vramq/vramq/internal/cli"
)

func main() {
	cli.Main("bench", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: want a subcommand: strategies, sweep, overhead, rss or latency", cli.ErrUsage)
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "strategies":
		return strategies.Run(ctx, rest, stdout, stderr)
	case "overhead":
		return overhead.Run(ctx, rest, stdout, stderr)
	case "rss":
		return rss.Run(ctx, rest, stdout, stderr)
	case "sweep":
		return sweep.Run(ctx, rest, stdout, stderr)
	case "latency":
		return latency.Run(ctx, rest, stdout, stderr)
	}
	return fmt.Errorf("%w: unknown subcommand %q: want strategies, sweep, overhead, rss or latency", cli.ErrUsage, sub)
}
