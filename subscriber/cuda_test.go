//go:build cuda

package subscriber

// Check 3 of the CUDA backend (bench/README.md, "On a GPU"): the budget
// follows the GPU's free memory when another process takes part of it. It
// needs a GPU: build with `make gpu-test-bin`, run build/gpu-test/subscriber.test
// on the GPU machine.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/internal/testenv/wait"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/model/refembed"
)

const gib = 1 << 30

// TestCUDAHog is not a test: run as a child process with VRAMQ_HOG_BYTES set,
// it holds that much device memory until its stdin closes, like any other
// tenant of the GPU would. It prints "ready" once the memory is held. With
// VRAMQ_HOG_BYTES=ask it first makes its context, prints "context", and reads
// the byte count from stdin: the parent can then size the hold from what is
// free once the hog's own context is in place, whatever that context costs
// (the emulator's is 256 MiB, a real driver's 300-500 MiB and varies).
func TestCUDAHog(t *testing.T) {
	spec := os.Getenv("VRAMQ_HOG_BYTES")
	if spec == "" {
		t.Skip("only a helper process for the tests that share the GPU with another process")
	}
	runtime.LockOSThread() // the context is this thread's
	ctx, err := cu.Device(0).MakeContext(cu.SchedBlockingSync)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Destroy()
	in := bufio.NewReader(os.Stdin)
	if spec == "ask" {
		fmt.Println("context")
		line, _ := in.ReadString('\n')
		spec = strings.TrimSpace(line)
	}
	n, err := strconv.ParseInt(spec, 10, 64)
	if err != nil {
		t.Fatalf("VRAMQ_HOG_BYTES: %v", err)
	}
	if n > 0 {
		p, err := cu.MemAlloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer cu.MemFree(p)
	}
	fmt.Println("ready")
	_, _ = in.ReadString('\n')
}

// startHog starts another process holding n bytes of GPU 0: PyTorch when
// VRAMQ_TORCH_PYTHON names a python with it (the example), else this
// test binary as TestCUDAHog. It returns when the memory is held; stop ends
// the process and waits for it.
func startHog(t *testing.T, n int64) (who string, stop func()) {
	t.Helper()
	return runHog(t, strconv.FormatInt(n, 10), nil)
}

// hogPage is what a driver rounds a large allocation up to (2 MiB pages on
// current NVIDIA drivers and on the emulator; PyTorch's caching allocator
// rounds large blocks to 2 MiB as well).
const hogPage = 2 << 20

// startHogLeaving starts another process on GPU 0 that leaves free about
// leave bytes: at least leave and less than one hogPage more. It measures
// free memory after the other process has made its CUDA context, so no
// context size is assumed.
func startHogLeaving(t *testing.T, dev gpu.Device, leave int64) (who string, stop func()) {
	t.Helper()
	return runHog(t, "ask", func() int64 {
		m, err := dev.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		if m.Free < leave {
			t.Fatalf("only %s free once the other process has its context; want at least %s",
				bytesize.Format(m.Free), bytesize.Format(leave))
		}
		// Whole pages, rounded down, so the driver's rounding up cannot
		// take the free memory below leave.
		return (m.Free - leave) / hogPage * hogPage
	})
}

// runHog starts the hog process with VRAMQ_HOG_BYTES=spec; with spec "ask",
// ask is called once the hog has its context and its answer is what it
// holds.
func runHog(t *testing.T, spec string, ask func() int64) (who string, stop func()) {
	t.Helper()
	var cmd *exec.Cmd
	if py := os.Getenv("VRAMQ_TORCH_PYTHON"); py != "" {
		who = "PyTorch"
		cmd = exec.Command(py, "-c", `import os, sys, torch
spec = os.environ["VRAMQ_HOG_BYTES"]
torch.cuda.init()
torch.empty(1, dtype=torch.uint8, device="cuda:0")  # the context, now
torch.cuda.synchronize()
if spec == "ask":
    print("context", flush=True)
    spec = sys.stdin.readline()
x = torch.empty(int(spec), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()`)
	} else {
		who = "a second CUDA process"
		cmd = exec.Command(os.Args[0], "-test.run", "^TestCUDAHog$")
	}
	cmd.Env = append(os.Environ(), "VRAMQ_HOG_BYTES="+spec)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	waitLine := func(want string) {
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				return
			}
		}
		// It exited without getting there: waiting for the budget to
		// shrink would only time out.
		stdin.Close()
		t.Fatalf("%s (VRAMQ_HOG_BYTES=%s) exited before %q: %v", who, spec, want, cmd.Wait())
	}
	if ask != nil {
		waitLine("context")
		if _, err := fmt.Fprintln(stdin, ask()); err != nil {
			t.Fatal(err)
		}
	}
	waitLine("ready")
	return who, func() {
		stdin.Close()
		_ = cmd.Wait()
	}
}

func TestCUDABudgetFollowsFreeMemory(t *testing.T) {
	cfg := refembed.DefaultConfig()
	b, err := refembed.OpenCUDA(0, refembed.GenerateWeights(cfg), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Logf("%s; %s", b.Model.Device(), b.CrossCheck)
	checkBudgetFollowsFreeMemory(t, b.Device, b.Model)
}

// checkBudgetFollowsFreeMemory runs a subscriber serving model on dev, a GPU,
// while another process takes and gives back part of its memory.
func checkBudgetFollowsFreeMemory(t *testing.T, dev gpu.Device, model gpu.Model) {
	const reserve = 256 << 20
	h := startWith(t, 1, Config{VRAMReserve: reserve, BudgetRefresh: 500 * time.Millisecond}, func(h *harness, c *Config) {
		c.Backend, c.Device = backend.InProcess{Model: model}, dev
	})
	defer h.shutdown()
	free := func() int64 {
		m, err := dev.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		return m.Free
	}
	start, free0 := h.sub.Budget(), free()

	// The other tenant takes a quarter of what the subscriber could use, at
	// least a GiB, so the change is far above the readings' tolerance.
	take := max(start/4, gib)
	who, stop := startHog(t, take)
	taken := free0 - free() // what it took, its own CUDA context included
	wait.For(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() < start-take })
	shrunk := h.sub.Budget()
	t.Logf("FIGURE check3: %s took %s (%s with its context, by NVML's free memory): budget %s -> %s (-%s)",
		who, bytesize.Format(take), bytesize.Format(taken), bytesize.Format(start), bytesize.Format(shrunk), bytesize.Format(start-shrunk))
	// It moves with free memory, within the readings' tolerance (an eighth
	// of the reserve).
	if d := (start - shrunk) - taken; d > reserve/8 || d < -reserve/8 {
		t.Errorf("the budget fell by %s while free memory fell by %s", bytesize.Format(start-shrunk), bytesize.Format(taken))
	}

	// Work still runs, within the smaller budget, without running out.
	for i := range 20 {
		h.send("shared", i, strings.Repeat("many words here ", 40), "short one")
	}
	wait.For(t, time.Minute, "20 results", func() bool { r, _ := h.results.Stats(); return r == 20 })
	if p := h.sub.PeakBytes(); p > shrunk {
		t.Errorf("admitted %s at once with a budget of %s", bytesize.Format(p), bytesize.Format(shrunk))
	}

	stop()
	wait.For(t, time.Minute, "the budget to come back", func() bool { return h.sub.Budget() > start-reserve/8 })
	t.Logf("FIGURE check3: %s exited: budget back to %s", who, bytesize.Format(h.sub.Budget()))
	if d, _ := h.dlq.Stats(); d != 0 {
		t.Errorf("%d dead letters", d)
	}
}
