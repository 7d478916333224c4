package wordpiece

import "sort"

// pieceTrie finds the longest vocabulary piece at the start of a word in one pass
// over its bytes, where probing a map with ever shorter prefixes costs a hash per
// length: WordPiece's greedy longest-match-first is a longest-prefix search.
//
// Nodes are numbered breadth-first; node n's edges are labels/child[edges[n]:edges[n+1]],
// sorted by label. The root's children are also in rootChild for one lookup.
type pieceTrie struct {
	labels    []byte
	child     []int32
	edges     []int32
	id        []int32 // the piece ending at a node, or -1
	rootChild [256]int32
	// dense[denseAt[n]-1] holds the children of node n by label where it has many
	// (denseAt[n] > 0), so that no scan is long.
	denseAt []int32
	dense   [][256]int32
}

// denseFrom is the number of children from which a node gets a dense table.
const denseFrom = 12

func newPieceTrie(pieces map[string]int32) *pieceTrie {
	// Sorting the keys makes each node's children contiguous and ordered, so a
	// breadth-first numbering falls out of one pass per depth.
	keys := make([]string, 0, len(pieces))
	for k := range pieces {
		if k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)

	type span struct{ lo, hi, depth int } // keys[lo:hi] share a prefix of length depth
	t := &pieceTrie{id: []int32{-1}}
	queue := []span{{0, len(keys), 0}}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		t.edges = append(t.edges, int32(len(t.labels)))
		lo := s.lo
		if lo < s.hi && len(keys[lo]) == s.depth { // the node's own piece sorts first
			lo++
		}
		for lo < s.hi {
			c := keys[lo][s.depth]
			hi := lo
			for hi < s.hi && keys[hi][s.depth] == c {
				hi++
			}
			node := int32(len(t.id))
			id := int32(-1)
			if len(keys[lo]) == s.depth+1 {
				id = pieces[keys[lo]]
			}
			t.id = append(t.id, id)
			t.labels = append(t.labels, c)
			t.child = append(t.child, node)
			queue = append(queue, span{lo, hi, s.depth + 1})
			lo = hi
		}
	}
	t.edges = append(t.edges, int32(len(t.labels)))
	for e := t.edges[0]; e < t.edges[1]; e++ {
		t.rootChild[t.labels[e]] = t.child[e]
	}
	t.denseAt = make([]int32, len(t.id))
	for n := range t.id {
		if t.edges[n+1]-t.edges[n] < denseFrom {
			continue
		}
		var d [256]int32
		for e := t.edges[n]; e < t.edges[n+1]; e++ {
			d[t.labels[e]] = t.child[e]
		}
		t.dense = append(t.dense, d)
		t.denseAt[n] = int32(len(t.dense))
	}
	return t
}

// longest returns the id and length of the longest piece that w starts with, or
// ok false.
func (t *pieceTrie) longest(w []byte) (id int32, n int, ok bool) {
	if len(w) == 0 {
		return 0, 0, false
	}
	node := t.rootChild[w[0]]
	for i := 0; node != 0; {
		if t.id[node] >= 0 {
			id, n, ok = t.id[node], i+1, true
		}
		i++
		if i == len(w) {
			break
		}
		next := int32(0)
		c := w[i]
		if d := t.denseAt[node]; d > 0 {
			node = t.dense[d-1][c]
			continue
		}
		for e := t.edges[node]; e < t.edges[node+1]; e++ {
			if t.labels[e] >= c {
				if t.labels[e] == c {
					next = t.child[e]
				}
				break
			}
		}
		node = next
	}
	return id, n, ok
}
