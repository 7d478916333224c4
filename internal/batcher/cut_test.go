package batcher

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Items here are words: a word's count is its number of dashes plus one
// (an embeddings item of several inputs), its size its length.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items string
		b     Bounds
		want  [][]string
	}{
		{"none", "", Bounds{Count: 2}, nil},
		{"count", "a b c", Bounds{Count: 2}, [][]string{{"a", "b"}, {"c"}}},
		{"weighted count", "a-b c d-e-f g", Bounds{Count: 3}, [][]string{{"a-b", "c"}, {"d-e-f"}, {"g"}}},
		{"count past the bound alone", "a b-c-d e", Bounds{Count: 2}, [][]string{{"a"}, {"b-c-d"}, {"e"}}},
		{"size", "aa bb c dddd", Bounds{Size: 5}, [][]string{{"aa", "bb", "c"}, {"dddd"}}},
		{"size exactly at the bound", "aa bbb c", Bounds{Size: 5}, [][]string{{"aa", "bbb"}, {"c"}}},
		{"size past the bound alone", "a bbbbbb c", Bounds{Size: 5}, [][]string{{"a"}, {"bbbbbb"}, {"c"}}},
		{"whichever comes first", "a b ccc dd", Bounds{Count: 2, Size: 4}, [][]string{{"a", "b"}, {"ccc"}, {"dd"}}},
		{"no bounds", "a b-c ddd", Bounds{}, [][]string{{"a", "b-c", "ddd"}}},
		{"negative is none", "a b", Bounds{Count: -1, Size: -1}, [][]string{{"a", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := strings.Fields(tc.items)
			weighed := 0
			weigh := func(s string) (int, int64) {
				weighed++
				return strings.Count(s, "-") + 1, int64(len(s))
			}
			got := Cut(items, tc.b, weigh)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if weighed != len(items) {
				t.Errorf("weighed %d times for %d items, want once each", weighed, len(items))
			}
			// The groups share items' array, and appending to one does not
			// write over the next.
			if len(got) > 1 {
				_ = append(got[0], "x")
				if got[1][0] == "x" {
					t.Error("appending to a group wrote over the next")
				}
			}
		})
	}
}

func TestTakeReturnsTheGroupsSize(t *testing.T) {
	sizes := []int64{3, 4, 5}
	k, size := Bounds{Size: 8}.Take(len(sizes), func(i int) (int, int64) { return 1, sizes[i] })
	if k != 2 || size != 7 {
		t.Errorf("Take = %d items of %d bytes, want 2 of 7", k, size)
	}
}
