#!/usr/bin/env bash
# make demo: the whole pipeline on this machine. Starts the emulator (unless
# one is running), creates a fresh set of queues and a payload bucket, starts
# the subscriber on a simulated GPU and the publisher, posts jobs of mixed
# sizes through the publisher's API (one item big enough to go through S3),
# follows them to the end, prints a summary and a few results, and stops what
# it started. Last, a Message Batch (Anthropic's API) runs on a second
# subscriber, whose model server is the project's fake (bin/fakemodel).
#
#   ADMISSION=count make demo     the same workload under another strategy
#   MESSAGES=40 make demo         bigger jobs (messages' worth of items per job)
#   MODEL=DIR make demo           a real BERT-family model you downloaded (e.g.
#                                 huggingface-cli download sentence-transformers/all-MiniLM-L6-v2 --local-dir DIR)
#   MODEL=ref make demo           the reference bag-of-words model instead of BERT
#
# By default the subscriber serves a small BERT with GENERATED weights
# (bin/genweights -bert): the real tokenizer and architecture, random
# weights. Its vectors mean nothing; it needs no download.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mkdir -p .run
emulator=localstack/emulator.sh
admission="${ADMISSION:-vram}"
messages="${MESSAGES:-20}"
metrics_port="${DEMO_METRICS_PORT:-9464}"
publisher_port="${DEMO_PUBLISHER_PORT:-8086}"
sub_log=.run/demo-subscriber.log
pub_log=.run/demo-publisher.log
ms_log=.run/demo-subscriber-model-server.log

started_emulator=0
sub_pid=""
pub_pid=""
fake_pid=""
cleanup() {
	for pid in $pub_pid $sub_pid $fake_pid; do
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		fi
	done
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

step "queues and payload bucket"
eval "$(bin/queues -prefix "demo-$$-" -payload-bucket "vramq-demo-$$")"
export QUEUE_URL RESULTS_QUEUE_URL DLQ_URL PAYLOAD_BUCKET
printf '  work     %s\n  results  %s\n  dlq      %s\n  bucket   %s\n' "$QUEUE_URL" "$RESULTS_QUEUE_URL" "$DLQ_URL" "$PAYLOAD_BUCKET"

# wait_healthy URL PID LOG: until URL answers, or fail with the log.
wait_healthy() {
	for _ in $(seq 1 50); do
		curl -fsS -m 1 "$1" >/dev/null 2>&1 && return 0
		kill -0 "$2" 2>/dev/null || { cat "$3"; return 1; }
		sleep 0.2
	done
	cat "$3"
	return 1
}

# A small simulated device so that a CPU can fill it, with room for two large
# messages at once beside the weights: the reference model's weights take
# 18 MiB and a large message 16 MiB; the generated BERT's 17 MiB and a large
# message (32 texts at 256 tokens) about 80 MiB. A real model's are larger:
# VRAM says how much to simulate.
model_flag=()
case "${MODEL:-}" in
"")
	model_dir=build/demo-bert
	bin/genweights -bert "$model_dir" >/dev/null
	model_flag=(-model="$model_dir")
	vram="${VRAM:-200MiB}"
	what="a small BERT with GENERATED weights ($model_dir): its vectors mean nothing"
	;;
ref)
	vram="${VRAM:-64MiB}"
	what="the reference bag-of-words model"
	;;
*)
	model_flag=(-model="$MODEL")
	vram="${VRAM:-2GiB}"
	what="the BERT model in $MODEL"
	;;
esac
step "subscriber (admission=$admission, SIMULATED device: $vram; $what; it runs on the CPU)"
# At debug it logs a line per device batch, a few of which the summary shows.
bin/subscriber -device=sim -vram="$vram" -vram-reserve=4MiB -admission="$admission" ${model_flag[@]+"${model_flag[@]}"} \
	-wait-time=2s -log-format=text -log-level=debug -metrics-addr="127.0.0.1:$metrics_port" >"$sub_log" 2>&1 &
sub_pid=$!
wait_healthy "http://127.0.0.1:$metrics_port/healthz" "$sub_pid" "$sub_log"
echo "  pid $sub_pid, log $sub_log, metrics http://127.0.0.1:$metrics_port/metrics"

step "publisher (HTTP API on 127.0.0.1:$publisher_port)"
# -metrics-addr= : no /metrics listener (the default :9090 would collide with other runs).
bin/publisher -addr="127.0.0.1:$publisher_port" -metrics-addr= -log-format=text >"$pub_log" 2>&1 &
pub_pid=$!
wait_healthy "http://127.0.0.1:$publisher_port/healthz" "$pub_pid" "$pub_log"
echo "  pid $pub_pid, log $pub_log"

step "jobs: 3 posted to POST /v1/jobs, each $messages messages' worth of short and long texts, plus one 1.2 MB item"
bin/loadgen -publisher-url="http://127.0.0.1:$publisher_port" -jobs=3 -messages="$messages" -huge-item-bytes=1200000 \
	-subscriber-metrics="http://127.0.0.1:$metrics_port/metrics" -json=.run/demo-summary.json

