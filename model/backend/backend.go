// Package backend is what a subscriber runs work on: a Backend costs and
// runs the items of a job, and names the resources it offers admission
// besides memory, with how much of each, and what a batch of items needs of
// each; the memory that bounds it is its own (Memory), in its own Unit.
// There are two: a model server (package model/modelserver), which owns
// its KV cache, counted in KV tokens, and offers its request slots and its
// rate limits' tokens, and a model that runs in this process on a device
// (InProcess), which offers none, its bound being the device's memory in
// bytes (package gpu).
package backend

import (
	"context"

	"github.com/vramq/vramq/job"
)

// Backend runs the items of jobs. Implementations are safe for concurrent
// use: the subscriber runs several batches at once when admission allows.
type Backend interface {
	// Name identifies the backend's model in results and logs.
	Name() string
	// Cost estimates the memory Run needs for items of a job that names
	// endpoint ("" for none), in the Unit of the Memory that bounds the
	// backend (device bytes for a model on a GPU, KV tokens for a model
	// server). Costs add
	// up: a batch needs at most the sum of the costs of its parts. The
	// subscriber admits work by this number, so an estimate below what Run
	// really takes brings back the out-of-memory failures vramq exists to
	// prevent.
	Cost(endpoint string, items []job.Item) int64
	// Run computes one output per item, in order, as one batch of items of
	// a job that names endpoint ("" for none); every batch holds the items
	// of one endpoint. Its errors are gpu.Model.Run's: gpu.ErrOutOfMemory
	// when the batch did not fit (retry smaller), one wrapping
	// fault.ErrInvalidInput for an input it can never process,
	// gpu.ErrDeviceLost, fault.ErrBackoff (with the finished items'
	// outputs in a fault.PartialError[job.Output]) and
	// fault.ErrNeedsOperator; any other is transient. On an error it
	// returns no outputs. It should return promptly when ctx ends.
	Run(ctx context.Context, endpoint string, items []job.Item) ([]job.Output, error)
	Offerer
}

// Resource is one thing a backend offers that admission hands out.
type Resource int

const (
	// Slots are the requests the backend runs at once, and those ready to
	// take a slot as it frees: a model server's concurrency, in rounds.
	// A message takes one for each request its items make.
	Slots Resource = iota
	// RateTokens are the tokens the rate limits a backend is under pass
	// within the time a batch may wait for them. A message takes what its
	// requests reserve of the limits: prompt plus the most they may
	// generate.
	RateTokens
	// NumResources is how many resources there are: the length of a
	// Vector.
	NumResources
)

var resourceNames = [NumResources]string{"slots", "rate_tokens"}

func (r Resource) String() string { return resourceNames[r] }

// Vector is an amount of each Resource.
type Vector [NumResources]int64

// Offerer is the part of a Backend that offers resources. The
// subscriber admits a message only when what it needs of every resource
// fits, as well as its device memory, takes them together and gives them
// back together once the message has ended. A message that needs more of
// a resource than is offered at the time takes all of it, and runs with
// nothing else holding any.
type Offerer interface {
	// Offers is how much of each resource admission may have handed out
	// at once now, and the most that may ever be; 0 for a resource it
	// does not offer. The subscriber reads it again as often as the
	// device's memory, and never hands out more than most.
	Offers() (now, most Vector)
	// Needs is what items of a job that names endpoint ("" for none)
	// take of each resource. Safe for concurrent use.
	Needs(endpoint string, items []job.Item) Vector
}
