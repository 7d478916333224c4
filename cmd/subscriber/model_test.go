package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/model/bert"
)

// TestModelFlag checks -model: a directory the loader refuses stops the
// start with the loader's error, -model with -weights is a usage error, and
// a good directory loads (as far as -calibrate, which fits its cost model
// and touches no queue).
func TestModelFlag(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d", "AWS_REGION": "us-east-1"}
	getenv := func(k string) string { return env[k] }

	err := run(t.Context(), []string{"-model=" + t.TempDir(), "-metrics-addr="}, getenv, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "-model") || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("-model of an empty directory: %v, want the loader's error naming config.json", err)
	}

	_, err = parse([]string{"-model=x", "-weights=y"}, getenv, &bytes.Buffer{})
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-weights") {
		t.Errorf("-model with -weights: %v, want a usage error", err)
	}

	dir := tinyBERT(t, "gen-bert", 1, 2, 64)
	var logs bytes.Buffer
	err = run(t.Context(), []string{"-model=" + dir, "-calibrate", "-calibrate-items=2", "-calibrate-points=4", "-log-format=text"}, getenv,
		&logs)
	if err != nil || !strings.Contains(logs.String(), "cost model of bert:gen-bert") {
		t.Errorf("-model=%s -calibrate: %v, want a cost model of bert:gen-bert:\n%s", dir, err, logs.String())
	}
	if !strings.Contains(logs.String(), "model loaded") || !strings.Contains(logs.String(), "max_seq_length=64") {
		t.Errorf("no log of the loaded model:\n%s", logs.String())
	}
}

// tinyBERT writes a small BERT directory named name, as a user downloads
// one (the real tokenizer, generated weights: hidden 32, intermediate 64),
// for the tests that start the subscriber on -model DIR.
func tinyBERT(t testing.TB, name string, layers, heads, maxSeqLength int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	g := bert.Generated{
		Config: bert.Config{VocabSize: 30522, HiddenSize: 32, NumLayers: layers, NumHeads: heads,
			IntermediateSize: 64, MaxPositionEmbeddings: 128, TypeVocabSize: 2, LayerNormEps: 1e-12},
		MaxSeqLength: maxSeqLength,
		Seed:         5,
	}
	if err := bert.Generate(dir, "../../model/wordpiece/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
	return dir
}
