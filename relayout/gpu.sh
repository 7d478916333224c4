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

# old identifier in package gpu -> new qualified identifier. Longer names
# first where one is a prefix of another is not needed: each is matched as a
# whole word (\bgpu\.Name\b).
renames='
FormatBytes bytesize.Format
ParseBytes bytesize.Parse
Bytes bytesize.Size
'

# Packages fiximports manages: name=import path.
pkgs=(
	gpu=github.com/vramq/vramq/gpu
	bytesize=github.com/vramq/vramq/internal/bytesize
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

changed=()
for f in "${files[@]}"; do
	if grep -q '\bgpu\.' "$f"; then
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
