// Package gpu is the device layer: what the subscriber knows of the
// accelerator. A Device reports its memory; a Model says how much working
// memory an input needs (its CostModel) and runs batches; the optional
// interfaces (Launcher, WorkingSet, LengthClasser, CostModelSetter,
// ProductNamer) are the capabilities a model or device declares. The Sim is
// a device whose memory vramq accounts itself, and a Spec names a device.
//
// The backends live below: package nvml reads a real GPU's memory, package
// cuda is the CUDA runtime models run on there (build tag cuda), and package
// calibrate measures a cost model on a device. The models, with their CUDA
// forward passes, are in model/.
package gpu

import (
	"context"
	"errors"

	"github.com/vramq/vramq/job"
)

// The errors of the device layer. Models and backends wrap them, so that
// callers never import a driver package to recognise one. The kinds that
// are not about a device (an input refused, a wait, a setup that needs a
// person) are job/fault's, which models wrap too.
var (
	// ErrOutOfMemory is returned (wrapped) by Model.Run when the device
	// could not hold the batch. It is a signal, not a failure: the caller
	// may retry smaller. Backends map their driver's out-of-memory error
	// to it.
	ErrOutOfMemory = errors.New("gpu: out of memory")
	// ErrDeviceLost is returned (wrapped) by Model.Run when the device can
	// run nothing more in this process: a sticky CUDA error (an illegal
	// address, a launch failure) leaves the context unusable, and every
	// later call fails the same way. No message is to blame. The caller
	// should stop taking work, hand back what it holds and exit, so that a
	// fresh process replaces it.
	ErrDeviceLost = errors.New("gpu: device lost")
	// ErrNoDevice is wrapped by the errors that mean there is no usable
	// device here at all: no driver, no NVML library, no device at that
	// index, or a build without NVML support. "auto" falls back to the
	// simulator on it and on nothing else.
	ErrNoDevice = errors.New("gpu: no device")
	// ErrClosed is returned by a device or model used after Close.
	ErrClosed = errors.New("gpu: closed")
)

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
	// having freed whatever it allocated, and one wrapping
	// fault.ErrInvalidInput for an input it can never process; any other
	// error is taken as transient, except ErrDeviceLost and job/fault's
	// ErrBackoff and ErrNeedsOperator. It should return promptly when ctx
	// ends. On an error it returns no outputs; the outputs of items it
	// finished before an ErrBackoff may come in the error
	// (fault.PartialError[job.Output]).
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
	// hold now, with any memory kept pooled for later batches (a model
	// server's backend says it in its memory's unit, KV tokens). Safe for
	// concurrent use, and cheap: it is read twice per refresh. It must
	// never be above what is really allocated, or the budget overstates
	// what is free: count a buffer once its allocation has succeeded, and
	// stop counting it before it is freed.
	Working() int64
}

// A ProductNamer is a Device that is one of a kind of hardware: a GPU,
// whose Name says which one (its index or UUID) and whose Product says what
// it is ("NVIDIA H100 80GB HBM3"), the same for every GPU of its kind. The
// NVML and CUDA devices are ProductNamers; the Sim is not.
type ProductNamer interface {
	Device
	Product() string
}

// Kind is what kind of device d is, without which one: its Product for a
// ProductNamer, whatever its index or UUID, and its Name otherwise ("sim").
// A cost model calibrated on one GPU holds for every GPU of its kind, so
// cost model files record and check this.
func Kind(d Device) string {
	if p, ok := d.(ProductNamer); ok {
		return p.Product()
	}
	return d.Name()
}
