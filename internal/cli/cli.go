// Package cli is what vramq's binaries share around their run function:
// signals, exit codes and the log setup, so each main stays a line.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vramq/vramq/internal/envflag"
)

// ErrUsage marks a bad command line or environment: the binary exits 2.
var ErrUsage = errors.New("usage")

// Main runs run under a context that SIGTERM or SIGINT cancels (ECS and
// Kubernetes stop with SIGTERM; a terminal with SIGINT), then exits: 0 on
// success or -h, 2 on an error wrapping ErrUsage, 1 on any other.
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx)
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode is the status Main exits with for err, having said why on w.
func ExitCode(name string, err error, w io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(w, "%s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(w, "%s: %v\n", name, err)
		return 1
	}
}

// Parse sets fs's flags from args and then the environment (envflag.Parse)
// for a command that takes no arguments besides its flags: a bad flag, value
// or argument is an error wrapping ErrUsage; -h is flag.ErrHelp as it is.
func Parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := envflag.Parse(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	return nil
}

// NewLogger returns the binaries' slog logger: JSON for machines (CloudWatch
// and other log stores parse it), text for people.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level=%s: %v", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format=%s: want json or text", format)
}

// Leaves flattens wrapped and joined errors into the errors joined, and
// stops at an error of type T (a configuration's field error, which wraps
// the message it carries), so each problem of a joined validation error
// comes out once, in its own type.
func Leaves[T error](err error) []error {
	if err == nil {
		return nil
	}
	if _, ok := err.(T); ok {
		return []error{err}
	}
	switch x := err.(type) {
	case interface{ Unwrap() []error }:
		var out []error
		for _, e := range x.Unwrap() {
			out = append(out, Leaves[T](e)...)
		}
		return out
	case interface{ Unwrap() error }:
		if inner := x.Unwrap(); inner != nil {
			return Leaves[T](inner)
		}
	}
	return []error{err}
}
