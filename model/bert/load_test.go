package bert

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/safetensors"
)

// copyModel copies testdata/model/<name> into a temporary directory that a
// test may change.
func copyModel(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("testdata", "model", name)
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// editJSON rewrites the JSON object file dir/name with edit.
func editJSON(t *testing.T, dir, name string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	writeJSON(t, path, m)
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rewriteWeights reads dir/model.safetensors (F32), lets edit change its
// tensors, and writes it back.
func rewriteWeights(t *testing.T, dir string, edit func([]safetensors.Tensor) []safetensors.Tensor) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := safetensors.Open(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, name := range st.Names() {
		info, _ := st.Tensor(name)
		if info.DType != "F32" {
			continue // the position_ids buffer: not needed to load
		}
		v, err := st.Float32s(name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, safetensors.Tensor{Name: name, Shape: info.Shape, Values: v})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, nil, edit(ts)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadRefuses checks that what the encoder cannot run exactly is
// refused at load, with an error naming the file and the field or tensor.
func TestLoadRefuses(t *testing.T) {
	config := func(edit func(map[string]any)) func(*testing.T, string) {
		return func(t *testing.T, dir string) { editJSON(t, dir, "config.json", edit) }
	}
	pooling := func(edit func(map[string]any)) func(*testing.T, string) {
		return func(t *testing.T, dir string) { editJSON(t, dir, "1_Pooling/config.json", edit) }
	}
	modules := func(mods ...string) func(*testing.T, string) {
		return func(t *testing.T, dir string) {
			var v []map[string]any
			for i, m := range mods {
				path := []string{"", "1_Pooling", "2_Normalize", "3_Dense"}[i]
				v = append(v, map[string]any{"idx": i, "name": "x", "path": path, "type": "sentence_transformers.models." + m})
			}
			writeJSON(t, filepath.Join(dir, "modules.json"), v)
		}
	}
	weights := func(edit func([]safetensors.Tensor) []safetensors.Tensor) func(*testing.T, string) {
		return func(t *testing.T, dir string) { rewriteWeights(t, dir, edit) }
	}
	tests := []struct {
		name  string
		setup func(*testing.T, string)
		want  []string // all in the error
	}{
		{"another model type", config(func(m map[string]any) { m["model_type"] = "roberta" }), []string{"config.json", "model_type", "roberta"}},
		{"no model type", config(func(m map[string]any) { delete(m, "model_type") }), []string{"config.json", "model_type", "missing"}},
		{"another architecture", config(func(m map[string]any) { m["architectures"] = []string{"NomicBertModel"} }),
			[]string{"config.json", "architectures", "NomicBertModel"}},
		{"tanh gelu", config(func(m map[string]any) { m["hidden_act"] = "gelu_new" }), []string{"config.json", "hidden_act", "gelu_new"}},
		{"relu", config(func(m map[string]any) { m["hidden_act"] = "relu" }), []string{"config.json", "hidden_act", "relu"}},
		{"relative positions", config(func(m map[string]any) { m["position_embedding_type"] = "relative_key_query" }),
			[]string{"config.json", "position_embedding_type", "relative_key_query"}},
		{"rotary positions", config(func(m map[string]any) { m["position_embedding_type"] = "rotary" }),
			[]string{"config.json", "position_embedding_type", "rotary"}},
		{"decoder", config(func(m map[string]any) { m["is_decoder"] = true }), []string{"config.json", "is_decoder"}},
		{"missing size", config(func(m map[string]any) { delete(m, "hidden_size") }), []string{"config.json", "hidden_size", "missing"}},
		{"heads do not divide", config(func(m map[string]any) { m["num_attention_heads"] = 5 }), []string{"config.json", "num_attention_heads"}},
		{"zero layers", config(func(m map[string]any) { m["num_hidden_layers"] = 0 }), []string{"config.json", "num_hidden_layers"}},
		{"bad eps", config(func(m map[string]any) { m["layer_norm_eps"] = -1 }), []string{"config.json", "layer_norm_eps"}},
		{"not json", func(t *testing.T, dir string) { os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o644) },
			[]string{"config.json"}},
		{"a dense module", modules("Transformer", "Pooling", "Normalize", "Dense"), []string{"modules.json", "4 modules"}},
		{"dense instead of normalize", modules("Transformer", "Pooling", "Dense"), []string{"modules.json", "module 2", "Dense"}},
		{"no pooling", modules("Transformer", "Normalize"), []string{"modules.json", "module 1", "Normalize"}},
		{"pooling path outside", func(t *testing.T, dir string) {
			writeJSON(t, filepath.Join(dir, "modules.json"), []map[string]any{
				{"idx": 0, "path": "", "type": moduleTransformer}, {"idx": 1, "path": "../1_Pooling", "type": modulePooling},
			})
		}, []string{"modules.json", "../1_Pooling"}},
		{"mean sqrt len pooling", pooling(func(m map[string]any) {
			m["pooling_mode_mean_tokens"] = false
			m["pooling_mode_mean_sqrt_len_tokens"] = true
		}), []string{"1_Pooling/config.json", "pooling_mode_mean_sqrt_len_tokens"}},
		{"two poolings", pooling(func(m map[string]any) { m["pooling_mode_cls_token"] = true }),
			[]string{"1_Pooling/config.json", "pooling_mode_cls_token", "pooling_mode_mean_tokens"}},
		{"no pooling mode", pooling(func(m map[string]any) { m["pooling_mode_mean_tokens"] = false }),
			[]string{"1_Pooling/config.json", "exactly one"}},
		{"pooling width", pooling(func(m map[string]any) { m["word_embedding_dimension"] = 384 }),
			[]string{"1_Pooling/config.json", "word_embedding_dimension"}},
		{"max_seq_length past positions", func(t *testing.T, dir string) {
			editJSON(t, dir, "sentence_bert_config.json", func(m map[string]any) { m["max_seq_length"] = 129 })
		}, []string{"sentence_bert_config.json", "max_seq_length", "129"}},
		{"missing tensor", weights(func(ts []safetensors.Tensor) []safetensors.Tensor {
			return deleteTensor(ts, "encoder.layer.1.intermediate.dense.bias")
		}), []string{"model.safetensors", `"encoder.layer.1.intermediate.dense.bias"`, "missing"}},
		{"missing key projection", weights(func(ts []safetensors.Tensor) []safetensors.Tensor {
			return deleteTensor(ts, "encoder.layer.0.attention.self.key.weight")
		}), []string{"model.safetensors", `"encoder.layer.0.attention.self.key.weight"`, "missing"}},
		{"shape against config", config(func(m map[string]any) { m["vocab_size"] = 513 }),
			[]string{"model.safetensors", `"embeddings.word_embeddings.weight"`, "[512 64]", "[513 64]"}},
		{"not finite", weights(func(ts []safetensors.Tensor) []safetensors.Tensor {
			for _, t := range ts {
				if t.Name == "encoder.layer.0.output.dense.weight" {
					t.Values[7] = float32(posInf())
				}
			}
			return ts
		}), []string{"model.safetensors", `"encoder.layer.0.output.dense.weight"`, "element 7"}},
		{"no weights", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model.safetensors")) }, []string{"model.safetensors"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyModel(t, "tiny-f32")
			tt.setup(t, dir)
			m, err := Load(dir)
			if err == nil {
				t.Fatalf("Load took it: %+v", m.Config())
			}
			t.Log(err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func deleteTensor(ts []safetensors.Tensor, name string) []safetensors.Tensor {
	var out []safetensors.Tensor
	for _, t := range ts {
		if t.Name != name {
			out = append(out, t)
		}
	}
	return out
}

func posInf() float64 { return math.Inf(1) }

// TestLoadVariants checks what Load accepts and what it makes of it.
func TestLoadVariants(t *testing.T) {
	golden := readGolden(t, filepath.Join("testdata", "model", "tiny-f32"))
	batch := golden.Batches[0]
	check := func(t *testing.T, m *Model, key string) {
		t.Helper()
		got, err := m.Embed(batch.IDs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if d := maxAbsDiff(got[i], batch.Outputs[key][i]); d > goldenTolerance {
				t.Errorf("item %d differs from ONNX Runtime's %s by %.3g", i, key, d)
			}
		}
	}

	t.Run("as shipped", func(t *testing.T) {
		m, err := Load(filepath.Join("testdata", "model", "tiny-f32") + "/")
		if err != nil {
			t.Fatal(err)
		}
		if m.Name() != "tiny-f32" {
			t.Errorf("Name() = %q, want the directory's name", m.Name())
		}
		want := Sentence{Pooling: PoolMean, Normalize: true, MaxSeqLength: 128}
		if m.Sentence() != want || m.Dim() != 64 || m.MaxSeqLength() != 128 || m.WeightDType() != "F32" {
			t.Errorf("Sentence() = %+v, Dim() = %d, MaxSeqLength() = %d, WeightDType() = %q", m.Sentence(), m.Dim(), m.MaxSeqLength(),
				m.WeightDType())
		}
		c := m.Config()
		wantCfg := Config{VocabSize: 512, HiddenSize: 64, NumLayers: 2, NumHeads: 4, IntermediateSize: 128, MaxPositionEmbeddings: 128,
			TypeVocabSize: 2, LayerNormEps: 1e-12}
		if c != wantCfg {
			t.Errorf("Config() = %+v, want %+v", c, wantCfg)
		}
		// Embeddings, 2 layers, without the pooler or the unused token type.
		params := int64(512*64 + 128*64 + 64 + 2*64 + 2*(4*64*64+4*64+2*64+128*64+128+64*128+64+2*64))
		if m.WeightBytes() != 4*params {
			t.Errorf("WeightBytes() = %d, want %d", m.WeightBytes(), 4*params)
		}
		check(t, m, "mean_norm")
	})
	t.Run("plain Hugging Face directory: mean pooling, no normalization", func(t *testing.T) {
		dir := copyModel(t, "tiny-f32")
		for _, f := range []string{"modules.json", "sentence_bert_config.json"} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Sentence{Pooling: PoolMean, MaxSeqLength: 128}); m.Sentence() != want {
			t.Errorf("Sentence() = %+v, want %+v", m.Sentence(), want)
		}
		check(t, m, "mean")
	})
	t.Run("max pooling from the pooling config", func(t *testing.T) {
		dir := copyModel(t, "tiny-f32")
		editJSON(t, dir, "1_Pooling/config.json", func(m map[string]any) {
			m["pooling_mode_mean_tokens"] = false
			m["pooling_mode_max_tokens"] = true
		})
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		check(t, m, "max_norm")
	})
	t.Run("TensorFlow-era LayerNorm names and a bert. prefix", func(t *testing.T) {
		dir := copyModel(t, "tiny-f32")
		rewriteWeights(t, dir, func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				ts[i].Name = "bert." + strings.NewReplacer("LayerNorm.weight", "LayerNorm.gamma", "LayerNorm.bias", "LayerNorm.beta").Replace(ts[i].Name)
			}
			return ts
		})
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		check(t, m, "mean_norm")
	})
	t.Run("BF16 checkpoint", func(t *testing.T) {
		// The same weights rounded to bfloat16, once as BF16 and once as
		// the F32 values they widen to: the two must give equal vectors.
		bf16, widened := copyModel(t, "tiny-f32"), copyModel(t, "tiny-f32")
		var wide []safetensors.Tensor
		rewriteWeights(t, bf16, func(ts []safetensors.Tensor) []safetensors.Tensor {
			out := make([]safetensors.Tensor, len(ts))
			for i, t := range ts {
				raw := make([]byte, 2*len(t.Values))
				w := make([]float32, len(t.Values))
				for j, v := range t.Values {
					b := math.Float32bits(v)
					b += 0x7fff + (b>>16)&1 // round to nearest even; no NaN here
					raw[2*j], raw[2*j+1] = byte(b>>16), byte(b>>24)
					w[j] = math.Float32frombits(b &^ 0xffff)
				}
				out[i] = safetensors.Tensor{Name: t.Name, Shape: t.Shape, DType: "BF16", Raw: raw}
				wide = append(wide, safetensors.Tensor{Name: t.Name, Shape: t.Shape, Values: w})
			}
			return out
		})
		rewriteWeights(t, widened, func([]safetensors.Tensor) []safetensors.Tensor { return wide })
		mb, err := Load(bf16)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := Load(widened)
		if err != nil {
			t.Fatal(err)
		}
		if mb.WeightDType() != "BF16" || mw.WeightDType() != "F32" {
			t.Errorf("WeightDType() = %q and %q, want BF16 and F32", mb.WeightDType(), mw.WeightDType())
		}
		gb, err := mb.Embed(batch.IDs)
		if err != nil {
			t.Fatal(err)
		}
		gw, err := mw.Embed(batch.IDs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range gb {
			if d := maxAbsDiff(gb[i], gw[i]); d != 0 {
				t.Errorf("item %d: BF16 checkpoint and its widened F32 copy differ by %.3g", i, d)
			}
			// Rounding to bfloat16 does move the vectors: the test would
			// not notice a loader that ignored the file otherwise.
			if d := maxAbsDiff(gb[i], batch.Outputs["mean_norm"][i]); d < goldenTolerance {
				t.Errorf("item %d: BF16 weights give the F32 model's vector (%.3g apart)", i, d)
			}
		}
	})
	t.Run("shorter max_seq_length", func(t *testing.T) {
		dir := copyModel(t, "tiny-f32")
		editJSON(t, dir, "sentence_bert_config.json", func(m map[string]any) { m["max_seq_length"] = 16 })
		m, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxSeqLength() != 16 {
			t.Errorf("MaxSeqLength() = %d, want 16", m.MaxSeqLength())
		}
		if _, err := m.Embed([][]int32{make([]int32, 17)}); !errors.Is(err, fault.ErrInvalidInput) {
			t.Errorf("Embed of 17 tokens: %v, want ErrInvalidInput", err)
		}
	})
}

// TestEmbedRefuses checks that inputs the model cannot take are refused
// as invalid, before anything is computed.
func TestEmbedRefuses(t *testing.T) {
	m, err := Load(filepath.Join("testdata", "model", "tiny-f16"))
	if err != nil {
		t.Fatal(err)
	}
	ok := []int32{101, 7, 102}
	for name, ids := range map[string][][]int32{
		"empty item":    {ok, {}},
		"too long":      {make([]int32, 129)},
		"id past vocab": {ok, {101, 512, 102}},
		"negative id":   {{101, -1, 102}},
	} {
		if out, err := m.Embed(ids); !errors.Is(err, fault.ErrInvalidInput) {
			t.Errorf("%s: Embed = %d vectors, %v; want ErrInvalidInput", name, len(out), err)
		}
	}
	if out, err := m.Embed(nil); err != nil || len(out) != 0 {
		t.Errorf("Embed(nil) = %v, %v; want nothing", out, err)
	}
	if out, err := m.Embed([][]int32{make([]int32, 128)}); err != nil || len(out) != 1 {
		t.Errorf("Embed of max_position_embeddings tokens: %d vectors, %v", len(out), err)
	}
}
