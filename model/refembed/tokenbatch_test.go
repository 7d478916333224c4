package refembed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/testenv/floats"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/safetensors"
)

func TestTokenBatchRoundTrip(t *testing.T) {
	cfg := DefaultConfig()
	items := sampleItems()
	var buf bytes.Buffer
	if err := WriteTokenBatch(&buf, cfg, items); err != nil {
		t.Fatal(err)
	}
	b, err := ReadTokenBatch(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	tokens, offsets := cfg.Tokenize(items)
	if !slices.Equal(b.Tokens, tokens) || !slices.Equal(b.Offsets, offsets) {
		t.Errorf("read back %d tokens %v, want %d %v", len(b.Tokens), b.Offsets, len(tokens), offsets)
	}
	if b.Vocab != cfg.Vocab || b.MaxTokens != cfg.MaxTokens || b.Items() != len(items) {
		t.Errorf("vocab %d, max tokens %d, %d items; want %d, %d, %d", b.Vocab, b.MaxTokens, b.Items(), cfg.Vocab, cfg.MaxTokens, len(items))
	}
	// The first B items of the file are the batch of those B items, as
	// embed.py --bench takes them.
	for _, n := range []int{1, 3, len(items)} {
		want, _ := cfg.Tokenize(items[:n])
		if got := b.Tokens[:b.Offsets[n]]; !slices.Equal(got, want) {
			t.Errorf("first %d items: tokens %v, want %v", n, got, want)
		}
	}

	// No items: an empty tokens tensor and offsets [0].
	buf.Reset()
	if err := WriteTokenBatch(&buf, cfg, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadTokenBatch(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil || b.Items() != 0 || len(b.Tokens) != 0 {
		t.Errorf("empty batch: %+v, %v", b, err)
	}
	bad := cfg
	bad.Vocab = 1
	if err := WriteTokenBatch(&buf, bad, items); err == nil {
		t.Error("WriteTokenBatch took an invalid config")
	}
}

func TestReadTokenBatchRejects(t *testing.T) {
	meta := map[string]string{"format": TokenBatchFormat, "vocab": "10", "max_tokens": "4"}
	with := func(kv ...string) map[string]string { return withMetadata(meta, kv...) }
	batch := func(tokens, offsets []int32) []safetensors.Tensor {
		return []safetensors.Tensor{
			{Name: "tokens", Shape: []int64{int64(len(tokens))}, Int32s: tokens},
			{Name: "offsets", Shape: []int64{int64(len(offsets))}, Int32s: offsets},
		}
	}
	ok := batch([]int32{1, 2, 3}, []int32{0, 1, 3})
	tests := []struct {
		name    string
		meta    map[string]string
		tensors []safetensors.Tensor
		want    string
	}{
		{"other format", with("format", TokenBatchFormat+"x"), ok, `metadata format is "vramq-token-batch-v1x"`},
		{"no vocab", with("vocab", ""), ok, `metadata vocab is "", want a positive integer`},
		{"zero max_tokens", with("max_tokens", "0"), ok, "max_tokens is \"0\""},
		{"extra tensor", meta,
			append(batch([]int32{1}, []int32{0, 1}), safetensors.Tensor{Name: "ids", Shape: []int64{1}, Int32s: []int32{1}}),
			"3 tensors, want exactly"},
		{"no offsets", meta, batch([]int32{1}, []int32{0, 1})[:1], `no tensor "offsets"`},
		{"offsets I64", meta, []safetensors.Tensor{ok[0], {Name: "offsets", Shape: []int64{3}, DType: "I64", Raw: make([]byte, 24)}},
			`tensor "offsets" is I64, want I32`},
		{"tokens 2-D", meta, []safetensors.Tensor{{Name: "tokens", Shape: []int64{1, 3}, Int32s: []int32{1, 2, 3}}, ok[1]},
			"tensor tokens has shape [1 3], want one dimension"},
		{"empty offsets", meta, batch([]int32{}, []int32{}), "offsets is empty"},
		{"offsets start late", meta, batch([]int32{1, 2, 3}, []int32{1, 3}), "offsets[0] is 1, want 0"},
		{"offsets end early", meta, batch([]int32{1, 2, 3}, []int32{0, 2}), "offsets end at 2, but there are 3 tokens"},
		{"offsets decrease", meta, batch([]int32{1, 2, 3}, []int32{0, 2, 1, 3}), "offsets[2] = 1 after offsets[1] = 2"},
		{"empty item", meta, batch([]int32{1, 2, 3}, []int32{0, 1, 1, 3}), "every item has at least one token"},
		{"id past vocab", meta, batch([]int32{1, 10, 3}, []int32{0, 1, 3}), "tokens[1] = 10 is outside [0, vocab 10)"},
		{"negative id", meta, batch([]int32{-1}, []int32{0, 1}), "tokens[0] = -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := safetensors.Write(&buf, tt.meta, tt.tensors); err != nil {
				t.Fatal(err)
			}
			_, err := ReadTokenBatch(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// pythonEmbeddings are the values in testdata/embeddings-python.safetensors,
// which makePythonEmbeddings wrote with bench/torch/embed.py's writer:
// Python's json puts spaces after ',' and ':', unlike Go's.
var pythonEmbeddings = [][]float32{
	{0.5, -1.25, 3e-05, 1.0},
	{float32(math.Copysign(0, -1)), 0.1, 65504.0, -7.5},
	{1e-40, 2.0, -3.0, 1.0 / 3},
}

const makePythonEmbeddings = `
import struct, sys
sys.path.insert(0, sys.argv[1])
import embed
values = [0.5, -1.25, 3e-05, 1.0, -0.0, 0.1, 65504.0, -7.5, 1e-40, 2.0, -3.0, 1.0 / 3]
raw = struct.pack("<12f", *values)
embed.write_safetensors(sys.argv[2], [("embeddings", "F32", [3, 4], raw)],
    {"format": embed.EMBEDDINGS_FORMAT, "device": "none", "torch": "none: written by write_safetensors alone"})
`

// TestLoadEmbeddingsFromPython reads an embeddings file as the PyTorch
// reference writes it, committed so that this runs without Python.
func TestLoadEmbeddingsFromPython(t *testing.T) {
	got, err := LoadEmbeddings("testdata/embeddings-python.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(pythonEmbeddings) {
		t.Fatalf("%d rows, want %d", len(got), len(pythonEmbeddings))
	}
	for i, row := range got {
		if !floats.SameBits(row, pythonEmbeddings[i]) || cap(row) != len(row) {
			t.Errorf("row %d = %v (cap %d), want %v", i, row, cap(row), pythonEmbeddings[i])
		}
	}
	if _, err := LoadEmbeddings(filepath.Join(t.TempDir(), "none")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

func TestReadEmbeddingsRejects(t *testing.T) {
	meta := map[string]string{"format": EmbeddingsFormat}
	tests := []struct {
		name    string
		meta    map[string]string
		tensors []safetensors.Tensor
		want    string
	}{
		{"no format", nil, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{1, 2}, Values: []float32{1, 2}}},
			`metadata format is "", want "vramq-embeddings-v1"`},
		{"1-D", meta, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{2}, Values: []float32{1, 2}}}, "shape [2], want [items, width]"},
		{"rows of width 0", meta, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{1 << 40, 0}, Values: []float32{}}},
			"want [items, width]"},
		{"I32", meta, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{1, 1}, Int32s: []int32{1}}},
			`tensor "embeddings" is I32, want F32`},
		{"other name", meta, []safetensors.Tensor{{Name: "output", Shape: []int64{1, 1}, Values: []float32{1}}}, `no tensor "embeddings"`},
		{"extra tensor", meta, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{1, 1}, Values: []float32{1}}, {Name: "ids", Shape: []int64{1}, Int32s: []int32{0}}}, "2 tensors"},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := safetensors.Write(&buf, tt.meta, tt.tensors); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadEmbeddings(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	// No items is a valid answer.
	var buf bytes.Buffer
	safetensors.Write(&buf, meta, []safetensors.Tensor{{Name: "embeddings", Shape: []int64{0, 256}, Values: []float32{}}})
	if rows, err := ReadEmbeddings(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil || len(rows) != 0 {
		t.Errorf("no items: %v, %v", rows, err)
	}
}

// TestPythonHandoff runs bench/torch/embed.py's file functions, which need
// no PyTorch, under the python3 on PATH (skipped without one): its writer
// must make the committed testdata file byte for byte, and its reader must
// see in Go's weights and token batch files what Go's reader sees.
func TestPythonHandoff(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	script := filepath.Join("..", "..", "bench", "torch")
	py := func(code string, args ...string) []byte {
		t.Helper()
		// -B: no __pycache__ left in the checkout.
		cmd := exec.Command(python, append([]string{"-B", "-c", code}, args...)...)
		cmd.Stderr = new(bytes.Buffer)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("python3: %v\n%s", err, cmd.Stderr)
		}
		return out
	}
	dir := t.TempDir()

	made := filepath.Join(dir, "embeddings.safetensors")
	py(makePythonEmbeddings, script, made)
	got, _ := os.ReadFile(made)
	want, _ := os.ReadFile("testdata/embeddings-python.safetensors")
	if !bytes.Equal(got, want) {
		t.Errorf("embed.py's writer made %d bytes, not testdata/embeddings-python.safetensors (%d): regenerate it with makePythonEmbeddings",
			len(got), len(want))
	}

	cfg := tinyConfig()
	weights := filepath.Join(dir, "model.safetensors")
	batch := filepath.Join(dir, "batch.safetensors")
	os.WriteFile(weights, weightsFile(t, cfg), 0o644)
	var buf bytes.Buffer
	if err := WriteTokenBatch(&buf, cfg, sampleItems()); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(batch, buf.Bytes(), 0o644)

	const describe = `
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import embed
meta, tensors = embed.read_safetensors(sys.argv[2])
print(json.dumps({"metadata": meta, "tensors": {n: [d, s, hashlib.sha256(b).hexdigest()] for n, (d, s, b) in tensors.items()}}))
`
	for _, path := range []string{weights, batch} {
		var seen struct {
			Metadata map[string]string
			Tensors  map[string][3]any
		}
		if err := json.Unmarshal(py(describe, script, path), &seen); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(path)
		f, err := safetensors.Open(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(seen.Metadata, f.Metadata()) {
			t.Errorf("%s: python reads metadata %v, Go %v", filepath.Base(path), seen.Metadata, f.Metadata())
		}
		if len(seen.Tensors) != len(f.Names()) {
			t.Errorf("%s: python reads %d tensors, Go %d", filepath.Base(path), len(seen.Tensors), len(f.Names()))
		}
		for _, name := range f.Names() {
			st, _ := f.Tensor(name)
			raw, err := f.Raw(name)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(raw)
			shape, _ := json.Marshal(st.Shape)
			gotShape, _ := json.Marshal(seen.Tensors[st.Name][1])
			if p := seen.Tensors[st.Name]; p[0] != st.DType || string(gotShape) != string(shape) || p[2] != hex.EncodeToString(sum[:]) {
				t.Errorf("%s: python reads tensor %s as %v, Go as %s %s %x", filepath.Base(path), st.Name, p, st.DType, shape, sum)
			}
		}
	}
}

// torchTolerance bounds |PyTorch − CPU reference| per output component. The
// CPU reference is within 4e-7 of the same model in float64 on the default
// config; another float32 implementation summing in another order is as
// close, and a different model (a transposed layer, the exact GELU, a sum
// for a mean) is off by 1e-3 and more.
const torchTolerance = 1e-5

// TestTorchMatchesCPUReference runs bench/torch/embed.py --out on the
// default weights and a few hundred items, and compares its embeddings with
// the CPU reference's: the PyTorch model that the CUDA backend is timed
// against must be this model. It runs when VRAMQ_TORCH_PYTHON names a
// python with PyTorch (on the GPU machine: beside the test binary, as
// make gpu-test-bin lays it out; or in the checkout), on CUDA when PyTorch
// sees a GPU, otherwise on the CPU.
func TestTorchMatchesCPUReference(t *testing.T) {
	python, script := torchReference(t)
	cfg := DefaultConfig()
	dir := t.TempDir()
	weights := filepath.Join(dir, "model.safetensors")
	batch := filepath.Join(dir, "batch.safetensors")
	out := filepath.Join(dir, "torch.safetensors")
	var buf bytes.Buffer
	if err := WriteWeights(&buf, cfg, defaultWeights()); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(weights, buf.Bytes(), 0o644)
	items := torchTestItems(300)
	buf.Reset()
	if err := WriteTokenBatch(&buf, cfg, items); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(batch, buf.Bytes(), 0o644)
	cmd := exec.Command(python, "-B", script, "--weights", weights, "--batch", batch, "--out", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, msg)
	}
	got, err := LoadEmbeddings(out)
	if err != nil {
		t.Fatal(err)
	}
	want := run(t, newTestEmbedder(t, nil), items)
	if len(got) != len(want) {
		t.Fatalf("PyTorch gave %d embeddings for %d items", len(got), len(want))
	}
	var worst float64
	for i := range want {
		if len(got[i]) != cfg.Out {
			t.Fatalf("item %d: PyTorch's embedding has %d components, want %d", i, len(got[i]), cfg.Out)
		}
		for j, v := range want[i].Embedding {
			worst = max(worst, math.Abs(float64(got[i][j])-float64(v)))
		}
	}
	t.Logf("FIGURE torch-vs-cpu: %d items: largest |PyTorch - CPU reference| of a component %.3g", len(items), worst)
	if !(worst <= torchTolerance) { // also fails on NaN
		t.Errorf("PyTorch's embeddings differ from the CPU reference's by up to %.3g, over %g", worst, torchTolerance)
	}
}

