#!/usr/bin/env bash
# The GPU verification, run on a machine with the NVIDIA driver, cuBLAS and
# PyTorch but no Go toolchain: `make gpu-verify` builds this folder (test
# binaries, the PyTorch reference, this script); copy it there and run
#
#   ./run.sh            (no arguments: every check, then the engine)
#   ./run.sh 10b 10c    (only the checks numbered so; "calibration", "engine")
#
# Each check runs as its own test process, so one that fails or panics does not
# cost the others their figures. Everything goes to results.md and log.txt in
# this folder (and to $OUT too, where that is set); commit results.md as
# bench/gpu/<device>.md. The checks are the ones bench/README.md "On a GPU" lists.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here" || exit 1
out=${OUT:-$here}
log=$out/log.txt
res=$out/results.md
: >"$log"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
python=${VRAMQ_TORCH_PYTHON:-python3}
torchv=$("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)

# cuBLAS: the loader's path first; else the copy PyTorch's wheels carry.
if [ -z "${VRAMQ_CUBLAS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.'; then
	VRAMQ_CUBLAS=$("$python" - <<'PY' 2>/dev/null
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
hits = []
for d in dirs:
    hits += glob.glob(os.path.join(d, "nvidia", "**", "libcublas.so.*"), recursive=True)
hits = sorted(h for h in hits if "Lt" not in os.path.basename(h))
print(hits[-1] if hits else "")
PY
)
	export VRAMQ_CUBLAS
fi
export VRAMQ_TORCH_PYTHON=$python

{
	echo "# GPU verification: $gpu"
	echo
	echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "- device (name, driver, memory): $gpu"
	echo "- PyTorch: $torchv"
	echo "- cuBLAS: ${VRAMQ_CUBLAS:-found on the loader path}"
	echo "- built from: $(cat "$here/COMMIT" 2>/dev/null || echo unknown)"
	echo
	echo "| check | result | seconds |"
	echo "|---|---|---|"
} >"$res"

# wanted ID: whether the command line names the check (none named: all). A
# lease of GPU time is short, and check 10 alone takes over three minutes.
wanted() {
	[ $# -gt 0 ] && [ "$chosen" ] || return 0
	case " $chosen " in *" $1 "*) return 0 ;; esac
	return 1
}
chosen="$*"
fail=0
run() { # run NAME BINARY TEST
	local name=$1 bin=$2 test=$3 t0 rc
	wanted "${name%%[. ]*}" || return 0
	t0=$(date +%s)
	echo "=== $name: $bin -test.run '^$test\$'" >>"$log"
	"./$bin" -test.run "^$test\$" -test.v -test.count=1 -test.timeout 8m >>"$log" 2>&1
	rc=$?
	local verdict=pass
	[ $rc = 0 ] || { verdict="FAIL (exit $rc)"; fail=1; }
	echo "| $name (\`$test\`) | $verdict | $(($(date +%s) - t0)) |" >>"$res"
}

run "1. CUDA equals the CPU reference" refembed.test TestCUDAMatchesCPU
run "2. OOM recovered by halving" refembed.test TestCUDAOutOfMemoryThenHalving
run "3. the budget follows free memory" subscriber.test TestCUDABudgetFollowsFreeMemory
run "4. outputs against PyTorch, items/s reported, not asserted" refembed.test TestCUDAOutputsAgainstTorch
run "calibration sample" refembed.test TestCUDAMeasure
run "5. BERT: CUDA equals the CPU encoder and ONNX Runtime" bert.test TestCUDABertMatchesCPUAndONNX
run "5b. BERT fused attention: equals the CPU and the GEMM path, float16 too" bert.test TestCUDABertFusedAttentionMatchesUnfused
run "5c. BERT query-tiled attention: equals the CPU and the per-row kernel, heads of 32 and 64" bert.test TestCUDABertTiledAttentionMatchesCPU
run "5d. BERT float16 and bfloat16: equal the CPU within the half tolerance" bert.test TestCUDABertHalfPrecisionMatchesCPU
run "6. BERT: erf against math.Erf" bert.test TestCUDABertErf
run "7. BERT: OOM recovered by halving" bert.test TestCUDABertOutOfMemoryThenHalving
run "8. BERT: OOM by sequence length" bert.test TestCUDABertOutOfMemoryByLength
run "9. BERT: the estimate against the device" bert.test TestCUDABertWorkingBytesCoversAllocation
run "10. BERT: outputs against PyTorch, items/s reported, not asserted" bert.test TestCUDABertAgainstTorch
run "10b. BERT float16: items/s at least PyTorch float16 + SDPA (a ratio floor), MiniLM-L6 and BERT-base" bert.test TestCUDABertHalfThroughputAtLeastTorchSDPA
run "10c. BERT fused attention: per-row against query-tiled kernel, items/s reported, not asserted" bert.test TestCUDABertFusedAttentionPerRowAgainstTiled
# The BERT cost model calibrated on this GPU (all-MiniLM-L6-v2's shape,
# generated weights): the fit, with its length² term, goes to
# bert-cost-model.json; commit it beside results.md. The command for a real
# model directory is in docs/cuda.md (subscriber-cuda -calibrate -model DIR).
export VRAMQ_COST_MODEL_OUT=$out/bert-cost-model.json
run "11. BERT: the cost model calibrated on the GPU covers every batch" bert.test TestCUDABertCalibratedCostCoversEveryBatch

{
	echo
	echo "## Figures (the tests' FIGURE lines)"
	echo
	echo '```'
	grep -h 'FIGURE' "$log" | sed 's/^[[:space:]]*//'
	echo '```'
	echo
	echo "## Failures (the tests' own lines)"
	echo
	echo '```'
	grep -hE -- '--- FAIL|panic:|_test.go:[0-9]+:' "$log" | grep -v FIGURE | head -40
	echo '```'
} >>"$res"
# The model-server path against a real engine where one is installed
# (gpu/verify/engine); its section says what it looked for otherwise. The
# model and the server's log stay here: transformers' random weights are
# hundreds of MB. VRAMQ_ENGINE_FLAGS passes flags (engine -h lists them).
read -ra engine_flags <<<"${VRAMQ_ENGINE_FLAGS:-}"
wanted engine || { cat "$res"; exit $fail; }
"$here/engine" -dir "$here/engine-run" -out "$out/engine.md" -python "$python" -phase 25s "${engine_flags[@]}" >>"$log" 2>&1 || fail=1
{ echo; cat "$out/engine.md"; } >>"$res"
[ -f "$here/engine-run/server.log" ] && tail -c 200000 "$here/engine-run/server.log" >"$out/engine-server.log"
cat "$res"
exit $fail
