#!/usr/bin/env bash
# micro-rounds.sh PKG REGEX [ROUNDS]: the benchmarks of ./PKG matching REGEX, one
# run of each per round, ROUNDS rounds (default 10), to stdout.
#
# Why not go test -count N: it runs a benchmark's N runs back to back, so the
# baseline and the benchmark it is compared with meet different moments of the
# other work on a shared machine, and their ratio swings by 2x between two
# runs of make bench-micro. In rounds they take turns within seconds of each
# other, N times over, and bench/medians.awk takes the median as before.
set -euo pipefail
pkg=${1:?usage: micro-rounds.sh PKG REGEX [ROUNDS]} regex=${2:?usage: micro-rounds.sh PKG REGEX [ROUNDS]} rounds=${3:-10}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go test -c -o "$dir/bench.test" "./$pkg"
cd "$pkg"
for _ in $(seq "$rounds"); do
	"$dir/bench.test" -test.run '^$' -test.bench "$regex" -test.benchmem -test.benchtime 300ms -test.count 1
done
