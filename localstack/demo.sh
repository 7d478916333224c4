#!/usr/bin/env bash
# make demo: the whole pipeline on this machine. Starts the emulator (unless
# one is running), creates a fresh set of queues, starts the subscriber on a
# simulated GPU, sends a mixed workload, waits for every result, prints a
# summary, and stops what it started.
#
#   ADMISSION=count make demo     the same workload under another strategy
#   MESSAGES=200 make demo        a bigger workload
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mkdir -p .run
emulator=localstack/emulator.sh
admission="${ADMISSION:-vram}"
messages="${MESSAGES:-60}"
metrics_port="${DEMO_METRICS_PORT:-9464}"
sub_log=.run/demo-subscriber.log

started_emulator=0
sub_pid=""
cleanup() {
	if [[ -n "$sub_pid" ]] && kill -0 "$sub_pid" 2>/dev/null; then
		kill -TERM "$sub_pid" 2>/dev/null || true
		wait "$sub_pid" 2>/dev/null || true
	fi
	if [[ $started_emulator == 1 ]]; then
		"$emulator" down >/dev/null
	fi
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

step "emulator"
if ! "$emulator" status >/dev/null 2>&1; then
	"$emulator" up
	started_emulator=1
else
	echo "already running; reusing it"
fi
eval "$("$emulator" env)"
export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY

step "queues"
eval "$(bin/queues -prefix "demo-$$-")"
export QUEUE_URL RESULTS_QUEUE_URL DLQ_URL
printf '  work     %s\n  results  %s\n  dlq      %s\n' "$QUEUE_URL" "$RESULTS_QUEUE_URL" "$DLQ_URL"

step "subscriber (admission=$admission, SIMULATED device: 64 MiB, the reference model runs on the CPU)"
# A small simulated device so that a CPU can fill it: the model's weights take
# 18 MiB, leaving about 42 MiB of budget, room for two large messages at once.
bin/subscriber -device=sim -vram=64MiB -vram-reserve=4MiB -admission="$admission" \
	-wait-time=2s -log-format=text -metrics-addr="127.0.0.1:$metrics_port" >"$sub_log" 2>&1 &
sub_pid=$!
for _ in $(seq 1 50); do
	curl -fsS -m 1 "http://127.0.0.1:$metrics_port/healthz" >/dev/null 2>&1 && break
	kill -0 "$sub_pid" 2>/dev/null || { cat "$sub_log"; exit 1; }
	sleep 0.2
done
echo "  pid $sub_pid, log $sub_log, metrics http://127.0.0.1:$metrics_port/metrics"

step "workload: $messages messages, every 5th large (32 long texts), the rest small (8 short texts)"
bin/loadgen -messages="$messages" -dlq-url="$DLQ_URL" -subscriber-metrics="http://127.0.0.1:$metrics_port/metrics" \
	-json=.run/demo-summary.json

step "shutdown (SIGTERM)"
kill -TERM "$sub_pid"
rc=0
wait "$sub_pid" || rc=$?
sub_pid=""
echo "  subscriber exited with status $rc"
grep -E 'level=WARN' "$sub_log" | head -5 || true
echo
echo "  a few batches from the subscriber's log (device memory free as each began and ended):"
grep -E 'msg=batch' "$sub_log" | head -3 | sed 's/^/    /'
[[ $rc == 0 ]]
echo
echo "demo done: summary also in .run/demo-summary.json"
