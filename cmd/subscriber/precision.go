package main

import (
	"fmt"

	"github.com/vramq/vramq/model/bert"
)

// gpuChoice is what -gpu-precision and -gpu-attention ask of the CUDA
// encoder, as bert.CUDAOptions takes it (that type exists only in the CUDA
// build).
type gpuChoice struct {
	precision   bert.GPUPrecision
	fromWeights bool
	attention   bert.GPUAttention
}

// cudaOptions reads -gpu-precision and -gpu-attention. Anything but the
// defaults needs a -model on a GPU: elsewhere nothing would apply it, and a
// flag that silently does nothing would let an operator believe the model
// runs in half precision.
func cudaOptions(o *options) (gpuChoice, error) {
	var c gpuChoice
	switch o.precision {
	case "", "float32": // "": options built in code rather than by the flags
	case "float16":
		c.precision = bert.GPUFloat16
	case "bfloat16":
		c.precision = bert.GPUBFloat16
	case "weights":
		c.fromWeights = true
	default:
		return c, fmt.Errorf("-gpu-precision=%s: want float32, float16, bfloat16 or weights", o.precision)
	}
	switch o.attention {
	case "", "gemm":
	case "fused":
		c.attention = bert.GPUAttentionFused
	default:
		return c, fmt.Errorf("-gpu-attention=%s: want gemm or fused", o.attention)
	}
	if c != (gpuChoice{}) && (!cudaBuild || o.device == "sim" || o.model == "") {
		return c, fmt.Errorf("-gpu-precision=%s -gpu-attention=%s: they apply to -model on a GPU (the CUDA build, -device=cuda:N or auto)",
			o.precision, o.attention)
	}
	return c, nil
}
