#!/usr/bin/env bash
# relayout/gpu.sh: the mechanical renames that issue 15's split of gpu/ forces
# on the rest of the tree. gpu/ kept only the device layer; what it also held
# moved to internal/bytesize, model/safetensors, model/refembed, gpu/calibrate,
# gpu/nvml, gpu/cuda and bench/timed. This rewrites every qualified use of a
# moved identifier (gpu.FormatBytes -> bytesize.Format, ...) in every Go file
# of the tree outside the moved packages themselves, whatever the file is
# called, then adds the imports the file now needs, drops the gpu import where
# nothing uses it any more, and gofmts it (relayout/fiximports.go).
#
# Idempotent: the old names no longer exist, so a second run finds nothing.
# Run it from anywhere in the repository, on any branch state:
#
#	relayout/gpu.sh          Go files
#	relayout/gpu.sh --docs   also the Markdown files (README.md, docs/, bench/,
#	                         ...): the same identifiers, and the moved files'
#	                         paths (gpu/embed.go -> model/refembed/embed.go)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

# old identifier in package gpu -> new qualified identifier, each matched as
# a whole word (\bgpu\.Name\b), comments included.
renames='
FormatBytes bytesize.Format
ParseBytes bytesize.Parse
Bytes bytesize.Size
Safetensors safetensors.File
OpenSafetensors safetensors.Open
TensorInfo safetensors.TensorInfo
SafetensorsTensor safetensors.Tensor
WriteSafetensors safetensors.Write
EmbedConfig refembed.Config
DefaultEmbedConfig refembed.DefaultConfig
EmbedWeights refembed.Weights
EmbedWeightsFormat refembed.WeightsFormat
GenerateEmbedWeights refembed.GenerateWeights
Embedder refembed.Embedder
NewEmbedder refembed.NewEmbedder
LoadEmbedWeights refembed.LoadWeights
ReadEmbedWeights refembed.ReadWeights
WriteEmbedWeights refembed.WriteWeights
TokenBatch refembed.TokenBatch
TokenBatchFormat refembed.TokenBatchFormat
WriteTokenBatch refembed.WriteTokenBatch
ReadTokenBatch refembed.ReadTokenBatch
EmbeddingsFormat refembed.EmbeddingsFormat
LoadEmbeddings refembed.LoadEmbeddings
ReadEmbeddings refembed.ReadEmbeddings
Calibration calibrate.Calibration
Calibrate calibrate.Calibrate
Fit calibrate.Fit
Meter calibrate.Meter
Sample calibrate.Sample
Miss calibrate.Miss
Sweep calibrate.Sweep
DefaultSweep calibrate.DefaultSweep
CostModelFile calibrate.CostModelFile
SaveCostModel calibrate.SaveCostModel
ReadCostModel calibrate.ReadCostModel
LoadCostModel calibrate.LoadCostModel
TimedModel timed.Model
NewTimedModel timed.New
NewTimedModelFor timed.NewFor
Timing timed.Timing
DefaultTiming timed.DefaultTiming
Noop timed.Noop
Open nvml.Open
OpenNVML nvml.OpenIndex
OpenNVMLByUUID nvml.OpenUUID
CUDAEmbedder refembed.CUDAEmbedder
NewCUDAEmbedder refembed.NewCUDAEmbedder
CUDABert bert.CUDAEncoder
NewCUDABert bert.NewCUDAEncoder
CUDABackend refembed.CUDABackend
OpenCUDA refembed.OpenCUDA
CUDAModel cuda.Model
OpenCUDADevice cuda.OpenDevice
BertConfig bert.GPUConfig
BertWeights bert.GPUWeights
BertLayerWeights bert.GPULayerWeights
BertPooling bert.GPUPooling
BertPoolMean bert.GPUPoolMean
BertPoolMax bert.GPUPoolMax
BertPoolCLS bert.GPUPoolCLS
'

# Packages fiximports manages: name=import path.
pkgs=(
	gpu=github.com/vramq/vramq/gpu
	bytesize=github.com/vramq/vramq/internal/bytesize
	safetensors=github.com/vramq/vramq/model/safetensors
	refembed=github.com/vramq/vramq/model/refembed
	calibrate=github.com/vramq/vramq/gpu/calibrate
	timed=github.com/vramq/vramq/bench/timed
	nvml=github.com/vramq/vramq/gpu/nvml
	cuda=github.com/vramq/vramq/gpu/cuda
	bert=github.com/vramq/vramq/model/bert
)

# The moved packages were edited by hand; everything else is rewritten.
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.go' |
	grep -Ev '^(gpu/|internal/bytesize/|model/safetensors/|model/refembed/|bench/timed/|relayout/)' |
	grep -v '/node_modules/' |
	while read -r f; do [ -f "$f" ] && echo "$f"; done)

expr=''
while read -r old new; do
	[ -n "$old" ] || continue
	expr+="s/\\bgpu\\.${old}\\b/${new}/g;"
