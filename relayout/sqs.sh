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

files() {
	find . -name node_modules -prune -o -path ./relayout -prune -o -path ./.git -prune -o \
		-name '*.go' -type f -print
}

changed=$(mktemp)
trap 'rm -f "$changed"' EXIT

# rewrite [-d DIR]... PERL-EXPRESSION: applies a perl substitution (whole
# file at once) to every Go file (under the DIRs when given), and notes the
# files it changed.
rewrite() {
	local dirs=() f
	while [ "$1" = -d ]; do dirs+=("$2"); shift 2; done
	local expr=$1
	while IFS= read -r f; do
		if [ ${#dirs[@]} -gt 0 ]; then
			local in=no d
			for d in "${dirs[@]}"; do [ "$(dirname "$f")" = "./$d" ] && in=yes; done
			[ $in = yes ] || continue
		fi
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
rewrite -d subscriber "s{\\n// failedMarker is failed/\\{job_id\\}/\\{chunk\\}\\.json.*?\\ntype failedMarker struct \\{.*?\\n\\}\\n}{}s"
rewrite -d subscriber -d publisher "s/(?<![.\\w])failedMarker\\b/job.FailedMarker/g"
rewrite -d publisher "s/(?<![.\\w\"])manifest\\{/job.Manifest{/g; s/\\*manifest\\b/*job.Manifest/g; s/\\b(var \\w+) manifest\\b/\\1 job.Manifest/g"

if [ -s "$changed" ]; then
	GOIMPORTS=${GOIMPORTS:-}
	if [ -z "$GOIMPORTS" ]; then
		GOIMPORTS=$(mktemp -d)/goimports
		GOBIN=$(dirname "$GOIMPORTS") go install golang.org/x/tools/cmd/goimports@v0.49.0
	fi
	sort -u "$changed" | xargs "$GOIMPORTS" -local github.com/vramq/vramq -w
fi
