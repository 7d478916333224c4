package gpu

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// EmbedWeightsFormat is the "format" metadata of a weights file of the
// reference embedding model. A loader checks it so that a safetensors file
// of some other model, which could happen to hold tensors of these names,
// is refused rather than run.
//
// A weights file is a safetensors file holding exactly these five tensors,
// float32 (dtype F32) little-endian, row-major, laid out exactly as
// EmbedWeights holds them:
//
//	embedding  [Vocab, Dim]     row t is token t's vector
//	w1         [Dim, Hidden]    x·w1: rows are inputs, columns outputs
//	b1         [Hidden]
//	w2         [Hidden, Out]
//	b2         [Out]
//
// PyTorch's nn.Linear keeps its weight as [out, in], the transpose of w1
// and w2: export linear.weight.T.contiguous(). F16 and BF16 tensors are
// accepted too and widened to float32 on load (exactly), since trained
// checkpoints are often kept in half precision.
//
// Its metadata ("__metadata__") holds strings:
//
//	format      "vramq-ref-embed-v1" (required)
//	max_tokens  EmbedConfig.MaxTokens, decimal (required): the tokenizer's
//	            cut-off, which the tensors cannot tell
//	seed        EmbedConfig.Seed, decimal (optional): the seed generated
//	            weights came from; absent means 0, as for trained weights
//
// Vocab, Dim, Hidden and Out are read from the shapes, which must agree with
// each other. Other metadata is ignored: the format allows free-form
// metadata (a source, a licence) and none of it changes the computation.
//
// A file holding any tensor besides the five is refused, not read in part:
// an extra tensor (a layer norm, a second layer) means a model of another
// architecture, and running its first layers alone would give wrong
// embeddings with no error.
const EmbedWeightsFormat = "vramq-ref-embed-v1"

// The tensors of a weights file, in the order WriteEmbedWeights lays them out.
const (
	tensorEmbedding = "embedding"
	tensorW1        = "w1"
	tensorB1        = "b1"
	tensorW2        = "w2"
	tensorB2        = "b2"
)

var embedTensorNames = []string{tensorEmbedding, tensorW1, tensorB1, tensorW2, tensorB2}

// LoadEmbedWeights reads a weights file of the reference model (see
// EmbedWeightsFormat for its layout) and the configuration its shapes and
// metadata give. The configuration is valid, the weights match it and
// are all finite.
func LoadEmbedWeights(path string) (*EmbedWeights, EmbedConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, EmbedConfig{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, EmbedConfig{}, err
	}
	w, cfg, err := ReadEmbedWeights(f, st.Size())
	if err != nil {
		return nil, EmbedConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return w, cfg, nil
}

// ReadEmbedWeights is LoadEmbedWeights for a file of size bytes read
// through r. It checks the header, names, shapes and configuration before
// reading any tensor, so a file that would be refused costs no memory for
// its tensors, and reads each tensor once, straight into its slice.
func ReadEmbedWeights(r io.ReaderAt, size int64) (*EmbedWeights, EmbedConfig, error) {
	f, err := readSafetensors(r, size)
	if err != nil {
		return nil, EmbedConfig{}, err
	}
	cfg, err := embedConfigOf(f)
	if err != nil {
		return nil, EmbedConfig{}, fmt.Errorf("embed weights: %w", err)
	}
	var w EmbedWeights
	for _, t := range []struct {
		name string
		dst  *[]float32
	}{
		{tensorEmbedding, &w.Embedding},
		{tensorW1, &w.W1},
		{tensorB1, &w.B1},
		{tensorW2, &w.W2},
		{tensorB2, &w.B2},
	} {
		v, err := f.float32s(f.tensor(t.name))
		if err != nil {
			return nil, EmbedConfig{}, fmt.Errorf("embed weights: %w", err)
		}
		if i := slices.IndexFunc(v, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }); i >= 0 {
			return nil, EmbedConfig{}, fmt.Errorf("embed weights: %s[%d] is %v: every weight must be finite", t.name, i, v[i])
		}
		*t.dst = v
	}
	return &w, cfg, nil
}

