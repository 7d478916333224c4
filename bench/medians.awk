# medians.awk: the median ns/op, B/op and allocs/op of each benchmark over the
# runs of `go test -bench ... -count N` output, as a Markdown table, with each
# one's ratio (of median ns/op) to its baseline: the benchmark whose name
# matches -v base=REGEX and has the same -v key=N'th '/'-separated part of its
# name (e.g. Admission/semaphore/contended is the baseline of
# Admission/vram/contended with key=3). Usage:
#   awk -v base='/semaphore/' -v key=3 -f bench/medians.awk /tmp/bench.txt
function median(list,    n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
/^Benchmark/ && / ns\/op/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	if (!(name in ns)) order[++count] = name
	for (i = 3; i <= NF; i++) {
		if ($(i) == "ns/op") ns[name] = ns[name] " " $(i - 1)
		if ($(i) == "B/op") bytes[name] = bytes[name] " " $(i - 1)
		if ($(i) == "allocs/op") allocs[name] = allocs[name] " " $(i - 1)
	}
}
END {
	printf "| benchmark | ns/op | B/op | allocs/op | runs | ratio to baseline |\n|---|--:|--:|--:|--:|--:|\n"
	for (k = 1; k <= count; k++) {
		name = order[k]
		split(name, parts, "/")
		if (base != "" && name ~ base) baseline[parts[key]] = median(ns[name])
	}
	for (k = 1; k <= count; k++) {
		name = order[k]; m = median(ns[name])
		split(name, parts, "/")
		if (base != "" && name ~ base) { ratio = "baseline" } else if (baseline[parts[key]] > 0) { ratio = sprintf("%.2f×", m / baseline[parts[key]]) } else { ratio = "" }
		printf "| `%s` | %.1f | %.0f | %.0f | %d | %s |\n", name, m, median(bytes[name]), median(allocs[name]), split(ns[name], tmp, " "), ratio
	}
}
