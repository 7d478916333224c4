package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/refembed"
)

func TestCalibrateFlags(t *testing.T) {
	none := func(string) string { return "" }
	o, err := parse([]string{"-calibrate", "-device=sim", "-cost-model=/tmp/x.json", "-calibrate-items=3"}, none, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("-calibrate needs no queue URLs: %v", err)
	}
	if !o.calibrate || o.costModel != "/tmp/x.json" || o.calibrateItems != 3 {
		t.Errorf("parsed %+v", o)
	}
	env := map[string]string{"VRAMQ_CALIBRATE": "true", "VRAMQ_COST_MODEL": "/m.json"}
	if o, err = parse(nil, func(k string) string { return env[k] }, &bytes.Buffer{}); err != nil || !o.calibrate || o.costModel != "/m.json" {
		t.Errorf("from the environment: %+v, %v", o, err)
	}
	if _, err := parse([]string{"-cost-model=/m.json"}, none, &bytes.Buffer{}); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "missing -queue-url") {
		t.Errorf("without -calibrate the queues are required: %v", err)
	}
	for _, bad := range []string{"-calibrate-items=-1", "-calibrate-points=1"} {
		name, _, _ := strings.Cut(bad, "=")
		if _, err := parse([]string{"-calibrate", bad}, none, &bytes.Buffer{}); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	var help bytes.Buffer
	_, _ = parse([]string{"-h"}, none, &help)
	for _, want := range []string{"-calibrate", "-calibrate-items", "-calibrate-points", "-cost-model", "$VRAMQ_COST_MODEL"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h does not list %s", want)
		}
	}
}

