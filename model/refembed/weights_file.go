package refembed

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vramq/vramq/model/safetensors"
)

// WeightsFormat is the "format" metadata of a weights file of the
// reference embedding model. A loader checks it so that a safetensors file
// of some other model, which could happen to hold tensors of these names,
// is refused rather than run.
//
// A weights file is a safetensors file holding exactly these five tensors,
// float32 (dtype F32) little-endian, row-major, laid out exactly as
// Weights holds them:
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
//	max_tokens  Config.MaxTokens, decimal (required): the tokenizer's
//	            cut-off, which the tensors cannot tell
//	seed        Config.Seed, decimal (optional): the seed generated
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
const WeightsFormat = "vramq-ref-embed-v1"

// The tensors of a weights file, in the order WriteWeights lays them out.
const (
	tensorEmbedding = "embedding"
	tensorW1        = "w1"
	tensorB1        = "b1"
	tensorW2        = "w2"
	tensorB2        = "b2"
)

var embedTensorNames = []string{tensorEmbedding, tensorW1, tensorB1, tensorW2, tensorB2}

// LoadWeights reads a weights file of the reference model (see
// WeightsFormat for its layout) and the configuration its shapes and
// metadata give. The configuration is valid, the weights match it and
// are all finite.
func LoadWeights(path string) (*Weights, Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, Config{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, Config{}, err
	}
	w, cfg, err := ReadWeights(f, st.Size())
	if err != nil {
		return nil, Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return w, cfg, nil
}

// ReadWeights is LoadWeights for a file of size bytes read
// through r. It checks the header, names, shapes and configuration before
// reading any tensor, so a file that would be refused costs no memory for
// its tensors, and reads each tensor once, straight into its slice.
func ReadWeights(r io.ReaderAt, size int64) (*Weights, Config, error) {
	f, err := safetensors.Open(r, size)
	if err != nil {
		return nil, Config{}, err
	}
	cfg, err := configOf(f)
	if err != nil {
		return nil, Config{}, fmt.Errorf("embed weights: %w", err)
	}
	var w Weights
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
		v, err := f.Float32s(t.name)
		if err != nil {
			return nil, Config{}, fmt.Errorf("embed weights: %w", err)
		}
		if i := slices.IndexFunc(v, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }); i >= 0 {
			return nil, Config{}, fmt.Errorf("embed weights: %s[%d] is %v: every weight must be finite", t.name, i, v[i])
		}
		*t.dst = v
	}
	return &w, cfg, nil
}

// configOf checks f's metadata, tensor names and shapes, and returns
// the configuration they describe.
func configOf(f *safetensors.File) (Config, error) {
	meta := f.Metadata()
	switch format, ok := meta["format"]; {
	case !ok:
		return Config{}, fmt.Errorf("no \"format\" in the metadata; want %q", WeightsFormat)
	case format != WeightsFormat:
		return Config{}, fmt.Errorf("metadata format is %q, want %q", format, WeightsFormat)
	}

	var missing, extra []string
	for _, name := range embedTensorNames {
		if _, ok := f.Tensor(name); !ok {
			missing = append(missing, name)
		}
	}
	for _, name := range f.Names() {
		if !slices.Contains(embedTensorNames, name) {
			extra = append(extra, strconv.Quote(name))
		}
	}
	if len(missing) > 0 {
		return Config{}, fmt.Errorf("no tensor %s (a weights file holds %s)", strings.Join(missing, ", "), strings.Join(embedTensorNames, ", "))
	}
	if len(extra) > 0 {
		return Config{}, fmt.Errorf("unexpected tensor %s: a weights file holds exactly %s, and another tensor means another architecture",
			strings.Join(extra, ", "), strings.Join(embedTensorNames, ", "))
	}

	// Each dimension is read from the first tensor it shapes and checked
	// against every later one.
	var cfg Config
	type dim struct {
		name string
		v    *int
		from string // the tensor that set v; "" while unset
	}
	vocab, width := &dim{name: "Vocab", v: &cfg.Vocab}, &dim{name: "Dim", v: &cfg.Dim}
	hidden, out := &dim{name: "Hidden", v: &cfg.Hidden}, &dim{name: "Out", v: &cfg.Out}
	want := func(name string, dims ...*dim) error {
		t, _ := f.Tensor(name)
		names := make([]string, len(dims))
		for i, d := range dims {
			names[i] = d.name
		}
		if len(t.Shape) != len(dims) {
			return fmt.Errorf("tensor %s has shape %v, want [%s]", name, t.Shape, strings.Join(names, ", "))
		}
		for i, d := range dims {
			n := t.Shape[i]
			switch {
			case n > math.MaxInt32: // beyond any valid config; keeps the int exact
				return fmt.Errorf("tensor %s has shape %v: %s %d is too large", name, t.Shape, d.name, n)
			case d.from != "" && int64(*d.v) != n:
				return fmt.Errorf("tensor %s has shape %v, want [%s] with %s = %d as tensor %s has it",
					name, t.Shape, strings.Join(names, ", "), d.name, *d.v, d.from)
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
			return Config{}, err
		}
	}

	mt, ok := meta["max_tokens"]
	if !ok {
		return Config{}, fmt.Errorf("no \"max_tokens\" in the metadata (the tokenizer's cut-off, e.g. %q)",
			strconv.Itoa(DefaultConfig().MaxTokens))
	}
	n, err := strconv.ParseInt(mt, 10, 32)
	if err != nil {
		return Config{}, fmt.Errorf("metadata max_tokens %q is not an integer", mt)
	}
	cfg.MaxTokens = int(n)
	if s, ok := meta["seed"]; ok {
		if cfg.Seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			return Config{}, fmt.Errorf("metadata seed %q is not an unsigned integer", s)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// WriteWeights writes weights, shaped by cfg, as a weights file (see
// WeightsFormat): the five tensors as F32 and the metadata format,
// max_tokens, and seed when cfg.Seed is not 0. It checks cfg and the
// shapes before writing anything. LoadWeights gives back the same
// weights, bit for bit, and the same cfg.
func WriteWeights(w io.Writer, cfg Config, weights *Weights) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if weights == nil {
		return fmt.Errorf("embed weights: nil weights")
	}
	if err := weights.CheckShape(cfg); err != nil {
		return err
	}
	meta := map[string]string{
		"format":     WeightsFormat,
		"max_tokens": strconv.Itoa(cfg.MaxTokens),
	}
	if cfg.Seed != 0 {
		meta["seed"] = strconv.FormatUint(cfg.Seed, 10)
	}
	v, d, h, o := int64(cfg.Vocab), int64(cfg.Dim), int64(cfg.Hidden), int64(cfg.Out)
	return safetensors.Write(w, meta, []safetensors.Tensor{
		{Name: tensorEmbedding, Shape: []int64{v, d}, Values: weights.Embedding},
		{Name: tensorW1, Shape: []int64{d, h}, Values: weights.W1},
		{Name: tensorB1, Shape: []int64{h}, Values: weights.B1},
		{Name: tensorW2, Shape: []int64{h, o}, Values: weights.W2},
		{Name: tensorB2, Shape: []int64{o}, Values: weights.B2},
	})
}
