// Command engine runs the model-server path against a real engine on a GPU
// machine, for `make gpu-verify` (issue 36, item 3): it looks for vLLM,
// then transformers' server; starts the first it finds on a small
// Llama-style model it writes itself with random weights (nothing from a
// hub); drives it with a batch through the model-server backend and an
// online load beside it; and writes a markdown section of the gpu-verify
// report with the figures, or with what it looked for and did not find.
//
//	engine -out engine.md [-dir DIR] [-python python3] [-phase 40s]
//
// It exits 0 when no server is installed (the section says so), 1 when one
// is but the run failed, and 2 on a bad command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/vramq/vramq/internal/cli"
)

type options struct {
	out, dir, python, engine, url string
	phase, period, ready          time.Duration
	seqs, blocks, maxLen          int
	workers, batchItems           int
	maxTokens, onlineMax          int
	stream                        bool
}

func main() { cli.Main("engine", parseAndRun) }

func parseAndRun(ctx context.Context) error {
	var o options
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	python := os.Getenv("VRAMQ_TORCH_PYTHON")
	if python == "" {
		python = "python3"
	}
	fs.StringVar(&o.out, "out", "", "the markdown section's file; empty: standard output")
	fs.StringVar(&o.dir, "dir", "", "where the model and the server's log go; empty: a new temporary directory")
	fs.StringVar(&o.python, "python", python, "the Python interpreter to look in and run the servers with (VRAMQ_TORCH_PYTHON)")
	fs.StringVar(&o.engine, "engine", "auto", "auto (vLLM, else transformers), vllm, transformers, or none (only the probe)")
	fs.StringVar(&o.url, "url", "", "drive a server already running at this URL (its model named by -model-name) instead of starting one")
	modelName := fs.String("model-name", servedName, "with -url: the model the requests name")
	fs.DurationVar(&o.phase, "phase", 40*time.Second, "each of the four phases' length")
	fs.DurationVar(&o.period, "period", 20*time.Second, "the online load's cycle, 20% to 90% of -seqs and back")
	fs.DurationVar(&o.ready, "ready", 5*time.Minute, "longest the server may take to answer after it starts")
	fs.IntVar(&o.seqs, "seqs", 64, "the server's max_num_seqs (vLLM --max-num-seqs) and the batch's concurrency")
	fs.IntVar(&o.blocks, "blocks", 2048, "vLLM's KV pool in blocks of 16 tokens (--num-gpu-blocks-override)")
	fs.IntVar(&o.maxLen, "max-len", 2048, "the server's max_model_len")
	fs.IntVar(&o.workers, "workers", 16, "batch callers, each running -batch-items items at a time")
	fs.IntVar(&o.batchItems, "batch-items", 8, "chat items of one Run")
	fs.IntVar(&o.maxTokens, "max-tokens", 512, "a batch item's max_tokens")
	fs.IntVar(&o.onlineMax, "online-tokens", 64, "an online request's max_tokens")
	fs.BoolVar(&o.stream, "stream", true, "online requests stream, and their TTFT is measured; false: their whole latency (a server that cannot stream)")
	writeOnly := fs.String("write-model", "", "only write the generated model (config.json, tokenizer) into this directory, and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if *writeOnly != "" {
		return writeModel(*writeOnly)
	}
	var w io.Writer = os.Stdout
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return err
		}
		err = run(ctx, o, *modelName, f)
		return errors.Join(err, f.Close())
	}
	return run(ctx, o, *modelName, w)
}

// run probes, starts, drives and reports; the section is written whatever
// happens, and the error says why the run stopped short.
func run(ctx context.Context, o options, modelName string, w io.Writer) (err error) {
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "vramq-engine-"); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := filepath.Join(o.dir, "model")
	r := report{found: probe(ctx, o.python), blocks: o.blocks, logPath: filepath.Join(o.dir, "server.log"), date: time.Now()}
	r.opts = driveOpts{seqs: o.seqs, phase: o.phase, period: o.period, workers: o.workers, batchItems: o.batchItems,
		maxTokens: o.maxTokens, onlineMax: o.onlineMax, stream: o.stream, minBatch: 1, minOnline: 1, logger: logger,
		// transformers' server refuses a request with a field it does not
		// know, and has no priorities to mark batch requests with.
		priority: 10}
	defer func() {
		if werr := r.write(w); err == nil {
			err = werr
		}
	}()
	switch {
	case o.url != "":
		r.engine, r.opts.base, r.opts.model = "a server", o.url, modelName
	case o.engine == "auto":
		r.engine = r.found.engine()
	case o.engine == "none":
	case o.engine == "vllm" || o.engine == "transformers":
		r.engine = o.engine
	default:
		return fmt.Errorf("-engine %q: want auto, vllm, transformers or none", o.engine)
	}
	if r.engine == "" {
		return nil
	}
	if o.url == "" {
		var env []string
		if r.engine == "transformers" {
			r.opts.priority = 0
			if dir, env, err = hfCache(filepath.Join(o.dir, "hf")); err != nil {
				r.err = err
				return err
			}
		}
		if err := writeModel(dir); err != nil {
			r.err = err
			return err
		}
		s, err := start(ctx, r.engine, serverOpts{python: o.python, dir: dir, env: env, logPath: r.logPath, maxSeqs: o.seqs,
			gpuBlocks: o.blocks, maxLen: o.maxLen, ready: o.ready}, r.found)
		if s != nil {
			r.argv = s.argv
		} else if r.engine == "vllm" {
			r.argv = vllmArgv(serverOpts{python: o.python, dir: dir, maxSeqs: o.seqs, gpuBlocks: o.blocks, maxLen: o.maxLen}, 0)
		}
		if err != nil {
			r.err, r.logTail = err, logTail(r.logPath, 30)
			return err
		}
		defer s.stop()
		r.opts.base, r.opts.model = s.base, s.model
		if r.engine == "vllm" {
			// Every answer as long as it may be: random weights pick the
			// eos token at random, and the figures want full-length work.
			r.opts.extra = `"ignore_eos":true`
		}
	}
	for i, p := range phases {
		if i > 0 {
			// The backend lets requests it sent run on when a Run is
			// cancelled: the next phase starts on an idle server.
			drain(ctx, r.opts.base, time.Minute)
		}
		res, err := runPhase(ctx, r.opts, p)
		if err != nil {
			r.err = err
			return err
		}
		r.results = append(r.results, res)
	}
	return nil
}
