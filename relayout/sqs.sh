#!/usr/bin/env bash
# relayout/sqs.sh: the mechanical renames of issue 15's SQS/job/internal part,
# over the whole tree. Re-runnable and idempotent: run it from the repository
# root after merging other branches; a second run changes nothing.
#
# It rewrites import paths and qualified identifiers (never file names) in
# every .go file outside node_modules and relayout/, then runs goimports (gofmt
# that also adds the import a moved identifier now needs and drops the one it
# no longer needs) over the files it changed. Set GOIMPORTS to a goimports
# binary to skip building one.
set -euo pipefail
cd "$(dirname "$0")/.."

M=github.com/vramq/vramq
docs=no
[ "${1:-}" = --docs ] && docs=yes

files() {
	find . -name node_modules -prune -o -path ./relayout -prune -o -path ./.git -prune -o \
		-name "${glob:-*.go}" -type f -print
}

changed=$(mktemp)
trap 'rm -f "$changed"' EXIT

# rewrite [-p PATH-REGEX] PERL-EXPRESSION: applies a perl substitution (whole
# file at once) to every Go file (whose path, ./dir/file.go, matches the Perl
# regex when given), and notes the files it changed.
rewrite() {
	local only=. f
	if [ "$1" = -p ]; then only=$2; shift 2; fi
	local expr=$1
	while IFS= read -r f; do
		printf '%s\n' "$f" | grep -qP -- "$only" || continue
		if ! perl -0777 -ne "my \$o = \$_; $expr; exit(\$_ eq \$o ? 0 : 1)" "$f"; then
			perl -0777 -pi -e "$expr" "$f"
			echo "$f" >>"$changed"
		fi
	done < <(files)
}

# 1. internal/sqsbatch became internal/sqscodec, the one SQS codec package;
#    its Code(string) is PlainCode now (Code(error) reads an error's code).
rewrite "s#\"$M/internal/sqsbatch\"#\"$M/internal/sqscodec\"#g; s/\bsqsbatch\.Code\(/sqscodec.PlainCode(/g; s/\bsqsbatch\./sqscodec./g"

# 2. job/ owns the payload bucket's layout and the records in it: the keys
#    moved from internal/payload, the manifest from publisher, the one
#    FailedMarker from the two copies (publisher read part of it, the
#    subscriber wrote it).
for k in ItemKey ManifestKey IdempotencyKey ResultKey FailedKey ResultPrefix FailedPrefix; do
	rewrite "s/\\bpayload\\.$k\\b/job.$k/g"
done
# The subscriber's declaration (wherever its file went), then every use.
rewrite -p "^\\./subscriber/" "s{\\n// failedMarker is failed/\\{job_id\\}/\\{chunk\\}\\.json.*?\\ntype failedMarker struct \\{.*?\\n\\}\\n}{}s"
rewrite -p "^\\./(subscriber|publisher)/" "s/(?<![.\\w])failedMarker\\b/job.FailedMarker/g"
rewrite -p "^\\./publisher/" "s/(?<![.\\w\"])manifest\\{/job.Manifest{/g; s/\\*manifest\\b/*job.Manifest/g; s/\\b(var \\w+) manifest\\b/\\1 job.Manifest/g"

