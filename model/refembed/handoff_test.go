package refembed

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/safetensors"
)

// The handoff with an outside implementation of the reference model (the
// PyTorch one in bench/torch/embed.py) is two more safetensors files, so
// that both sides parse one format: Go tokenizes (the tokenizer exists only
// here) and writes a token batch; the other side writes the embeddings it
// computed from it. Only the GPU checks (cuda_test.go) hand off, so the
// format lives with the tests.
//
// A token batch holds two I32 tensors, exactly as Config.Tokenize
// returns them, and metadata:
//
//	tokens   [T]    every item's token ids, one item after another
//	offsets  [N+1]  offsets[i] is where item i's ids start, offsets[N] = T
//	format "vramq-token-batch-v1", vocab and max_tokens (decimal): the
//	configuration that tokenized it, so a reader can refuse weights of
//	another vocabulary, whose rows the ids would index without error
//
// Its first B items (tokens[:offsets[B]], offsets[:B+1]) are a batch of
// size B, so one file serves every batch size up to N.
//
// An embeddings file holds one F32 tensor and its format:
//
//	embeddings  [N, Out]  row i is item i's output
//	format "vramq-embeddings-v1"; any other metadata (the device, the
//	library's version) is for people and ignored.
const (
	TokenBatchFormat = "vramq-token-batch-v1"
	EmbeddingsFormat = "vramq-embeddings-v1"
)

// TokenBatch is a token batch file's content.
type TokenBatch struct {
	Tokens    []int32
	Offsets   []int32 // len(Offsets) = items + 1
	Vocab     int
	MaxTokens int
}

// Items is the number of items in the batch.
func (b *TokenBatch) Items() int { return len(b.Offsets) - 1 }

// WriteTokenBatch tokenizes items with cfg and writes them as a token batch
// file.
func WriteTokenBatch(w io.Writer, cfg Config, items []job.Item) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	tokens, offsets := cfg.Tokenize(items)
	return safetensors.Write(w, map[string]string{
		"format":     TokenBatchFormat,
		"vocab":      strconv.Itoa(cfg.Vocab),
		"max_tokens": strconv.Itoa(cfg.MaxTokens),
	}, []safetensors.Tensor{
		{Name: "tokens", Shape: []int64{int64(len(tokens))}, Int32s: tokens},
		{Name: "offsets", Shape: []int64{int64(len(offsets))}, Int32s: offsets},
	})
}

// ReadTokenBatch reads a token batch file of size bytes through r and
// checks that its offsets and ids describe a batch: offsets start at 0,
// increase (every item has a token) and end at len(tokens), and every id
// is below vocab.
func ReadTokenBatch(r io.ReaderAt, size int64) (*TokenBatch, error) {
	f, err := safetensors.Open(r, size)
	if err != nil {
		return nil, err
	}
	if err := checkOnly(f, TokenBatchFormat, "tokens", "offsets"); err != nil {
		return nil, fmt.Errorf("token batch: %w", err)
	}
	b := &TokenBatch{}
	for _, m := range []struct {
		key string
		dst *int
	}{{"vocab", &b.Vocab}, {"max_tokens", &b.MaxTokens}} {
		n, err := strconv.ParseInt(f.Metadata()[m.key], 10, 32)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("token batch: metadata %s is %q, want a positive integer", m.key, f.Metadata()[m.key])
		}
		*m.dst = int(n)
	}
	for _, t := range []struct {
		name string
		dst  *[]int32
	}{{"tokens", &b.Tokens}, {"offsets", &b.Offsets}} {
		st, _ := f.Tensor(t.name)
		if len(st.Shape) != 1 {
			return nil, fmt.Errorf("token batch: tensor %s has shape %v, want one dimension", t.name, st.Shape)
		}
		if *t.dst, err = f.Int32s(t.name); err != nil {
			return nil, fmt.Errorf("token batch: %w", err)
		}
	}
	o := b.Offsets
	switch {
	case len(o) == 0:
		return nil, fmt.Errorf("token batch: offsets is empty, want items + 1 entries")
	case o[0] != 0:
		return nil, fmt.Errorf("token batch: offsets[0] is %d, want 0", o[0])
	case int(o[len(o)-1]) != len(b.Tokens):
		return nil, fmt.Errorf("token batch: offsets end at %d, but there are %d tokens", o[len(o)-1], len(b.Tokens))
	}
	for i := 1; i < len(o); i++ {
		if o[i] <= o[i-1] {
			// The tokenizer gives an item without words the empty token.
			return nil, fmt.Errorf("token batch: offsets[%d] = %d after offsets[%d] = %d: every item has at least one token", i, o[i], i-1, o[i-1])
		}
	}
	for i, id := range b.Tokens {
		if id < 0 || int(id) >= b.Vocab {
			return nil, fmt.Errorf("token batch: tokens[%d] = %d is outside [0, vocab %d)", i, id, b.Vocab)
		}
	}
	return b, nil
}

// LoadEmbeddings reads an embeddings file (see EmbeddingsFormat), as
// bench/torch/embed.py --out writes it.
func LoadEmbeddings(path string) ([][]float32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	e, err := ReadEmbeddings(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// ReadEmbeddings reads an embeddings file of size bytes through r: one row
// per item, each of length Out. The rows share one array, each capped at
// its length, so appending to one cannot overwrite the next.
func ReadEmbeddings(r io.ReaderAt, size int64) ([][]float32, error) {
	f, err := safetensors.Open(r, size)
	if err != nil {
		return nil, err
	}
	if err := checkOnly(f, EmbeddingsFormat, "embeddings"); err != nil {
		return nil, fmt.Errorf("embeddings: %w", err)
	}
	t, _ := f.Tensor("embeddings")
	if len(t.Shape) != 2 || t.Shape[1] == 0 && t.Shape[0] != 0 {
		return nil, fmt.Errorf("embeddings: tensor embeddings has shape %v, want [items, width]", t.Shape)
	}
	flat, err := f.Float32s("embeddings")
	if err != nil {
		return nil, fmt.Errorf("embeddings: %w", err)
	}
	rows := make([][]float32, t.Shape[0])
	width := int(t.Shape[1])
	for i := range rows {
		rows[i] = flat[i*width : (i+1)*width : (i+1)*width]
	}
	return rows, nil
}

// checkOnly checks that f's format is format and that it holds exactly the
// tensors names, as a weights file is checked.
func checkOnly(f *safetensors.File, format string, names ...string) error {
	if got := f.Metadata()["format"]; got != format {
		return fmt.Errorf("metadata format is %q, want %q", got, format)
	}
	for _, name := range names {
		if _, ok := f.Tensor(name); !ok {
			return fmt.Errorf("no tensor %q", name)
		}
	}
	if n := len(f.Names()); n != len(names) {
		return fmt.Errorf("%d tensors, want exactly %q", n, names)
	}
	return nil
}
