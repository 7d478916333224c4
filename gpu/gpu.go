// Package gpu is what the subscriber knows of the accelerator: a device that
// reports its memory, and a model that says how much working memory an input
// needs and runs batches on the device.
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
// retrying. Any other error from Run is taken as transient.
var ErrInvalidInput = errors.New("gpu: invalid input")

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
	// items on top of the weights. Costs add up: a batch needs the sum of the
	// costs of its parts. The subscriber admits work by this number, so an
	// estimate below what Run really allocates brings back the OOMs vramq
	// exists to prevent.
	Cost(items []job.Item) int64
	// Run computes one output per item, in order, as one batch. It returns an
	// error wrapping ErrOutOfMemory when the device could not hold the batch,
	// having freed whatever it allocated. It should return promptly when ctx
	// ends.
	Run(ctx context.Context, items []job.Item) ([]job.Output, error)
}
