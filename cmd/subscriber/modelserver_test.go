package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
)

// Issue 27: a job of chat completions and one of embeddings run through the
// real subscriber, on the emulator's queues, against the fake model server
// (with a 503 and a dropped connection on the way); the results carry the
// server's answers, and an item the server refuses carries its refusal. It
// never skips: a guard on a feature it needs skipped it on every run
// (job.Item.Check refuses any body, which needs an endpoint), so a
// regression there must fail it instead.
func TestModelServerEndToEnd(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	srv := fakeoai.New(fakeoai.Config{MaxModelLen: 512, Faults: []fakeoai.Fault{
		{Kind: fakeoai.FaultStatus, Status: 503, Times: 1}, {Kind: fakeoai.FaultDrop, Skip: 3, Times: 1}}})
	defer srv.Close()
	client := sqstest.Client(t)
	urls := sqstest.Queues(t, client, 5)

	chat := func(id, text string) job.Item {
		return job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","messages":[{"role":"user","content":%q}],"max_tokens":16}`, text))}
	}
	var embeds []job.Item
	texts := map[string]string{}
	for i := range 10 {
		id, text := fmt.Sprintf("e%d", i), fmt.Sprintf("passage number %d", i)
		texts[id] = text
		embeds = append(embeds, job.Item{ID: id, Body: json.RawMessage(fmt.Sprintf(`{"model":"fake-model","input":%q}`, text))})
	}
	works := []job.Work{
		{V: job.Version, JobID: "chat", Chunk: 0, Chunks: 2, Endpoint: "/v1/chat/completions",
			Items: []job.Item{chat("a", "hello"), chat("b", "how are you"), chat("c", "tell me a story")}},
		{V: job.Version, JobID: "chat", Chunk: 1, Chunks: 2, Endpoint: "/v1/chat/completions",
			Items: []job.Item{chat("d", "one more"), chat("long", strings.Repeat("word ", 600))}},
		{V: job.Version, JobID: "emb", Chunk: 0, Chunks: 1, Endpoint: "/v1/embeddings", Items: embeds},
	}
	if err := jobq.Send(t.Context(), client, urls.Work, works); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"VRAMQ_MODEL_SERVER": srv.URL(), "VRAMQ_MODEL_SERVER_MODELS": "fake-model",
		"VRAMQ_VRAM_RESERVE": "", "VRAMQ_VRAM": ""}
	c, logs := runWhile(t, client, urls, env, "3 results", func(c *jobq.Collector) bool { return len(c.Results) >= 3 })

	for k, r := range c.Results {
		if r.Model != "model-server:fake-model" {
			t.Errorf("%v: model %q", k, r.Model)
		}
		for _, o := range r.Outputs {
			switch {
			case o.ID == "long":
				if o.Error == nil || o.Error.Code != job.ItemRequestRefused || o.Response == nil || o.Response.StatusCode != 422 {
					t.Errorf("the item past the context: %+v; want request_refused with the server's 422", o)
				}
			case k.JobID == "chat":
				var b struct {
					Object  string `json:"object"`
					Choices []struct {
						Message struct{ Content string } `json:"message"`
					} `json:"choices"`
				}
				if o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 || json.Unmarshal(o.Response.Body, &b) != nil ||
					b.Object != "chat.completion" || len(b.Choices) != 1 || b.Choices[0].Message.Content == "" {
					t.Errorf("chat item %s: %+v; want the server's chat.completion", o.ID, o)
				}
			default:
				var b struct {
					Data []struct {
						Embedding []float64 `json:"embedding"`
					} `json:"data"`
				}
				if o.Error != nil || o.Response == nil || json.Unmarshal(o.Response.Body, &b) != nil || len(b.Data) != 1 {
					t.Errorf("embedding item %s: %+v", o.ID, o)
					continue
				}
				if diff := cmp.Diff(fakeoai.Embed(texts[o.ID], 16), b.Data[0].Embedding); diff != "" {
					t.Errorf("embedding item %s is not its text's (-want +got):\n%s", o.ID, diff)
				}
			}
		}
	}
	if r := c.Results[job.Key{JobID: "chat", Chunk: 1}]; r.ItemsFailed != 1 {
		t.Errorf("chunk chat/1: %d items failed, want 1", r.ItemsFailed)
	}
	st := srv.Stats()
	if st.Faults[fakeoai.FaultStatus] != 1 || st.Faults[fakeoai.FaultDrop] != 1 {
		t.Errorf("faults injected: %v; want the 503 and the drop", st.Faults)
	}
	// 5 chat requests and 10 embeddings in one request, 2 faults retried.
	if st.Requests != 8 {
		t.Errorf("%d requests reached the server; want 8", st.Requests)
	}
	if t.Failed() {
		t.Logf("subscriber log:\n%s", logs)
	}
}

