package bert

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// recordingEncoder runs Model.Embed and records what it was given, standing
// in for a GPU.
type recordingEncoder struct {
	m      *Model
	shapes [][2]int // items, longest
	ctxs   []context.Context
	fail   error
	closed int
}

func (r *recordingEncoder) Embed(ctx context.Context, ids [][]int32) ([][]float32, error) {
	longest := 0
	for _, x := range ids {
		longest = max(longest, len(x))
	}
	r.shapes = append(r.shapes, [2]int{len(ids), longest})
	r.ctxs = append(r.ctxs, ctx)
	if r.fail != nil {
		return nil, r.fail
	}
	return r.m.Embed(ids)
}

func (r *recordingEncoder) Close() error { r.closed++; return nil }

type ctxKey struct{}

// TestEmbedderOnRunsSubBatchesOnEncoder checks that an Embedder on an
// Encoder runs each length bucket's sub-batch there, with Run's context,
// giving the CPU Embedder's outputs; that it reports the device's weights
// and working memory; that Cost is the CPU's plus one Granule for a
// non-empty call; that an error of the device fails the batch; and that
// Close closes the device once.
func TestEmbedderOnRunsSubBatchesOnEncoder(t *testing.T) {
	cpu, err := Open(servedModelDir(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	enc := &recordingEncoder{m: cpu.Model()}
	e, err := NewEmbedderOn(cpu.Model(), cpu.tok, enc, 12345, func() int64 { return 678 })
	if err != nil {
		t.Fatal(err)
	}
	if e.Weights() != 12345 || e.Working() != 678 {
		t.Errorf("Weights, Working = %d, %d; want the device's 12345, 678", e.Weights(), e.Working())
	}
	r := rand.New(rand.NewPCG(3, 4))
	var items []job.Item
	for i, words := range []int{2, 30, 3, 200, 30, 1} {
		items = append(items, job.Item{ID: fmt.Sprintf("i%d", i), Text: sentence(r, words)})
	}
	if got, want := e.Cost(items), cpu.Cost(items)+Granule; got != want {
		t.Errorf("Cost = %d, want the CPU's %d and a granule", got, want)
	}
	if got := e.Cost(nil); got != 0 {
		t.Errorf("Cost(nil) = %d, want 0", got)
	}
	ctx := context.WithValue(context.Background(), ctxKey{}, "run")
	outs, err := e.Run(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cpu.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if outs[i].ID != want[i].ID || !slices.Equal(outs[i].Embedding, want[i].Embedding) {
			t.Errorf("item %d: %q %v, want the CPU Embedder's %q %v", i, outs[i].ID, outs[i].Embedding[:2], want[i].ID, want[i].Embedding[:2])
		}
	}
	if len(enc.shapes) < 3 {
		t.Errorf("the encoder ran %v: want one sub-batch per bucket, at least 3", enc.shapes)
	}
	for _, s := range enc.shapes {
		if e.bucket(s[1]) < s[1] {
			t.Errorf("sub-batch %v runs past its bucket", s)
		}
	}
	for _, c := range enc.ctxs {
		if c.Value(ctxKey{}) != "run" {
			t.Error("the encoder did not get Run's context")
		}
	}
	enc.fail = fmt.Errorf("cuda: %w", gpu.ErrOutOfMemory)
	if _, err := e.Run(ctx, items); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Run with the device out of memory: %v, want ErrOutOfMemory", err)
	}
	if err := errors.Join(e.Close(), e.Close()); err != nil || enc.closed != 1 {
		t.Errorf("Close twice: %v, the encoder closed %d times; want nil, once", err, enc.closed)
	}
	if _, err := e.Run(ctx, items); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
}

// TestSeqBytesBoundsCUDAWorkingBytes checks the bound a GPU Embedder's Cost
// rests on: the CUDA encoder's one allocation for a sub-batch of any size,
// padded to any length within a bucket, is at most the size times the
// bucket's per-sequence bytes (the driver's rounding of it is the Granule
// Cost adds), in every precision (half precision adds HalfSeqBytes) and
// with either attention.
func TestSeqBytesBoundsCUDAWorkingBytes(t *testing.T) {
	for _, c := range []Config{servedShape.Config, miniLM, paddingConfig} {
		for _, p := range []GPUPrecision{GPUFloat32, GPUFloat16, GPUBFloat16} {
			for _, a := range []GPUAttention{GPUAttentionGEMM, GPUAttentionFused} {
				seqBytesBoundsCUDAWorkingBytes(t, c, p, a)
			}
		}
	}
}

func seqBytesBoundsCUDAWorkingBytes(t *testing.T, c Config, p GPUPrecision, a GPUAttention) {
	{
		maxLen := min(c.MaxPositionEmbeddings, 512)
		g := GPUConfig{Vocab: c.VocabSize, Hidden: c.HiddenSize, Layers: c.NumLayers, Heads: c.NumHeads,
			Intermediate: c.IntermediateSize, MaxPositions: c.MaxPositionEmbeddings, LayerNormEps: c.LayerNormEps, MaxSeqLength: maxLen,
			Precision: p, Attention: a}
		for l := 1; l <= maxLen; l++ {
			per := c.seqBytes(bucketOf(l, maxLen)) + g.HalfSeqBytes(bucketOf(l, maxLen))
			for _, n := range []int{1, 2, 3, 4, 7, 16, 33, 64, 256} {
				if need := g.CUDAWorkingBytes(n, l); need > int64(n)*per {
					t.Fatalf("hidden %d, %v, attention %d: CUDAWorkingBytes(%d, %d) = %d, over %d × seqBytes(%d) = %d",
						c.HiddenSize, p, a, n, l, need, n, bucketOf(l, maxLen), int64(n)*per)
				}
			}
		}
	}
}
