package wordpiece

import (
	"testing"
	"unicode"
)

// TestIsControlFastPath: the range shortcuts of isControl agree with the plain
// definition (Cc, Cf, Co of Unicode 8.0, less tab, newline and carriage return) on
// every code point.
func TestIsControlFastPath(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := r != '\t' && r != '\n' && r != '\r' &&
			unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co) && unicode.Is(unicode8, r)
		if got := isControl(r); got != want {
			t.Fatalf("isControl(%U) = %v, want %v", r, got, want)
		}
	}
}