done <<<"$renames"
# "cuda:N" is CUDA's numbering now (gpu.Spec); nvml.Open reads NVML's.
expr+='s/\bnvml\.Open\("cuda:(\d+)"/nvml.Open("nvml:$1"/g;'
# A struct embedding *timed.Model names the field Model, no longer TimedModel.
expr+='s/\.TimedModel\b/.Model/g; s/\bTimedModel: /Model: /g; s/(?<![\w.])TimedModel\b/timed.Model/g;'
# cmd/subscriber's calibrate function would shadow package calibrate.
expr+='s/(?<![\w.])calibrate\((ctx, o, )/measureCostModel($1/g;'

changed=()
for f in "${files[@]}"; do
	if grep -qP '\bgpu\.|(?<![\w.])calibrate\(ctx, o, |\bTimedModel\b' "$f"; then
		before=$(cksum <"$f")
		perl -pi -e "$expr" "$f"
		[ "$(cksum <"$f")" = "$before" ] || changed+=("$f")
	fi
done

# Where each moved file went, for --docs.
paths='
gpu/cuda_bert_test.go model/bert/cuda_encoder_test.go
gpu/cuda_emu_test.go model/refembed/cuda_emu_test.go
gpu/cuda_test.go model/refembed/cuda_test.go
gpu/cuda_bert.go model/bert/cuda_encoder.go
gpu/cuda_owner.go gpu/cuda/owner.go
gpu/cuda_device.go gpu/cuda/device.go
gpu/cuda.go model/refembed/cuda.go
gpu/cublas.go gpu/cuda/cublas.go
gpu/cudaload.c gpu/cuda/load.c
gpu/cudaload.go gpu/cuda/load.go
gpu/cudabuild/ gpu/cuda/cudabuild/
gpu/kernels/embed. model/refembed/kernels/embed.
gpu/kernels/bert. model/bert/kernels/bert.
gpu/kernels/ model/*/kernels/
gpu/gemm_test.go gpu/cuda/gemm_test.go
gpu/gemm.go gpu/cuda/gemm.go
gpu/bert_weights_test.go model/bert/gpu_weights_test.go
gpu/bert_weights.go model/bert/gpu_weights.go
gpu/nvml_nocgo.go gpu/nvml/nvml_nocgo.go
gpu/nvml_test.go gpu/nvml/nvml_test.go
gpu/nvml.go gpu/nvml/nvml.go
gpu/open_test.go gpu/spec_test.go
gpu/open.go gpu/spec.go
gpu/bytesize_test.go internal/bytesize/bytesize_test.go
gpu/bytesize.go internal/bytesize/bytesize.go
gpu/safetensors_open_test.go model/safetensors/open_test.go
gpu/safetensors_open.go model/safetensors/open.go
gpu/safetensors_weights.go model/refembed/weights_file.go
gpu/safetensors_test.go model/safetensors/safetensors_test.go
gpu/safetensors.go model/safetensors/safetensors.go
gpu/embed_weights.go model/refembed/weights.go
gpu/embed_test.go model/refembed/embed_test.go
gpu/embed.go model/refembed/embed.go
gpu/tokenbatch_test.go model/refembed/tokenbatch_test.go
gpu/tokenbatch.go model/refembed/tokenbatch.go
gpu/tokenize_test.go model/refembed/tokenize_test.go
gpu/tokenize.go model/refembed/tokenize.go
gpu/fuzz_test.go model/refembed/fuzz_test.go
gpu/testdata/embeddings-python.safetensors model/refembed/testdata/embeddings-python.safetensors
gpu/calibrate_test.go gpu/calibrate/calibrate_test.go
gpu/calibrate.go gpu/calibrate/calibrate.go
gpu/timedfor_test.go bench/timed/timedfor_test.go
gpu/timing_test.go bench/timed/timing_test.go
gpu/working_test.go bench/timed/working_test.go
gpu/timed.go bench/timed/timed.go
gpu/timing.go bench/timed/timing.go
gpu/noop.go bench/timed/noop.go
'

if [ "${1:-}" = --docs ]; then
	docexpr=$expr
	while read -r old new; do
		[ -n "$old" ] || continue
		docexpr+="s{(?<![\\w/.-])\\Q${old}\\E(?![\\w])}{${new}}g;"
	done <<<"$paths"
	mapfile -t docs < <(git ls-files -co --exclude-standard -- '*.md' | grep -v '/node_modules/' |
		while read -r f; do [ -f "$f" ] && echo "$f"; done)
	for f in "${docs[@]}"; do
		perl -pi -e "$docexpr" "$f"
	done
	echo "relayout/gpu.sh: ${#docs[@]} Markdown files checked"
fi

if [ ${#changed[@]} -gt 0 ]; then
	args=()
	for p in "${pkgs[@]}"; do args+=(-pkg "$p"); done
	go run relayout/fiximports.go "${args[@]}" "${changed[@]}"
fi
echo "relayout/gpu.sh: ${#changed[@]} files rewritten"
