// Command genweights writes the reference embedding model's generated
// weights (refembed.GenerateWeights) to a safetensors file, the format
// refembed.LoadWeights reads and bench/torch/embed.py loads:
//
//	genweights -out build/model.safetensors               # the default config, seed 1
//	genweights -out small.safetensors -vocab 1024 -dim 64 -hidden 128 -out-dim 64
//
// With -bert it writes a whole BERT model directory instead, as a
// sentence-transformers download lays it out, with generated weights and
// the tokenizer files of -tokenizer (`subscriber -model DIR` serves it; its
// vectors mean nothing):
//
//	genweights -bert build/demo-bert                      # the demo's shape
//	genweights -bert tiny -bert-hidden 32 -bert-layers 1 -bert-heads 2
//
// The same flags and seed give the same file on every machine. The file is
// written beside its destination and renamed into place, so a reader never
// sees half of one.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/envflag"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/refembed"
)

// demoBERT is the shape `make demo` serves: all-MiniLM-L6-v2's vocabulary
// (its tokenizer is the one copied), but narrower and shallower, so that a
// two-core CPU gets through the demo's workload in a minute or so, with
// long texts at 256 tokens that cost many times what short ones do.
var demoBERT = bert.Generated{
	Config: bert.Config{VocabSize: 30522, HiddenSize: 128, NumLayers: 2, NumHeads: 2, IntermediateSize: 512,
		MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12},
	MaxSeqLength: 256,
}

func main() {
	err := run(os.Args[1:], os.Getenv, os.Stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "genweights:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "genweights:", err)
		os.Exit(1)
	}
}

// usageError is a bad command line or environment; the usage has been printed.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func run(args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("genweights", flag.ContinueOnError)
	cfg := refembed.DefaultConfig()
	out := fs.String("out", "", "write the weights to `PATH` (required)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the generated weights")
	fs.IntVar(&cfg.Vocab, "vocab", cfg.Vocab, "token ids (rows of the embedding table)")
	fs.IntVar(&cfg.Dim, "dim", cfg.Dim, "width of a token embedding")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "width of the hidden layer")
	fs.IntVar(&cfg.Out, "out-dim", cfg.Out, "width of the output embedding")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", cfg.MaxTokens, "most tokens read from one item (recorded in the file's metadata)")
	b := demoBERT
	bertDir := fs.String("bert", "", "write a BERT model directory with generated weights to `DIR` instead of -out (its vectors mean nothing)")
	tokDir := fs.String("tokenizer", "model/wordpiece/testdata/tokenizer",
		"with -bert: `DIR` of the tokenizer files to copy (tokenizer.json, vocab.txt, ...)")
	fs.IntVar(&b.HiddenSize, "bert-hidden", b.HiddenSize, "with -bert: hidden size (the intermediate size is 4 times it)")
	fs.IntVar(&b.NumLayers, "bert-layers", b.NumLayers, "with -bert: encoder layers")
	fs.IntVar(&b.NumHeads, "bert-heads", b.NumHeads, "with -bert: attention heads")
	fs.IntVar(&b.MaxSeqLength, "bert-max-seq-length", b.MaxSeqLength, "with -bert: max_seq_length, the longest input in tokens")
	// As in the other commands: envflag's errors and the flag package's
	// reported the same way, once.
	fs.SetOutput(io.Discard)
	err := envflag.Parse(fs, args, getenv)
	fs.SetOutput(nil)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case *bertDir != "":
		b.Seed = cfg.Seed
		b.IntermediateSize = 4 * b.HiddenSize
		b.MaxPositionEmbeddings = max(b.MaxPositionEmbeddings, b.MaxSeqLength)
		err = b.Validate()
	case *out == "":
		err = errors.New("-out is required (or -bert for a BERT model directory)")
	default:
		err = cfg.Validate()
	}
	if err != nil {
		fs.Usage()
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}

	if *bertDir != "" {
		if err := bert.Generate(*bertDir, *tokDir, b); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: BERT with generated weights (its vectors mean nothing): "+
			"hidden %d, %d layers, %d heads, intermediate %d, max_seq_length %d, seed %d\n",
			*bertDir, b.HiddenSize, b.NumLayers, b.NumHeads, b.IntermediateSize, b.MaxSeqLength, b.Seed)
		return nil
	}
	if err := writeFile(*out, cfg); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ref-embed-v1 vocab %d, dim %d, hidden %d, out %d, max tokens %d, seed %d: %s of weights\n",
		*out, cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens, cfg.Seed, bytesize.Format(cfg.WeightBytes()))
	return nil
}

// writeFile writes cfg's weights to a temporary file in path's directory
// and renames it to path.
func writeFile(path string, cfg refembed.Config) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after a successful rename, there is nothing left to remove
	err = refembed.WriteWeights(f, cfg, refembed.GenerateWeights(cfg))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file 0600; weights are not secret.
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
