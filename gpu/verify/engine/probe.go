package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// What the engine run looks for on the machine, in the order it would run
// them: vLLM first, then transformers' own server.
var (
	lookModules  = []string{"vllm", "transformers", "torch", "fastapi", "uvicorn"}
	lookBinaries = []string{"vllm", "transformers", "nvidia-smi"}
)

// probeScript asks the interpreter for each module's distribution version
// without importing it (importing vLLM takes seconds and may start CUDA):
// a module that cannot start shows when its server does, in the server's log.
const probeScript = `
import importlib.util, importlib.metadata, json, os, shutil, sys
here = os.path.dirname(sys.executable)
out = {"python": sys.version.split()[0], "executable": sys.executable, "modules": {},
       "scripts": {b: shutil.which(b, path=here) or "" for b in ("vllm", "transformers")}}
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception as e:
        found = False
    if not found:
        out["modules"][name] = ""
        continue
    try:
        out["modules"][name] = importlib.metadata.version(name)
    except Exception:
        out["modules"][name] = "installed, version unknown"
print(json.dumps(out))
`

// findings is what the probe found: a module or binary missing has an
// empty version or path.
type findings struct {
	Python     string            // the interpreter asked
	PythonInfo string            // its version and path, or why it could not be asked
	Modules    map[string]string // module: version, "" when not found
	Binaries   map[string]string // binary: path, "" when not on PATH
	Device     string            // nvidia-smi's name, driver and memory, or why not
}

// probe asks python about lookModules and the PATH about lookBinaries.
func probe(ctx context.Context, python string) findings {
	f := findings{Python: python, Modules: map[string]string{}, Binaries: map[string]string{}}
	for _, b := range lookBinaries {
		if p, err := exec.LookPath(b); err == nil {
			f.Binaries[b] = p
		} else {
			f.Binaries[b] = ""
		}
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(pctx, python, append([]string{"-c", probeScript}, lookModules...)...).Output()
	var got struct {
		Python, Executable string
		Modules            map[string]string
		// Scripts are the binaries beside the interpreter (a virtual
		// environment's bin/, often not on PATH).
		Scripts map[string]string
	}
	switch {
	case err != nil:
		f.PythonInfo = fmt.Sprintf("could not be run: %v", err)
	case json.Unmarshal(out, &got) != nil:
		f.PythonInfo = fmt.Sprintf("answered %q, not the probe's JSON", clip(string(out), 200))
	default:
		f.PythonInfo = fmt.Sprintf("Python %s at %s", got.Python, got.Executable)
	}
	for _, m := range lookModules {
		f.Modules[m] = got.Modules[m]
	}
	for b, p := range got.Scripts {
		if _, ok := f.Binaries[b]; ok && f.Binaries[b] == "" {
			f.Binaries[b] = p
		}
	}
	f.Device = "no nvidia-smi on PATH"
	if f.Binaries["nvidia-smi"] != "" {
		out, err := exec.CommandContext(pctx, "nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader").Output()
		if err != nil {
			f.Device = fmt.Sprintf("nvidia-smi failed: %v", err)
		} else {
			f.Device = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
		}
	}
	return f
}

// engine is the server the run starts: "vllm", "transformers", or "" when
// neither is installed. transformers' server is its `transformers serve`
// command (the `transformers` binary; older releases have only
// transformers-cli, whose serve is another API) with the serving extras
// (transformers[serving]: FastAPI and uvicorn) and PyTorch.
func (f findings) engine() string {
	switch {
	case f.Modules["vllm"] != "":
		return "vllm"
	case f.Binaries["transformers"] != "" && f.Modules["transformers"] != "" && f.Modules["torch"] != "" &&
		f.Modules["fastapi"] != "" && f.Modules["uvicorn"] != "":
		return "transformers"
	}
	return ""
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
