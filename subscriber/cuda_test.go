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
	"github.com/vramq/vramq/model/refembed"
)

const gib = 1 << 30

// TestCUDAHog is not a test: run as a child process with VRAMQ_HOG_BYTES set,
// it holds that much device memory until its stdin closes, like any other
// tenant of the GPU would. It prints "ready" once the memory is held.
func TestCUDAHog(t *testing.T) {
	n, err := strconv.ParseInt(os.Getenv("VRAMQ_HOG_BYTES"), 10, 64)
	if err != nil {
		t.Skip("only a helper process for TestCUDABudgetFollowsFreeMemory")
	}
	runtime.LockOSThread() // the context is this thread's
	ctx, err := cu.Device(0).MakeContext(cu.SchedBlockingSync)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Destroy()
	p, err := cu.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer cu.MemFree(p)
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

// startHog starts another process holding n bytes of GPU 0: PyTorch when
// VRAMQ_TORCH_PYTHON names a python with it (the example), else this
// test binary as TestCUDAHog. It returns when the memory is held; stop ends
// the process and waits for it.
func startHog(t *testing.T, n int64) (who string, stop func()) {
	t.Helper()
	var cmd *exec.Cmd
	if py := os.Getenv("VRAMQ_TORCH_PYTHON"); py != "" {
		who = "PyTorch"
		cmd = exec.Command(py, "-c", fmt.Sprintf(`import sys, torch
x = torch.empty(%d, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()`, n))
	} else {
		who = "a second CUDA process"
		cmd = exec.Command(os.Args[0], "-test.run", "^TestCUDAHog$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("VRAMQ_HOG_BYTES=%d", n))
	}
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
	ready := false
	for !ready && sc.Scan() {
		ready = strings.Contains(sc.Text(), "ready")
	}
	if !ready {
		// It exited without holding the memory: waiting for the budget
		// to shrink would only time out.
		stdin.Close()
		t.Fatalf("%s exited before holding %d bytes: %v", who, n, cmd.Wait())
	}
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
		c.Model, c.Device = model, dev
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
	waitFor(t, time.Minute, "the budget to shrink", func() bool { return h.sub.Budget() < start-take })
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
	waitFor(t, time.Minute, "20 results", func() bool { r, _ := h.results.Stats(); return r == 20 })
	if p := h.sub.PeakBytes(); p > shrunk {
		t.Errorf("admitted %s at once with a budget of %s", bytesize.Format(p), bytesize.Format(shrunk))
	}

	stop()
	waitFor(t, time.Minute, "the budget to come back", func() bool { return h.sub.Budget() > start-reserve/8 })
	t.Logf("FIGURE check3: %s exited: budget back to %s", who, bytesize.Format(h.sub.Budget()))
	if d, _ := h.dlq.Stats(); d != 0 {
		t.Errorf("%d dead letters", d)
	}
}
