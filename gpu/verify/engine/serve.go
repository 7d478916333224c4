package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// servedName is the model's name on vLLM's routes; cachedRepo its name in
// the Hugging Face cache layout transformers' server lists models from.
const (
	servedName = "vramq-engine"
	cachedRepo = "vramq/engine"
)

// hfCache lays the model out under root as Hugging Face's cache holds a
// repository (hub/models--vramq--engine/snapshots/REV, refs/main naming
// REV): transformers' server lists only cached repositories on
// GET /v1/models, which the model-server backend checks at Open, and loads
// one offline from there. It returns the snapshot directory to write the
// model into and the environment that points the server at root.
func hfCache(root string) (string, []string, error) {
	const rev = "0000000000000000000000000000000000000000"
	repo := filepath.Join(root, "hub", "models--"+strings.ReplaceAll(cachedRepo, "/", "--"))
	snap := filepath.Join(repo, "snapshots", rev)
	if err := os.MkdirAll(filepath.Join(repo, "refs"), 0o755); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(rev), 0o644); err != nil {
		return "", nil, err
	}
	return snap, []string{"HF_HOME=" + root, "HF_HUB_CACHE=" + filepath.Join(root, "hub")}, nil
}

// saveScript saves a model of random weights from the config.json in
// argv[1], into the same directory, for transformers' server, which has no
// dummy load format.
const saveScript = `
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(1)
cfg = AutoConfig.from_pretrained(sys.argv[1])
AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(sys.argv[1])
`

// serverOpts are the server's limits, the same for every engine where it
// has them.
type serverOpts struct {
	python    string
	dir       string   // the model directory writeModel wrote
	env       []string // added to the server's environment
	logPath   string
	maxSeqs   int // vLLM's --max-num-seqs: the capacity online traffic is a share of
	gpuBlocks int // vLLM's --num-gpu-blocks-override, blocks of 16 tokens
	maxLen    int
	ready     time.Duration
}

// server is a started model server.
type server struct {
	cmd     *exec.Cmd
	base    string
	model   string   // the name requests give
	argv    []string // as started, for the report
	exited  chan struct{}
	waitErr error
}

// offlineEnv keeps every library off the network: nothing may come from a
// hub, and the GPU machine has no network to try.
var offlineEnv = []string{"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_DATASETS_OFFLINE=1",
	"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"}

// vllmArgv is vLLM's OpenAI server on the generated model with random
// weights. The KV pool is fixed in blocks rather than taken from the GPU's
// free memory, so that it fills under the benchmark's load as a real
// model's would on a smaller card; priority scheduling is what
// online-first mode marks batch requests for.
func vllmArgv(o serverOpts, port int) []string {
	return []string{o.python, "-m", "vllm.entrypoints.openai.api_server",
		"--model", o.dir, "--served-model-name", servedName, "--load-format", "dummy", "--dtype", "bfloat16",
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--max-model-len", strconv.Itoa(o.maxLen), "--max-num-seqs", strconv.Itoa(o.maxSeqs),
		"--num-gpu-blocks-override", strconv.Itoa(o.gpuBlocks), "--gpu-memory-utilization", "0.3",
		"--scheduling-policy", "priority", "--enforce-eager"}
}

// transformersArgv is transformers' server; it loads the model a request
// names from the cache hfCache laid out.
func transformersArgv(f findings, port int) []string {
	return []string{f.Binaries["transformers"], "serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port)}
}

// start starts engine's server and waits until it answers HTTP, the
// process exits, or o.ready passes.
func start(ctx context.Context, engine string, o serverOpts, f findings) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(o.logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	env := append(append(os.Environ(), offlineEnv...), o.env...)
	s := &server{base: "http://127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	switch engine {
	case "vllm":
		s.argv, s.model = vllmArgv(o, port), servedName
	case "transformers":
		save := exec.CommandContext(ctx, o.python, "-c", saveScript, o.dir)
		save.Env, save.Stdout, save.Stderr = env, log, log
		if err := save.Run(); err != nil {
			return nil, fmt.Errorf("saving random weights from config.json: %w (log: %s)", err, o.logPath)
		}
		s.argv, s.model = transformersArgv(f, port), cachedRepo
	default:
		return nil, fmt.Errorf("no server to start for %q", engine)
	}
	s.cmd = exec.Command(s.argv[0], s.argv[1:]...)
	s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr = env, log, log
	// Its own process group, so that stop reaches the workers it forks
	// (vLLM's engine core runs in a process of its own).
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	deadline := time.NewTimer(o.ready)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited before it answered: %v (log: %s)", engine, s.waitErr, o.logPath)
		case <-deadline.C:
			s.stop()
			return nil, fmt.Errorf("%s did not answer within %v (log: %s)", engine, o.ready, o.logPath)
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-tick.C:
			if answers(ctx, s.base+"/v1/models") {
				return s, nil
			}
		}
	}
}

// answers is whether url answers HTTP at all: both servers bind their port
// only once the model is loaded.
func answers(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// stop ends the server's process group: SIGTERM, then SIGKILL after 30 s.
func (s *server) stop() {
	if s == nil || s.cmd.Process == nil {
		return
	}
	pg := -s.cmd.Process.Pid
	_ = syscall.Kill(pg, syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(pg, syscall.SIGKILL)
		<-s.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail is the last n lines of the server's log, for the report when it
// would not start.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var errNoEngine = errors.New("neither vLLM nor transformers serve with PyTorch is installed")
