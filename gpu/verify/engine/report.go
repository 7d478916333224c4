package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// report is what the engine run found and measured, for its section of
// the gpu-verify report.
type report struct {
	found   findings
	engine  string // the server run, "" none
	argv    []string
	opts    driveOpts
	blocks  int
	results []phaseResult
	err     error  // why the run stopped short, nil when it did not
	logTail string // the server's last lines when it failed
	logPath string
	date    time.Time
}

// heading starts the section; run.sh and the tests find it by this line.
const heading = "## Real engine: the model-server path against a server on this machine (issue 36, item 3)"

func (r report) write(w io.Writer) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("%s", heading)
	p("")
	p("- date: %s", r.date.UTC().Format("2006-01-02T15:04Z"))
	p("- device (name, driver, memory): %s", r.found.Device)
	p("- python (%s): %s", r.found.Python, r.found.PythonInfo)
	var mods, bins []string
	for _, m := range lookModules {
		mods = append(mods, m+" "+orNot(r.found.Modules[m]))
	}
	for _, x := range lookBinaries {
		bins = append(bins, x+" "+orNot(r.found.Binaries[x]))
	}
	p("- python modules looked for: %s", strings.Join(mods, "; "))
	p("- binaries looked for on PATH and beside the interpreter: %s", strings.Join(bins, "; "))
	switch r.engine {
	case "":
		p("- server: none run: %v; looked for vLLM (module vllm), then transformers' server (the transformers binary, modules transformers, torch, fastapi and uvicorn)", errNoEngine)
	case "vllm":
		p("- server: vLLM %s, random weights (--load-format dummy), KV pool %d blocks of 16 tokens", r.found.Modules["vllm"], r.blocks)
	case "transformers":
		p("- server: transformers %s (transformers serve), random weights saved from config.json (from_config) as the cache entry %s", r.found.Modules["transformers"], cachedRepo)
	default:
		p("- server: %s at %s (already running)", r.engine, r.opts.base)
	}
	if len(r.argv) > 0 {
		p("- command: `%s`", strings.Join(r.argv, " "))
		p("- model: generated here (gpu/verify/engine/model.go), nothing from a hub: Llama-style, 8 layers of 1,024, 16 heads, 8 KV heads of 64 (%d B of KV a token), a WordPiece tokenizer of %d tokens", kvBytesPerToken, vocabSize)
	}
	if r.engine != "" {
		p("- load: %d batch callers × %d chat items a Run through the model-server backend (max_tokens %d); online: a closed loop of requests for up to %d tokens, its requests in flight moving from 20%% to 90%% of max_num_seqs %d and back over %v; %v a phase",
			r.opts.workers, r.opts.batchItems, r.opts.maxTokens, r.opts.onlineMax, r.opts.seqs, r.opts.period, r.opts.phase)
	}
	if r.err != nil {
		p("- result: FAILED: %v", r.err)
		if r.logTail != "" {
			p("")
			p("The server's last lines (%s):", r.logPath)
			p("")
			p("```")
			p("%s", r.logTail)
			p("```")
		}
	}
	if len(r.results) > 0 {
		writeFigures(p, r.results, r.opts.stream)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orNot(v string) string {
	if v == "" {
		return "(not found)"
	}
	return "(" + v + ")"
}

func writeFigures(p func(string, ...any), rs []phaseResult, stream bool) {
	lat := "TTFT"
	if !stream {
		lat = "latency (not streamed)"
	}
	na := func(v float64, format string) string {
		if v < 0 {
			return "n/a"
		}
		return fmt.Sprintf(format, v)
	}
	p("")
	p("| phase | seconds | batch items ok / failed | batch tokens/s | server tokens/s (prompt + generated) | KV used of the pool, mean / max | preemptions | 429s | 503s | other non-2xx | online answers / failed | online %s p50 / p99 | batch in flight, mean | slots online left, mean | online-first bound / give-ways |", lat)
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		online, ttft := "–", "–"
		if r.online {
			online = fmt.Sprintf("%d / %d", r.onlineOK, r.onlineFailed)
			ttft = fmt.Sprintf("%v / %v", ms(quantile(r.ttft, .5)), ms(quantile(r.ttft, .99)))
		}
		batch, btps := "–", "–"
		if r.batch {
			batch = fmt.Sprintf("%d / %d", r.batchOK, r.batchFailed)
			btps = fmt.Sprintf("%.0f", float64(r.batchTokens)/r.seconds)
		}
		kv := "n/a"
		if r.kvMean >= 0 {
			kv = fmt.Sprintf("%.3f / %.3f", r.kvMean, r.kvMax)
		}
		bound := "–"
		if r.onlineFirst {
			bound = na(r.bound, "%.0f") + " / " + na(r.giveWays, "%.0f")
		}
		stps := "n/a"
		if r.serverTokens >= 0 {
			stps = fmt.Sprintf("%.0f", r.serverTokens/r.seconds)
		}
		name := r.name
		if r.cut {
			name += " (cut short: no answer within the overrun)"
		}
		p("| %s | %.1f | %s | %s | %s | %s | %s | %d | %d | %d | %s | %s | %.1f | %.1f | %s |", name, r.seconds, batch, btps,
			stps, kv, na(r.preemptions, "%.0f"), r.s429, r.s503, r.sOther, online, ttft, r.batchSlots, r.idleSlots, bound)
	}
	// Issue 36's two figures for online-first mode, here against the real
	// server: online p99 against the phase without batch, and the batch's
	// share of the slots online left.
	var alone *phaseResult
	for i := range rs {
		if rs[i].online && !rs[i].batch {
			alone = &rs[i]
		}
	}
	for _, r := range rs {
		if !r.online || !r.batch {
			continue
		}
		line := fmt.Sprintf("- %s: batch in flight %.2f of the slots online left", r.name, r.batchSlots/max(r.idleSlots, 1e-9))
		if alone != nil && len(alone.ttft) > 0 && len(r.ttft) > 0 {
			a, w := quantile(alone.ttft, .99), quantile(r.ttft, .99)
			line += fmt.Sprintf("; online %s p99 %v against %v without batch (%+.1f%%)", lat, ms(w), ms(a), 100*(float64(w)/float64(a)-1))
		}
		p("%s", line)
	}
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
