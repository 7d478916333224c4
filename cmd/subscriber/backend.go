package main

import (
	"fmt"
	"log/slog"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/refembed"
)

// closingModel is a model that holds device memory until closed.
type closingModel interface {
	gpu.Model
	Close() error
}

// loadWeights reads -weights, or generates the reference weights from
// -model-seed: every backend runs the same weights from the same place.
func loadWeights(o *options, log *slog.Logger) (*refembed.Weights, refembed.Config, error) {
	if o.weights != "" {
		w, cfg, err := refembed.LoadWeights(o.weights)
		if err != nil {
			return nil, cfg, fmt.Errorf("-weights: %w", err)
		}
		log.Info("weights loaded", "file", o.weights, "vocab", cfg.Vocab, "dim", cfg.Dim, "hidden", cfg.Hidden, "out", cfg.Out,
			"max_tokens", cfg.MaxTokens, "bytes", bytesize.Format(w.Bytes()))
		return w, cfg, nil
	}
	cfg := refembed.DefaultConfig()
	cfg.Seed = o.modelSeed
	return refembed.GenerateWeights(cfg), cfg, nil
}

// openSim opens the simulated device of -vram bytes and loads the CPU
// reference model onto it: the backend of every build, and the only one of
// a build without CUDA.
func openSim(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	if o.model != "" {
		return openBERT(o, log)
	}
	w, mcfg, err := loadWeights(o, log)
	if err != nil {
		return nil, nil, err
	}
	dev := gpu.NewSim(int64(o.vram))
	log.Warn("the device is SIMULATED: memory is accounted by vramq, the model runs on the CPU", "capacity", bytesize.Format(int64(o.vram)))
	model, err := refembed.NewEmbedder(w, mcfg, dev)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the model: %w", err)
	}
	return dev, model, nil
}

// openBERT loads -model, a BERT-family model directory, onto the simulated
// device: the encoder runs on the CPU, its weights and each batch's
// working memory accounted on the device. A directory the loader refuses
// stops the start with its error, which names the file and field.
func openBERT(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	dev := gpu.NewSim(int64(o.vram))
	log.Warn("the device is SIMULATED: memory is accounted by vramq, the model runs on the CPU", "capacity", bytesize.Format(int64(o.vram)))
	m, err := bert.Open(o.model, dev)
	if err != nil {
		return nil, nil, fmt.Errorf("-model: %w", err)
	}
	c, s := m.Model().Config(), m.Model().Sentence()
	log.Info("model loaded", "model", m.Name(), "dir", o.model, "layers", c.NumLayers, "hidden", c.HiddenSize, "heads", c.NumHeads,
		"max_seq_length", s.MaxSeqLength, "pooling", s.Pooling.String(), "normalize", s.Normalize,
		"dtype", m.Model().WeightDType(), "weights", bytesize.Format(m.Weights()))
	return dev, m, nil
}
