//go:build cuda

package cuda

import (
	"fmt"
	"runtime"
	"sync"

	"gorgonia.org/cu"

	"github.com/vramq/vramq/gpu"
)

// Owner is what every model on a GPU shares: one goroutine, locked to its OS
// thread, that owns a CUDA context (contexts are per thread) and makes every
// CUDA call through Do; and the context, the kernels' module and cuBLAS it
// opens on that thread. A model holds one, starts it with its own setup and
// teardown, and stops it in its Close.
type Owner struct {
	label   string // names the model in errors
	ops     chan func()
	quit    chan struct{}
	stopped chan struct{}
	stop    sync.Once

	// Set by Open, on the owner's goroutine.
	Product    string // e.g. "NVIDIA H100 80GB HBM3"
	DeviceName string // e.g. "NVIDIA H100 80GB HBM3 (cuda:0)"
	Blas       *Blas
	cuctx      cu.CUContext
	mod        cu.Module
}

// NewOwner is an Owner whose errors name the model label; Start runs it.
func NewOwner(label string) *Owner {
	return &Owner{label: label, ops: make(chan func()), quit: make(chan struct{}), stopped: make(chan struct{})}
}

// Start runs the owner's goroutine: setup, then the ops Do sends until Stop,
// then teardown (also after a failed setup). It returns setup's error.
func (o *Owner) Start(setup func() error, teardown func()) error {
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

// Do runs op on the owner's goroutine and waits for it. After Stop it fails
// with gpu.ErrClosed.
func (o *Owner) Do(op func()) error {
	done := make(chan struct{})
	select {
	case o.ops <- func() { defer close(done); op() }:
	case <-o.stopped:
		return fmt.Errorf("%s: %w", o.label, gpu.ErrClosed)
	}
	<-done
	return nil
}

// Stop ends the goroutine, after the op in progress and teardown, and waits
// for it. Later calls only wait.
func (o *Owner) Stop() {
	o.stop.Do(func() { close(o.quit) })
	<-o.stopped
}

// Open makes the context on GPU index, loads ptx and looks up each kernel
// into its Function, and loads cuBLAS. On the owner's goroutine, in setup.
func (o *Owner) Open(index int, ptx string, kernels map[string]*cu.Function) error {
	dev := cu.Device(index)
	name, err := dev.Name()
	if err != nil {
		return fmt.Errorf("cuda: device %d: name: %w", index, err)
	}
	o.Product = name
	o.DeviceName = fmt.Sprintf("%s (cuda:%d)", name, index)
	// Blocking sync: a thread waiting for the GPU sleeps instead of
	// spinning a core the subscriber's other goroutines need.
	if o.cuctx, err = dev.MakeContext(cu.SchedBlockingSync); err != nil {
		return fmt.Errorf("cuda: %s: context: %w", o.DeviceName, err)
	}
	if o.mod, err = cu.LoadData(ptx); err != nil {
		return fmt.Errorf("cuda: %s: loading kernels: %w", o.DeviceName, err)
	}
	for kname, dst := range kernels {
		if *dst, err = o.mod.Function(kname); err != nil {
			return fmt.Errorf("cuda: kernel %s: %w", kname, err)
		}
	}
	o.Blas, err = loadCublas()
	return err
}

// Release frees what Open made, whatever of it was made. On the owner's
// goroutine, in teardown, after the model has freed its own device memory.
func (o *Owner) Release() {
	if o.Blas != nil {
		o.Blas.close()
	}
	if o.mod != (cu.Module{}) {
		_ = o.mod.Unload()
	}
	if o.cuctx != (cu.CUContext{}) {
		_ = o.cuctx.Destroy()
	}
}
