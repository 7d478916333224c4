package bert

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// paddingConfig is big enough that gonum's GEMM splits the batch's
// products into blocks on goroutines while an item alone runs serially.
var paddingConfig = Config{
	VocabSize: 1000, HiddenSize: 128, NumLayers: 2, NumHeads: 4,
	IntermediateSize: 512, MaxPositionEmbeddings: 160, TypeVocabSize: 2, LayerNormEps: 1e-12,
}

// paddingTolerance bounds how far an item's vector may move when it is
// padded in a batch. Measured: not at all with gonum
// (TestPaddingChangesNothing -v), since it sums each output element in
// the same order whatever the number of rows, and masked scores are exact
// zeros; 1.0e-7 with fma, whose score columns past the last multiple of 16
// (which padding moves) are summed in Go without fused multiply-adds. The
// bound allows for that, while a mask that lets padding through moves
// vectors by about 0.2.
const paddingTolerance = 2e-6

// TestPaddingChangesNothing checks that an item's vector is the same alone
// and padded in a batch with longer items, for every pooling.
func TestPaddingChangesNothing(t *testing.T) {
	backends(t, testPaddingChangesNothing)
}

func testPaddingChangesNothing(t *testing.T) {
	m := randomModel(paddingConfig, 3)
	r := rand.New(rand.NewPCG(4, 4))
	ids := randomIDs(r, paddingConfig.VocabSize, 3, 150, 1, 97, 2, 160, 41)
	worst := 0.0
	for _, pool := range []Pooling{PoolMean, PoolCLS, PoolMax} {
		m.sentence.Pooling = pool
		batch, err := m.Embed(ids)
		if err != nil {
			t.Fatal(err)
		}
		for i, item := range ids {
			alone, err := m.Embed([][]int32{item})
			if err != nil {
				t.Fatal(err)
			}
			d := maxAbsDiff(alone[0], batch[i])
			worst = max(worst, d)
			if d > paddingTolerance {
				t.Errorf("%v pooling: item %d (%d tokens) moves by %.3g when padded to %d", pool, i, len(item), d, 160)
			}
		}
	}
	t.Logf("largest change from padding: %.3g", worst)
}

// TestWorkingBytesBoundsAllocation checks that WorkingBytes is never below
// what Embed really allocates (runtime.MemStats.TotalAlloc over the call),
// and that it is not wildly above it either (twice, beyond a little
// slack for the smallest shapes), for shapes from one short item
// to long padded batches.
func TestWorkingBytesBoundsAllocation(t *testing.T) {
	backends(t, testWorkingBytesBoundsAllocation)
}

func testWorkingBytesBoundsAllocation(t *testing.T) {
	m := randomModel(paddingConfig, 5)
	r := rand.New(rand.NewPCG(6, 6))
	for _, shape := range []struct{ batch, seqLen int }{{1, 2}, {1, 160}, {3, 17}, {8, 64}, {16, 128}, {5, 160}} {
		lengths := make([]int, shape.batch)
		for i := range lengths {
			lengths[i] = 1 + r.IntN(shape.seqLen)
		}
		lengths[0] = shape.seqLen
		ids := randomIDs(r, paddingConfig.VocabSize, lengths...)
		var most uint64
		for range 3 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if _, err := m.Embed(ids); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			most = max(most, after.TotalAlloc-before.TotalAlloc)
		}
		est := m.WorkingBytes(shape.batch, shape.seqLen)
		t.Logf("batch %d × %d tokens: allocated %d bytes, WorkingBytes %d (%.2f×)", shape.batch, shape.seqLen, most, est,
			float64(est)/float64(most))
		if int64(most) > est {
			t.Errorf("batch %d × %d tokens: Embed allocated %d bytes, over WorkingBytes %d", shape.batch, shape.seqLen, most, est)
		}
		if est > 2*int64(most)+64<<10 {
			t.Errorf("batch %d × %d tokens: WorkingBytes %d is over twice the %d bytes allocated (and 64 KiB)", shape.batch, shape.seqLen, est, most)
		}
	}
}

// TestWorkingBytesCountsAttention checks the shape of the estimate: the
// attention scores, batch × heads × seqLen² float32s, are in it, so it
// grows with the square of the length.
func TestWorkingBytesCountsAttention(t *testing.T) {
	c := miniLM
	for _, s := range []struct{ batch, seqLen int }{{1, 16}, {32, 128}, {8, 512}} {
		scores := int64(s.batch*c.NumHeads*s.seqLen*s.seqLen) * 4
		if got := c.WorkingBytes(s.batch, s.seqLen); got < scores {
			t.Errorf("WorkingBytes(%d, %d) = %d, below the %d bytes of attention scores", s.batch, s.seqLen, got, scores)
		}
	}
	if d1, d2 := c.WorkingBytes(4, 256)-c.WorkingBytes(4, 128), c.WorkingBytes(4, 512)-c.WorkingBytes(4, 256); d2 <= 2*d1 {
		t.Errorf("doubling the length from 256 to 512 adds %d bytes, from 128 to 256 %d: the quadratic term is missing", d2, d1)
	}
	if c.WorkingBytes(0, 10) != 0 || c.WorkingBytes(3, 0) != 0 {
		t.Error("an empty batch should need nothing")
	}
}

// TestLinear checks a linear layer against a float64 product, on shapes
// that are not multiples of any SIMD width, with either backend.
func TestLinear(t *testing.T) {
	backends(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(8, 8))
		for _, s := range []struct{ rows, in, out int }{{1, 1, 1}, {3, 7, 5}, {5, 33, 17}, {67, 129, 70}, {130, 64, 200}} {
			x := make([]float32, s.rows*s.in)
			w := make([]float32, s.in*s.out)
			bias := make([]float32, s.out)
			for _, v := range [][]float32{x, w, bias} {
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
			}
			dst := make([]float32, s.rows*s.out)
			for i := range dst {
				dst[i] = float32(math.NaN()) // must be overwritten
			}
			linear(dst, x, w, bias, s.rows, s.in, s.out)
			for i := range s.rows {
				for j := range s.out {
					want := float64(bias[j])
					for k := range s.in {
						want += float64(x[i*s.in+k]) * float64(w[k*s.out+j])
					}
					if got := float64(dst[i*s.out+j]); !(math.Abs(got-want) <= 1e-5*(1+math.Abs(want))*math.Sqrt(float64(s.in))) {
						t.Fatalf("%d×%d·%d×%d: [%d,%d] = %v, want %v", s.rows, s.in, s.in, s.out, i, j, got, want)
					}
				}
			}
		}
	})
}

// TestEmbedConcurrent checks that Embed may run from several goroutines at
// once (the subscriber runs batches side by side) and gives each the
// vectors it gives alone; -race checks the sharing.
func TestEmbedConcurrent(t *testing.T) {
	m, err := Load("testdata/model/tiny-f32")
	if err != nil {
		t.Fatal(err)
	}
	g := readGolden(t, "testdata/model/tiny-f32")
	want := make([][][]float32, len(g.Batches))
	for i, b := range g.Batches {
		if want[i], err = m.Embed(b.IDs); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		for i, b := range g.Batches {
			wg.Go(func() {
				got, err := m.Embed(b.IDs)
				if err != nil {
					t.Error(err)
					return
				}
				for j := range got {
					if d := maxAbsDiff(got[j], want[i][j]); d != 0 {
						t.Errorf("batch %d item %d: %.3g apart when run concurrently", i, j, d)
					}
				}
			})
		}
	}
	wg.Wait()
}
