package publisher

import (
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
)

// lineCheck counts JSONL lines as MaxFileLines documents them, whatever
// the reads' sizes, and refuses the read that goes over a limit.
func TestLineCheck(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		maxBytes   int64
		maxLines   int
		maxLine    int64
		lines      int
		code       string // the refusal's, or "" for none
	}{
		{"empty", "", 100, 3, 10, 0, ""},
		{"a last newline starts no line", "a\nb\n", 100, 2, 10, 2, ""},
		{"a last line without its newline counts", "a\nb", 100, 2, 10, 2, ""},
		{"empty lines count", "a\n\n\nb\n", 100, 4, 10, 4, ""},
		{"one line over the count", "a\nb\nc", 100, 2, 10, 0, CodeTooManyLines},
		{"a line at its limit", "0123456789\n", 100, 2, 10, 1, ""},
		{"a line over it, newline not counted", "a\n01234567890\n", 100, 5, 10, 0, CodeLineTooLarge},
		{"a last line over it", "a\n01234567890", 100, 5, 10, 0, CodeLineTooLarge},
		{"a file at its limit", "0123\n5678\n", 10, 5, 10, 2, ""},
		{"a file over it", "0123\n5678\nx", 10, 5, 10, 0, CodeFileTooLarge},
	} {
		for _, one := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tc.file)
			if one {
				r = iotest.OneByteReader(r)
			}
			c := &lineCheck{r: r, maxBytes: tc.maxBytes, maxLines: tc.maxLines, maxLineBytes: tc.maxLine}
			_, err := io.Copy(io.Discard, c)
			var e *APIError
			switch {
			case tc.code == "" && (err != nil || c.lines != tc.lines):
				t.Errorf("%s (byte by byte: %v): %d lines, %v; want %d lines", tc.name, one, c.lines, err, tc.lines)
			case tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code || e.Param != "file" || c.err != err):
				t.Errorf("%s (byte by byte: %v): %v; want %s", tc.name, one, err, tc.code)
			}
		}
	}
}

// An upload stops reading its client while it sends a part to S3 (payload
// .Pauser): the client must not be cut off as too slow for S3's time. A
// pause longer than the grace leaves the body on pace; the grace runs again
// from the resume, and a client that then stalls is cut off as before.
func TestPacePausesWhileAPartGoesToS3(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = time.Second
		var cuts atomic.Int32
		p := startPace(1<<20, grace, func() { cuts.Add(1) })
		if !p.arrived(1 << 10) {
			t.Fatal("the first bytes are late")
		}
		p.pause()
		time.Sleep(10 * grace) // S3 taking its time with a part
		synctest.Wait()
		if cuts.Load() != 0 {
			t.Fatal("the body was cut off while paused")
		}
		p.resume(1 << 10)
		if !p.arrived(2 << 10) {
			t.Fatal("the body is late after the pause")
		}
		time.Sleep(grace / 2)
		synctest.Wait()
		if cuts.Load() != 0 || p.stop() {
			t.Fatal("the body was cut off within the grace after the pause")
		}

		// Without the pause, the same wait cuts it off.
		q := startPace(1<<20, grace, func() { cuts.Add(1) })
		q.arrived(1 << 10)
		time.Sleep(10 * grace)
		synctest.Wait()
		if cuts.Load() != 1 || !q.stop() {
			t.Errorf("%d cuts, want the unpaused body cut off", cuts.Load())
		}

		// Paused and resumed, then stalled: cut off a grace later.
		r := startPace(1<<20, grace, func() { cuts.Add(1) })
		r.arrived(1 << 10)
		r.pause()
		time.Sleep(10 * grace)
		r.resume(1 << 10)
		time.Sleep(2 * grace)
		synctest.Wait()
		if cuts.Load() != 2 || !r.stop() {
			t.Errorf("%d cuts, want the body that stalled after its pause cut off", cuts.Load())
		}
	})
}
