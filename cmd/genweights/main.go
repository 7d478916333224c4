// Command genweights writes the reference embedding model's generated
// weights (gpu.GenerateEmbedWeights) to a safetensors file, the format
// LoadEmbedWeights reads and bench/torch/embed.py loads:
//
//	genweights -out build/model.safetensors               # the default config, seed 1
//	genweights -out small.safetensors -vocab 1024 -dim 64 -hidden 128 -out-dim 64
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

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/envflag"
)

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
	cfg := gpu.DefaultEmbedConfig()
	out := fs.String("out", "", "write the weights to `PATH` (required)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the generated weights")
	fs.IntVar(&cfg.Vocab, "vocab", cfg.Vocab, "token ids (rows of the embedding table)")
	fs.IntVar(&cfg.Dim, "dim", cfg.Dim, "width of a token embedding")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "width of the hidden layer")
	fs.IntVar(&cfg.Out, "out-dim", cfg.Out, "width of the output embedding")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", cfg.MaxTokens, "most tokens read from one item (recorded in the file's metadata)")
	// As in the other commands: envflag's errors and the flag package's
	// reported the same way, once.
	fs.SetOutput(io.Discard)
	err := envflag.Parse(fs, args, getenv)
	fs.SetOutput(nil)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case *out == "":
		err = errors.New("-out is required")
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

	if err := writeFile(*out, cfg); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ref-embed-v1 vocab %d, dim %d, hidden %d, out %d, max tokens %d, seed %d: %s of weights\n",
		*out, cfg.Vocab, cfg.Dim, cfg.Hidden, cfg.Out, cfg.MaxTokens, cfg.Seed, gpu.FormatBytes(cfg.WeightBytes()))
	return nil
}

// writeFile writes cfg's weights to a temporary file in path's directory
// and renames it to path.
func writeFile(path string, cfg gpu.EmbedConfig) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after a successful rename, there is nothing left to remove
	err = gpu.WriteEmbedWeights(f, cfg, gpu.GenerateEmbedWeights(cfg))
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
