package bert

import (
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/vramq/vramq/model/safetensors"
)

// weights are the encoder's parameters in float32. Linear layers are kept
// transposed from PyTorch's [out, in], as [in, out] row-major, the layout
// both matrix-product backends take without a transposed variant; the
// query, key and value projections are side by side in one
// [hidden, 3·hidden] matrix so that one product computes all three.
type weights struct {
	word, pos   []float32 // [vocab, hidden], [max_position, hidden]
	tokenType0  []float32 // [hidden]: row 0, the only token type a sentence encoder uses
	embLN       layerNorm
	layers      []layerWeights
	parameters  int64 // float32 values held
	sourceDType string
}

type layerNorm struct{ gamma, beta []float32 }

type layerWeights struct {
	qkvW, qkvB         []float32 // [h, 3h], [3h]
	attnOutW, attnOutB []float32 // [h, h], [h]
	attnLN             layerNorm
	interW, interB     []float32 // [h, i], [i]
	outW, outB         []float32 // [i, h], [h]
	outLN              layerNorm
}

// tensorReader reads the tensors of one checkpoint by their Hugging Face
// names, with the "bert." prefix that BertFor* heads put in front when the
// file has it, checking each shape against the config.
type tensorReader struct {
	st     *safetensors.File
	file   string
	prefix string
	dtypes map[string]bool
	n      int64
}

func (r *tensorReader) read(name string, shape ...int) ([]float32, error) {
	full := r.prefix + name
	info, ok := r.st.Tensor(full)
	if !ok {
		// Checkpoints from the original TensorFlow port name LayerNorm's
		// parameters gamma and beta; Hugging Face renames them on load.
		if alt, renamed := legacyLayerNormName(full); renamed {
			if info, ok = r.st.Tensor(alt); ok {
				full = alt
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q is missing", r.file, r.prefix+name)
	}
	want := make([]int64, len(shape))
	for i, d := range shape {
		want[i] = int64(d)
	}
	if !slices.Equal(info.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v from config.json", r.file, full, info.Shape, want)
	}
	v, err := r.st.Float32s(full)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.file, err)
	}
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%s: tensor %q: element %d is %v", r.file, full, i, x)
		}
	}
	r.dtypes[info.DType] = true
	r.n += int64(len(v))
	return v, nil
}

func legacyLayerNormName(name string) (string, bool) {
	for _, s := range [][2]string{{"LayerNorm.weight", "LayerNorm.gamma"}, {"LayerNorm.bias", "LayerNorm.beta"}} {
		if len(name) > len(s[0]) && name[len(name)-len(s[0]):] == s[0] {
			return name[:len(name)-len(s[0])] + s[1], true
		}
	}
	return "", false
}

// readWeights reads dir/model.safetensors for cfg. Tensors the encoder does
// not use (embeddings.position_ids, the pooler, masked-LM or other heads)
// are left unread.
func readWeights(path string, cfg Config) (*weights, error) {
	const file = "model.safetensors"
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, err := safetensors.Open(f, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	r := &tensorReader{st: st, file: file, dtypes: map[string]bool{}}
	if _, ok := st.Tensor("bert.embeddings.word_embeddings.weight"); ok {
		r.prefix = "bert."
	}

	h, in := cfg.HiddenSize, cfg.IntermediateSize
	w := &weights{}
	var errs error
	get := func(name string, shape ...int) []float32 {
		if errs != nil {
			return nil
		}
		v, err := r.read(name, shape...)
		errs = err
		return v
	}
	ln := func(prefix string) layerNorm {
		return layerNorm{gamma: get(prefix+".weight", h), beta: get(prefix+".bias", h)}
	}
	w.word = get("embeddings.word_embeddings.weight", cfg.VocabSize, h)
	w.pos = get("embeddings.position_embeddings.weight", cfg.MaxPositionEmbeddings, h)
	if tt := get("embeddings.token_type_embeddings.weight", cfg.TypeVocabSize, h); tt != nil {
		w.tokenType0 = slices.Clone(tt[:h])
	}
	w.embLN = ln("embeddings.LayerNorm")
	for l := range cfg.NumLayers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		var lw layerWeights
		q := get(p+"attention.self.query.weight", h, h)
		k := get(p+"attention.self.key.weight", h, h)
		v := get(p+"attention.self.value.weight", h, h)
		lw.qkvW = transpose(slices.Concat(q, k, v), 3*h, h)
		lw.qkvB = slices.Concat(get(p+"attention.self.query.bias", h), get(p+"attention.self.key.bias", h), get(p+"attention.self.value.bias", h))
		lw.attnOutW = transpose(get(p+"attention.output.dense.weight", h, h), h, h)
		lw.attnOutB = get(p+"attention.output.dense.bias", h)
		lw.attnLN = ln(p + "attention.output.LayerNorm")
		lw.interW = transpose(get(p+"intermediate.dense.weight", in, h), in, h)
		lw.interB = get(p+"intermediate.dense.bias", in)
		lw.outW = transpose(get(p+"output.dense.weight", h, in), h, in)
		lw.outB = get(p+"output.dense.bias", h)
		lw.outLN = ln(p + "output.LayerNorm")
		w.layers = append(w.layers, lw)
	}
	if errs != nil {
		return nil, errs
	}
	// The token-type table is read whole (to check its shape) but only
	// row 0 is kept; count what is held.
	w.parameters = r.n - int64((cfg.TypeVocabSize-1)*h)
	w.sourceDType = strings.Join(slices.Sorted(maps.Keys(r.dtypes)), "+")
	return w, nil
}

// transpose returns the [cols, rows] transpose of the row-major [rows,
// cols] matrix m, or nil if m is not whole (a part failed to load: the
// error is already recorded).
func transpose(m []float32, rows, cols int) []float32 {
	if len(m) != rows*cols {
		return nil
	}
	t := make([]float32, len(m))
	for r := range rows {
		for c, v := range m[r*cols : (r+1)*cols] {
			t[c*rows+r] = v
		}
	}
	return t
}
