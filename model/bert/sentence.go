package bert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Pooling is how the token vectors of a text become one vector, as
// sentence-transformers' Pooling module does it.
type Pooling int

const (
	// PoolMean averages the vectors of the attended tokens
	// (pooling_mode_mean_tokens).
	PoolMean Pooling = iota
	// PoolCLS takes the first token's vector (pooling_mode_cls_token).
	PoolCLS
	// PoolMax takes each dimension's maximum over the attended tokens
	// (pooling_mode_max_tokens).
	PoolMax
)

func (p Pooling) String() string {
	switch p {
	case PoolMean:
		return "mean"
	case PoolCLS:
		return "cls"
	case PoolMax:
		return "max"
	}
	return fmt.Sprintf("Pooling(%d)", int(p))
}

// Sentence is what the sentence-transformers files say about turning the
// encoder's output into one vector per text.
type Sentence struct {
	Pooling   Pooling
	Normalize bool // L2-normalize the pooled vector
	// MaxSeqLength is the longest input, in tokens with [CLS] and [SEP]:
	// sentence_bert_config.json's max_seq_length, or the model's
	// max_position_embeddings when the file does not say.
	MaxSeqLength int
}

// The module types of modules.json this package runs.
const (
	moduleTransformer = "sentence_transformers.models.Transformer"
	modulePooling     = "sentence_transformers.models.Pooling"
	moduleNormalize   = "sentence_transformers.models.Normalize"
)

type stModule struct {
	Idx  int    `json:"idx"`
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
}

// readSentence reads the sentence-transformers files of dir. Without a
// modules.json the directory is a plain Hugging Face model, and
// sentence-transformers would wrap it in mean pooling with no
// normalization: so does this.
//
// modules.json must be a Transformer, then a Pooling, then optionally a
// Normalize: a Dense layer (as in some LaBSE or GTR exports) or any other
// module would change the vectors, and running without it would be wrong
// silently.
func readSentence(dir string, cfg Config) (Sentence, error) {
	s := Sentence{Pooling: PoolMean, MaxSeqLength: cfg.MaxPositionEmbeddings}
	if err := readMaxSeqLength(dir, cfg, &s); err != nil {
		return Sentence{}, err
	}

	const file = "modules.json"
	data, err := os.ReadFile(filepath.Join(dir, file))
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return Sentence{}, err
	}
	var mods []stModule
	if err := json.Unmarshal(data, &mods); err != nil {
		return Sentence{}, fmt.Errorf("%s: %w", file, err)
	}
	if len(mods) < 2 || len(mods) > 3 {
		return Sentence{}, fmt.Errorf("%s: %d modules, want Transformer, Pooling and optionally Normalize", file, len(mods))
	}
	for i, m := range mods {
		want := []string{moduleTransformer, modulePooling, moduleNormalize}[i]
		if m.Type != want {
			return Sentence{}, fmt.Errorf("%s: module %d: type %q is not supported here, want %q", file, i, m.Type, want)
		}
	}
	if p := mods[0].Path; p != "" && p != "." {
		return Sentence{}, fmt.Errorf("%s: module 0: path %q: the Transformer must be the directory itself", file, p)
	}
	poolDir := mods[1].Path
	if !fs.ValidPath(poolDir) || poolDir == "." || strings.Contains(poolDir, `\`) {
		return Sentence{}, fmt.Errorf("%s: module 1: path %q is not a subdirectory of the model", file, poolDir)
	}
	if err := readPooling(dir, path.Join(poolDir, "config.json"), cfg, &s); err != nil {
		return Sentence{}, err
	}
	s.Normalize = len(mods) == 3
	return s, nil
}

// readMaxSeqLength reads sentence_bert_config.json, if there is one.
func readMaxSeqLength(dir string, cfg Config, s *Sentence) error {
	const file = "sentence_bert_config.json"
	data, err := os.ReadFile(filepath.Join(dir, file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var c struct {
		MaxSeqLength *int `json:"max_seq_length"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if c.MaxSeqLength == nil {
		return nil
	}
	if n := *c.MaxSeqLength; n < 2 || n > cfg.MaxPositionEmbeddings {
		return fmt.Errorf("%s: max_seq_length: %d, want 2 to max_position_embeddings (%d)", file, n, cfg.MaxPositionEmbeddings)
	}
	s.MaxSeqLength = *c.MaxSeqLength
	return nil
}

// readPooling reads the Pooling module's config.json (file, relative to
// dir). Exactly one of mean, CLS and max must be on: sentence-transformers
// concatenates several, which no model of this family ships, and the
// other modes (mean_sqrt_len, weightedmean, lasttoken) are not done here.
func readPooling(dir, file string, cfg Config, s *Sentence) error {
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(file)))
	if err != nil {
		return fmt.Errorf("modules.json names a Pooling module: %w", err)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var on []string
	for key, v := range raw {
		switch key {
		case "word_embedding_dimension":
			var d int
			if err := json.Unmarshal(v, &d); err != nil || d != cfg.HiddenSize {
				return fmt.Errorf("%s: word_embedding_dimension: %s, want hidden_size %d", file, v, cfg.HiddenSize)
			}
		case "pooling_mode":
			// Newer sentence-transformers may write the mode as a string
			// as well as the flags; the flags decide.
		case "include_prompt":
			// Only matters for instruction prompts, which the tokenizer
			// does not add.
		default:
			if !strings.HasPrefix(key, "pooling_mode_") {
				continue
			}
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return fmt.Errorf("%s: %s: %s, want true or false", file, key, v)
			}
			if b {
				on = append(on, key)
			}
		}
	}
	slices.Sort(on) // map order is random; the error should not be
	if len(on) != 1 {
		return fmt.Errorf("%s: pooling modes %v are on, "+
			"want exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token, pooling_mode_max_tokens", file, on)
	}
	switch on[0] {
	case "pooling_mode_mean_tokens":
		s.Pooling = PoolMean
	case "pooling_mode_cls_token":
		s.Pooling = PoolCLS
	case "pooling_mode_max_tokens":
		s.Pooling = PoolMax
	default:
		return fmt.Errorf("%s: %s is not supported, want pooling_mode_mean_tokens, pooling_mode_cls_token or pooling_mode_max_tokens",
			file, on[0])
	}
	return nil
}
