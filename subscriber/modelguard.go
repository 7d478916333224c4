package subscriber

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/job"
)

// The model is the one part of the subscriber that reads what a message's
// sender chose, item by item, in code vramq does not control (tokenizers,
// image decoders, a CUDA backend). A panic there would end the process with
// up to -max-inflight messages held, every one of them redelivered to the
// next subscriber to panic again. So every call into the model (Cost, LengthClass,
// Run, Launch and the launched Run) recovers a panic into an error wrapping
// gpu.ErrInvalidInput, which process and runAlone already answer: a batch is
// split in halves until the item that panics is alone, and that message is
// dead-lettered as invalid_input; the rest run. A panic in a goroutine the
// model starts itself cannot be recovered here.

// recovered turns a recovered panic value into the invalid-input error of
// the call, and logs its stack, which is for operators, not for the reason.
func (s *Subscriber) recovered(what string, p any, err *error) {
	s.log.Error("the model panicked; its batch is treated as invalid input",
		"call", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	*err = fmt.Errorf("%w: model %s panicked in %s: %v", gpu.ErrInvalidInput, s.cfg.Model.Name(), what, p)
}

func (s *Subscriber) modelCost(items []job.Item) (cost int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered("Cost", p, &err)
		}
	}()
	return s.cfg.Model.Cost(items), nil
}

func (s *Subscriber) modelClass(items []job.Item) (class int, err error) {
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

func (s *Subscriber) modelRun(ctx context.Context, items []job.Item) (outs []job.Output, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs = nil
			s.recovered("Run", p, &err)
		}
	}()
	return s.cfg.Model.Run(ctx, items)
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
