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
#	relayout/gpu.sh
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
CUDAEmbedder cuda.Embedder
NewCUDAEmbedder cuda.NewEmbedder
CUDABert cuda.Bert
NewCUDABert cuda.NewBert
CUDABackend cuda.Backend
OpenCUDA cuda.Open
CUDAModel cuda.Model
OpenCUDADevice cuda.OpenDevice
BertConfig cuda.BertConfig
BertWeights cuda.BertWeights
BertLayerWeights cuda.BertLayerWeights
BertPooling cuda.BertPooling
BertPoolMean cuda.BertPoolMean
BertPoolMax cuda.BertPoolMax
BertPoolCLS cuda.BertPoolCLS
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

if [ ${#changed[@]} -gt 0 ]; then
	args=()
	for p in "${pkgs[@]}"; do args+=(-pkg "$p"); done
	go run relayout/fiximports.go "${args[@]}" "${changed[@]}"
fi
echo "relayout/gpu.sh: ${#changed[@]} files rewritten"
