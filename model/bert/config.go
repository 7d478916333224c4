package bert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Config is the encoder's shape, from the model directory's config.json
// (Hugging Face's BertConfig).
type Config struct {
	VocabSize             int
	HiddenSize            int
	NumLayers             int
	NumHeads              int
	IntermediateSize      int
	MaxPositionEmbeddings int
	TypeVocabSize         int
	LayerNormEps          float64
}

// HeadDim is the width of one attention head.
func (c Config) HeadDim() int { return c.HiddenSize / c.NumHeads }

// Validate checks that the shape is one the encoder can run.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize},
		{"num_hidden_layers", c.NumLayers}, {"num_attention_heads", c.NumHeads},
		{"intermediate_size", c.IntermediateSize},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
		{"type_vocab_size", c.TypeVocabSize},
	} {
		// The bound keeps every tensor's element count, and the products
		// WorkingBytes forms from them, far inside int64.
		if f.v < 1 || f.v > 1<<20 {
			errs = append(errs, fmt.Errorf("%s: %d, want 1 to %d", f.name, f.v, 1<<20))
		}
	}
	if c.NumHeads > 0 && c.HiddenSize%c.NumHeads != 0 {
		errs = append(errs, fmt.Errorf("hidden_size %d is not a multiple of num_attention_heads %d", c.HiddenSize, c.NumHeads))
	}
	if !(c.LayerNormEps > 0 && c.LayerNormEps < 1) {
		errs = append(errs, fmt.Errorf("layer_norm_eps: %g, want in (0, 1)", c.LayerNormEps))
	}
	return errors.Join(errs...)
}

// hfConfig is the part of config.json this package reads. Pointers tell a
// missing field from a zero one.
type hfConfig struct {
	ModelType             *string  `json:"model_type"`
	Architectures         []string `json:"architectures"`
	VocabSize             *int     `json:"vocab_size"`
	HiddenSize            *int     `json:"hidden_size"`
	NumHiddenLayers       *int     `json:"num_hidden_layers"`
	NumAttentionHeads     *int     `json:"num_attention_heads"`
	IntermediateSize      *int     `json:"intermediate_size"`
	MaxPositionEmbeddings *int     `json:"max_position_embeddings"`
	TypeVocabSize         *int     `json:"type_vocab_size"`
	LayerNormEps          *float64 `json:"layer_norm_eps"`
	HiddenAct             *string  `json:"hidden_act"`
	PositionEmbeddingType *string  `json:"position_embedding_type"`
	IsDecoder             bool     `json:"is_decoder"`
	AddCrossAttention     bool     `json:"add_cross_attention"`
}

// readConfig reads dir/config.json. Fields BertConfig gives defaults to
// (type_vocab_size 2, layer_norm_eps 1e-12, hidden_act "gelu",
// position_embedding_type "absolute") may be absent; the sizes may not,
// since a default there would only hide a file from another model.
func readConfig(dir string) (Config, error) {
	const file = "config.json"
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return Config{}, err
	}
	var h hfConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&h); err != nil {
		return Config{}, fmt.Errorf("%s: %w", file, err)
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %s", file, field, fmt.Sprintf(format, args...))
	}

	// Other model types that look like BERT in their sizes (RoBERTa's
	// position offset, NomicBERT's and the new GTE's rotary positions,
	// DistilBERT's missing token types) compute something else.
	if h.ModelType == nil {
		return Config{}, fail("model_type", "missing, want \"bert\"")
	}
	if *h.ModelType != "bert" {
		return Config{}, fail("model_type", "%q is not supported, want \"bert\"", *h.ModelType)
	}
	for _, a := range h.Architectures {
		if !strings.HasPrefix(a, "Bert") {
			return Config{}, fail("architectures", "%q is not a BERT architecture", a)
		}
	}
	if h.HiddenAct != nil && *h.HiddenAct != "gelu" {
		return Config{}, fail("hidden_act", "%q is not supported, want \"gelu\" (exact, with erf)", *h.HiddenAct)
	}
	if h.PositionEmbeddingType != nil && *h.PositionEmbeddingType != "absolute" {
		return Config{}, fail("position_embedding_type", "%q is not supported, want \"absolute\"", *h.PositionEmbeddingType)
	}
	if h.IsDecoder {
		return Config{}, fail("is_decoder", "true is not supported: a sentence encoder attends both ways")
	}
	if h.AddCrossAttention {
		return Config{}, fail("add_cross_attention", "true is not supported")
	}

	var missing []string
	need := func(name string, p *int) int {
		if p == nil {
			missing = append(missing, name)
			return 0
		}
		return *p
	}
	c := Config{
		VocabSize:             need("vocab_size", h.VocabSize),
		HiddenSize:            need("hidden_size", h.HiddenSize),
		NumLayers:             need("num_hidden_layers", h.NumHiddenLayers),
		NumHeads:              need("num_attention_heads", h.NumAttentionHeads),
		IntermediateSize:      need("intermediate_size", h.IntermediateSize),
		MaxPositionEmbeddings: need("max_position_embeddings", h.MaxPositionEmbeddings),
		TypeVocabSize:         2,
		LayerNormEps:          1e-12,
	}
	if len(missing) > 0 {
		return Config{}, fail(strings.Join(missing, ", "), "missing")
	}
	if h.TypeVocabSize != nil {
		c.TypeVocabSize = *h.TypeVocabSize
	}
	if h.LayerNormEps != nil {
		c.LayerNormEps = *h.LayerNormEps
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", file, err)
	}
	return c, nil
}
