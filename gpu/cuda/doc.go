// Package cuda runs models on an NVIDIA GPU through the CUDA driver API
// (gorgonia.org/cu) and cuBLAS, loaded at run time. Build it with the cuda
// tag (make cuda); without it only the parts a test can check on any machine
// build (the cuBLAS call shapes, the BERT encoder's configuration and memory
// estimate).
//
// It is the runtime, the goroutine that owns a GPU's context (owner.go),
// module loading, cuBLAS, device memory and the mapping of CUDA's errors to
// gpu.ErrOutOfMemory and gpu.ErrDeviceLost, and the two models' forward
// passes on it: Embedder, the reference model (model/refembed), and Bert,
// the BERT encoder (model/bert, through bert.OpenCUDA). The forward passes
// live here, not beside their models, because they are built on the
// runtime's unexported parts (the owner, the cuBLAS bindings, the upload,
// launch and error-classifying helpers) and its internal tests; moving them
// out would mean exporting all of that.
//
// OpenDevice pairs a loaded model with its GPU's memory reports: CUDA index
// N (gpu.Spec "cuda:N") is found in NVML by UUID.
package cuda
