package job

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// firstAboveFFFD, which scans bytes, finds the same rune as decoding every
// rune would, on text mixing every UTF-8 length around the boundaries.
func TestFirstAboveFFFDMatchesRuneScan(t *testing.T) {
	pieces := []string{"a", "é", "\u07ff", "\u0800", "\ufeff", "\ufffd", "\ufffe", "\uffff", "\U00010000", "😀", "\U0010ffff", `\"`, " "}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := []byte(b.String())
		want := bytes.IndexFunc(s, func(r rune) bool { return r >= 0xFFFE })
		if got := firstAboveFFFD(s); got != want {
			t.Fatalf("%q: firstAboveFFFD %d, rune scan %d", s, got, want)
		}
	}
}
