// Package refembed is vramq's reference model: a real text embedding in pure
// Go (Embedder), its hashing tokenizer, its generated or loaded weights
// (Weights, a safetensors file of WeightsFormat) and the token-batch and
// embeddings files that hand its inputs and outputs to the PyTorch
// reference in bench/torch/embed.py. It runs on the CPU over a gpu.Allocator
// (a gpu.Sim), so out-of-memory happens where a device of the Sim's size
// would run out; CUDAEmbedder (build tag cuda) runs the same function on a
// GPU.
//
// Its working memory is linear in tokens and items (Config.CostModel), and
// it is a calibrate.Meter and a gpu.CostModelSetter, so a cost model
// measured on a device can replace the analytic one.
package refembed