// -calibrate on the simulated device: the report, a file the subscriber
// loads, and no queue needed.
func TestCalibrateEndToEnd(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	path := filepath.Join(t.TempDir(), "cost.json")
	var out bytes.Buffer
	args := []string{"-calibrate", "-device=sim", "-calibrate-items=6", "-calibrate-points=8", "-cost-model=" + path, "-metrics-addr=",
		"-log-format=text"}
	if err := run(t.Context(), args, func(string) string { return "" }, &out); err != nil {
		t.Fatalf("run -calibrate: %v\n%s", err, out.String())
	}
	analytic := refembed.DefaultConfig().CostModel()
	for _, want := range []string{"fitted model:      1028 B/token + 6148 B/item + 0 B/batch", "worst under-estimate of the least squares: none",
		"cost model written", "on sim"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
	f, err := calibrate.ReadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.CostModel != analytic || f.Device != "sim" || f.MaxItems != 6 || f.Samples < 20 || !strings.HasPrefix(f.Model, "ref-embed-v1-") {
		t.Errorf("file %+v", f)
	}

	// A subscriber given it applies it; one with a heavier per-batch
	// charge shows that Cost follows the file.
	f.PerBatch = 5 << 20
	if err := calibrate.SaveCostModel(path, f); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o, dev, model := openForTest(t, log, "-device=sim", "-cost-model="+path)
	items := []job.Item{{ID: "a", Text: "three short words"}}
	before := model.Cost(items)
	if err := useCostModel(o, dev, model, log); err != nil {
		t.Fatal(err)
	}
	if got, want := model.Cost(items), before+5<<20; got != want {
		t.Errorf("Cost after -cost-model = %d, want %d", got, want)
	}
	if !strings.Contains(logs.String(), "cost model loaded") || !strings.Contains(logs.String(), "per_batch=5242880") {
		t.Errorf("the log does not show the loaded model:\n%s", logs.String())
	}

	// Fitted for another model: the start fails, before any queue.
	f.Model = "some-other-model"
	if err := calibrate.SaveCostModel(path, f); err != nil {
		t.Fatal(err)
	}
	err = run(t.Context(), []string{"-device=sim", "-cost-model=" + path, "-metrics-addr="}, queueEnv, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "-cost-model") || !strings.Contains(err.Error(), `fitted for model "some-other-model"`) {
		t.Errorf("a cost model of another model: %v", err)
	}
}

// With -cost-model the subscriber admits and dead-letters by the calibrated
// estimate: a message the analytic model would run is too large for the
// whole budget under a cost model that says a token takes 64 KiB.
func TestCostModelFlagDecidesAdmission(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)
	path := filepath.Join(t.TempDir(), "cost.json")
	name := "ref-embed-v1-v16384-d256-h1024-o256-t512"
	if err := calibrate.SaveCostModel(path, calibrate.CostModelFile{Model: name, Device: "sim",
		CostModel: gpu.CostModel{PerToken: 64 << 10, PerItem: 6148}}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("word ", 500) // 500 tokens: 31.3 MiB by the file, over the 29 MiB budget; 508 KiB analytic
	if err := jobq.Send(t.Context(), client, urls.Work, []job.Work{
		{V: 1, JobID: "cm", Chunk: 0, Chunks: 2, Items: []job.Item{{ID: "short", Text: "a few words"}}},
		{V: 1, JobID: "cm", Chunk: 1, Chunks: 2, Items: []job.Item{{ID: "long", Text: long}}},
	}); err != nil {
		t.Fatal(err)
	}
	c, logs := runWhile(t, client, urls, map[string]string{"VRAMQ_COST_MODEL": path, "VRAMQ_LOG_LEVEL": "info", "VRAMQ_LOG_FORMAT": "text"},
		"a result and a dead-lettered message", func(c *jobq.Collector) bool {
			dlq, _, err := jobq.Counts(t.Context(), client, urls.DLQ)
			return err == nil && len(c.Results) == 1 && dlq == 1
		})
	if _, ok := c.Results[job.Key{JobID: "cm", Chunk: 0}]; !ok {
		t.Errorf("results %v: want chunk 0's", c.Results)
	}
	for _, want := range []string{"cost model loaded", "too_large"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

// -calibrate -model DIR fits a BERT's cost model by padded shape, with a
// length² term, here on the simulated device (the CUDA build's test does
// it on the emulated GPU); -cost-model -model DIR makes Cost apply it, and
// a file fitted for another device or model stops the start.
func TestCalibrateBERTEndToEnd(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	dir := tinyBERT(t, "calib-tiny", 2, 4, 64)
	path := filepath.Join(t.TempDir(), "cost.json")
	var out bytes.Buffer
	args := []string{"-calibrate", "-device=sim", "-model=" + dir, "-calibrate-items=4", "-calibrate-points=6", "-cost-model=" + path,
		"-metrics-addr=", "-log-format=text"}
	if err := run(t.Context(), args, func(string) string { return "" }, &out); err != nil {
		t.Fatalf("run -calibrate -model: %v\n%s", err, out.String())
	}
	for _, want := range []string{"padded to 1 to 64 tokens, 4 attention heads", "B/attention score", "cost model written", "max_seq_length=64"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
	f, err := calibrate.ReadCostModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Model != "bert:calib-tiny" || f.Device != "sim" || f.Form != calibrate.FormPadded || f.Heads != 4 || f.MaxTokens != 64 ||
		f.MaxItems != 4 || f.PerScore == 0 {
		t.Errorf("file %+v", f)
	}

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o, dev, model := openForTest(t, log, "-device=sim", "-model="+dir, "-cost-model="+path)
	if err := useCostModel(o, dev, model, log); err != nil {
		t.Fatal(err)
	}
	items := []job.Item{{ID: "a", Text: "three short words"}} // 5 tokens
	if got, want := model.Cost(items), f.Padded(1, 5, 4); got != want {
		t.Errorf("Cost after -cost-model = %d, want the file's %d", got, want)
	}
	if !strings.Contains(logs.String(), "form=padded") || !strings.Contains(logs.String(), "heads=4") {
		t.Errorf("the log does not show the loaded model:\n%s", logs.String())
	}

	for _, tc := range []struct {
		edit func(*calibrate.CostModelFile)
		want string
	}{
		{func(f *calibrate.CostModelFile) { f.Device = "NVIDIA H100 80GB HBM3" }, `fitted on device "NVIDIA H100 80GB HBM3", not "sim"`},
		{func(f *calibrate.CostModelFile) { f.Model = "bert:another" }, `fitted for model "bert:another"`},
		{func(f *calibrate.CostModelFile) { f.Form, f.Heads, f.PerScore = "", 0, 0 }, "not of padded shapes"},
	} {
		bad := f
		tc.edit(&bad)
		p := filepath.Join(t.TempDir(), "bad.json")
		if err := calibrate.SaveCostModel(p, bad); err != nil {
			t.Fatal(err)
		}
		err := run(t.Context(), []string{"-device=sim", "-model=" + dir, "-cost-model=" + p, "-metrics-addr="},
			queueEnv, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "-cost-model") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// queueEnv is an environment that names the three queues, which the
// subscriber's command line requires.
func queueEnv(k string) string {
	return map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d"}[k]
}

// openForTest parses args as the subscriber's command line (with the
// queue URLs it requires) and opens the device and model they name, closed
// when t ends.
func openForTest(t *testing.T, log *slog.Logger, args ...string) (*options, gpu.Device, closingModel) {
	t.Helper()
	o, err := parse(args, queueEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	dev, model, err := openBackend(o, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		model.Close()
		dev.Close()
	})
	return o, dev, model
}
