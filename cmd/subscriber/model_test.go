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

	dir := filepath.Join(t.TempDir(), "gen-bert")
	g := bert.Generated{Config: bert.Config{VocabSize: 30522, HiddenSize: 16, NumLayers: 1, NumHeads: 2,
		IntermediateSize: 32, MaxPositionEmbeddings: 64, TypeVocabSize: 2, LayerNormEps: 1e-12}, MaxSeqLength: 64, Seed: 1}
	if err := bert.Generate(dir, "../../model/bert/testdata/tokenizer", g); err != nil {
		t.Fatal(err)
	}
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
