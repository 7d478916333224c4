package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vramq/vramq/model/bert"
)

// -gpu-precision and -gpu-attention: the defaults pass everywhere, a value
// neither knows is a usage error naming it, and a half-precision or fused
// choice without a -model on a GPU is refused rather than ignored.
func TestGPUPrecisionFlags(t *testing.T) {
	queues := []string{"-queue-url=q", "-results-queue-url=r", "-dlq-url=d"}
	for _, c := range []struct {
		args []string
		want string // in the error; empty: accepted
	}{
		{nil, ""},
		{[]string{"-gpu-precision=float32", "-gpu-attention=gemm"}, ""},
		{[]string{"-gpu-precision=half"}, "-gpu-precision=half: want float32, float16, bfloat16 or weights"},
		{[]string{"-gpu-attention=flash"}, "-gpu-attention=flash: want gemm or fused"},
		{[]string{"-gpu-precision=float16"}, "they apply to -model on a GPU"},
		{[]string{"-gpu-attention=fused", "-device=sim"}, "they apply to -model on a GPU"},
	} {
		_, err := parse(append(queues, c.args...), func(string) string { return "" }, io.Discard)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v, want accepted", c.args, err)
		case c.want != "" && (!errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}

// Each value reaches the CUDA encoder's options as bert names it.
func TestGPUChoiceReachesTheEncoder(t *testing.T) {
	for _, c := range []struct {
		precision, attention string
		want                 gpuChoice
	}{
		{"float32", "gemm", gpuChoice{}},
		{"float16", "gemm", gpuChoice{precision: bert.GPUFloat16}},
		{"bfloat16", "fused", gpuChoice{precision: bert.GPUBFloat16, attention: bert.GPUAttentionFused}},
		{"weights", "gemm", gpuChoice{fromWeights: true}},
	} {
		o := &options{precision: c.precision, attention: c.attention, device: "cuda:0", model: "m"}
		got, err := cudaOptions(o)
		if cudaBuild && err != nil {
			t.Errorf("-gpu-precision=%s -gpu-attention=%s: %v", c.precision, c.attention, err)
		}
		if got != c.want {
			t.Errorf("-gpu-precision=%s -gpu-attention=%s: %+v, want %+v", c.precision, c.attention, got, c.want)
		}
	}
}
