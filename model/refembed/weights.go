package refembed

import (
	"fmt"
	"math"
)

// Weights are the reference embedding model's parameters, float32,
// row-major. They are kept apart from Embedder so that they can come from
// somewhere other than GenerateWeights (a checkpoint file) and be
// uploaded as they are by a GPU backend.
type Weights struct {
	Embedding []float32 // Vocab×Dim: row t is token t's vector
	W1        []float32 // Dim×Hidden
	B1        []float32 // Hidden
	W2        []float32 // Hidden×Out
	B2        []float32 // Out
}

// Bytes is the memory the tensors take, on the host or on a device.
func (w *Weights) Bytes() int64 {
	return 4 * int64(len(w.Embedding)+len(w.W1)+len(w.B1)+len(w.W2)+len(w.B2))
}

// CheckShape reports a tensor whose size does not match cfg.
func (w *Weights) CheckShape(cfg Config) error {
	for _, t := range []struct {
		name       string
		got        int
		rows, cols int
	}{
		{"embedding", len(w.Embedding), cfg.Vocab, cfg.Dim},
		{"W1", len(w.W1), cfg.Dim, cfg.Hidden},
		{"b1", len(w.B1), 1, cfg.Hidden},
		{"W2", len(w.W2), cfg.Hidden, cfg.Out},
		{"b2", len(w.B2), 1, cfg.Out},
	} {
		if t.got != t.rows*t.cols {
			return fmt.Errorf("embed weights: %s has %d values, want %d×%d", t.name, t.got, t.rows, t.cols)
		}
	}
	return nil
}

// GenerateWeights makes weights from cfg.Seed, the same on every
// machine. Each tensor is uniform with the spread of the usual initialisers:
// embeddings with unit variance (±√3), linear layers and their biases
// ±1/√fan_in. Each tensor draws from its own stream, so changing one
// dimension leaves the tensors it does not shape unchanged. It panics if
// cfg.Validate fails.
func GenerateWeights(cfg Config) *Weights {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	uniform := func(stream uint64, n int, bound float64) []float32 {
		r := Rand{State: Mix64(cfg.Seed ^ Mix64(stream))}
		b := float32(bound)
		out := make([]float32, n)
		for i := range out {
			out[i] = b * r.Symmetric()
		}
		return out
	}
	dimBound := 1 / math.Sqrt(float64(cfg.Dim))
	hiddenBound := 1 / math.Sqrt(float64(cfg.Hidden))
	return &Weights{
		Embedding: uniform(1, cfg.Vocab*cfg.Dim, math.Sqrt(3)),
		W1:        uniform(2, cfg.Dim*cfg.Hidden, dimBound),
		B1:        uniform(3, cfg.Hidden, dimBound),
		W2:        uniform(4, cfg.Hidden*cfg.Out, hiddenBound),
		B2:        uniform(5, cfg.Out, hiddenBound),
	}
}

// Rand is splitmix64, the generator GenerateWeights draws from: a few
// lines, fully specified by its seed, and so easy to reproduce outside Go (a
// script that checks a backend's outputs) as well as stable across Go
// releases. Exported so that the model's stand-ins and tests draw the same
// way.
type Rand struct{ State uint64 }

// Uint64 advances the state and returns the next value.
func (r *Rand) Uint64() uint64 {
	r.State += 0x9e3779b97f4a7c15
	return Mix64(r.State)
}

// Mix64 is splitmix64's output function, a bijection that scatters
// neighbouring inputs across the whole range.
func Mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Symmetric returns a uniform float32 in [-1, 1), from the top 24 bits so
// that every value is exact.
func (r *Rand) Symmetric() float32 {
	return float32(r.Uint64()>>40)*(1.0/(1<<23)) - 1
}
