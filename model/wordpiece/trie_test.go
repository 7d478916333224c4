package wordpiece

import (
	"math/rand/v2"
	"testing"
)

// TestPieceTrieLongest: the trie finds what probing a map with ever shorter
// prefixes finds.
func TestPieceTrieLongest(t *testing.T) {
	pieces := map[string]int32{"a": 1, "ab": 2, "abc": 3, "b": 4, "bcd": 5, "é": 6, "éa": 7, "z": 8, "zzzz": 9}
	trie := newPieceTrie(pieces)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "c", "d", "z", "é", "x"}
	for range 5000 {
		w := ""
		for range rng.IntN(7) {
			w += alphabet[rng.IntN(len(alphabet))]
		}
		wantID, wantN, wantOK := int32(0), 0, false
		for n := len(w); n > 0; n-- {
			if id, ok := pieces[w[:n]]; ok {
				wantID, wantN, wantOK = id, n, true
				break
			}
		}
		id, n, ok := trie.longest([]byte(w))
		if id != wantID || n != wantN || ok != wantOK {
			t.Fatalf("%q: got (%d, %d, %v), want (%d, %d, %v)", w, id, n, ok, wantID, wantN, wantOK)
		}
	}
}
