// Package bert runs BERT-family sentence encoders (all-MiniLM-L6-v2,
// BGE-small, E5, GTE-small and their kin) on the CPU, from a model
// directory as Hugging Face ships it.
//
// Load reads config.json, model.safetensors (F32, F16 or BF16, widened to
// float32) and the sentence-transformers files that say how token vectors
// become one vector per text (modules.json, 1_Pooling/config.json, a
// Normalize module, sentence_bert_config.json). What it cannot run exactly
// as Hugging Face and sentence-transformers do — another architecture,
// rotary or relative positions, an activation other than exact GELU, a
// pooling it does not know, extra modules — it refuses, naming the file and
// field, rather than produce vectors that look right and are not.
//
// Embed takes token ids (from model/wordpiece's tokenizer) and
// runs the encoder in float32, its matrix products, GELU and softmax's exp
// through this package's AVX2+FMA kernels (gemm_amd64.s, mathf_amd64.s)
// where the CPU has AVX2 and FMA, and through gonum's BLAS and Go
// elsewhere (see README.md for the measurements behind the choice).
// Items of different lengths in one batch are padded to the longest; an
// additive attention mask keeps padding out of every item's output.
// WorkingBytes bounds the memory a batch of a given padded shape needs,
// attention scores (batch × heads × length²) included, which is what an
// admission cost model is built from.
//
// The outputs are checked against ONNX Runtime on generated models (see
// golden/onnx and testdata/model).
package bert
