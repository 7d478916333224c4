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
	*err = fmt.Errorf("%w: model %s panicked in %s: %v", fault.ErrInvalidInput, s.cfg.Backend.Name(), what, p)
}

// modelCost is the backend's estimate for items of a job that names
// endpoint ("" for none).
func (s *Subscriber) modelCost(endpoint string, items []job.Item) (cost int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered("Cost", p, &err)
		}
	}()
	return s.cfg.Backend.Cost(endpoint, items), nil
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
// batch on the backend.
func (s *Subscriber) modelRun(ctx context.Context, endpoint string, items []job.Item) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Run", p, &err)
		}
	}()
	return s.cfg.Backend.Run(ctx, endpoint, items)
}

// capabilities is what the backend's optional capabilities are asked of:
// an in-process backend's model (gpu.Launcher, gpu.LengthClasser,
// gpu.WorkingSet), or the backend itself.
func capabilities(b backend.Backend) any {
	if ip, ok := b.(backend.InProcess); ok {
		return ip.Model
	}
	return b
}

// weights is the device memory the backend's model holds: 0 but for a
// model in this process, whose weights are on the device.
func weights(b backend.Backend) int64 {
	if ip, ok := b.(backend.InProcess); ok {
		return ip.Model.Weights()
	}
	return 0
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