// torchTestItems is n items of 1 to 700 words (past MaxTokens for some),
// with an empty one and one without letters, so that every path of the
// tokenizer and the pooling is compared.
func torchTestItems(n int) []job.Item {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while queues hold messages and GPUs run batches 東京 naïve")
	r := Rand{State: 99}
	items := make([]job.Item, n)
	for i := range items {
		var sb strings.Builder
		for range 1 + r.Uint64()%700 {
			sb.WriteString(words[r.Uint64()%uint64(len(words))])
			sb.WriteByte(' ')
		}
		items[i] = job.Item{ID: strconv.Itoa(i), Text: sb.String()}
	}
	items[1].Text = ""
	items[2].Text = "!!! ??? ..."
	return items
}

// torchReference is the python with PyTorch that VRAMQ_TORCH_PYTHON names
// and bench/torch/embed.py: beside the test binary, as make gpu-test-bin
// lays it out on a GPU machine, or in the checkout. It skips the test when
// the variable is not set.
func torchReference(t *testing.T) (python, script string) {
	t.Helper()
	python = os.Getenv("VRAMQ_TORCH_PYTHON")
	if python == "" {
		t.Skip("VRAMQ_TORCH_PYTHON is not set")
	}
	script = "embed.py"
	if _, err := os.Stat(script); err != nil {
		script = filepath.Join("..", "..", "bench", "torch", "embed.py")
	}
	return python, script
}

// withMetadata is base with the key-value pairs of kv set, or deleted where
// the value is empty.
func withMetadata(base map[string]string, kv ...string) map[string]string {
	m := maps.Clone(base)
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(m, kv[i])
		} else {
			m[kv[i]] = kv[i+1]
		}
	}
	return m
}
