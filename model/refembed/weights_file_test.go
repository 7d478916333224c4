package refembed

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/testenv/floats"
	"github.com/vramq/vramq/model/safetensors"
)

// tinyConfig is a model small enough to spell out in a test file.
func tinyConfig() Config {
	return Config{Vocab: 5, Dim: 3, Hidden: 4, Out: 2, MaxTokens: 8, Seed: 7}
}

// weightsFile is cfg's generated weights as a weights file.
func weightsFile(t testing.TB, cfg Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteWeights(&buf, cfg, GenerateWeights(cfg)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestEmbedWeightsRoundTrip(t *testing.T) {
	for _, cfg := range []Config{tinyConfig(), DefaultConfig(), {Vocab: 2, Dim: 1, Hidden: 1, Out: 1, MaxTokens: 1}} {
		t.Run(fmt.Sprintf("v%d-d%d", cfg.Vocab, cfg.Dim), func(t *testing.T) {
			want := GenerateWeights(cfg)
			var buf bytes.Buffer
			if err := WriteWeights(&buf, cfg, want); err != nil {
				t.Fatal(err)
			}
			// The data takes exactly the weights' bytes, after a header
			// padded to 8 bytes so that the data is aligned.
			hdr := int64(binary.LittleEndian.Uint64(buf.Bytes()))
			if hdr%8 != 0 || int64(buf.Len()) != 8+hdr+cfg.WeightBytes() {
				t.Errorf("file of %d bytes with a %d-byte header; want 8 + a multiple of 8 + %d", buf.Len(), hdr, cfg.WeightBytes())
			}
			r := &countingReaderAt{r: bytes.NewReader(buf.Bytes())}
			got, gotCfg, err := ReadWeights(r, int64(buf.Len()))
			if err != nil {
				t.Fatal(err)
			}
			if gotCfg != cfg {
				t.Errorf("config %+v, want %+v", gotCfg, cfg)
			}
			for _, p := range []struct {
				name      string
				got, want []float32
			}{
				{"embedding", got.Embedding, want.Embedding},
				{"w1", got.W1, want.W1},
				{"b1", got.B1, want.B1},
				{"w2", got.W2, want.W2},
				{"b2", got.B2, want.B2},
			} {
				if !floats.SameBits(p.got, p.want) {
					t.Errorf("%s differs after the round trip", p.name)
				}
			}
			// Each byte of the file is read once: no second copy of it.
			if r.n != int64(buf.Len()) {
				t.Errorf("read %d bytes of a %d-byte file", r.n, buf.Len())
			}
		})
	}
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r io.ReaderAt
	n int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n += int64(n)
	return n, err
}

func TestLoadEmbedWeightsRunsLikeGenerated(t *testing.T) {
	cfg := DefaultConfig()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, weightsFile(t, cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	w, gotCfg, err := LoadWeights(path)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := NewEmbedder(w, gotCfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	generated := newTestEmbedder(t, nil)
	if loaded.Name() != generated.Name() {
		t.Errorf("name %q, want %q", loaded.Name(), generated.Name())
	}
	items := sampleItems()
	got, want := run(t, loaded, items), run(t, generated, items)
	for i := range want {
		if !floats.SameBits(got[i].Embedding, want[i].Embedding) {
			t.Errorf("item %d: loaded weights give %v..., generated %v...", i, got[i].Embedding[:3], want[i].Embedding[:3])
		}
	}

	if _, _, err := LoadWeights(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want os.ErrNotExist", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(bad, []byte("not a model"), 0o644)
	if _, _, err := LoadWeights(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: %v, want an error naming the path", err)
	}
}

func TestWriteEmbedWeightsRefuses(t *testing.T) {
	cfg := tinyConfig()
	w := GenerateWeights(cfg)
	short := *w
	short.B2 = short.B2[:1]
	bad := cfg
	bad.MaxTokens = 0
	for _, tt := range []struct {
		name string
		cfg  Config
		w    *Weights
		want string
	}{
		{"invalid config", bad, w, "MaxTokens is 0"},
		{"nil weights", cfg, nil, "nil weights"},
		{"shape", cfg, &short, "b2 has 1 values"},
	} {
		var buf bytes.Buffer
		err := WriteWeights(&buf, tt.cfg, tt.w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
		if buf.Len() > 0 {
			t.Errorf("%s: wrote %d bytes before refusing", tt.name, buf.Len())
		}
	}
}

// TestReadEmbedWeightsRejects is well-formed safetensors files that are not
// weights of the reference model.
func TestReadEmbedWeightsRejects(t *testing.T) {
	cfg := tinyConfig()
	gen := GenerateWeights(cfg)
	meta := func(kv ...string) map[string]string {
		return withMetadata(map[string]string{"format": WeightsFormat, "max_tokens": "8"}, kv...)
	}
	// tensors are the generated ones, with changes: a tensor replaced,
	// added (a name not among the five) or, with a nil shape, removed.
	tensors := func(changes ...safetensors.Tensor) []safetensors.Tensor {
		ts := []safetensors.Tensor{
			{Name: "embedding", Shape: []int64{5, 3}, Values: gen.Embedding},
			{Name: "w1", Shape: []int64{3, 4}, Values: gen.W1},
			{Name: "b1", Shape: []int64{4}, Values: gen.B1},
			{Name: "w2", Shape: []int64{4, 2}, Values: gen.W2},
			{Name: "b2", Shape: []int64{2}, Values: gen.B2},
		}
		for _, c := range changes {
			i := slices.IndexFunc(ts, func(t safetensors.Tensor) bool { return t.Name == c.Name })
			switch {
			case i < 0:
				ts = append(ts, c)
			case c.Shape == nil:
				ts = slices.Delete(ts, i, i+1)
			default:
				ts[i] = c
			}
		}
		return ts
	}
	nan := slices.Clone(gen.W2)
	nan[5] = float32(math.NaN())
	inf := slices.Clone(gen.B1)
	inf[0] = float32(math.Inf(-1))
	tests := []struct {
		name    string
		meta    map[string]string
		tensors []safetensors.Tensor
		want    string
	}{
		{"wrong dtype", meta(), tensors(safetensors.Tensor{Name: "w1", Shape: []int64{3, 4}, DType: "I32", Raw: make([]byte, 48)}),
			`tensor "w1" is I32, want F32`},
		{"F64", meta(), tensors(safetensors.Tensor{Name: "b2", Shape: []int64{2}, DType: "F64", Raw: make([]byte, 16)}),
			`tensor "b2" is F64, want F32`},
		{"missing tensor", meta(), tensors(safetensors.Tensor{Name: "b2"}), "no tensor b2 (a weights file holds embedding, w1, b1, w2, b2)"},
		{"two missing", meta(), tensors(safetensors.Tensor{Name: "b1"}, safetensors.Tensor{Name: "embedding"}), "no tensor embedding, b1"},
		{"extra tensor", meta(), tensors(safetensors.Tensor{Name: "ln.weight", Shape: []int64{2}, Values: []float32{1, 1}}),
			`unexpected tensor "ln.weight"`},
		{"renamed (PyTorch names)", meta(),
			tensors(safetensors.Tensor{Name: "w1"}, safetensors.Tensor{Name: "fc1.weight", Shape: []int64{4, 3}, Values: gen.W1}), "no tensor w1"},
		{"w1 not transposed", meta(), tensors(safetensors.Tensor{Name: "w1", Shape: []int64{4, 3}, Values: gen.W1}),
			"tensor w1 has shape [4 3], want [Dim, Hidden] with Dim = 3 as tensor embedding has it"},
		{"b1 disagrees", meta(), tensors(safetensors.Tensor{Name: "b1", Shape: []int64{3}, Values: gen.B1[:3]}),
			"tensor b1 has shape [3], want [Hidden] with Hidden = 4 as tensor w1 has it"},
		{"w2 disagrees", meta(), tensors(safetensors.Tensor{Name: "w2", Shape: []int64{2, 4}, Values: gen.W2}),
			"tensor w2 has shape [2 4], want [Hidden, Out] with Hidden = 4"},
		{"b2 disagrees", meta(), tensors(safetensors.Tensor{Name: "b2", Shape: []int64{1}, Values: gen.B2[:1]}),
			"tensor b2 has shape [1], want [Out] with Out = 2 as tensor w2 has it"},
		{"embedding 1-D", meta(), tensors(safetensors.Tensor{Name: "embedding", Shape: []int64{15}, Values: gen.Embedding}),
			"tensor embedding has shape [15], want [Vocab, Dim]"},
		{"b1 2-D", meta(), tensors(safetensors.Tensor{Name: "b1", Shape: []int64{1, 4}, Values: gen.B1}),
			"tensor b1 has shape [1 4], want [Hidden]"},
		{"vocab of 1", meta(), tensors(safetensors.Tensor{Name: "embedding", Shape: []int64{1, 3}, Values: gen.Embedding[:3]}),
			"Vocab is 1, want 2 to"},
		{"no format", meta("format", ""), tensors(), `no "format" in the metadata; want "vramq-ref-embed-v1"`},
		{"other format", meta("format", "pt"), tensors(), `metadata format is "pt", want "vramq-ref-embed-v1"`},
		{"no max_tokens", meta("max_tokens", ""), tensors(), `no "max_tokens" in the metadata`},
		{"bad max_tokens", meta("max_tokens", "8x"), tensors(), `metadata max_tokens "8x" is not an integer`},
		{"zero max_tokens", meta("max_tokens", "0"), tensors(), "MaxTokens is 0"},
		{"bad seed", meta("seed", "-1"), tensors(), `metadata seed "-1" is not an unsigned integer`},
		{"NaN", meta(), tensors(safetensors.Tensor{Name: "w2", Shape: []int64{4, 2}, Values: nan}), "w2[5] is NaN: every weight must be finite"},
		{"infinity", meta(), tensors(safetensors.Tensor{Name: "b1", Shape: []int64{4}, Values: inf}), "b1[0] is -Inf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := safetensors.Write(&buf, tt.meta, tt.tensors); err != nil {
				t.Fatal(err)
			}
			if _, err := safetensors.Open(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
				t.Fatalf("not a valid safetensors file: %v", err)
			}
			w, _, err := ReadWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if w != nil {
				t.Errorf("weights returned with the error")
			}
		})
	}

	// Free-form metadata is allowed, and a file without a seed is seed 0.
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, meta("source", "a test", "licence", "none"), tensors()); err != nil {
		t.Fatal(err)
	}
	if _, got, err := ReadWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil || got.Seed != 0 || got.MaxTokens != 8 {
		t.Errorf("extra metadata: config %+v, %v; want seed 0, max tokens 8", got, err)
	}
}

// TestReadEmbedWeightsHalfPrecision loads F16 and BF16 tensors, which
// widen to float32 exactly.
func TestReadEmbedWeightsHalfPrecision(t *testing.T) {
	cfg := tinyConfig()
	gen := GenerateWeights(cfg)
	// halve keeps the top 16 bits: a bfloat16 of v, rounded toward zero.
	halve := func(vs []float32) ([]byte, []float32) {
		var raw []byte
		var want []float32
		for _, v := range vs {
			b := uint16(math.Float32bits(v) >> 16)
			raw = binary.LittleEndian.AppendUint16(raw, b)
			want = append(want, math.Float32frombits(uint32(b)<<16))
		}
		return raw, want
	}
	embRaw, embWant := halve(gen.Embedding)
	// F16 for w1: 1.0, -2.0, 0.5, the largest normal, the smallest
	// subnormal, -0, and a few more, twelve values in all.
	f16 := []uint16{0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000, 0x3555, 0x03ff, 0x0400, 0xbc00, 0x2e66, 0x4248}
	w1Want := []float32{1, -2, 0.5, 65504, 0x1p-24, float32(math.Copysign(0, -1)), 0.333251953125, 0x3ffp-24, 0x1p-14, -1,
		0.0999755859375, 3.140625}
	var w1Raw []byte
	for _, h := range f16 {
		w1Raw = binary.LittleEndian.AppendUint16(w1Raw, h)
	}
	var buf bytes.Buffer
	err := safetensors.Write(&buf, map[string]string{"format": WeightsFormat, "max_tokens": "8"}, []safetensors.Tensor{
		{Name: "embedding", Shape: []int64{5, 3}, DType: "BF16", Raw: embRaw},
		{Name: "w1", Shape: []int64{3, 4}, DType: "F16", Raw: w1Raw},
		{Name: "b1", Shape: []int64{4}, Values: gen.B1},
		{Name: "w2", Shape: []int64{4, 2}, Values: gen.W2},
		{Name: "b2", Shape: []int64{2}, Values: gen.B2},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, _, err := ReadWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !floats.SameBits(w.Embedding, embWant) {
		t.Errorf("BF16 embedding = %v, want %v", w.Embedding, embWant)
	}
	if !floats.SameBits(w.W1, w1Want) {
		t.Errorf("F16 w1 = %v, want %v", w.W1, w1Want)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// TestReadSafetensorsShortReader reads through a ReaderAt that ends before
// the size it was given: an error, not a panic or a short tensor.
func TestReadSafetensorsShortReader(t *testing.T) {
	file := weightsFile(t, tinyConfig())
	for _, cut := range []int{4, 30, len(file) - 3} {
		_, _, err := ReadWeights(bytes.NewReader(file[:cut]), int64(len(file)))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
}

// TestWriteWeightsFailingWriter: a failing writer's error comes back.
func TestWriteWeightsFailingWriter(t *testing.T) {
	errDisk := errors.New("disk full")
	if err := WriteWeights(failingWriter{errDisk}, tinyConfig(), GenerateWeights(tinyConfig())); !errors.Is(err, errDisk) {
		t.Errorf("failing writer: %v, want %v", err, errDisk)
	}
}
