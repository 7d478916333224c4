# medians.awk: the median ns/op, B/op and allocs/op of each benchmark over the
# runs of `go test -bench ... -count N` output, as a Markdown table, with each
# one's ratio (of median ns/op) to its baseline: the benchmark whose name
# matches -v base=REGEX and has the same -v key=N'th '/'-separated part of its
# name (e.g. Admission/semaphore/contended is the baseline of
# Admission/vram/contended with key=3). The spread is (max - min) / median of
# ns/op over the runs: on a shared machine a ratio inside its rows' spreads is
# no measurable difference. -v metric=UNIT (e.g. cpu-ns/op) adds the median of
# that custom metric and takes the ratio of it instead of ns/op. -v min=1 adds
# a ratio of the fastest runs (least ns/op of each): other work on the machine
# only ever adds time, so on a loaded machine the fastest run is the least
# disturbed. Usage:
#   awk -v base='/semaphore/' -v key=3 -f bench/medians.awk /tmp/bench.txt
function median(list,    n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function least(list,    n, a, i, lo) {
	n = split(list, a, " "); lo = a[1] + 0
	for (i = 2; i <= n; i++) if (a[i] + 0 < lo) lo = a[i] + 0
	return lo
}
function spread(list,    n, a, i, lo, hi) {
	n = split(list, a, " "); lo = hi = a[1] + 0
	for (i = 2; i <= n; i++) { if (a[i] + 0 < lo) lo = a[i] + 0; if (a[i] + 0 > hi) hi = a[i] + 0 }
	return (hi - lo) / median(list) * 100
}
/^Benchmark/ && / ns\/op/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	if (!(name in ns)) order[++count] = name
	for (i = 3; i <= NF; i++) {
		if ($(i) == "ns/op") ns[name] = ns[name] " " $(i - 1)
		if ($(i) == "B/op") bytes[name] = bytes[name] " " $(i - 1)
		if ($(i) == "allocs/op") allocs[name] = allocs[name] " " $(i - 1)
		if (metric != "" && $(i) == metric) extra[name] = extra[name] " " $(i - 1)
	}
}
END {
	head = metric != "" ? " " metric " |" : ""
	printf "| benchmark | ns/op | spread |%s B/op | allocs/op | runs | ratio to baseline |%s\n", head, min ? " ratio, fastest runs |" : ""
	printf "|---|--:|--:|%s--:|--:|--:|--:|%s\n", metric != "" ? "--:|" : "", min ? "--:|" : ""
	for (k = 1; k <= count; k++) {
		name = order[k]
		split(name, parts, "/")
		if (base != "" && name ~ base) { baseline[parts[key]] = median(metric != "" ? extra[name] : ns[name]); fastest[parts[key]] = least(ns[name]) }
	}
	for (k = 1; k <= count; k++) {
		name = order[k]; m = median(ns[name]); r = metric != "" ? median(extra[name]) : m
		split(name, parts, "/")
		if (base != "" && name ~ base) { ratio = "baseline" } else if (baseline[parts[key]] > 0) { ratio = sprintf("%.2f×", r / baseline[parts[key]]) } else { ratio = "" }
		col = metric != "" ? sprintf(" %.0f |", r) : ""
		fast = ""
		if (min) fast = (base != "" && name ~ base) ? " baseline |" : fastest[parts[key]] > 0 ? sprintf(" %.2f× |", least(ns[name]) / fastest[parts[key]]) : " |"
		printf "| `%s` | " (m < 100 ? "%.1f" : "%.0f") " | %.0f%% |%s %.0f | %.0f | %d | %s |%s\n", name, m, spread(ns[name]), col, median(bytes[name]), median(allocs[name]), split(ns[name], tmp, " "), ratio, fast
	}
}