// embedConfigOf checks f's metadata, tensor names and shapes, and returns
// the configuration they describe.
func embedConfigOf(f *safetensorsFile) (EmbedConfig, error) {
	switch format, ok := f.metadata["format"]; {
	case !ok:
		return EmbedConfig{}, fmt.Errorf("no \"format\" in the metadata; want %q", EmbedWeightsFormat)
	case format != EmbedWeightsFormat:
		return EmbedConfig{}, fmt.Errorf("metadata format is %q, want %q", format, EmbedWeightsFormat)
	}

	var missing, extra []string
	for _, name := range embedTensorNames {
		if f.tensor(name) == nil {
			missing = append(missing, name)
		}
	}
	for _, t := range f.tensors {
		if !slices.Contains(embedTensorNames, t.name) {
			extra = append(extra, strconv.Quote(t.name))
		}
	}
	if len(missing) > 0 {
		return EmbedConfig{}, fmt.Errorf("no tensor %s (a weights file holds %s)", strings.Join(missing, ", "), strings.Join(embedTensorNames, ", "))
	}
	if len(extra) > 0 {
		return EmbedConfig{}, fmt.Errorf("unexpected tensor %s: a weights file holds exactly %s, and another tensor means another architecture", strings.Join(extra, ", "), strings.Join(embedTensorNames, ", "))
	}

	// Each dimension is read from the first tensor it shapes and checked
	// against every later one.
	var cfg EmbedConfig
	type dim struct {
		name string
		v    *int
		from string // the tensor that set v; "" while unset
	}
	vocab, width := &dim{name: "Vocab", v: &cfg.Vocab}, &dim{name: "Dim", v: &cfg.Dim}
	hidden, out := &dim{name: "Hidden", v: &cfg.Hidden}, &dim{name: "Out", v: &cfg.Out}
	want := func(name string, dims ...*dim) error {
		t := f.tensor(name)
		names := make([]string, len(dims))
		for i, d := range dims {
			names[i] = d.name
		}
		if len(t.shape) != len(dims) {
			return fmt.Errorf("tensor %s has shape %v, want [%s]", name, t.shape, strings.Join(names, ", "))
		}
		for i, d := range dims {
			n := t.shape[i]
			switch {
			case n > math.MaxInt32: // beyond any valid config; keeps the int exact
				return fmt.Errorf("tensor %s has shape %v: %s %d is too large", name, t.shape, d.name, n)
			case d.from != "" && int64(*d.v) != n:
				return fmt.Errorf("tensor %s has shape %v, want [%s] with %s = %d as tensor %s has it",
					name, t.shape, strings.Join(names, ", "), d.name, *d.v, d.from)
			}
			*d.v, d.from = int(n), name
		}
		return nil
	}
	for _, t := range []struct {
		name string
		dims []*dim
	}{
		{tensorEmbedding, []*dim{vocab, width}},
		{tensorW1, []*dim{width, hidden}},
		{tensorB1, []*dim{hidden}},
		{tensorW2, []*dim{hidden, out}},
		{tensorB2, []*dim{out}},
	} {
		if err := want(t.name, t.dims...); err != nil {
			return EmbedConfig{}, err
		}
	}

	mt, ok := f.metadata["max_tokens"]
	if !ok {
		return EmbedConfig{}, fmt.Errorf("no \"max_tokens\" in the metadata (the tokenizer's cut-off, e.g. %q)", strconv.Itoa(DefaultEmbedConfig().MaxTokens))
	}
	n, err := strconv.ParseInt(mt, 10, 32)
	if err != nil {
		return EmbedConfig{}, fmt.Errorf("metadata max_tokens %q is not an integer", mt)
	}
	cfg.MaxTokens = int(n)
	if s, ok := f.metadata["seed"]; ok {
		if cfg.Seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			return EmbedConfig{}, fmt.Errorf("metadata seed %q is not an unsigned integer", s)
		}
	}
	if err := cfg.Validate(); err != nil {
		return EmbedConfig{}, err
	}
	return cfg, nil
}

// WriteEmbedWeights writes weights, shaped by cfg, as a weights file (see
// EmbedWeightsFormat): the five tensors as F32 and the metadata format,
// max_tokens, and seed when cfg.Seed is not 0. It checks cfg and the
// shapes before writing anything. LoadEmbedWeights gives back the same
// weights, bit for bit, and the same cfg.
func WriteEmbedWeights(w io.Writer, cfg EmbedConfig, weights *EmbedWeights) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if weights == nil {
		return fmt.Errorf("embed weights: nil weights")
	}
	if err := weights.checkShape(cfg); err != nil {
		return err
	}
	meta := map[string]string{
		"format":     EmbedWeightsFormat,
		"max_tokens": strconv.Itoa(cfg.MaxTokens),
	}
	if cfg.Seed != 0 {
		meta["seed"] = strconv.FormatUint(cfg.Seed, 10)
	}
	v, d, h, o := int64(cfg.Vocab), int64(cfg.Dim), int64(cfg.Hidden), int64(cfg.Out)
	return writeSafetensors(w, meta, []stOut{
		{name: tensorEmbedding, shape: []int64{v, d}, f32: weights.Embedding},
		{name: tensorW1, shape: []int64{d, h}, f32: weights.W1},
		{name: tensorB1, shape: []int64{h}, f32: weights.B1},
		{name: tensorW2, shape: []int64{h, o}, f32: weights.W2},
		{name: tensorB2, shape: []int64{o}, f32: weights.B2},
	})
}
