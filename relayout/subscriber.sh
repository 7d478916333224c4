#!/bin/sh
# Mechanical renames forced by the subscriber re-layout (issue 15), for files
# the subscriber helper does not own. Idempotent: run it from the repository
# root after merging the other branches, then `go build ./...`.
set -eu
cd "$(dirname "$0")/.."

# The ECS task-protection client moved to subscriber/taskprotect; the
# subscriber consumes it through the TaskProtection interface (a field of
# that type, no longer a pointer).
for f in subscriber/config*.go; do
	[ -e "$f" ] || continue
	sed -i 's/^\(\s*TaskProtection\s\+\)\*TaskProtection\b/\1TaskProtection/' "$f"
	gofmt -w "$f"
done
for f in $(grep -rlE 'subscriber\.(NewTaskProtection|ProtectionError|ProtectionState)\b' --include='*.go' . 2>/dev/null |
	grep -v '^\./subscriber/' || true); do
	sed -i -E -e 's/\bsubscriber\.NewTaskProtection\(/taskprotect.New(/g' \
		-e 's/\bsubscriber\.ProtectionError\b/taskprotect.Error/g' \
		-e 's/\bsubscriber\.ProtectionState\b/taskprotect.State/g' "$f"
	if ! grep -q '"github.com/vramq/vramq/subscriber/taskprotect"' "$f"; then
		sed -i 's#^\t"github.com/vramq/vramq/subscriber"$#&\n\t"github.com/vramq/vramq/subscriber/taskprotect"#' "$f"
	fi
	gofmt -w "$f"
done

# Files renamed or split, as named in documentation and comments outside
# subscriber/ (never cmd/subscriber/...: the path must not follow a /).
files=$(grep -rlE 'subscriber/(batch|run|poll|lease|finish|protection)(_test)?\.go' \
	--include='*.md' --include='*.go' --include='*.tf' --include='Makefile' . 2>/dev/null | grep -v '^\./subscriber/' || true)
for f in $files; do
	sed -i -E \
		-e 's#(^|[^/])`subscriber/batch\.go`\)\. What was left#\1`subscriber/admission.go`). What was left#' \
		-e '/result_too_large|encodes them/s#subscriber/finish\.go#subscriber/outbox.go#g' \
		-e 's#(^|[^/])subscriber/batch\.go#\1subscriber/batcher.go#g' \
		-e 's#(^|[^/])subscriber/batch_test\.go#\1subscriber/batcher_test.go#g' \
		-e 's#(^|[^/])subscriber/run\.go#\1subscriber/runner.go#g' \
		-e 's#(^|[^/])subscriber/poll\.go#\1subscriber/poller.go#g' \
		-e 's#(^|[^/])subscriber/poll_test\.go#\1subscriber/poller_test.go#g' \
		-e 's#(^|[^/])subscriber/lease\.go#\1subscriber/keeper.go#g' \
		-e 's#(^|[^/])subscriber/lease_test\.go#\1subscriber/keeper_test.go#g' \
		-e 's#(^|[^/])subscriber/finish\.go#\1subscriber/end.go#g' \
		-e 's#(^|[^/])subscriber/protection\.go#\1subscriber/taskprotect/taskprotect.go#g' \
		-e 's#(^|[^/])subscriber/protection_test\.go#\1subscriber/protector_test.go#g' \
		"$f"
done

# BenchmarkKeeperFinish is BenchmarkKeeperAck (a message's end is ack, release
# or dead-letter; "finish" is gone).
grep -rlw 'KeeperFinish' --include='*.md' --include='*.txt' --include='*.json' --include='*.go' . 2>/dev/null |
	grep -v '^\./subscriber/' | xargs -r sed -i 's/\bKeeperFinish\b/KeeperAck/g'
