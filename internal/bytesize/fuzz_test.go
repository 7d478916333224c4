package bytesize

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseBytes feeds arbitrary text, and the decimal form of an arbitrary
// int64, to Parse. The seed corpus is in testdata/fuzz/FuzzParseBytes;
// go test runs it. Invariants:
//   - a refusal's message quotes the input;
//   - an accepted size is >= 0;
//   - Format of an accepted size parses back to within the rounding
//     Format applies (half a tenth of the unit it prints in), or, for
//     sizes of 7.95EiB and more, which it rounds up to "8.0EiB", is refused
//     as overflowing int64;
//   - a plain integer N (any int64 >= 0) parses to exactly N, and one
//     above math.MaxInt64 is refused.
func FuzzParseBytes(f *testing.F) {
	f.Add("16GiB", int64(16<<30))
	f.Fuzz(func(t *testing.T, s string, n int64) {
		got, err := Parse(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("Parse(%q): error %q does not quote the input", s, err)
			}
		} else {
			if got < 0 {
				t.Fatalf("Parse(%q) = %d, negative", s, got)
			}
			checkFormatParsesBack(t, got)
		}

		// Plain integers, exactly.
		if n < 0 {
			n = -(n + 1) // keeps the whole non-negative range reachable
		}
		got, err = Parse(strconv.FormatInt(n, 10))
		if err != nil || got != n {
			t.Fatalf("Parse(%q) = %d, %v; want %d", strconv.FormatInt(n, 10), got, err, n)
		}
		checkFormatParsesBack(t, n)

		// Digits only, possibly past int64: exact or refused as too large.
		if digits := strings.TrimSpace(s); digits != "" && strings.Trim(digits, "0123456789") == "" {
			want, ok := new(big.Int).SetString(digits, 10)
			got, err := Parse(s)
			switch {
			case !ok:
				t.Fatalf("big.Int refused %q", digits)
			case want.IsInt64() && (err != nil || got != want.Int64()):
				t.Fatalf("Parse(%q) = %d, %v; want %s", s, got, err, want)
			case !want.IsInt64() && err == nil:
				t.Fatalf("Parse(%q) = %d, want an overflow error", s, got)
			}
		}
	})
}

// checkFormatParsesBack checks that Format(n), for n >= 0, parses back
// to within the rounding Format applies.
func checkFormatParsesBack(t *testing.T, n int64) {
	t.Helper()
	text := Format(n)
	back, err := Parse(text)
	if n < 1<<10 {
		if err != nil || back != n {
			t.Fatalf("Parse(Format(%d) = %q) = %d, %v; want it exactly", n, text, back, err)
		}
		return
	}
	// unit: the largest IEC unit not above n, which Format prints in
	// (or, from 1023.95 of it, as 1.0 of the next, the same 1024 of it).
	unit := int64(1) << 10
	for unit <= math.MaxInt64>>10 && unit<<10 <= n {
		unit <<= 10
	}
	if err != nil {
		// 8.0EiB is 2^63 bytes, one more than int64 holds: the one case
		// where the rounding leaves the range Parse accepts.
		if text == "8.0EiB" && unit == 1<<60 && !strings.Contains(err.Error(), "overflows") {
			t.Fatalf("Parse(Format(%d) = %q): %v, want an overflow error", n, text, err)
		}
		if text != "8.0EiB" {
			t.Fatalf("Parse(Format(%d) = %q): %v", n, text, err)
		}
		return
	}
	// %.1f rounds to within 0.05 unit; parsing the decimal truncates to a
	// whole byte; the float64 division costs at most a few ulps of n.
	tol := unit/20 + 1 + n>>50
	if d := back - n; d > tol || -d > tol {
		t.Fatalf("Parse(Format(%d) = %q) = %d, off by %d (more than %d)", n, text, back, d, tol)
	}
}
