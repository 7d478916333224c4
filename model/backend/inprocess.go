package backend

import (
	"context"
	"fmt"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// InProcess is the Backend of a model that runs in this process on a
// device (gpu.Model). Such a model knows text items only: InProcess runs
// the inputs of /v1/embeddings items on it as text items and answers with
// OpenAI's embeddings response (embeddings.go); the items of the other
// endpoints, which need a generative model server, it answers itself with
// an item error (job.ItemUnsupportedEndpoint) and never runs on the model.
// Its bound is the device's memory, so it offers no other resource.
//
// The model's optional capabilities (gpu.Launcher, gpu.WorkingSet,
// gpu.LengthClasser) are asked of Model, for text items.
type InProcess struct {
	Model gpu.Model
	// Device is the device Model runs on, whose memory bounds it
	// (Memory). Nil leaves that to the subscriber's Config.Device.
	Device gpu.Device
}

var _ Backend = InProcess{}

// Name is the model's.
func (b InProcess) Name() string { return b.Model.Name() }

// Cost is the model's for text items; an embeddings item costs what its
// inputs would as text items, and an item of another endpoint nothing: it
// never runs on the model.
func (b InProcess) Cost(endpoint string, items []job.Item) int64 {
	switch endpoint {
	case "":
		return b.Model.Cost(items)
	case job.EndpointEmbeddings:
		return embeddingsCost(b.Model, items)
	}
	return 0
}

// Run runs text items on the model, and the inputs of embeddings items as
// one batch of text items; it answers the items of other endpoints with
// an item error.
func (b InProcess) Run(ctx context.Context, endpoint string, items []job.Item) ([]job.Output, error) {
	switch endpoint {
	case "":
		return b.Model.Run(ctx, items)
	case job.EndpointEmbeddings:
		return runEmbeddings(ctx, b.Model, items)
	}
	return unsupportedEndpoint(b.Model.Name(), endpoint, items), nil
}

// Memory is Device's memory, in bytes; nil without a Device.
func (b InProcess) Memory() Memory {
	if b.Device == nil {
		return nil
	}
	return DeviceMemory(b.Device)
}

// Offers is nothing: the device's memory bounds the model, and the
// subscriber reads that from the device.
func (InProcess) Offers() (now, most Vector) { return now, most }

// Needs is nothing, as nothing is offered.
func (InProcess) Needs(string, []job.Item) Vector { return Vector{} }

func unsupportedEndpoint(model, endpoint string, items []job.Item) []job.Output {
	outs := make([]job.Output, len(items))
	for i, it := range items {
		outs[i] = job.Output{ID: it.ID, Error: job.NewItemError(job.ItemUnsupportedEndpoint, fmt.Sprintf(
			"the job names endpoint %s, and this subscriber runs the in-process model %s, not a model server (-model-server)",
			endpoint, model))}
	}
	return outs
}
