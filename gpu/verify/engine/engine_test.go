package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/model/wordpiece"
)

// The generated tokenizer is one the project's own WordPiece loader takes,
// with the ids the vocabulary gives, and config.json agrees with it.
func TestGeneratedModelLoads(t *testing.T) {
	dir := t.TempDir()
	if err := writeModel(dir); err != nil {
		t.Fatal(err)
	}
	tok, err := wordpiece.Load(dir)
	if err != nil {
		t.Fatalf("wordpiece.Load refused the generated tokenizer: %v", err)
	}
	v := vocab()
	if len(v) != vocabSize || tok.VocabSize() != vocabSize {
		t.Fatalf("vocabulary: %d pieces generated, %d loaded, want %d", len(v), tok.VocabSize(), vocabSize)
	}
	seen := map[string]bool{}
	for _, p := range v {
		if seen[p] {
			t.Fatalf("piece %q twice: ids would not be positions", p)
		}
		seen[p] = true
	}
	id := func(p string) int32 {
		for i, q := range v {
			if q == p {
				return int32(i)
			}
		}
		t.Fatalf("%q not in the vocabulary", p)
		return -1
	}
	// Lowercased; a word split into a piece and continuations; bos first,
	// no eos after.
	got := tok.Encode("The BATCH queue, zebra", -1)
	want := []int32{bosID, id("the"), id("batch"), id("queue"), id(","), id("z"), id("##eb"), id("##ra")}
	if !slicesEqual(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if s := tok.Specials(); s.CLS != bosID || s.SEP != eosID || s.PAD != 0 || s.UNK != 1 {
		t.Fatalf("specials %+v, want bos/[CLS] %d, eos/[SEP] %d, pad 0, unk 1", s, bosID, eosID)
	}

	var cfg struct {
		VocabSize   int `json:"vocab_size"`
		Layers      int `json:"num_hidden_layers"`
		Hidden      int `json:"hidden_size"`
		Heads       int `json:"num_attention_heads"`
		KVHeads     int `json:"num_key_value_heads"`
		HeadDim     int `json:"head_dim"`
		BOS         int `json:"bos_token_id"`
		EOS         int `json:"eos_token_id"`
		TorchDType  string
		Torch_dtype string `json:"torch_dtype"`
	}
	readJSON(t, filepath.Join(dir, "config.json"), &cfg)
	if cfg.VocabSize != vocabSize || cfg.BOS != bosID || cfg.EOS != eosID {
		t.Fatalf("config.json: vocab %d, bos %d, eos %d; want the tokenizer's %d, %d, %d", cfg.VocabSize, cfg.BOS, cfg.EOS, vocabSize, bosID, eosID)
	}
	if cfg.Heads*cfg.HeadDim != cfg.Hidden || cfg.Heads%cfg.KVHeads != 0 {
		t.Fatalf("config.json: %d heads of %d for hidden %d, %d KV heads: not a Llama shape", cfg.Heads, cfg.HeadDim, cfg.Hidden, cfg.KVHeads)
	}
	if got := 2 * cfg.Layers * cfg.KVHeads * cfg.HeadDim * 2; got != kvBytesPerToken || cfg.Torch_dtype != "bfloat16" {
		t.Fatalf("config.json gives %d B of KV a token (%s), the report says %d", got, cfg.Torch_dtype, kvBytesPerToken)
	}
	var tc map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &tc)
	if tc["chat_template"] == "" || tc["eos_token"] != "[SEP]" || tc["tokenizer_class"] != "PreTrainedTokenizerFast" {
		t.Fatalf("tokenizer_config.json: %v", tc)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fakePython writes an interpreter that answers the probe with the
// modules given installed, and puts only its directory on PATH, so that no
// binary of the machine's is found.
func fakePython(t *testing.T, modules, scripts map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ans, _ := json.Marshal(map[string]any{"python": "3.12.0", "executable": "/fake/python3", "modules": modules, "scripts": scripts})
	path := filepath.Join(dir, "python3")
	script := "#!/bin/sh\necho '" + string(ans) + "'\n" // echo: a builtin, with nothing on PATH
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	return path
}

// With neither server installed, the run starts nothing, succeeds, and its
// section names everything it looked for as not found. This is the path
// CI runs end to end.
func TestNotInstalledSection(t *testing.T) {
	// transformers serve beside the interpreter, but not its serving extras.
	python := fakePython(t, map[string]string{"transformers": "4.57.1", "torch": "2.9.0", "uvicorn": "0.38.0"},
		map[string]string{"transformers": "/venv/bin/transformers"})
	var out bytes.Buffer
	o := options{dir: t.TempDir(), python: python, engine: "auto", seqs: 8, blocks: 64, maxLen: 512}
	if err := run(t.Context(), o, servedName, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		heading,
		"- python (" + python + "): Python 3.12.0 at /fake/python3",
		"vllm (not found); transformers (4.57.1); torch (2.9.0); fastapi (not found); uvicorn (0.38.0)",
		"beside the interpreter: vllm (not found); transformers (/venv/bin/transformers); nvidia-smi (not found)",
		"- device (name, driver, memory): no nvidia-smi on PATH",
		"- server: none run: " + errNoEngine.Error(),
	} {
		if !strings.Contains(s, want) {
			t.Errorf("section lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "| phase |") {
		t.Errorf("figures without a server:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(o.dir, "model")); err == nil {
		t.Errorf("a model was written with no server to serve it")
	}
}

// An interpreter that cannot be run is reported as such, and the run
// still writes its section.
func TestNoPython(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var out bytes.Buffer
	missing := filepath.Join(t.TempDir(), "python3")
	if err := run(t.Context(), options{dir: t.TempDir(), python: missing, engine: "auto"}, servedName, &out); err != nil {
		t.Fatal(err)
	}
	if want := "- python (" + missing + "): could not be run: "; !strings.Contains(out.String(), want) {
		t.Fatalf("section lacks %q:\n%s", want, out.String())
	}
}

func TestEngineChoice(t *testing.T) {
	for _, c := range []struct {
		mods map[string]string
		want string
	}{
		{map[string]string{"vllm": "0.11.0", "transformers": "4.57.1", "torch": "2.9.0"}, "vllm"},
		{map[string]string{"vllm": "0.11.0"}, "vllm"},
		{map[string]string{"transformers": "4.57.1", "torch": "2.9.0", "fastapi": "0.1", "uvicorn": "0.1"}, "transformers"},
		{map[string]string{"transformers": "4.57.1", "torch": "2.9.0", "fastapi": "0.1"}, ""},
		{map[string]string{"transformers": "4.57.1", "torch": "2.9.0", "uvicorn": "0.1"}, ""},
		{map[string]string{"transformers": "4.57.1", "fastapi": "0.1", "uvicorn": "0.1"}, ""},
		{map[string]string{"torch": "2.9.0"}, ""},
		{map[string]string{}, ""},
	} {
		if got := (findings{Modules: c.mods, Binaries: map[string]string{"transformers": "/bin/transformers"}}).engine(); got != c.want {
			t.Errorf("engine(%v) = %q, want %q", c.mods, got, c.want)
		}
	}
	// Without the transformers binary (a release older than transformers
	// serve), no server.
	for _, c := range []struct {
		mods map[string]string
		want string
	}{
		{map[string]string{"transformers": "4.40.0", "torch": "2.9.0", "fastapi": "0.1", "uvicorn": "0.1"}, ""},
		{map[string]string{"vllm": "0.11.0"}, "vllm"},
	} {
		if got := (findings{Modules: c.mods, Binaries: map[string]string{"transformers": ""}}).engine(); got != c.want {
			t.Errorf("engine(%v) = %q, want %q", c.mods, got, c.want)
		}
	}
}

// The whole drive against fakeoai standing in for vLLM (its metrics, its
// max_num_seqs and KV pool): four phases, each ended by count (phase 0),
// and the section's figures read from the server's metrics and answers.
func TestDriveAgainstFake(t *testing.T) {
	s := fakeoai.New(fakeoai.Config{MaxNumSeqs: 8, BlockSize: 16, NumGPUBlocks: 256, MaxModelLen: 1024, TokenLatency: time.Millisecond, PriorityScheduling: true})
	defer s.Close()
	var out bytes.Buffer
	o := options{dir: t.TempDir(), python: fakePython(t, nil, nil), url: s.URL(), period: time.Second, seqs: 8,
		workers: 2, batchItems: 2, maxTokens: 32, onlineMax: 8, stream: false}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a hang fails rather than stalls the suite
	defer cancel()
	if err := run(ctx, o, "fake-model", &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	sec := out.String()
	rows := map[string][]string{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, " | ")
		for _, p := range phases {
			if strings.HasPrefix(line, "| "+p.name+" |") {
				rows[p.name] = cells
			}
		}
	}
	if len(rows) != len(phases) {
		t.Fatalf("%d phase rows, want %d:\n%s", len(rows), len(phases), sec)
	}
	num := regexp.MustCompile(`^\d+`)
	first := func(cell string) int {
		n, _ := strconv.Atoi(num.FindString(strings.TrimSpace(cell)))
		return n
	}
	for _, p := range phases {
		r := rows[p.name]
		// columns: 2 batch ok/failed, 4 server tokens/s, 5 KV, 7 429s, 8 503s, 10 online ok/failed
		if p.batch && first(r[2]) == 0 {
			t.Errorf("%s: no batch item answered: %v", p.name, r)
		}
		if p.online && first(r[10]) == 0 {
			t.Errorf("%s: no online answer: %v", p.name, r)
		}
		if r[4] == "n/a" || r[5] == "n/a" || first(r[4]) == 0 && !strings.HasPrefix(r[4], "0.") {
			t.Errorf("%s: the server's metrics were not read (tokens/s %q, KV %q)", p.name, r[4], r[5])
		}
		if r[7] != "0" || r[8] != "0" {
			t.Errorf("%s: %s 429s and %s 503s from a server without limits", p.name, r[7], r[8])
		}
	}
	if !strings.Contains(sec, "- online + batch, online-first: batch in flight") || !strings.Contains(sec, "without batch (") {
		t.Errorf("no online-first summary line:\n%s", sec)
	}
}

// A server that takes requests and never answers cuts each phase short
// after its overrun, marked so, rather than holding the GPU run forever.
func TestPhaseCutWhenServerHangs(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"stuck"}]}`)
		case "/v1/chat/completions":
			// The backend lets a request it sent run on when its Run is
			// cancelled; the test ends them.
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	defer close(stop)
	o := driveOpts{base: srv.URL, model: "stuck", seqs: 4, period: time.Second, workers: 1, batchItems: 1, maxTokens: 8,
		onlineMax: 8, minBatch: 1, minOnline: 1, overrun: 300 * time.Millisecond, logger: slog.New(slog.DiscardHandler)}
	for _, p := range phases[:2] {
		res, err := runPhase(t.Context(), o, p)
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		if !res.cut || res.onlineOK+res.batchOK != 0 {
			t.Errorf("%s: cut %v, %d online and %d batch answers from a server that never answers", p.name, res.cut, res.onlineOK, res.batchOK)
		}
		if res.kvMean != -1 || res.preemptions != -1 || res.serverTokens != -1 {
			t.Errorf("%s: figures %v %v %v from a server without /metrics, want -1 (n/a)", p.name, res.kvMean, res.preemptions, res.serverTokens)
		}
	}
}

// The project's WordPiece loader and transformers.js, an independent
// reading of Hugging Face's tokenizer.json, give the same ids for the
// generated tokenizer (testdata/hfjs.mjs wrote the golden file from it):
// what vLLM's tokenizer will make of the benchmark's prompts is what the
// backend counts.
func TestGeneratedTokenizerMatchesTransformersJS(t *testing.T) {
	var golden struct {
		Generator string
		Encode    []struct {
			Text string
			IDs  []int32
		}
		EOS int `json:"eos_token_id"`
		BOS int `json:"bos_token_id"`
	}
	readJSON(t, filepath.Join("testdata", "hfjs-golden.json"), &golden)
	if golden.EOS != eosID || golden.BOS != bosID || len(golden.Encode) == 0 {
		t.Fatalf("%s read eos %d, bos %d and %d texts; the model has %d and %d", golden.Generator, golden.EOS, golden.BOS, len(golden.Encode), eosID, bosID)
	}
	dir := t.TempDir()
	if err := writeModel(dir); err != nil {
		t.Fatal(err)
	}
	tok, err := wordpiece.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range golden.Encode {
		if got := tok.Encode(e.Text, -1); !slicesEqual(got, e.IDs) {
			t.Errorf("%q: wordpiece %v, %s %v", e.Text, got, golden.Generator, e.IDs)
		}
	}
}
