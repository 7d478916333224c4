package bert

import "math"

// pool writes item b's sentence vector into dst from the last hidden state
// x ([batch·seqLen, h]), over its first n tokens, as sentence-transformers'
// Pooling and Normalize modules compute it.
func (s Sentence) pool(dst, x []float32, b, seqLen, n, h int) {
	rows := x[b*seqLen*h:][: n*h : n*h]
	switch s.Pooling {
	case PoolCLS:
		copy(dst, rows[:h])
	case PoolMax:
		// Padding never competes: only the first n rows are read (where
		// sentence-transformers sets padded rows to -1e9 first).
		copy(dst, rows[:h])
		for t := 1; t < n; t++ {
			for j, v := range rows[t*h:][:h] {
				dst[j] = max(dst[j], v)
			}
		}
	default: // PoolMean
		for j := range h {
			var sum float64
			for t := range n {
				sum += float64(rows[t*h+j])
			}
			dst[j] = float32(sum / float64(n))
		}
	}
	if s.Normalize {
		normalize(dst)
	}
}

// normalize scales v to unit L2 norm, dividing by max(‖v‖, 1e-12) as
// torch.nn.functional.normalize does, so a zero vector stays zero.
func normalize(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	inv := 1 / max(math.Sqrt(ss), 1e-12)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
}
