#!/usr/bin/env bash
# Benchmarks, kept out of the test run. Prints the limiter's cost as ratios to
# a bare EVALSHA measured in the same run (machines here are shared and noisy).
#   ./scripts/bench.sh            limiter micro-benchmarks + memory per entry
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench.sh: redis-server not found (sudo apt-get install redis-server)" >&2; exit 1; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "== limiter benchmarks (3 rounds, interleaved by go test -count)"
go test -run '^$' -bench 'BenchmarkBareEvalsha|BenchmarkAllow' -benchtime=20000x -count=3 ./throttle/ | tee "$out" | grep -E '^Benchmark'
awk '
/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name); ns=$3
  v[name]=v[name] " " ns
}
function median(s,   a, n, i, j, t) {
  n = split(s, a, " ")
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return a[int((n + 1) / 2)]
}
END {
  print ""
  printf "%-48s %12s %10s\n", "benchmark (median of 3)", "ns/op", "x floor"
  for (k in v) m[k] = median(v[k])
  for (k in m) {
    mode = (k ~ /Parallel/) ? "Parallel" : "Serial"
    floor = m["BenchmarkBareEvalsha/" mode]
    printf "%-48s %12.0f %10.2f\n", k, m[k], floor / m[k]
  }
}' "$out" | sort
echo
echo "== memory per entry (MEMORY USAGE of a full key)"
go test -count=1 -run 'TestMemoryPerEntry' -v ./throttle/ | grep -E 'limit'
