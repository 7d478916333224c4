package subscriber

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/job/fault"
	"github.com/vramq/vramq/model/backend"
)

// The model is the one part of the subscriber that reads what a message's
// sender chose, item by item, in code vramq does not control (tokenizers,
// image decoders, a CUDA backend). A panic there would end the process with
// up to -max-inflight messages held, every one of them redelivered to the
// next subscriber to panic again. So every call into the model (Cost, LengthClass,
// Run, Launch and the launched Run) recovers a panic into an error wrapping
// fault.ErrInvalidInput, which process and runAlone already answer: a batch is
// split in halves until the item that panics is alone, and that message is
// dead-lettered as invalid_input; the rest run. A panic in a goroutine the
// model starts itself cannot be recovered here.

// recovered turns a recovered panic value into the invalid-input error of
// the call, and logs its stack, which is for operators, not for the reason.
func (s *Subscriber) recovered(what string, p any, err *error) {
	s.log.Error("the model panicked; its batch is treated as invalid input",
		"call", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	*err = fmt.Errorf("%w: model %s panicked in %s: %v", fault.ErrInvalidInput, s.cfg.Model.Name(), what, p)
}

// modelCost is the model's estimate for items of a job that names
// endpoint ("" for none). An in-process model's embeddings items cost what
// their inputs would as text items; items of an endpoint it cannot serve
// cost nothing: they never run on it (modelRun answers them).
func (s *Subscriber) modelCost(endpoint string, items []job.Item) (cost int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered("Cost", p, &err)
		}
	}()
	if endpoint != "" {
		if em, ok := s.cfg.Model.(gpu.EndpointModel); ok {
			return em.CostEndpoint(endpoint, items), nil
		}
		if endpoint == job.EndpointEmbeddings {
			return embeddingsCost(s.cfg.Model, items), nil
		}
		return 0, nil
	}
	return s.cfg.Model.Cost(items), nil
}

// modelNeeds is what items take of the resources the model offers
// (backend.Offerer); none when it offers none.
func (s *Subscriber) modelNeeds(endpoint string, items []job.Item) (n backend.Vector) {
	if s.adm.offerer == nil {
		return n
	}
	defer func() {
		if recover() != nil {
			n = s.adm.most // a model that panics here is refused when it runs
		}
	}()
	return s.adm.offerer.Needs(endpoint, items)
}

// modelClass is the batcher's class for items of a job that names endpoint
// ("" for none): the model's length class, or for an endpoint job a class
// of that endpoint's own (negative, below every length class), so that a
// batch never mixes endpoints, nor endpoint requests with text items.
func (s *Subscriber) modelClass(endpoint string, items []job.Item) (class int, err error) {
	if endpoint != "" {
		return -1 - slices.Index(job.Endpoints, endpoint), nil
	}
	if s.classer == nil {
		return 0, nil
	}
	defer func() {
		if p := recover(); p != nil {
			s.recovered("LengthClass", p, &err)
		}
	}()
	return s.classer.LengthClass(items), nil
}

// modelRun runs items of a job that names endpoint ("" for none) as one
// batch. Endpoint items go to a gpu.EndpointModel with their endpoint; an
// in-process model embeds the inputs of /v1/embeddings items
// (runEmbeddings) and never sees the others: each is answered with an item
// error (job.ItemUnsupportedEndpoint), so that such a job ends with its
// errors rather than crashing the model or being retried into the DLQ.
func (s *Subscriber) modelRun(ctx context.Context, endpoint string, items []job.Item) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Run", p, &err)
		}
	}()
	if endpoint != "" {
		if em, ok := s.cfg.Model.(gpu.EndpointModel); ok {
			return em.RunEndpoint(ctx, endpoint, items)
		}
		if endpoint == job.EndpointEmbeddings {
			return runEmbeddings(ctx, s.cfg.Model, items)
		}
		return unsupportedEndpoint(s.cfg.Model.Name(), endpoint, items), nil
	}
	return s.cfg.Model.Run(ctx, items)
}

func unsupportedEndpoint(model, endpoint string, items []job.Item) []job.Output {
	outs := make([]job.Output, len(items))
	for i, it := range items {
		outs[i] = job.Output{ID: it.ID, Error: job.NewItemError(job.ItemUnsupportedEndpoint, fmt.Sprintf(
			"the job names endpoint %s, and this subscriber runs the in-process model %s, not a model server (-model-server)",
			endpoint, model))}
	}
	return outs
}

func (s *Subscriber) modelLaunch(ctx context.Context, items []job.Item) (l gpu.Launched, err error) {
	defer func() {
		if p := recover(); p != nil {
			l = nil
			s.recovered("Launch", p, &err)
		}
	}()
	return s.launcher.Launch(ctx, items)
}

func (s *Subscriber) launchedRun(ctx context.Context, l gpu.Launched) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Launched.Run", p, &err)
		}
	}()
	return l.Run(ctx)
}
