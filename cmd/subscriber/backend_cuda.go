//go:build cuda

package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/model/bert"
	"github.com/vramq/vramq/model/refembed"
)

// cudaBuild is whether this binary runs models on a GPU (-gpu-precision).
const cudaBuild = true

const deviceHelp = "device: cuda:N (GPU N in CUDA's numbering), auto (cuda:0), or sim (simulated memory, the model on the CPU)"

func checkDevice(spec string) error {
	if spec == "sim" || spec == "auto" {
		return nil
	}
	if _, err := cudaIndex(spec); err != nil {
		return err
	}
	return nil
}

// cudaIndex is the CUDA device index spec names (gpu.Spec): cuda:N's N,
// and 0 for auto. An NVML index is refused: this backend loads the model by
// CUDA's numbering, which NVML's need not match.
func cudaIndex(spec string) (int, error) {
	s, err := gpu.ParseSpec(spec)
	if err != nil || (s.Kind != "cuda" && s.Kind != "auto") {
		return 0, errors.New("want sim, auto or cuda:N (N a device index, 0 first)")
	}
	return s.Index, nil
}

// openBackend loads the model onto the GPU. This binary links the CUDA
// driver, so it does not start at all on a machine without one: "auto" is
// always the GPU here, and "sim" is for trying the binary's flags on a GPU
// machine without touching the GPU.
func openBackend(o *options, log *slog.Logger) (gpu.Device, closingModel, error) {
	if o.device == "sim" {
		return openSim(o, log)
	}
	index, err := cudaIndex(o.device)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: -device=%s: %v", errUsage, o.device, err)
	}
	if o.model != "" {
		return openCUDABERT(o, index, log)
	}
	w, cfg, err := loadWeights(o, log)
	if err != nil {
		return nil, nil, err
	}
	b, err := refembed.OpenCUDA(index, w, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the model onto cuda:%d: %w", index, err)
	}
	mem, err := b.Device.MemInfo()
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	log.Info("model loaded onto the GPU", "device", b.Model.Device(), "memory", b.Device.Name(),
		"weights", bytesize.Format(b.Model.Weights()), "total", bytesize.Format(mem.Total), "free", bytesize.Format(mem.Free),
		"process", bytesize.Format(mem.Process), "cross_check", b.CrossCheck)
	// The caller closes both: the model (its context) and the device (NVML).
	return b.Device, b.Model, nil
}

// openCUDABERT loads -model, a BERT-family model directory, onto GPU index
// (bert.OpenCUDA). A directory the loader refuses stops the start, with
// its error naming the file and field, before anything is put on the GPU.
func openCUDABERT(o *options, index int, log *slog.Logger) (gpu.Device, closingModel, error) {
	choice, err := cudaOptions(o)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	b, err := bert.OpenCUDAWith(o.model, index,
		bert.CUDAOptions{Precision: choice.precision, PrecisionFromWeights: choice.fromWeights, Attention: choice.attention})
	if err != nil {
		return nil, nil, fmt.Errorf("-model: loading onto cuda:%d: %w", index, err)
	}
	mem, err := b.Device.MemInfo()
	if err != nil {
		return nil, nil, errors.Join(err, b.Embedder.Close(), b.Device.Close())
	}
	m := b.Embedder.Model()
	c, s := m.Config(), m.Sentence()
	log.Info("model loaded onto the GPU", "model", b.Embedder.Name(), "dir", o.model, "device", b.Encoder.Device(), "memory", b.Device.Name(),
		"layers", c.NumLayers, "hidden", c.HiddenSize, "heads", c.NumHeads, "max_seq_length", s.MaxSeqLength,
		"pooling", s.Pooling.String(), "normalize", s.Normalize, "dtype", m.WeightDType(),
		"precision", o.precision, "attention", o.attention,
		"weights", bytesize.Format(b.Encoder.Weights()), "resident", bytesize.Format(b.Embedder.Weights()),
		"total", bytesize.Format(mem.Total), "free", bytesize.Format(mem.Free), "process", bytesize.Format(mem.Process),
		"cross_check", b.CrossCheck)
	// The caller closes both: the model (its context) and the device.
	return b.Device, b.Embedder, nil
}
