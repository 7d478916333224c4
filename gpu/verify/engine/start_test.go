package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vramq/vramq/internal/testenv/fakeoai"
)

// The vLLM path end to end, with this test binary standing in for the
// interpreter: asked the probe, it answers that vLLM is installed; asked to
// run vLLM's OpenAI server, it checks the command line and the
// environment the run gives it and serves fakeoai on the port named, as
// vLLM would (docs: vllm serve's --port, --served-model-name,
// --max-num-seqs, --num-gpu-blocks-override, --load-format dummy). So the
// probe, the generated model, the start, the readiness wait, the drive and
// the stop of the process group all run as on the GPU machine.
func TestStartsVLLMAndDrives(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	python := filepath.Join(bin, "python3")
	script := fmt.Sprintf("#!/bin/sh\nVRAMQ_ENGINE_HELPER=1 exec %q -test.run='^TestHelperPython$' -- \"$@\"\n", self)
	if err := os.WriteFile(python, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	dir := t.TempDir()
	o := options{dir: dir, python: python, engine: "auto", seqs: 8, blocks: 256, maxLen: 1024, ready: time.Minute,
		period: time.Second, workers: 2, batchItems: 2, maxTokens: 32, onlineMax: 8, stream: false}
	var out bytes.Buffer
	if err := run(t.Context(), o, servedName, &out); err != nil {
		t.Fatalf("run: %v\n%s\nserver log:\n%s", err, out.String(), logTail(filepath.Join(dir, "server.log"), 30))
	}
	sec := out.String()
	for _, want := range []string{
		"- server: vLLM 0.0.0-helper, random weights (--load-format dummy), KV pool 256 blocks of 16 tokens",
		"--served-model-name " + servedName + " --load-format dummy",
		"| online + batch, online-first |",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("section lacks %q:\n%s", want, sec)
		}
	}
	if strings.Contains(sec, "FAILED") {
		t.Errorf("the run failed:\n%s", sec)
	}
	// The server was stopped: its port no longer answers.
	port := portOf(t, sec)
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
		c.Close()
		t.Errorf("the server still listens on %s after the run", port)
	}
}

// portOf is the --port of the command the section shows.
func portOf(t *testing.T, s string) string {
	t.Helper()
	i := strings.Index(s, "--port ")
	if i < 0 {
		t.Fatalf("no --port in:\n%s", s)
	}
	f := strings.Fields(s[i+len("--port "):])
	return f[0]
}

// TestHelperPython is the stand-in interpreter of TestStartsVLLMAndDrives;
// it does nothing in a plain test run.
func TestHelperPython(t *testing.T) {
	if os.Getenv("VRAMQ_ENGINE_HELPER") == "" {
		t.Skip("the stand-in interpreter of TestStartsVLLMAndDrives")
	}
	args := flag.Args()
	switch {
	case len(args) > 0 && args[0] == "-c":
		fmt.Println(`{"python": "3.12.0", "executable": "/helper/python3", "modules": {"vllm": "0.0.0-helper", "torch": "2.9.0"}}`)
		os.Exit(0)
	case len(args) > 2 && args[0] == "-m" && args[1] == "vllm.entrypoints.openai.api_server":
		os.Exit(fakeVLLM(args[2:]))
	}
	fmt.Fprintf(os.Stderr, "helper python: unexpected %q\n", args)
	os.Exit(2)
}

func fakeVLLM(args []string) int {
	fs := flag.NewFlagSet("vllm", flag.ContinueOnError)
	model := fs.String("model", "", "")
	name := fs.String("served-model-name", "", "")
	load := fs.String("load-format", "", "")
	port := fs.Int("port", 0, "")
	seqs := fs.Int("max-num-seqs", 0, "")
	blocks := fs.Int("num-gpu-blocks-override", 0, "")
	maxLen := fs.Int("max-model-len", 0, "")
	policy := fs.String("scheduling-policy", "", "")
	fs.String("host", "", "")
	fs.String("dtype", "", "")
	fs.String("gpu-memory-utilization", "", "")
	fs.Bool("enforce-eager", false, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var errs []string
	if *load != "dummy" {
		errs = append(errs, "--load-format "+*load)
	}
	if _, err := os.Stat(filepath.Join(*model, "config.json")); err != nil {
		errs = append(errs, "--model: "+err.Error())
	}
	if os.Getenv("HF_HUB_OFFLINE") != "1" {
		errs = append(errs, "HF_HUB_OFFLINE is not 1: the server may try the hub")
	}
	if len(errs) > 0 {
		fmt.Fprintln(os.Stderr, strings.Join(errs, "; "))
		return 3
	}
	// A run that failed to stop it must not leave it behind.
	parent := os.Getppid()
	go func() {
		for os.Getppid() == parent {
			time.Sleep(100 * time.Millisecond)
		}
		os.Exit(1)
	}()
	s := fakeoai.NewUnstarted(fakeoai.Config{Models: []string{*name}, MaxNumSeqs: *seqs, BlockSize: 16, NumGPUBlocks: *blocks,
		MaxModelLen: *maxLen, PriorityScheduling: *policy == "priority", TokenLatency: time.Millisecond})
	// As vLLM does, the port is bound only once the model is loaded.
	srv := &http.Server{Addr: "127.0.0.1:" + strconv.Itoa(*port), Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	return 1
}
