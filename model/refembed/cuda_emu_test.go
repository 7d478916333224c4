//go:build cuda

package refembed

// Tests of the CUDA backend that need faults a real GPU does not produce on
// demand: they run on the CPU emulation of the GPU (internal/testenv/cudaemu,
// make cuda-emu-test), which injects them, and skip on any other device.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/cuda"

	"gorgonia.org/cu"
)

// emulatedGPU is the device name of the emulator's libcuda.so.1.
const emulatedGPU = "vramq CPU-emulated GPU"

// requireEmulator skips the test on any other device; under make
// cuda-emu-test (which sets VRAMQ_EMU_STATE) a missing emulator fails it.
func requireEmulator(t *testing.T) {
	t.Helper()
	if name, err := cu.Device(0).Name(); err != nil || name != emulatedGPU {
		msg := fmt.Sprintf("needs the emulated GPU (make cuda-emu-test); device 0 is %q (%v; driver: %v)", name, err, cuda.DriverError())
		if os.Getenv("VRAMQ_EMU_STATE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// A cuBLAS that loads but cannot make a handle (one newer than the driver)
// is passed over for the next; when none works, the error names each
// library with its failure.
func TestCUDAEmuCublasCandidates(t *testing.T) {
	requireEmulator(t)
	t.Setenv("VRAMQ_CUBLAS", "")
	t.Setenv("VRAMQ_EMU_CUBLAS_FAIL", "libcublas.so.13")
	m, _, _ := newCUDATestModel(t)
	if m.own.Blas.Path != "libcublas.so.12" {
		t.Errorf("with libcublas.so.13 failing cublasCreate, the model uses %s, want libcublas.so.12", m.own.Blas.Path)
	}
	if _, err := m.Run(context.Background(), testTexts(3)); err != nil {
		t.Fatal(err)
	}

	t.Setenv("VRAMQ_EMU_CUBLAS_FAIL", "libcublas.so.13,libcublas.so.12")
	cfg := DefaultConfig()
	_, err := NewCUDAEmbedder(0, GenerateWeights(cfg), cfg)
	if err == nil {
		t.Fatal("no error with every cuBLAS failing")
	}
	for _, want := range []string{
		"libcublas.so.13: cuBLAS cublasCreate: status 1",
		"libcublas.so.12: cuBLAS cublasCreate: status 1",
		"libcublas.so.11: libcublas.so.11: cannot open",
		"libcublas.so: libcublas.so: cannot open",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}

// A sticky fault (an illegal address, a launch failure), in a kernel or in
// cuBLAS, loses the device: that batch and every later one fail with
// gpu.ErrDeviceLost, where any other error would be taken as transient and the
// messages retried, each failing in turn.
func TestCUDAEmuStickyFaultLosesDevice(t *testing.T) {
	requireEmulator(t)
	for _, fault := range []string{"launch=1", "launch=3", "launch=2,error=launch-failed"} {
		t.Run(fault, func(t *testing.T) {
			m, _, _ := newCUDATestModel(t)
			// The warm-up batch has run; count from the first batch's launches.
			t.Setenv("VRAMQ_EMU_FAULT", fault)
			_, err := m.Run(context.Background(), testTexts(4))
			if !errors.Is(err, gpu.ErrDeviceLost) {
				t.Fatalf("the faulting batch: err %v, want gpu.ErrDeviceLost", err)
			}
			t.Setenv("VRAMQ_EMU_FAULT", "")
			if _, err := m.Run(context.Background(), testTexts(2)); !errors.Is(err, gpu.ErrDeviceLost) {
				t.Errorf("the next batch: err %v, want gpu.ErrDeviceLost", err)
			}
			if _, _, err := m.MemGetInfo(); !errors.Is(err, gpu.ErrDeviceLost) {
				t.Errorf("MemGetInfo: err %v, want gpu.ErrDeviceLost", err)
			}
			if n := m.Working(); n != 0 {
				t.Errorf("after the fault the model still counts %d bytes working", n)
			}
		})
	}
}

// Out of memory is not a lost device: the model keeps working.
func TestCUDAEmuOutOfMemoryIsNotDeviceLost(t *testing.T) {
	requireEmulator(t)
	m, _, _ := newCUDATestModel(t)
	items := testTexts(64)
	release := hogMemory(t, m, m.Cost(items)/2)
	_, err := m.Run(context.Background(), items)
	release()
	if !errors.Is(err, gpu.ErrOutOfMemory) || errors.Is(err, gpu.ErrDeviceLost) {
		t.Fatalf("err %v, want gpu.ErrOutOfMemory and not gpu.ErrDeviceLost", err)
	}
	if _, err := m.Run(context.Background(), items); err != nil {
		t.Fatal(err)
	}
}

// A kernel that runs past the end of its buffer faults on the emulator's
// guard page, which the emulated driver turns into a sticky illegal address,
// as a GPU does, instead of a crash of the process (the Go runtime forwards
// faults in C code to the handler that was installed first).
func TestCUDAEmuKernelOverrunIsIllegalAddress(t *testing.T) {
	requireEmulator(t)
	m, _, _ := newCUDATestModel(t)
	var launchErr, syncErr error
	if err := m.own.Do(func() {
		p, err := cu.MemAlloc(1024)
		if err != nil {
			launchErr = err
			return
		}
		rows, width := int64(1<<12), int64(m.cfg.Hidden) // far more than 1 KiB
		launchErr = cuda.Launch(m.fns.gelu, 64, 256, &p, &m.w.b1, &rows, &width)
		syncErr = cu.Synchronize()
	}); err != nil {
		t.Fatal(err)
	}
	if launchErr != nil || !errors.Is(syncErr, cu.IllegalAddress) {
		t.Fatalf("launch: %v, then synchronize: %v; want nil, then IllegalAddress", launchErr, syncErr)
	}
	if _, err := m.Run(context.Background(), testTexts(2)); !errors.Is(err, gpu.ErrDeviceLost) {
		t.Errorf("the next batch: %v, want gpu.ErrDeviceLost", err)
	}
}
