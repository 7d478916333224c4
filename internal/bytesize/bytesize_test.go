package bytesize

import (
	"encoding"
	"flag"
	"math"
	"strings"
	"testing"
)

var (
	_ flag.Value               = (*Size)(nil)
	_ encoding.TextUnmarshaler = (*Size)(nil)
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1000000", 1000000},
		{"900B", 900},
		{"900 b", 900},
		{"64KiB", 64 << 10},
		{"512MiB", 512 << 20},
		{"16GiB", 16 << 30},
		{"16gib", 16 << 30},
		{"16 GiB", 16 << 30},
		{"  16GiB\n", 16 << 30},
		{"1.5GiB", 3 << 29},
		{"0.5KiB", 512},
		{"2TiB", 2 << 40},
		{"2GB", 2e9},
		{"2gb", 2e9},
		{"1.5MB", 1.5e6},
		{"3KB", 3000},
		{"1.0001KB", 1000}, // 1000.1 bytes, rounded down
		{"9223372036854775807", math.MaxInt64},
		{"7.9999EiB", 9223256744704315123},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("Parse(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // in the error message
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"-1", "negative"},
		{"-1GiB", "negative"},
		{"+1GiB", "want a number"},
		{"GiB", "want a number"},
		{"abc", "want a number"},
		{"16G", `unknown unit "G"`},
		{"16 gigabytes", "unknown unit"},
		{"16GiB extra", "unknown unit"},
		{"1..5GiB", "bad number"},
		{"1.GiB", "bad number"},
		{".5GiB", "bad number"},
		{"1.2.3", "bad number"},
		{"9223372036854775808", "overflows"},
		{"8EiB", "overflows"},
		{"100000000000TB", "overflows"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err == nil {
			t.Errorf("Parse(%q) = %d, want an error", tt.in, got)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error %q does not mention %q", tt.in, err, tt.want)
		}
		if !strings.Contains(err.Error(), tt.in) {
			t.Errorf("Parse(%q) error %q does not quote the input", tt.in, err)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0B"},
		{900, "900B"},
		{1023, "1023B"},
		{1024, "1.0KiB"},
		{1536, "1.5KiB"},
		{512 << 20, "512.0MiB"},
		{16 << 30, "16.0GiB"},
		{(1 << 30) - 1, "1.0GiB"},
		{2e9, "1.9GiB"},
		{3 << 40, "3.0TiB"},
		{math.MaxInt64, "8.0EiB"},
		{-900, "-900B"},
		{-(3 << 29), "-1.5GiB"},
		{math.MinInt64, "-8.0EiB"},
	}
	for _, tt := range tests {
		if got := Format(tt.in); got != tt.want {
			t.Errorf("Format(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFormatBytesParsesBack(t *testing.T) {
	for _, n := range []int64{0, 900, 1 << 10, 64 << 10, 512 << 20, 16 << 30, 5 << 40} {
		got, err := Parse(Format(n))
		if err != nil || got != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, got, err)
		}
	}
}

func TestBytesFlag(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	b := Size(1 << 30)
	fs.Var(&b, "reserve", "memory to leave free")
	if err := fs.Parse([]string{"-reserve", "512MiB"}); err != nil {
		t.Fatal(err)
	}
	if b != 512<<20 {
		t.Errorf("after -reserve 512MiB: %d", b)
	}
	if got := b.String(); got != "512.0MiB" {
		t.Errorf("String() = %q", got)
	}
	if err := fs.Parse([]string{"-reserve", "lots"}); err == nil {
		t.Error("-reserve lots: no error")
	}
	if b != 512<<20 {
		t.Errorf("a failed Set changed the value to %d", b)
	}
}

func TestBytesUnmarshalText(t *testing.T) {
	var b Size
	if err := b.UnmarshalText([]byte("2GB")); err != nil || b != 2e9 {
		t.Errorf("UnmarshalText(2GB) = %d, %v", b, err)
	}
	if err := b.UnmarshalText([]byte("-2GB")); err == nil {
		t.Error("UnmarshalText(-2GB): no error")
	}
}
