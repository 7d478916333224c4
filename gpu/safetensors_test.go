package gpu

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
)

// tinyConfig is a model small enough to spell out in a test file.
func tinyConfig() EmbedConfig {
	return EmbedConfig{Vocab: 5, Dim: 3, Hidden: 4, Out: 2, MaxTokens: 8, Seed: 7}
}

// weightsFile is cfg's generated weights as a weights file.
func weightsFile(t testing.TB, cfg EmbedConfig) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteEmbedWeights(&buf, cfg, GenerateEmbedWeights(cfg)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// stBytes is a safetensors file of header (unpadded) and data, spelled out
// by hand rather than by writeSafetensors, so that malformed ones can be.
func stBytes(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

// f32Bytes is vs as F32 data.
func f32Bytes(vs ...float32) []byte {
	var out []byte
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}

func readBytes(data []byte) (*safetensorsFile, error) {
	return readSafetensors(bytes.NewReader(data), int64(len(data)))
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestEmbedWeightsRoundTrip(t *testing.T) {
	for _, cfg := range []EmbedConfig{tinyConfig(), DefaultEmbedConfig(), {Vocab: 2, Dim: 1, Hidden: 1, Out: 1, MaxTokens: 1}} {
		t.Run(fmt.Sprintf("v%d-d%d", cfg.Vocab, cfg.Dim), func(t *testing.T) {
			want := GenerateEmbedWeights(cfg)
			var buf bytes.Buffer
			if err := WriteEmbedWeights(&buf, cfg, want); err != nil {
				t.Fatal(err)
			}
			// The data takes exactly the weights' bytes, after a header
			// padded to 8 bytes so that the data is aligned.
			hdr := int64(binary.LittleEndian.Uint64(buf.Bytes()))
			if hdr%8 != 0 || int64(buf.Len()) != 8+hdr+cfg.WeightBytes() {
				t.Errorf("file of %d bytes with a %d-byte header; want 8 + a multiple of 8 + %d", buf.Len(), hdr, cfg.WeightBytes())
			}
			r := &countingReaderAt{r: bytes.NewReader(buf.Bytes())}
			got, gotCfg, err := ReadEmbedWeights(r, int64(buf.Len()))
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
				if !sameBits(p.got, p.want) {
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
	cfg := DefaultEmbedConfig()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, weightsFile(t, cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	w, gotCfg, err := LoadEmbedWeights(path)
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
		if !sameBits(got[i].Embedding, want[i].Embedding) {
			t.Errorf("item %d: loaded weights give %v..., generated %v...", i, got[i].Embedding[:3], want[i].Embedding[:3])
		}
	}

	if _, _, err := LoadEmbedWeights(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want os.ErrNotExist", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(bad, []byte("not a model"), 0o644)
	if _, _, err := LoadEmbedWeights(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: %v, want an error naming the path", err)
	}
}

func TestWriteEmbedWeightsRefuses(t *testing.T) {
	cfg := tinyConfig()
	w := GenerateEmbedWeights(cfg)
	short := *w
	short.B2 = short.B2[:1]
	bad := cfg
	bad.MaxTokens = 0
	for _, tt := range []struct {
		name string
		cfg  EmbedConfig
		w    *EmbedWeights
		want string
	}{
		{"invalid config", bad, w, "MaxTokens is 0"},
		{"nil weights", cfg, nil, "nil weights"},
		{"shape", cfg, &short, "b2 has 1 values"},
	} {
		var buf bytes.Buffer
		err := WriteEmbedWeights(&buf, tt.cfg, tt.w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
		if buf.Len() > 0 {
			t.Errorf("%s: wrote %d bytes before refusing", tt.name, buf.Len())
		}
	}
}

// TestReadSafetensorsReferenceVectors reads files from the test suite of
// the format's reference implementation (huggingface/safetensors,
// safetensors/src/tensor.rs), with the outcome it expects, so that this
// reader is tested against bytes its own writer did not make. The one
// departure is noted.
func TestReadSafetensorsReferenceVectors(t *testing.T) {
	zeros := func(n int) string { return strings.Repeat("\x00", n) }
	i32x4 := `{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`
	tests := []struct {
		name string
		file string
		want string // error text; "" to accept
	}{
		// test_serialization: an F32 tensor [1,2,3] of 0..5, unpadded 64-byte header.
		{"serialization", string(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5))), ""},
		// test_serialization_forced_alignement: the header padded with spaces to 72 bytes.
		{"padded header", string(stBytes(`{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `, f32Bytes(0, 1, 2, 3, 4, 5))), ""},
		{"empty", "\x08" + zeros(7) + "{}      ", ""},
		{"metadata only", "\x28" + zeros(7) + `{"__metadata__":{"framework":"pt"}}     `, ""},
		{"scalar", "8" + zeros(7) + `{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}` + zeros(4), ""},
		{"deserialization", "<" + zeros(7) + i32x4 + zeros(16), ""},
		{"zero-sized", "<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}`, ""},
		{"whitespace padding", "\x06" + zeros(7) + "{}\r \t\n", ""},
		{"extra data", "<" + zeros(7) + i32x4 + zeros(16) + "extra_bogus_data_for_polyglot_file", "tensors must cover the buffer"},
		{"missing data", "<" + zeros(7) + i32x4 + zeros(14), "run past the data buffer"},
		{"header too large", "<\x00\x00\x00\x00\xff\xff\xff" + i32x4 + zeros(16), "over the limit"},
		{"too small", "", "too short"},
		{"header past the end", "<" + zeros(7), "runs past the end of the file"},
		{"not UTF-8", "\x01" + zeros(7) + "\xff", "not valid UTF-8"},
		{"not JSON", "\x01" + zeros(7) + "{", "header: not valid JSON"},
		{"invalid info", "<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}`, "is 16 bytes, but data_offsets [0, 4] hold 4"},
		{"shape overflow", "O" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}` + zeros(16), "out of range"},
		{"bytes overflow", "N" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}` + zeros(16), "overflows int64"},
		// test_json_attack: ten tensors claiming the same 16 bytes.
		{"json attack", string(stBytes(jsonAttackHeader(), make([]byte, 16))), "overlap"},
		// The reference reader still lets leading whitespace through (it
		// reserves the check for its 0.4.0); the format says the header
		// MUST start with '{', and this reader holds to it.
		{"leading whitespace", "\x06" + zeros(7) + "\t\n{}\r ", "does not start with '{'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readBytes([]byte(tt.file))
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}

	// What the accepted ones hold.
	f, err := readBytes(stBytes(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, f32Bytes(0, 1, 2, 3, 4, 5)))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := f.float32s(f.tensor("attn.0")); err != nil || !slices.Equal(v, []float32{0, 1, 2, 3, 4, 5}) {
		t.Errorf("attn.0 = %v, %v; want 0..5", v, err)
	}
	f, err = readBytes([]byte("\x28" + zeros(7) + `{"__metadata__":{"framework":"pt"}}     `))
	if err != nil || f.metadata["framework"] != "pt" || len(f.tensors) != 0 {
		t.Errorf("metadata only: %+v, %v", f, err)
	}
	f, err = readBytes([]byte("<" + zeros(7) + `{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}`))
	if err != nil || !slices.Equal(f.tensor("test").shape, []int64{2, 0}) {
		t.Errorf("zero-sized: %+v, %v", f, err)
	}
	if v, err := f.int32s(f.tensor("test")); err != nil || len(v) != 0 {
		t.Errorf("zero-sized tensor read as %v, %v", v, err)
	}
}

func jsonAttackHeader() string {
	var parts []string
	for i := range 10 {
		parts = append(parts, fmt.Sprintf(`"weight_%d":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}`, i))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestReadSafetensorsRejects is the malformed files, each refused with an
// error that says what is wrong.
func TestReadSafetensorsRejects(t *testing.T) {
	entry := func(name, dtype, shape string, begin, end int) string {
		return fmt.Sprintf(`"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, dtype, shape, begin, end)
	}
	valid := weightsFile(t, tinyConfig())
	withLength := func(n uint64) []byte {
		out := slices.Clone(valid)
		binary.LittleEndian.PutUint64(out, n)
		return out
	}
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"empty file", nil, "file of 0 bytes, too short"},
		{"truncated length", valid[:5], "too short"},
		{"truncated header", valid[:40], "header length"},
		{"truncated data", valid[:len(valid)-1], `tensor "b2": data_offsets`},
		{"header length over the limit", withLength(stMaxHeader + 1), "header length 100000001 is over the limit of 100000000 bytes"},
		{"header length past the file", withLength(uint64(len(valid))), "runs past the end of the file"},
		{"header length of 2^64-1", withLength(math.MaxUint64), "over the limit"},
		{"bad JSON", stBytes(`{"a":{"dtype":"F32",`, nil), "header: not valid JSON"},
		{"not an object", stBytes(`[1,2]`, nil), "does not start with '{'"},
		{"empty header", stBytes(``, nil), "does not start with '{'"},
		{"two objects", stBytes(`{} {}`, nil), "bytes after the object"},
		{"trailing garbage", stBytes(`{}x`, nil), "header: 1 more bytes after the object"},
		{"duplicate tensor", stBytes(`{`+entry("a", "F32", "[1]", 0, 4)+","+entry("a", "F32", "[1]", 4, 8)+`}`, make([]byte, 8)), `key "a" appears twice`},
		{"duplicate field", stBytes(`{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)), `key "dtype" appears twice`},
		{"unknown field", stBytes(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}}`, make([]byte, 4)), `tensor "a": unknown field "stride"`},
		{"no offsets", stBytes(`{"a":{"dtype":"F32","shape":[1]}}`, make([]byte, 4)), `tensor "a": no data_offsets`},
		{"entry not an object", stBytes(`{"a":[1]}`, nil), `tensor "a": found '[', want an object`},
		{"dtype not a string", stBytes(`{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)), "dtype is 32, want a string"},
		{"negative dim", stBytes(`{`+entry("a", "F32", "[-1]", 0, 4)+`}`, make([]byte, 4)), "-1 is not a non-negative integer"},
		{"fractional dim", stBytes(`{`+entry("a", "F32", "[1.0]", 0, 4)+`}`, make([]byte, 4)), "1.0 is not a non-negative integer"},
		{"exponent dim", stBytes(`{`+entry("a", "F32", "[1e0]", 0, 4)+`}`, make([]byte, 4)), "1e0 is not a non-negative integer"},
		{"quoted dim", stBytes(`{`+entry("a", "F32", `["1"]`, 0, 4)+`}`, make([]byte, 4)), `"1" is not a non-negative integer`},
		{"null dim", stBytes(`{`+entry("a", "F32", `[null]`, 0, 4)+`}`, make([]byte, 4)), `null is not a non-negative integer`},
		{"null shape", stBytes(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, make([]byte, 4)), "shape: null is not an array"},
		{"three offsets", stBytes(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, make([]byte, 4)), "data_offsets has 3 numbers"},
		{"unknown dtype", stBytes(`{`+entry("a", "F4", "[2]", 0, 1)+`}`, make([]byte, 1)), `tensor "a": dtype "F4" is not one this reader knows`},
		{"shape and offsets disagree", stBytes(`{`+entry("a", "F32", "[2,3]", 0, 20)+`}`, make([]byte, 20)), `tensor "a": shape [2 3] of F32 is 24 bytes, but data_offsets [0, 20] hold 20`},
		{"offsets reversed", stBytes(`{`+entry("a", "F32", "[0]", 4, 0)+`}`, make([]byte, 4)), "end before they begin"},
		{"offsets past the buffer", stBytes(`{`+entry("a", "F32", "[2]", 0, 8)+`}`, make([]byte, 4)), "run past the data buffer (4 bytes)"},
		{"overlap", stBytes(`{`+entry("a", "F32", "[2]", 0, 8)+","+entry("b", "F32", "[2]", 4, 12)+`}`, make([]byte, 12)), `tensor "b": data_offsets [4, 12] overlap tensor "a"'s [0, 8]`},
		{"zero-sized inside another", stBytes(`{`+entry("a", "F32", "[2]", 0, 8)+","+entry("b", "F32", "[0]", 4, 4)+`}`, make([]byte, 8)), "overlap"},
		{"gap", stBytes(`{`+entry("a", "F32", "[1]", 0, 4)+","+entry("b", "F32", "[1]", 8, 12)+`}`, make([]byte, 12)), `data buffer bytes [4, 8) belong to no tensor (a gap before "b")`},
		{"gap at the start", stBytes(`{`+entry("a", "F32", "[1]", 4, 8)+`}`, make([]byte, 8)), "bytes [0, 4) belong to no tensor"},
		{"bytes after the last tensor", stBytes(`{`+entry("a", "F32", "[1]", 0, 4)+`}`, make([]byte, 8)), "data buffer is 8 bytes but its tensors end at 4"},
		{"metadata not strings", stBytes(`{"__metadata__":{"max_tokens":8}}`, nil), `__metadata__: "max_tokens" is 8, want a string`},
		{"metadata not an object", stBytes(`{"__metadata__":"v1"}`, nil), "__metadata__"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readBytes(tt.file)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "safetensors: ") {
				t.Errorf("error %q does not say it is about the file format", err)
			}
			// The weights loader refuses them too, with the same error.
			if _, _, werr := ReadEmbedWeights(bytes.NewReader(tt.file), int64(len(tt.file))); werr == nil || werr.Error() != err.Error() {
				t.Errorf("ReadEmbedWeights: %v, want %v", werr, err)
			}
		})
	}
}

// TestReadEmbedWeightsRejects is well-formed safetensors files that are not
// weights of the reference model.
func TestReadEmbedWeightsRejects(t *testing.T) {
	cfg := tinyConfig()
	gen := GenerateEmbedWeights(cfg)
	meta := func(kv ...string) map[string]string {
		return withMetadata(map[string]string{"format": EmbedWeightsFormat, "max_tokens": "8"}, kv...)
	}
	// tensors are the generated ones, with changes: a tensor replaced,
	// added (a name not among the five) or, with a nil shape, removed.
	tensors := func(changes ...stOut) []stOut {
		ts := []stOut{
			{name: "embedding", shape: []int64{5, 3}, f32: gen.Embedding},
			{name: "w1", shape: []int64{3, 4}, f32: gen.W1},
			{name: "b1", shape: []int64{4}, f32: gen.B1},
			{name: "w2", shape: []int64{4, 2}, f32: gen.W2},
			{name: "b2", shape: []int64{2}, f32: gen.B2},
		}
		for _, c := range changes {
			i := slices.IndexFunc(ts, func(t stOut) bool { return t.name == c.name })
			switch {
			case i < 0:
				ts = append(ts, c)
			case c.shape == nil:
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
		tensors []stOut
		want    string
	}{
		{"wrong dtype", meta(), tensors(stOut{name: "w1", shape: []int64{3, 4}, dtype: "I32", raw: make([]byte, 48)}), `tensor "w1" is I32, want F32`},
		{"F64", meta(), tensors(stOut{name: "b2", shape: []int64{2}, dtype: "F64", raw: make([]byte, 16)}), `tensor "b2" is F64, want F32`},
		{"missing tensor", meta(), tensors(stOut{name: "b2"}), "no tensor b2 (a weights file holds embedding, w1, b1, w2, b2)"},
		{"two missing", meta(), tensors(stOut{name: "b1"}, stOut{name: "embedding"}), "no tensor embedding, b1"},
		{"extra tensor", meta(), tensors(stOut{name: "ln.weight", shape: []int64{2}, f32: []float32{1, 1}}), `unexpected tensor "ln.weight"`},
		{"renamed (PyTorch names)", meta(), tensors(stOut{name: "w1"}, stOut{name: "fc1.weight", shape: []int64{4, 3}, f32: gen.W1}), "no tensor w1"},
		{"w1 not transposed", meta(), tensors(stOut{name: "w1", shape: []int64{4, 3}, f32: gen.W1}), "tensor w1 has shape [4 3], want [Dim, Hidden] with Dim = 3 as tensor embedding has it"},
		{"b1 disagrees", meta(), tensors(stOut{name: "b1", shape: []int64{3}, f32: gen.B1[:3]}), "tensor b1 has shape [3], want [Hidden] with Hidden = 4 as tensor w1 has it"},
		{"w2 disagrees", meta(), tensors(stOut{name: "w2", shape: []int64{2, 4}, f32: gen.W2}), "tensor w2 has shape [2 4], want [Hidden, Out] with Hidden = 4"},
		{"b2 disagrees", meta(), tensors(stOut{name: "b2", shape: []int64{1}, f32: gen.B2[:1]}), "tensor b2 has shape [1], want [Out] with Out = 2 as tensor w2 has it"},
		{"embedding 1-D", meta(), tensors(stOut{name: "embedding", shape: []int64{15}, f32: gen.Embedding}), "tensor embedding has shape [15], want [Vocab, Dim]"},
		{"b1 2-D", meta(), tensors(stOut{name: "b1", shape: []int64{1, 4}, f32: gen.B1}), "tensor b1 has shape [1 4], want [Hidden]"},
		{"vocab of 1", meta(), tensors(stOut{name: "embedding", shape: []int64{1, 3}, f32: gen.Embedding[:3]}), "Vocab is 1, want 2 to"},
		{"no format", meta("format", ""), tensors(), `no "format" in the metadata; want "vramq-ref-embed-v1"`},
		{"other format", meta("format", "pt"), tensors(), `metadata format is "pt", want "vramq-ref-embed-v1"`},
		{"no max_tokens", meta("max_tokens", ""), tensors(), `no "max_tokens" in the metadata`},
		{"bad max_tokens", meta("max_tokens", "8x"), tensors(), `metadata max_tokens "8x" is not an integer`},
		{"zero max_tokens", meta("max_tokens", "0"), tensors(), "MaxTokens is 0"},
		{"bad seed", meta("seed", "-1"), tensors(), `metadata seed "-1" is not an unsigned integer`},
		{"NaN", meta(), tensors(stOut{name: "w2", shape: []int64{4, 2}, f32: nan}), "w2[5] is NaN: every weight must be finite"},
		{"infinity", meta(), tensors(stOut{name: "b1", shape: []int64{4}, f32: inf}), "b1[0] is -Inf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := writeSafetensors(&buf, tt.meta, tt.tensors); err != nil {
				t.Fatal(err)
			}
			if _, err := readBytes(buf.Bytes()); err != nil {
				t.Fatalf("not a valid safetensors file: %v", err)
			}
			w, _, err := ReadEmbedWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
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
	if err := writeSafetensors(&buf, meta("source", "a test", "licence", "none"), tensors()); err != nil {
		t.Fatal(err)
	}
	if _, got, err := ReadEmbedWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil || got.Seed != 0 || got.MaxTokens != 8 {
		t.Errorf("extra metadata: config %+v, %v; want seed 0, max tokens 8", got, err)
	}
}

// TestReadEmbedWeightsHalfPrecision loads F16 and BF16 tensors, which
// widen to float32 exactly.
func TestReadEmbedWeightsHalfPrecision(t *testing.T) {
	cfg := tinyConfig()
	gen := GenerateEmbedWeights(cfg)
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
	w1Want := []float32{1, -2, 0.5, 65504, 0x1p-24, float32(math.Copysign(0, -1)), 0.333251953125, 0x3ffp-24, 0x1p-14, -1, 0.0999755859375, 3.140625}
	var w1Raw []byte
	for _, h := range f16 {
		w1Raw = binary.LittleEndian.AppendUint16(w1Raw, h)
	}
	var buf bytes.Buffer
	err := writeSafetensors(&buf, map[string]string{"format": EmbedWeightsFormat, "max_tokens": "8"}, []stOut{
		{name: "embedding", shape: []int64{5, 3}, dtype: "BF16", raw: embRaw},
		{name: "w1", shape: []int64{3, 4}, dtype: "F16", raw: w1Raw},
		{name: "b1", shape: []int64{4}, f32: gen.B1},
		{name: "w2", shape: []int64{4, 2}, f32: gen.W2},
		{name: "b2", shape: []int64{2}, f32: gen.B2},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, _, err := ReadEmbedWeights(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(w.Embedding, embWant) {
		t.Errorf("BF16 embedding = %v, want %v", w.Embedding, embWant)
	}
	if !sameBits(w.W1, w1Want) {
		t.Errorf("F16 w1 = %v, want %v", w.W1, w1Want)
	}
}

// TestF16ToF32 checks every binary16 value against its definition,
// (-1)^s × 2^(e-15) × 1.m, or 2^-14 × 0.m for subnormals.
func TestF16ToF32(t *testing.T) {
	for h := range 1 << 16 {
		got := f16ToF32(uint16(h))
		sign, exp, mant := h>>15, (h>>10)&0x1f, h&0x3ff
		var want float64
		switch {
		case exp == 0x1f && mant == 0:
			want = math.Inf(1)
		case exp == 0x1f:
			if !math.IsNaN(float64(got)) || math.Float32bits(got)>>13&0x3ff != uint32(mant) {
				t.Fatalf("f16ToF32(%#04x) = %v (%#08x), want NaN with payload %#x", h, got, math.Float32bits(got), mant)
			}
			continue
		case exp == 0:
			want = math.Ldexp(float64(mant)/1024, -14)
		default:
			want = math.Ldexp(1+float64(mant)/1024, exp-15)
		}
		if sign == 1 {
			want = math.Copysign(want, -1)
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("f16ToF32(%#04x) = %v, want %v", h, got, want)
		}
	}
	if got := bf16ToF32(0x3f80); got != 1 {
		t.Errorf("bf16ToF32(0x3f80) = %v, want 1", got)
	}
	if got := bf16ToF32(0xc049); got != -3.140625 {
		t.Errorf("bf16ToF32(0xc049) = %v, want -3.140625", got)
	}
}

func TestWriteSafetensorsRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		tensors []stOut
		want    string
	}{
		{"shape and data", []stOut{{name: "a", shape: []int64{3}, f32: []float32{1, 2}}}, "8 bytes of data for shape [3] of F32"},
		{"negative dim", []stOut{{name: "a", shape: []int64{-1, -2}, f32: []float32{1, 2}}}, "shape [-1 -2]"},
		{"unknown dtype", []stOut{{name: "a", shape: []int64{1}, dtype: "F4", raw: []byte{0}}}, `unknown dtype "F4"`},
		{"duplicate", []stOut{{name: "a", shape: []int64{1}, f32: []float32{1}}, {name: "a", shape: []int64{1}, f32: []float32{1}}}, `"a" used twice`},
		{"reserved", []stOut{{name: "__metadata__", shape: []int64{1}, f32: []float32{1}}}, "reserved"},
	} {
		var buf bytes.Buffer
		if err := writeSafetensors(&buf, nil, tt.tensors); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
		if buf.Len() > 0 {
			t.Errorf("%s: wrote %d bytes before refusing", tt.name, buf.Len())
		}
	}
	// A failing writer's error comes back.
	errDisk := errors.New("disk full")
	if err := WriteEmbedWeights(failingWriter{errDisk}, tinyConfig(), GenerateEmbedWeights(tinyConfig())); !errors.Is(err, errDisk) {
		t.Errorf("failing writer: %v, want %v", err, errDisk)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// TestReadSafetensorsShortReader reads through a ReaderAt that ends before
// the size it was given: an error, not a panic or a short tensor.
func TestReadSafetensorsShortReader(t *testing.T) {
	file := weightsFile(t, tinyConfig())
	for _, cut := range []int{4, 30, len(file) - 3} {
		_, _, err := ReadEmbedWeights(bytes.NewReader(file[:cut]), int64(len(file)))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
}
