package batcher

// Bounds bound a group of items by its count and its size in all, each the
// sum of the weights its items are given: one per item and its bytes for an
// SQS call, an embeddings request's inputs and tokens for a model server.
// Zero or less is no bound. A group holds one item at least, whatever its
// weights: an item past a bound on its own is a group by itself, and the
// caller decides whether it may go.
type Bounds struct {
	Count int
	Size  int64
}

// Take returns how many of n items, from the first, make one group within
// b, and the group's size: the items up to the first whose weights would
// take it past a bound. weigh gives item i's count and size.
func (b Bounds) Take(n int, weigh func(i int) (count int, size int64)) (k int, size int64) {
	count := 0
	for ; k < n; k++ {
		c, s := weigh(k)
		if k > 0 && ((b.Count > 0 && count+c > b.Count) || (b.Size > 0 && size+s > b.Size)) {
			break
		}
		count, size = count+c, size+s
	}
	return k, size
}

// Cut cuts items, in order, into groups within b, weigh giving each item's
// count and size (it is called once an item). The groups share items'
// backing array.
func Cut[T any](items []T, b Bounds, weigh func(T) (count int, size int64)) [][]T {
	type weight struct {
		count int
		size  int64
	}
	ws := make([]weight, len(items))
	for i, it := range items {
		ws[i].count, ws[i].size = weigh(it)
	}
	var out [][]T
	for len(items) > 0 {
		k, _ := b.Take(len(items), func(i int) (int, int64) { return ws[i].count, ws[i].size })
		out = append(out, items[:k:k])
		items, ws = items[k:], ws[k:]
	}
	return out
}
