#!/usr/bin/env bash
# relayout/sqs.sh: the mechanical renames of issue 15's SQS/job/internal part,
# over the whole tree. Re-runnable and idempotent: run it from the repository
# root after merging other branches; a second run changes nothing.
#
# It rewrites import paths and qualified identifiers (never file names) in
# every .go file outside node_modules and relayout/, then gofmt -w's the files
# it changed so import blocks are sorted again.
set -euo pipefail
cd "$(dirname "$0")/.."

M=github.com/vramq/vramq

files() {
	find . -name node_modules -prune -o -path ./relayout -prune -o -path ./.git -prune -o \
		-name '*.go' -type f -print
}

# rewrite PERL-EXPRESSION: applies a perl substitution (slurped file) to every
# Go file, and gofmt's those it changed.
rewrite() {
	local expr=$1 f
	while IFS= read -r f; do
		if perl -0777 -ne "\$_ = \$_; my \$o = \$_; $expr; exit(\$_ eq \$o ? 1 : 0)" "$f"; then
			perl -0777 -pi -e "$expr" "$f"
			gofmt -w "$f"
		fi
	done < <(files)
}

# 1. internal/sqsbatch became internal/sqscodec, the one SQS codec package;
#    its Code(string) is PlainCode now (Code(error) reads an error's code).
rewrite "s#\"$M/internal/sqsbatch\"#\"$M/internal/sqscodec\"#g; s/\bsqsbatch\.Code\(/sqscodec.PlainCode(/g; s/\bsqsbatch\./sqscodec./g"
