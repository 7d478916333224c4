package batches

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// The lines of a batch's input file: a last line without its newline is a
// line, a newline at the end starts none, and a line over the bound is
// reported once, whole, however it arrives, the next line read after it.
func TestLineReader(t *testing.T) {
	long := strings.Repeat("x", 300)
	for name, c := range map[string]struct {
		in   string
		want []string // "!" for errLineTooLong
	}{
		"newline at the end":     {"a\nb\n", []string{"a", "b"}},
		"no newline at the end":  {"a\nb", []string{"a", "b"}},
		"blank lines":            {"a\n\n\nb\n", []string{"a", "", "", "b"}},
		"empty":                  {"", nil},
		"too long in the middle": {"a\n" + long + "\nb\n", []string{"a", "!", "b"}},
		"too long at the end":    {"a\n" + long, []string{"a", "!"}},
		"exactly the bound":      {strings.Repeat("y", 100) + "\n", []string{strings.Repeat("y", 100)}},
		"one over the bound":     {strings.Repeat("y", 101) + "\nz", []string{"!", "z"}},
	} {
		t.Run(name, func(t *testing.T) {
			// One byte a read: every line arrives in pieces.
			lr := newLineReader(iotest.OneByteReader(strings.NewReader(c.in)), 100)
			var got []string
			for {
				l, err := lr.next()
				if err == io.EOF {
					break
				}
				switch {
				case errors.Is(err, errLineTooLong):
					got = append(got, "!")
				case err != nil:
					t.Fatal(err)
				default:
					got = append(got, string(l))
				}
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") || len(got) != len(c.want) {
				t.Errorf("lines %q; want %q", got, c.want)
			}
		})
	}
}

// Lines longer than the reader's 64 KiB buffer: read whole within the
// bound, skipped whole past it.
func TestLineReaderPastItsBuffer(t *testing.T) {
	in := strings.Repeat("a", 150_000) + "\n" + strings.Repeat("b", 250_000) + "\nc"
	lr := newLineReader(strings.NewReader(in), 200_000)
	l, err := lr.next()
	if err != nil || len(l) != 150_000 {
		t.Fatalf("first line: %d bytes, %v", len(l), err)
	}
	if _, err := lr.next(); !errors.Is(err, errLineTooLong) {
		t.Fatalf("second line: %v; want errLineTooLong", err)
	}
	if l, err := lr.next(); err != nil || string(l) != "c" {
		t.Fatalf("third line: %q, %v", l, err)
	}
	if _, err := lr.next(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
}
