//go:build cuda

package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/bert"
)

// -device=cuda:0 -model DIR serves the directory on the GPU: the backend
// is bert's Embedder on the CUDA encoder, its outputs the CPU's within
// 1e-5, its weights and working memory the GPU's. Run by make
// cuda-emu-test.
func TestCUDABackendServesModelDir(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	dir := tinyBERT(t, "served-tiny", 2, 2, 96)
	dev, model, err := openBackend(&options{device: "cuda:0", model: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	defer model.Close()
	e, ok := model.(*bert.Embedder)
	if !ok {
		t.Fatalf("the backend is a %T, want *bert.Embedder", model)
	}
	if dev.Simulated() || e.Weights() < e.Model().WeightBytes() {
		t.Errorf("device %s (simulated %v), weights %d: want the GPU holding at least the %d bytes of weights",
			dev.Name(), dev.Simulated(), e.Weights(), e.Model().WeightBytes())
	}
	cpu, err := bert.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	items := []job.Item{{ID: "a", Text: "short"}, {ID: "b", Text: strings.Repeat("a longer text of many words ", 30)},
		{ID: "c", Text: "déjà vu in 東京"}}
	got, err := e.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cpu.Run(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if got[i].ID != want[i].ID || len(got[i].Embedding) != len(want[i].Embedding) {
			t.Fatalf("item %d: %q with %d values, want %q with %d", i, got[i].ID, len(got[i].Embedding), want[i].ID, len(want[i].Embedding))
		}
		for j := range got[i].Embedding {
			if d := math.Abs(float64(got[i].Embedding[j] - want[i].Embedding[j])); !(d <= 1e-5) {
				t.Fatalf("item %d value %d: %g on the GPU, %g on the CPU", i, j, got[i].Embedding[j], want[i].Embedding[j])
			}
		}
	}
}

// A -model directory the loader refuses stops the start with the loader's
// error before the GPU is used: here the GPU cannot be used at all (the
// emulated driver's cuInit fails), and the error is still the directory's.
func TestCUDABackendRefusesBadModelDirFirst(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	dir := t.TempDir() // no config.json
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-device=cuda:0", "-model="+dir)
	cmd.Env = append(os.Environ(), "VRAMQ_TEST_RUN_MAIN=1", "VRAMQ_EMU_STATE=/nonexistent/vramq/state",
		"QUEUE_URL=http://127.0.0.1:1/q", "RESULTS_QUEUE_URL=http://127.0.0.1:1/r", "DLQ_URL=http://127.0.0.1:1/d",
		"AWS_ENDPOINT_URL=http://127.0.0.1:1", "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=x")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "-model") || !strings.Contains(string(out), "config.json") || strings.Contains(string(out), "cuInit") {
		t.Errorf("-model with no config.json: %v; want the directory's error, not the GPU's\n%s", err, out)
	}
}

// -calibrate -device=cuda:0 -model DIR, the command docs/cuda.md gives for
// a GPU, on the emulated one: a cost model of padded shapes fitted on the
// GPU, named for it, that -cost-model then loads for the same GPU.
func TestCUDACalibrateModelDir(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	dir := tinyBERT(t, "calib-tiny", 1, 2, 32)
	path := filepath.Join(t.TempDir(), "cost.json")
	var out strings.Builder
	args := []string{"-calibrate", "-device=cuda:0", "-model=" + dir, "-calibrate-items=2", "-calibrate-points=4", "-cost-model=" + path,
		"-metrics-addr=", "-log-format=text"}
	if err := run(context.Background(), args, func(string) string { return "" }, &out); err != nil {
		t.Fatalf("run %v: %v\n%s", args, err, out.String())
	}
	f, err := calibrate.ReadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Model != "bert:calib-tiny" || !strings.HasPrefix(f.Device, "vramq CPU-emulated GPU") || f.Form != calibrate.FormPadded ||
		f.Heads != 2 || f.MaxTokens != 32 || f.MaxItems != 2 || f.Samples != 8 {
		t.Errorf("file %+v\n%s", f, out.String())
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	o, dev, model := openForTest(t, log, "-device=cuda:0", "-model="+dir, "-cost-model="+path)
	if err := useCostModel(o, dev, model, log); err != nil {
		t.Fatal(err)
	}
	if got, want := model.Cost([]job.Item{{ID: "a", Text: "a a a"}}), f.Padded(1, 5, 2); got != want {
		t.Errorf("Cost after -cost-model = %d, want the file's %d", got, want)
	}
}

// -gpu-precision and -gpu-attention reach the CUDA encoder: the model's
// name says which it runs (bert.OpenCUDAWith). Run by make cuda-emu-test.
func TestCUDABackendTakesPrecisionFlags(t *testing.T) {
	if os.Getenv("VRAMQ_EMU_STATE") == "" {
		t.Skip("needs the emulated GPU (make cuda-emu-test)")
	}
	dir := tinyBERT(t, "half-tiny", 2, 2, 96)
	o := &options{device: "cuda:0", model: dir, precision: "float16", attention: "fused"}
	dev, model, err := openBackend(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	defer model.Close()
	if name := model.Name(); !strings.HasSuffix(name, "@float16+fused-attention") {
		t.Errorf("the model is %s, want it run in float16 with fused attention", name)
	}
}