// -model-server's flags: required models, and no in-process model beside it.
func TestModelServerFlags(t *testing.T) {
	base := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model-server=http://localhost:8000"}, "no model names"},
		{[]string{"-model-server=http://localhost:8000", "-model-server-models=m", "-model=/x"}, "-model-server and -model"},
		{[]string{"-model-server=http://localhost:8000", "-model-server-models=m", "-calibrate"}, "-model-server and -calibrate"},
		{[]string{"-model-server=http://localhost:8000", "-model-server-models=m", "-vram=16GiB"}, "-model-server and -vram"},
		{[]string{"-model-server=http://localhost:8000", "-model-server-models=m", "-model-server-max-wait=5m"}, "below -inference-timeout"},
	} {
		_, err := parse(tc.args, func(k string) string { return base[k] }, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q) = %v; want a usage error saying %q", tc.args, err, tc.want)
		}
	}
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d",
		"VRAMQ_MODEL_SERVER": "http://localhost:8000", "VRAMQ_MODEL_SERVER_MODELS": "a, b", "KEY": "sk-secret"}
	o, err := parse([]string{"-model-server-api-key-env=KEY", "-model-server-tpm=100000", "-model-server-max-server-wait=10m",
		"-model-server-allow-remote-urls"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.ms.config(func(k string) string { return env[k] }, nil)
	if c.APIKey != "sk-secret" || c.TPM != 100000 || !cmp.Equal(c.Models, []string{"a", "b"}) || o.cfg.VRAMReserve != 1 ||
		c.MaxServerWait != 10*time.Minute || !c.AllowRemoteURLs {
		t.Errorf("config %+v, reserve %d; want the key from $KEY, TPM 100000, models a and b, no reserve, a 10m ceiling on server waits, remote URLs",
			c, o.cfg.VRAMReserve)
	}
}

// With a model server the budget is its KV cache in tokens, so the
// admission flags in a GPU's bytes would be read as tokens (-vram-reserve
// 1GiB a reserve of a billion tokens): they are refused with the flag to
// give instead, from the command line or the environment, and the KV
// flags set the budget's reserve, cap and batch size in tokens. Without a
// model server the KV flags are refused.
func TestModelServerAdmissionFlagsCountTokens(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d",
		"VRAMQ_MODEL_SERVER": "http://localhost:8000", "VRAMQ_MODEL_SERVER_MODELS": "m"}
	for _, tc := range []struct {
		args     []string
		env      map[string]string
		want     string
		noServer bool
	}{
		{args: []string{"-vram-reserve=1GiB"}, want: "-vram-reserve (VRAMQ_VRAM_RESERVE) counts a GPU's bytes; " +
			"with -model-server the budget is the server's KV cache in tokens: give -model-server-kv-reserve-tokens"},
		{args: []string{"-vram-limit=8GiB"}, want: "give -model-server-kv-limit-tokens"},
		{args: []string{"-max-batch-bytes=64MiB"}, want: "give -model-server-max-batch-kv-tokens"},
		{env: map[string]string{"VRAMQ_VRAM_LIMIT": "8GiB"}, want: "-vram-limit (VRAMQ_VRAM_LIMIT) counts a GPU's bytes"},
		{args: []string{"-model-server-kv-limit-tokens=-1"}, want: "-model-server-kv-limit-tokens=-1: want 0 or more"},
		{args: []string{"-model-server-kv-reserve-tokens=100"}, noServer: true,
			want: "-model-server-kv-reserve-tokens needs -model-server: without one the budget is the device's memory in bytes (-vram-reserve)"},
	} {
		getenv := func(k string) string {
			if v, ok := tc.env[k]; ok {
				return v
			}
			if tc.noServer && strings.HasPrefix(k, "VRAMQ_MODEL_SERVER") {
				return ""
			}
			return env[k]
		}
		_, err := parse(tc.args, getenv, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q, %v) = %v; want a usage error saying %q", tc.args, tc.env, err, tc.want)
		}
	}
	o, err := parse([]string{"-model-server-kv-reserve-tokens=512", "-model-server-kv-limit-tokens=40000",
		"-model-server-max-batch-kv-tokens=8192"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cfg; c.VRAMReserve != 512 || c.VRAMLimit != 40000 || c.MaxBatchBytes != 8192 {
		t.Errorf("reserve %d, limit %d, batch %d; want 512, 40000 and 8192 KV tokens", c.VRAMReserve, c.VRAMLimit, c.MaxBatchBytes)
	}
}

// Issue 32, item 3: the KV cache is counted in tokens, so the flags that
// sized it in bytes are gone; a deployment that still sets them starts,
// with a warning naming each (for one release), and the pool is the
// server's tokens whatever they said.
func TestDeprecatedKVByteFlagsWarn(t *testing.T) {
	srv := fakeoai.New(fakeoai.Config{BlockSize: 16, NumGPUBlocks: 100, MaxModelLen: 1024})
	defer srv.Close()
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d",
		"VRAMQ_MODEL_SERVER": srv.URL(), "VRAMQ_MODEL_SERVER_MODELS": "fake-model", "VRAMQ_MODEL_SERVER_CONFIG": "/models/config.json"}
	getenv := func(k string) string { return env[k] }
	o, err := parse([]string{"-model-server-kv-bytes-per-token=131072", "-model-server-kv-bytes-per-value", "1"}, getenv, io.Discard)
	if err != nil {
		t.Fatalf("parse with the deprecated flags: %v; want them accepted", err)
	}
	var logs strings.Builder
	m, err := openModelServer(t.Context(), o, getenv, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, f := range []string{"-model-server-kv-bytes-per-token", "-model-server-config", "-model-server-kv-bytes-per-value"} {
		if !strings.Contains(logs.String(), "level=WARN msg=\"a deprecated flag is ignored") || !strings.Contains(logs.String(), "flag="+f+"\n") {
			t.Errorf("no warning for %s in:\n%s", f, logs.String())
		}
	}
	if mem, err := m.Memory().Read(); err != nil || mem.Total != 100*16 || m.Memory().Unit() != backend.KVTokens {
		t.Errorf("the pool: %+v in %v, %v; want the server's 1600 KV tokens", mem, m.Memory().Unit(), err)
	}
}
