package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/internal/testenv/floats"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/refembed"
)

func noEnv(string) string { return "" }

func TestRunWritesLoadableWeights(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "small.safetensors")
	var out bytes.Buffer
	args := []string{"-out", path, "-vocab", "100", "-dim", "8", "-hidden", "16", "-out-dim", "4", "-max-tokens", "32"}
	env := map[string]string{"VRAMQ_SEED": "42"}
	if err := run(args, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatal(err)
	}
	want := refembed.Config{Vocab: 100, Dim: 8, Hidden: 16, Out: 4, MaxTokens: 32, Seed: 42}
	w, cfg, err := refembed.LoadWeights(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != want {
		t.Errorf("config %+v, want %+v", cfg, want)
	}
	gen := refembed.GenerateWeights(want)
	if !floats.SameBits(w.Embedding, gen.Embedding) || !floats.SameBits(w.W1, gen.W1) || !floats.SameBits(w.B1, gen.B1) ||
		!floats.SameBits(w.W2, gen.W2) || !floats.SameBits(w.B2, gen.B2) {
		t.Error("the file's weights are not refembed.GenerateWeights' for its config")
	}
	if !strings.Contains(out.String(), path) || !strings.Contains(out.String(), "seed 42") {
		t.Errorf("printed %q; want the path and the seed", out.String())
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("file mode: %v, %v; want 0644", fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d entries in the directory; want only the weights, no temporary file", len(entries))
	}

	// The defaults are refembed.DefaultConfig, and a second run replaces the file.
	if err := run([]string{"-out", path}, noEnv, &out); err != nil {
		t.Fatal(err)
	}
	if _, cfg, err := refembed.LoadWeights(path); err != nil || cfg != refembed.DefaultConfig() {
		t.Errorf("defaults: config %+v, %v; want %+v", cfg, err, refembed.DefaultConfig())
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "w.safetensors")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no -out", nil, nil, "-out is required"},
		{"unknown flag", []string{"-out", out, "-bogus"}, nil, "bogus"},
		{"extra argument", []string{"-out", out, "extra"}, nil, "extra"},
		{"vocab of 1", []string{"-out", out, "-vocab", "1"}, nil, "Vocab is 1"},
		{"zero max tokens", []string{"-out", out, "-max-tokens", "0"}, nil, "MaxTokens is 0"},
		{"bad environment", []string{"-out", out}, map[string]string{"VRAMQ_DIM": "wide"}, "VRAMQ_DIM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := run(tt.args, func(k string) string { return tt.env[k] }, &stdout)
			if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want a usage error saying %q", err, tt.want)
			}
			if stdout.Len() > 0 {
				t.Errorf("printed %q on error", stdout.String())
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused run left %s: %v", out, err)
	}
	if err := run([]string{"-h"}, noEnv, new(bytes.Buffer)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: error %v, want flag.ErrHelp", err)
	}
	// A directory that does not exist: an error naming the path, not a usage error.
	missing := filepath.Join(dir, "no", "such", "w.safetensors")
	err := run([]string{"-out", missing}, noEnv, new(bytes.Buffer))
	if err == nil || errors.As(err, new(usageError)) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "write "+missing) {
		t.Errorf("missing directory: %v, want a file error", err)
	}
}

// TestRunWritesBERTDirectory checks -bert: the directory it writes loads
// and serves (config, weights, sentence-transformers files, tokenizer),
// in the shape the flags asked for; a shape BERT cannot have is a usage
// error.
func TestRunWritesBERTDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gen")
	var out bytes.Buffer
	args := []string{"-bert", dir, "-tokenizer", "../../model/wordpiece/testdata/tokenizer", "-bert-hidden", "24", "-bert-layers", "1",
		"-bert-heads", "3", "-bert-max-seq-length", "40"}
	if err := run(args, noEnv, &out); err != nil {
		t.Fatal(err)
	}
	e, err := bert.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, s := e.Model().Config(), e.Model().Sentence()
	if c.HiddenSize != 24 || c.NumLayers != 1 || c.NumHeads != 3 || c.IntermediateSize != 96 || s.MaxSeqLength != 40 || !s.Normalize || s.Pooling != bert.PoolMean {
		t.Errorf("generated %+v, %+v; want hidden 24, 1 layer, 3 heads, intermediate 96, max_seq_length 40, mean pooling, normalized", c, s)
	}
	outs, err := e.Run(t.Context(), []job.Item{{ID: "a", Text: "hello world"}})
	if err != nil || len(outs) != 1 || len(outs[0].Embedding) != 24 {
		t.Errorf("Run on the generated model: %v, %v", outs, err)
	}
	if !strings.Contains(out.String(), "mean nothing") {
		t.Errorf("printed %q; want it to say the vectors mean nothing", out.String())
	}
	err = run([]string{"-bert", dir, "-bert-hidden", "10", "-bert-heads", "3"}, noEnv, &out)
	if !errors.As(err, new(usageError)) {
		t.Errorf("-bert-hidden 10 -bert-heads 3: %v, want a usage error", err)
	}
}
