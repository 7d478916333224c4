//go:build cuda

package cuda

import (
	"fmt"
	"runtime"

	"github.com/vramq/vramq/gpu"

	"gorgonia.org/cu"
)

// cudaOwner is what every CUDA backend shares: one goroutine, locked to its
// OS thread, that owns a CUDA context (contexts are per thread) and makes
// every CUDA call through do; and the context, the kernels' module and
// cuBLAS it opens on that thread.
type cudaOwner struct {
	label   string // names the backend in errors
	ops     chan func()
	quit    chan struct{}
	stopped chan struct{}

	// Set by open, on the owner's goroutine.
	product string // e.g. "NVIDIA H100 80GB HBM3"
	devName string // e.g. "NVIDIA H100 80GB HBM3 (cuda:0)"
	cuctx   cu.CUContext
	mod     cu.Module
	blas    *cublas
}

func newCUDAOwner(label string) cudaOwner {
	return cudaOwner{label: label, ops: make(chan func()), quit: make(chan struct{}), stopped: make(chan struct{})}
}

// start runs the owner's goroutine: setup, then the ops do sends until stop,
// then teardown (also after a failed setup). It returns setup's error.
func (o *cudaOwner) start(setup func() error, teardown func()) error {
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer close(o.stopped)
		if err := setup(); err != nil {
			teardown()
			started <- err
			return
		}
		started <- nil
		for {
			select {
			case op := <-o.ops:
				op()
			case <-o.quit:
				teardown()
				return
			}
		}
	}()
	return <-started
}

// do runs op on the owner's goroutine and waits for it.
func (o *cudaOwner) do(op func()) error {
	done := make(chan struct{})
	select {
	case o.ops <- func() { defer close(done); op() }:
	case <-o.stopped:
		return fmt.Errorf("%s: %w", o.label, gpu.ErrClosed)
	}
	<-done
	return nil
}

// open makes the context on GPU index, loads ptx and looks up each kernel
// into its Function, and loads cuBLAS. On the owner's goroutine.
func (o *cudaOwner) open(index int, ptx string, kernels map[string]*cu.Function) error {
	dev := cu.Device(index)
	name, err := dev.Name()
	if err != nil {
		return fmt.Errorf("cuda: device %d: name: %w", index, err)
	}
	o.product = name
	o.devName = fmt.Sprintf("%s (cuda:%d)", name, index)
	// Blocking sync: a thread waiting for the GPU sleeps instead of
	// spinning a core the subscriber's other goroutines need.
	if o.cuctx, err = dev.MakeContext(cu.SchedBlockingSync); err != nil {
		return fmt.Errorf("cuda: %s: context: %w", o.devName, err)
	}
	if o.mod, err = cu.LoadData(ptx); err != nil {
		return fmt.Errorf("cuda: %s: loading kernels: %w", o.devName, err)
	}
	for kname, dst := range kernels {
		if *dst, err = o.mod.Function(kname); err != nil {
			return fmt.Errorf("cuda: kernel %s: %w", kname, err)
		}
	}
	o.blas, err = loadCublas()
	return err
}

// close releases what open made, whatever of it was made. On the owner's
// goroutine, after the backend has freed its own device memory.
func (o *cudaOwner) close() {
	if o.blas != nil {
		o.blas.close()
	}
	if o.mod != (cu.Module{}) {
		_ = o.mod.Unload()
	}
	if o.cuctx != (cu.CUContext{}) {
		_ = o.cuctx.Destroy()
	}
}