# The subscriber's own counters: SQS calls per message received, by action.
curl -s "http://127.0.0.1:$metrics_port/metrics" >.run/demo-metrics.txt || true
awk '/^vramq_subscriber_messages_received_total /{n=$2}
	/^vramq_subscriber_sqs_requests_total\{/{match($0,/action="[A-Za-z]+"/); a=substr($0,RSTART+8,RLENGTH-9); r[a]+=$2}
	END{if(n>0){printf "  SQS requests per message (subscriber, %d messages):", n; t=0
		for(a in r){printf " %s %.2f,", a, r[a]/n; t+=r[a]}; printf " total %.2f\n", t/n}}' .run/demo-metrics.txt
step "a batch through OpenAI's Batch API: 4 embeddings lines to POST /v1/files, then POST /v1/batches, polled to its end"
api="http://127.0.0.1:$publisher_port/v1"
for i in 1 2 3 4; do
	printf '{"custom_id":"line-%d","method":"POST","url":"/v1/embeddings","body":{"model":"demo","input":"the %d th sentence of the demo batch"}}\n' "$i" "$i"
done >.run/demo-batch.jsonl
file_id=$(curl -fsS "$api/files" -F purpose=batch -F file=@.run/demo-batch.jsonl | sed -n 's/.*"id":"\(file-[0-9a-f]*\)".*/\1/p')
batch=$(curl -fsS "$api/batches" -H 'Content-Type: application/json' \
	-d '{"input_file_id":"'"$file_id"'","endpoint":"/v1/embeddings","completion_window":"24h"}')
batch_id=$(sed -n 's/.*"id":"\(batch_[0-9a-f]*\)".*/\1/p' <<<"$batch")
for _ in $(seq 120); do
	batch=$(curl -fsS "$api/batches/$batch_id")
	case $(sed -n 's/.*"status":"\([a-z_]*\)".*/\1/p' <<<"$batch") in completed | failed | expired | cancelled) break ;; esac
	sleep 0.5
done
echo "  $batch_id: $(grep -o '"status":"[a-z_]*"' <<<"$batch"), $(grep -o '"request_counts":{[^}]*}' <<<"$batch")"
output_id=$(sed -n 's/.*"output_file_id":"\(file-[0-9a-f]*\)".*/\1/p' <<<"$batch")
[[ -n $output_id ]] && curl -fsS "$api/files/$output_id/content" | cut -c1-150 | sed 's/^/    /'

step "a batch through Anthropic's Message Batches: 4 requests to POST /v1/messages/batches, on a model server's /v1/messages"
# The in-process model serves no /v1/messages: its subscriber stops first, so
# that the batch's chunks go to one whose model server does (the fake).
kill -TERM "$sub_pid"
rc=0
wait "$sub_pid" || rc=$?
sub_pid=""
bin/fakemodel >.run/demo-fakemodel.url &
fake_pid=$!
for _ in $(seq 50); do [[ -s .run/demo-fakemodel.url ]] && break; sleep 0.1; done
bin/subscriber -model-server="$(head -1 .run/demo-fakemodel.url)" -model-server-models=fake-model -model-server-messages=native \
	-wait-time=2s -log-format=text -metrics-addr="127.0.0.1:$metrics_port" >"$ms_log" 2>&1 &
sub_pid=$!
wait_healthy "http://127.0.0.1:$metrics_port/healthz" "$sub_pid" "$ms_log"
requests=""
for i in 1 2 3 4; do
	requests+="${requests:+,}"'{"custom_id":"q-'"$i"'","params":{"model":"fake-model","max_tokens":16,"messages":[{"role":"user","content":"question '"$i"' of the demo"}]}}'
done
anthropic=(-H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01')
msgbatch=$(curl -fsS "$api/messages/batches" "${anthropic[@]}" -d '{"requests":['"$requests"']}')
msgbatch_id=$(sed -n 's/.*"id":"\(msgbatch_[0-9a-f]*\)".*/\1/p' <<<"$msgbatch")
for _ in $(seq 120); do
	msgbatch=$(curl -fsS "$api/messages/batches/$msgbatch_id" "${anthropic[@]}")
	grep -q '"processing_status":"ended"' <<<"$msgbatch" && break
	sleep 0.5
done
echo "  $msgbatch_id: $(grep -o '"processing_status":"[a-z_]*"' <<<"$msgbatch"), $(grep -o '"request_counts":{[^}]*}' <<<"$msgbatch")"
curl -fsS "$api/messages/batches/$msgbatch_id/results" "${anthropic[@]}" | cut -c1-150 | sed 's/^/    /'

step "shutdown (SIGTERM)"
kill -TERM "$pub_pid"
prc=0
wait "$pub_pid" || prc=$?
pub_pid=""
kill -TERM "$sub_pid"
msrc=0
wait "$sub_pid" || msrc=$?
sub_pid=""
kill -TERM "$fake_pid"
wait "$fake_pid" || true
fake_pid=""
echo "  publisher exited with status $prc, subscriber with status $rc, model-server subscriber with status $msrc"
grep -E 'level=WARN' "$sub_log" | head -5 || true
echo
echo "  a few batches from the subscriber's log (device memory free as each began and ended):"
grep -E 'msg=batch' "$sub_log" | head -3 | sed 's/^/    /'
[[ $rc == 0 && $prc == 0 && $msrc == 0 ]]
echo
echo "demo done: summary also in .run/demo-summary.json"
echo "model: $what"
