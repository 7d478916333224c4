// Package bytesize parses and formats memory sizes ("16GiB", "512MB") for
// flags, config files and logs.
package bytesize

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Size is a memory size given on the command line or in a config file, such
// as "16GiB" or "512MB"; see Parse for the forms it accepts. It
// implements flag.Value and encoding.TextUnmarshaler.
type Size int64

// Set parses s with Parse.
func (b *Size) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*b = Size(n)
	return nil
}

// String formats b with Format. It rounds to one decimal so that flag
// help reads "16.0GiB" rather than "17179869184"; parsing it back may not give
// the exact number.
func (b Size) String() string { return Format(int64(b)) }

// UnmarshalText parses text with Parse.
func (b *Size) UnmarshalText(text []byte) error { return b.Set(string(text)) }

// byteUnits maps each accepted unit, lower-cased, to its size. Bare "K", "M"
// and "G" are left out on purpose: tools disagree on whether they mean powers
// of 1000 or 1024, and a budget off by 7% is the kind of error vramq is for
// preventing, so the user has to say which.
var byteUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"pb":  1e15,
	"eb":  1e18,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
	"pib": 1 << 50,
	"eib": 1 << 60,
}

const byteUnitList = "B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB, EiB"

var errEmpty = errors.New("empty size")

// Parse parses a size in bytes: a non-negative decimal number, an
// optional space, and an optional unit. Units are case-insensitive; KB, MB,
// GB, TB, PB and EB are powers of 1000, KiB, MiB, GiB, TiB, PiB and EiB powers
// of 1024, and no unit (or B) means bytes. A fraction is allowed with a unit
// ("1.5GiB"); a result that is not a whole number of bytes is rounded down.
func Parse(s string) (int64, error) {
	n, err := parse(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("parse size %q: %w", s, err)
	}
	return n, nil
}

func parse(s string) (int64, error) {
	if s == "" {
		return 0, errEmpty
	}
	if s[0] == '-' {
		return 0, errors.New("negative size")
	}
	num, unit := splitNumber(s)
	if num == "" {
		return 0, fmt.Errorf("want a number, then an optional unit (%s)", byteUnitList)
	}
	if !validDecimal(num) {
		return 0, fmt.Errorf("bad number %q", num)
	}
	unit = strings.TrimLeft(unit, " ")
	mult, ok := byteUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (want %s)", unit, byteUnitList)
	}
	// Exact rational arithmetic: float64 would misround sizes near the top
	// of the int64 range, where the overflow check has to be right.
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("bad number %q", num)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	whole := new(big.Int).Quo(r.Num(), r.Denom())
	if !whole.IsInt64() {
		return 0, fmt.Errorf("size overflows int64 (max %d bytes)", int64(math.MaxInt64))
	}
	return whole.Int64(), nil
}

// splitNumber splits s after its leading run of digits and dots.
func splitNumber(s string) (num, rest string) {
	i := 0
	for i < len(s) && (s[i] == '.' || '0' <= s[i] && s[i] <= '9') {
		i++
	}
	return s[:i], s[i:]
}

// validDecimal reports whether s is digits, optionally followed by a dot and
// more digits. big.Rat would also take "1/2" or "1e3", which are not sizes.
func validDecimal(s string) bool {
	intPart, frac, hasDot := strings.Cut(s, ".")
	allDigits := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	return allDigits(intPart) && (!hasDot || allDigits(frac))
}

// Format formats n for people: bytes below 1KiB ("900B"), otherwise
// one decimal in the largest IEC unit that keeps the number at least 1
// ("16.0GiB", "1.5MiB"). The result is rounded; use the number itself where
// exactness matters.
func Format(n int64) string {
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign = "-"
		u = -u // two's complement: correct for math.MinInt64 too
	}
	if u < 1<<10 {
		return fmt.Sprintf("%s%dB", sign, u)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for i+1 < len(units) && u >= 1<<(10*(i+2)) {
		i++
	}
	v := float64(u) / float64(uint64(1)<<(10*(i+1)))
	// 1023.96MiB would print as "1024.0MiB"; say "1.0GiB" instead.
	if math.Round(v*10) >= 1024*10 && i+1 < len(units) {
		i++
		v /= 1024
	}
	return fmt.Sprintf("%s%.1f%s", sign, v, units[i])
}
