package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/calibrate"
	"github.com/vramq/vramq/internal/bytesize"
)

// defaultChunkItems is the publisher's default -chunk-items: with
// -max-batch messages of that many items, the largest batch the subscriber
// runs, which the calibration sweep covers unless -calibrate-items says.
const defaultChunkItems = 32

// measureCostModel is `subscriber -calibrate`: it measures a sweep of batches on
// the model and device openBackend gave, writes the report to out and the
// cost model to -cost-model when set. It touches no queue.
func measureCostModel(ctx context.Context, o *options, dev gpu.Device, model gpu.Model, log *slog.Logger, out io.Writer) error {
	items := o.calibrateItems
	if items == 0 {
		items = o.cfg.MaxBatch * defaultChunkItems
	}
	sweep := calibrate.DefaultSweep(items)
	sweep.Points = o.calibratePoints
	var c *calibrate.Calibration
	var err error
	// A transformer (-model DIR) is measured by padded shape, with a
	// length² term for its attention; the reference model by tokens and
	// items.
	switch m := model.(type) {
	case calibrate.ShapeMeter:
		log.Info("calibrating: measuring padded batches one at a time; nothing else should use the device meanwhile",
			"model", m.Name(), "device", dev.Name(), "max_items", items, "max_seq_length", m.MaxSeqLength(), "heads", m.AttentionHeads(),
			"points", sweep.Points, "batches", len(sweep.Shapes(m.MaxSeqLength())), "seed", sweep.Seed)
		c, err = calibrate.CalibrateShapes(ctx, m, gpu.Kind(dev), sweep)
	case calibrate.Meter:
		// On the simulated device the model computes on the CPU: a sweep of
		// 256 items takes a minute or two there, seconds on a GPU.
		log.Info("calibrating: measuring a sweep of batches one at a time; nothing else should use the device meanwhile",
			"model", m.Name(), "device", dev.Name(), "max_items", items, "max_tokens", m.MaxTokens(), "points", sweep.Points,
			"seed", sweep.Seed)
		c, err = calibrate.Calibrate(ctx, m, gpu.Kind(dev), sweep)
	default:
		return fmt.Errorf("-calibrate: model %s cannot measure its memory (it is not a calibrate.Meter or ShapeMeter)", model.Name())
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, c)
	if o.costModel == "" {
		log.Warn("cost model not saved: give -cost-model a path to keep it")
		return nil
	}
	if err := calibrate.SaveCostModel(o.costModel, c.File()); err != nil {
		return err
	}
	log.Info("cost model written; start the subscriber with -cost-model to use it", "file", o.costModel)
	return nil
}

// useCostModel loads -cost-model onto the model, so that Cost, by which the
// subscriber admits messages and dead-letters those too large for the whole
// budget, applies it. A file fitted for another model or device is an error:
// starting with an estimate that does not describe this device would bring
// back the out-of-memory errors admission is for.
func useCostModel(o *options, dev gpu.Device, model gpu.Model, log *slog.Logger) error {
	f, err := calibrate.LoadCostModel(o.costModel, model, gpu.Kind(dev))
	if err != nil {
		return fmt.Errorf("-cost-model: %w", err)
	}
	log.Info("cost model loaded", "file", o.costModel, "model", f.Model, "device", f.Device, "form", f.Form, "heads", f.Heads,
		"per_token", f.PerToken, "per_score", f.PerScore, "per_item", f.PerItem, "per_batch", f.PerBatch,
		"per_batch_size", bytesize.Format(f.PerBatch), "max_items", f.MaxItems, "fitted_at", f.FittedAt)
	if o.cfg.MaxBatch > f.MaxItems {
		// Every message has an item, so a batch of -max-batch messages
		// has more items than any batch the cost model was checked on.
		log.Warn("batches may hold more items than the cost model was calibrated for; "+
			"calibrate with -calibrate-items at least -max-batch × items per message",
			"max_batch", o.cfg.MaxBatch, "calibrated_max_items", f.MaxItems)
	}
	return nil
}
