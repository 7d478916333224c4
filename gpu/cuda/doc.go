// Package cuda is the CUDA runtime vramq's models run on an NVIDIA GPU
// with: the CUDA driver API (gorgonia.org/cu) and cuBLAS, both loaded at run
// time. Build it with the cuda tag (make cuda); without it only the parts a
// test can check on any machine build (the cuBLAS call shapes).
//
// An Owner is the goroutine that owns a GPU's context (contexts are per
// thread), with the kernels' module and cuBLAS (Blas) it opens there; the
// helpers (Upload, Launch, Grid, MapError, Classify) are what a model's
// forward pass does on it, mapping CUDA's errors to gpu.ErrOutOfMemory and
// gpu.ErrDeviceLost. OpenDevice pairs a loaded model with its GPU's memory
// reports: CUDA index N (gpu.Spec "cuda:N") is found in NVML by UUID.
//
// The forward passes and their kernels live with their models, in
// cuda-tagged files: refembed.CUDAEmbedder (model/refembed/cuda.go,
// kernels/embed.cu) and bert.CUDAEncoder (model/bert/cuda_encoder.go,
// kernels/bert.cu).
package cuda
