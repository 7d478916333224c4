//go:build cuda

package bert

import (
	"errors"
	"fmt"

	"github.com/vramq/vramq/gpu"
	"github.com/vramq/vramq/gpu/cuda"
	"github.com/vramq/vramq/model/wordpiece"
)

// OnCUDA is a model directory served on a GPU.
type OnCUDA struct {
	// Device reports the GPU's memory (see cuda.OpenDevice).
	Device   gpu.Device
	Embedder *Embedder
	Encoder  *CUDAEncoder
	// CrossCheck compares NVML's free memory with the driver's.
	CrossCheck string
}

// CUDAOptions choose how the GPU encoder multiplies. The zero value is
// OpenCUDA's: float32 products, attention through GEMMs.
type CUDAOptions struct {
	// Precision of the matrix products (GPUConfig.Precision).
	Precision GPUPrecision
	// PrecisionFromWeights, when set, takes the precision from the
	// checkpoint's dtype instead (PrecisionOfWeights).
	PrecisionFromWeights bool
	// Attention is GPUConfig.Attention.
	Attention GPUAttention
}

// OpenCUDA loads the model and tokenizer in dir and serves them on CUDA
// device index: texts are tokenized and sorted into length buckets on the
// host, each sub-batch runs on the GPU (CUDAEncoder). A directory the
// loader refuses, or a model the GPU encoder cannot run, is an error before
// anything is allocated on the GPU. Close the Embedder, then the Device.
func OpenCUDA(dir string, index int) (*OnCUDA, error) { return OpenCUDAWith(dir, index, CUDAOptions{}) }

// OpenCUDAWith is OpenCUDA with the encoder's precision and attention
// chosen by o. Other than the zero options, the model's name says which
// (variantName): its outputs are not float32's, and a cost model
// calibrated for one choice does not describe another's memory, so
// calibrate.LoadCostModel, which matches names, refuses it.
func OpenCUDAWith(dir string, index int, o CUDAOptions) (*OnCUDA, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	tok, err := wordpiece.Load(dir)
	if err != nil {
		return nil, err
	}
	if err := CheckTokenizer(m, tok); err != nil {
		return nil, err
	}
	cfg, w := m.GPU()
	cfg.Precision, cfg.Attention = o.Precision, o.Attention
	if o.PrecisionFromWeights {
		cfg.Precision = PrecisionOfWeights(m.WeightDType())
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bert: %s: %w", dir, err)
	}
	if err := w.CheckShape(cfg); err != nil {
		return nil, fmt.Errorf("bert: %s: %w", dir, err)
	}
	var enc *CUDAEncoder
	dev, footprint, check, err := cuda.OpenDevice(index, func() (cuda.Model, error) {
		var err error
		enc, err = NewCUDAEncoder(index, "bert:"+m.Name(), w, cfg)
		return enc, err
	})
	if err != nil {
		return nil, err
	}
	// As for the reference model (refembed.OpenCUDA): the CUDA context and
	// cuBLAS's workspace are the model's too; the weights are the floor.
	e, err := NewEmbedderOn(m, tok, enc, max(footprint, enc.Weights()), enc.Working)
	if err != nil {
		return nil, errors.Join(err, enc.Close(), dev.Close())
	}
	e.name = variantName(e.name, cfg)
	return &OnCUDA{Device: dev, Embedder: e, Encoder: enc, CrossCheck: check}, nil
}
