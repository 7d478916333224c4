package config

import (
	"errors"
	"testing"
	"time"
)

func TestProblemsJoinsEveryFieldError(t *testing.T) {
	var p Problems
	if err := p.Err(); err != nil {
		t.Fatalf("Err() with no problem = %v; want nil", err)
	}
	p.Add("MaxItems", "max items %d: want at least 1", 0)
	p.Add("Queue", "no work queue")
	err := p.Err()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not a *FieldError", e)
		}
		fields = append(fields, fe.Field+": "+fe.Error())
	}
	want := []string{"MaxItems: max items 0: want at least 1", "Queue: no work queue"}
	if len(fields) != len(want) || fields[0] != want[0] || fields[1] != want[1] {
		t.Fatalf("problems = %q; want %q", fields, want)
	}
}

func TestOrDefaultFillsOnlyZero(t *testing.T) {
	n, m := 0, 7
	OrDefault(&n, 5)
	OrDefault(&m, 5)
	if n != 5 || m != 7 {
		t.Fatalf("OrDefault: got %d and %d; want 5 (was zero) and 7 (was set)", n, m)
	}
}

func TestAtLeastReadsAsTheChecksItServes(t *testing.T) {
	var p Problems
	AtLeast(&p, "MaxItems", "max items", 0, 1)
	AtLeast(&p, "SendBackoff", "send backoff", -time.Second, 0)
	AtLeast(&p, "Count", "count", 1, 1) // at the bound: no problem
	got := p.Err()
	want := "max items 0: want at least 1\nsend backoff -1s: want at least 0"
	if got == nil || got.Error() != want {
		t.Fatalf("problems = %v; want %q", got, want)
	}
}