# 3. The subscriber's queue: its interface and types in subscriber/queue
#    (subscriber keeps aliases), the SQS adapter in subscriber/sqsqueue, the
#    conformance suite and the in-memory queue exported in
#    subscriber/queuetest. The subscriber's tests move from the unexported
#    memQueue to queuetest.Mem, whose lock is its own: Put, Stats, All,
#    Calls, Violations, Expire and Redrive lock inside.
rewrite 's/\bsubscriber\.NewSQSQueue\(/sqsqueue.New(/g; s/\bsubscriber\.SQSQueue\b/sqsqueue.Queue/g'
T='^\./subscriber/(?!queuetest/|sqsqueue/|queue/).*_test\.go$'
# slowQueue guarded its own calls with the fake's lock: it gets its own.
rewrite -p "$T" 's/(type slowQueue struct \{\n\t)\*memQueue\n/$1*queuetest.Mem\n\tmu sync.Mutex \/\/ guards calls\n/'
# The harness locked the fake around put; Put locks.
rewrite -p "$T" 's/^\t*h\.(work|results|dlq)\.mu\.(Lock|Unlock)\(\)\n//mg; s/^(\t*)(\w+)\.mu\.Lock\(\)\n((?:\t*\2\.put\([^\n]*\n)+)\t*\2\.mu\.Unlock\(\)\n/$3/mg'
rewrite -p "$T" 's/^(\t*)(\w+)\.mu\.Lock\(\)\n\t*\2\.byHandle\[([^\]\n]+)\]\.visibleAt = time\.Now\(\)\n\t*\2\.mu\.Unlock\(\)\n/$1$2.Expire($3)\n/mg'
rewrite -p "$T" 's/\n\/\/ callCount[^\n]*\n(?:\/\/[^\n]*\n)*|\nfunc \(q \*memQueue\) callCount\(name string\) int \{\n.*?\n\}\n//sg; s/\.callCount\(/.Calls(/g'
rewrite -p "$T" 's/\bnewMemQueue\(\)/queuetest.NewMem()/g; s/\*memQueue\b/*queuetest.Mem/g; s/\bmemQueue: /Mem: /g; s/\.memQueue\b/.Mem/g'
rewrite -p "$T" 's/\.put\(/.Put(/g; s/\.stats\(\)/.Stats()/g; s/\.all\(\)/.All()/g; s/\.deletedHandles\(\)/.DeletedHandles()/g'
rewrite -p "$T" 's/\.attrs\b/.Attributes/g; s/\b([md])\.body\b/$1.Body/g'
rewrite -p "$T" 's/\b([\w.]+)\.dlq, \1\.maxReceive = ([\w.]+), (\d+)/$1.Redrive($2, $3)/g'
rewrite -p "$T" 's/\b(h\.(?:work|results|dlq))\.sendErr\b/$1.SendErr/g; s/\b(h\.(?:work|results|dlq))\.maxBytes\b/$1.MaxBytes/g'
rewrite -p "$T" 's/\b(h\.work|q)\.violations\b/$1.Violations()/g'

# 4. internal/ holds what ships in the publisher and subscriber binaries
#    (awsconfig, cli, envflag, payload, sqscodec); the harness of tests and
#    of the tools that drive them (loadgen, soak, bench) moved under
#    internal/testenv.
for p in sqstest lambdart faultproxy accounting jobq workload procmem; do
	rewrite "s#\"\Q$M\E/internal/$p\"#\"$M/internal/testenv/$p\"#g"
done
# The same paths named in comments and messages.
rewrite 's#(?<![\w/.])internal/(sqstest|lambdart|faultproxy|accounting|jobq|workload|procmem)\b#internal/testenv/$1#g'

if [ $docs = yes ]; then
	glob='*.md'
	rewrite 's#(?<![\w/.])internal/(sqstest|lambdart|faultproxy|accounting|jobq|workload|procmem)\b#internal/testenv/$1#g'
	rewrite 's/\bpayload\.(ItemKey|ManifestKey|IdempotencyKey|ResultKey|FailedKey|ResultPrefix|FailedPrefix)\b/job.$1/g'
	rewrite 's/\bsubscriber\.NewSQSQueue\(/sqsqueue.New(/g; s#(?<![\w/.])internal/sqsbatch\b#internal/sqscodec#g'
	glob=
	grep -v '\.md$' "$changed" >"$changed.go" || true
	mv "$changed.go" "$changed"
fi

if [ -s "$changed" ]; then
	GOIMPORTS=${GOIMPORTS:-}
	if [ -z "$GOIMPORTS" ]; then
		GOIMPORTS=$(mktemp -d)/goimports
		GOBIN=$(dirname "$GOIMPORTS") go install golang.org/x/tools/cmd/goimports@v0.49.0
	fi
	sort -u "$changed" | xargs "$GOIMPORTS" -local github.com/vramq/vramq -w
fi
