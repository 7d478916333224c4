// Package gpu is what the subscriber knows of the accelerator: a device that
// reports its memory, and a model that says how much working memory an input
// needs and runs batches on the device.
//
// How much working memory an input needs is a CostModel: bytes per token,
// per item and per batch. A model's own is analytic, the bytes of the
// buffers its forward pass asks for, which is exact for the CPU reference
// model on a simulated device. On a GPU the driver rounds allocations up and
// libraries take workspace, so there the cost model is measured: Calibrate
// runs a sweep of batches on a Meter (a model that reports what each batch
// really held), fits the three coefficients and raises the per-batch one
// until no batch is under-estimated; SaveCostModel writes the result, and
// LoadCostModel gives it to a CostModelSetter, refusing one fitted for
// another model or device (`subscriber -calibrate` and `-cost-model`).
package gpu

import (
	"context"
	"errors"

	"github.com/vramq/vramq/job"
)

// ErrOutOfMemory is returned (wrapped) by Model.Run when the device could not
// hold the batch. It is a signal, not a failure: the caller may retry smaller.
// Backends map their driver's out-of-memory error to it, so callers never
// import a driver package to recognise it.
var ErrOutOfMemory = errors.New("gpu: out of memory")

// ErrInvalidInput is returned (wrapped) by Model.Run when an input can never
// be processed, whatever the memory: the subscriber dead-letters it instead of
// retrying. Any other error from Run is taken as transient, except
// ErrDeviceLost.
var ErrInvalidInput = errors.New("gpu: invalid input")

// ErrDeviceLost is returned (wrapped) by Model.Run when the device can run
// nothing more in this process: a sticky CUDA error (an illegal address, a
// launch failure) leaves the context unusable, and every later call fails
// the same way. No message is to blame. The caller should stop taking work,
// hand back what it holds and exit, so that a fresh process replaces it.
var ErrDeviceLost = errors.New("gpu: device lost")

// MemInfo is a snapshot of a device's memory, in bytes.
type MemInfo struct {
	Total int64
	Free  int64
	Used  int64
	// Process is the memory this process holds on the device, when the
	// device can tell (NVML can, per process; 0 when unknown).
	Process int64
}

// Device is one accelerator. Implementations are safe for concurrent use.
type Device interface {
	// Name says which device this is, e.g. "sim" or "NVIDIA H100 80GB HBM3 (0)".
	Name() string
	// Simulated is true when the memory is accounted by vramq rather than
	// read from hardware; logs and metrics say so.
	Simulated() bool
	// MemInfo reads the device's memory now.
	MemInfo() (MemInfo, error)
	Close() error
}

// Model runs inference on a device. Implementations are safe for concurrent
// use: the subscriber runs several batches at once when memory allows.
type Model interface {
	// Name identifies the model in results and logs.
	Name() string
	// Weights is the device memory the loaded model holds, in bytes.
	Weights() int64
	// Cost estimates the device working memory, in bytes, that Run needs for
	// items on top of the weights. Costs add up: a batch needs at most the
	// sum of the costs of its parts (a cost model's per-batch bytes are in
	// each part's cost, and the batch needs them once). The subscriber
	// admits work by this number, so an estimate below what Run really
	// allocates brings back the OOMs vramq exists to prevent.
	Cost(items []job.Item) int64
	// Run computes one output per item, in order, as one batch. It returns an
	// error wrapping ErrOutOfMemory when the device could not hold the batch,
	// having freed whatever it allocated. It should return promptly when ctx
	// ends.
	Run(ctx context.Context, items []job.Item) ([]job.Output, error)
}

// Launcher is implemented by a Model whose batches begin with a phase that
// needs no device memory: the host's side of a launch (tokenizing, building
// the inputs, queueing the work). Launch does that phase; Run on what it
// returns does the rest, and the Model's Run is the two in a row. The
// subscriber launches a batch that is waiting for admission while it waits,
// so that once memory frees the batch allocates and works at once, rather
// than the device idling through its launch.
type Launcher interface {
	Launch(ctx context.Context, items []job.Item) (Launched, error)
}

// Launched is a batch that is launched and not yet run. Run allocates its
// working memory, does its work and returns its outputs as the Model's Run
// does; call it at most once. A Launched dropped without running holds
// nothing on the device.
type Launched interface {
	Run(ctx context.Context) ([]job.Output, error)
}

// WorkingSet is implemented by a Model that can say how much device memory
// its batches hold right now: working memory, not weights. The subscriber
// keeps its budget as free device memory plus this, less the reserve (what
// the device would have free for work if this process's batches were done),
// so that its own batches do not shrink it as another process's memory
// does. Without it, the subscriber reads the budget only while none of its
// work is admitted.
type WorkingSet interface {
	// Working is the device memory, in bytes, that Run calls in progress
	// hold now, with any memory kept pooled for later batches. Safe for
	// concurrent use, and cheap: it is read twice per refresh. It must
	// never be above what is really allocated, or the budget overstates
	// what is free: count a buffer once its allocation has succeeded, and
	// stop counting it before it is freed.
	Working() int64
}

// Kind is what kind of device d is, without which one: the GPU's product
// name ("NVIDIA H100 80GB HBM3") for a real GPU, whatever its index or UUID,
// and the name otherwise ("sim"). A cost model calibrated on one GPU holds
// for every GPU of its kind, so cost model files record and check this.
func Kind(d Device) string {
	if p, ok := d.(interface{ Product() string }); ok {
		return p.Product()
	}
	return d.Name()
}
