package bert

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/vramq/vramq/job/fault"
)

// Model is a loaded sentence encoder. It is immutable once loaded: Embed
// may be called from several goroutines at once, each call with its own
// buffers.
type Model struct {
	dir      string
	cfg      Config
	sentence Sentence
	w        *weights
}

// Load reads the model in dir: config.json, model.safetensors and the
// sentence-transformers files (see the package doc). Every error names the
// file, and the field or tensor, that is wrong.
func Load(dir string) (*Model, error) {
	cfg, err := readConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("bert: %s: %w", dir, err)
	}
	s, err := readSentence(dir, cfg)
	if err != nil {
		return nil, fmt.Errorf("bert: %s: %w", dir, err)
	}
	w, err := readWeights(filepath.Join(dir, "model.safetensors"), cfg)
	if err != nil {
		return nil, fmt.Errorf("bert: %s: %w", dir, err)
	}
	return &Model{dir: dir, cfg: cfg, sentence: s, w: w}, nil
}

// Name identifies the model in results and logs: its directory's name, as
// `huggingface-cli download --local-dir` leaves it (e.g.
// "all-MiniLM-L6-v2").
func (m *Model) Name() string { return filepath.Base(filepath.Clean(m.dir)) }

// Config is the encoder's shape.
func (m *Model) Config() Config { return m.cfg }

// Sentence is how the model pools and normalizes.
func (m *Model) Sentence() Sentence { return m.sentence }

// Dim is the length of the vectors Embed returns.
func (m *Model) Dim() int { return m.cfg.HiddenSize }

// MaxSeqLength is the longest item Embed takes, in tokens, [CLS] and
// [SEP] included.
func (m *Model) MaxSeqLength() int { return m.sentence.MaxSeqLength }

// WeightBytes is the memory the float32 weights hold.
func (m *Model) WeightBytes() int64 { return m.w.parameters * 4 }

// WeightDType is the checkpoint's dtype ("F32", "F16", "BF16"; joined with
// "+" if it mixes them).
func (m *Model) WeightDType() string { return m.w.sourceDType }

// Embed returns one vector per item of token ids ([CLS] … [SEP], as the
// tokenizer gives them), computed as one batch padded to the longest item.
// An empty batch gives no vectors. An item that is empty, longer than
// MaxSeqLength or holds an id outside the vocabulary is an error wrapping
// fault.ErrInvalidInput, and nothing is computed.
func (m *Model) Embed(ids [][]int32) ([][]float32, error) {
	seqLen := 0
	for i, item := range ids {
		if err := m.checkItem(item); err != nil {
			return nil, fmt.Errorf("bert: item %d: %w", i, err)
		}
		seqLen = max(seqLen, len(item))
	}
	if len(ids) == 0 {
		return nil, nil
	}
	a := newActivations(m.cfg, len(ids), seqLen)
	m.encode(a, ids)

	h := m.cfg.HiddenSize
	flat := make([]float32, len(ids)*h)
	out := make([][]float32, len(ids))
	for b, item := range ids {
		out[b] = flat[b*h : (b+1)*h : (b+1)*h]
		m.sentence.pool(out[b], a.x, b, seqLen, len(item), h)
	}
	return out, nil
}

var errEmptyItem = errors.New("no tokens (a tokenized text has at least [CLS] and [SEP])")

func (m *Model) checkItem(item []int32) error {
	if len(item) == 0 {
		return fmt.Errorf("%w: %w", fault.ErrInvalidInput, errEmptyItem)
	}
	if len(item) > m.sentence.MaxSeqLength {
		return fmt.Errorf("%w: %d tokens, over the model's limit of %d", fault.ErrInvalidInput, len(item), m.sentence.MaxSeqLength)
	}
	for p, id := range item {
		if id < 0 || int(id) >= m.cfg.VocabSize {
			return fmt.Errorf("%w: token %d is id %d, outside the vocabulary [0, %d)", fault.ErrInvalidInput, p, id, m.cfg.VocabSize)
		}
	}
	return nil
}

// WorkingBytes is an upper bound of the memory Embed allocates for a batch
// of batch items padded to seqLen tokens, beyond the weights: the
// activations (the hidden state, queries, keys and values, the attention
// scores, batch × heads × seqLen², the feed-forward layer's inner
// activations, the mask), the output vectors, and a bound on what the
// goroutines of the matrix products and parallel loops cost.
func (c Config) WorkingBytes(batch, seqLen int) int64 {
	if batch <= 0 || seqLen <= 0 {
		return 0
	}
	b := int64(batch)
	const sliceHeader = 24
	out := b*int64(c.HiddenSize)*4 + b*sliceHeader
	return c.activationFloats(batch, seqLen)*4 + out + c.gemmOverhead(batch, seqLen)
}

// WorkingBytes is Config.WorkingBytes for this model.
func (m *Model) WorkingBytes(batch, seqLen int) int64 { return m.cfg.WorkingBytes(batch, seqLen) }
