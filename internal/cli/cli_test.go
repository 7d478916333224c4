package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		says string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{fmt.Errorf("%w: missing -queue-url", ErrUsage), 2, "x: usage: missing -queue-url"},
		{errors.New("queue gone"), 1, "x: queue gone"},
	} {
		var w bytes.Buffer
		if got := ExitCode("x", tc.err, &w); got != tc.code || strings.TrimSpace(w.String()) != tc.says {
			t.Errorf("ExitCode(%v) = %d, said %q; want %d, %q", tc.err, got, w.String(), tc.code, tc.says)
		}
	}
}

func TestNewLogger(t *testing.T) {
	var w bytes.Buffer
	log, err := NewLogger(&w, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	if out := w.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("json logger at warn wrote %q", out)
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"json", "loud"}} {
		if _, err := NewLogger(&w, bad[0], bad[1]); err == nil {
			t.Errorf("NewLogger(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

type fieldErr struct{ err error }

func (e *fieldErr) Error() string { return e.err.Error() }
func (e *fieldErr) Unwrap() error { return e.err }

// Leaves takes joined errors apart, through wrapping, and stops at the
// field errors instead of going inside them.
func TestLeaves(t *testing.T) {
	a, b, c := &fieldErr{errors.New("a")}, &fieldErr{errors.New("b")}, errors.New("c")
	err := fmt.Errorf("config: %w", errors.Join(a, fmt.Errorf("wrapped: %w", b), c))
	got := Leaves[*fieldErr](err)
	if len(got) != 3 || got[0] != error(a) || got[1] != error(b) || got[2] != c {
		t.Errorf("Leaves = %v; want the two field errors and c", got)
	}
	if Leaves[*fieldErr](nil) != nil {
		t.Error("Leaves(nil) is not empty")
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		is    error
		wantN int
	}{
		{"flags", []string{"-n", "3"}, nil, nil, 3},
		{"environment", nil, map[string]string{"VRAMQ_N": "4"}, nil, 4},
		{"help", []string{"-h"}, nil, flag.ErrHelp, 0},
		{"bad value", []string{"-n", "x"}, nil, ErrUsage, 0},
		{"stray argument", []string{"-n", "3", "extra"}, nil, ErrUsage, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			n := fs.Int("n", 0, "a number")
			err := Parse(fs, tc.args, func(k string) string { return tc.env[k] })
			if tc.is == nil && err != nil || tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("Parse = %v; want %v", err, tc.is)
			}
			if tc.is == ErrUsage && errors.Is(err, flag.ErrHelp) {
				t.Fatalf("Parse = %v, a help error; want only a usage error", err)
			}
			if tc.is == nil && *n != tc.wantN {
				t.Fatalf("-n = %d; want %d", *n, tc.wantN)
			}
		})
	}
}
