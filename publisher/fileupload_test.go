package publisher

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/vramq/vramq/publisher/api"
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
			var e *api.Error
			switch {
			case tc.code == "" && (err != nil || c.lines != tc.lines):
				t.Errorf("%s (byte by byte: %v): %d lines, %v; want %d lines", tc.name, one, c.lines, err, tc.lines)
			case tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code || e.Param != "file" || c.err != err):
				t.Errorf("%s (byte by byte: %v): %v; want %s", tc.name, one, err, tc.code)
			}
		}
	}
}
