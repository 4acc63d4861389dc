#!/usr/bin/env bash
# The test command: makes sure redis-server and Chromium exist (installing
# Debian's packages when run as root with apt and they are missing), runs every test with
# the race detector (e2e and the deploy/ module without it, below).
#   ./scripts/test.sh --quick                the edit-test loop (go test -short): no slow tests, no race detector, no e2e, no deploy/, no Chromium
#   ./scripts/test.sh --fuzz                 then fuzzes every parser (scripts/fuzz.sh; SLUICE_FUZZTIME=200000x for longer)
#   ./scripts/test.sh -run TestBoundary     extra arguments go to `go test`
# Where the time goes, and why the phases are split as they are: docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."

quick= fuzz=
case "${1:-}" in
  --quick) quick=1; shift ;;
  --fuzz) fuzz=1; shift ;;
esac

# apt_install PKG: installs a Debian package when run as root with apt.
apt_updated=
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: $1 missing; installing Debian's $1" >&2
    if [ -z "$apt_updated" ]; then apt-get update -qq >/dev/null; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  else
    return 1
  fi
}

if ! command -v redis-server >/dev/null 2>&1; then
  if ! apt_install redis-server; then
    echo "test.sh: redis-server not found. Install Redis 7 (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) and run again." >&2
    exit 1
  fi
fi
# The dashboard's browser test (dashboard: TestDashboardInBrowser) drives a headless Chromium;
# --quick (-short) leaves it out, and needs none.
chromium_bin() { command -v chromium || command -v chromium-browser || command -v google-chrome || command -v google-chrome-stable; }
if [ -z "$quick" ] && [ -z "${SLUICE_CHROMIUM:-}" ] && ! chromium_bin >/dev/null 2>&1; then
  if ! apt_install chromium || ! chromium_bin >/dev/null 2>&1; then
    echo "test.sh: Chromium not found; the dashboard's browser test needs it. Install it (Debian/Ubuntu: sudo apt-get install chromium; macOS: brew install --cask chromium), or point SLUICE_CHROMIUM at a Chrome or Chromium binary, and run again." >&2
    exit 1
  fi
fi
echo "test.sh: $(redis-server --version)"
[ -n "$quick" ] || echo "test.sh: $("${SLUICE_CHROMIUM:-$(chromium_bin)}" --version 2>/dev/null || echo "browser at ${SLUICE_CHROMIUM:-$(chromium_bin)}")"

# The slowest packages first (throttle 163-282 s under the race detector,
# worker 130 s, api 105 s, plans 84 s, cmd/sluice 46 s, dashboard 40 s):
# go test builds and starts packages in the order it is given them, four at
# a time (-p 4), so these start while the others compile instead of after
# them. In alphabetical order throttle started 11 minutes into a fresh
# machine's run and ended the phase 3 minutes after every other package.
slowest='worker throttle api plans cmd/sluice dashboard'
packages=$(go list ./... | grep -v '/e2e$' | awk -v slow="$slowest" '
  BEGIN { n = split(slow, s, " "); for (i = 1; i <= n; i++) rank["github.com/sluicehq/sluice/" s[i]] = i }
  ($0 in rank) { first[rank[$0]] = $0; next }
  { rest = rest $0 "\n" }
  END { for (i = 1; i <= n; i++) if (i in first) print first[i]; printf "%s", rest }')
if [ -n "$quick" ]; then
  # The contributor's loop: -short (the tests that take seconds, sluicetest.Slow,
  # and e2e are left out), no race detector; the full run below is what CI
  # runs. About 50 s warm on two cores.
  exec go test -short -count=1 -p 4 -parallel 8 "$@" ./...
fi

# What the later phases compile is built in the background, so that a
# fresh machine's run is not compile, then wait, then compile again:
# - the sluice binary as e2e builds it and the e2e test package (both
#   without the race detector), during the package phase, which needs them
#   next;
# - deploy/'s modules (Helm, Kubernetes: most of what a fresh machine
#   fetches and compiles) at the lowest priority (nice 19), so it takes the
#   CPU the e2e phase leaves idle (its tests mostly wait on windows) and
#   yields it whenever the e2e processes want it.
# Nothing runs there: `-run '^$'` only builds, into Go's build cache. A
# failed build shows again, with its error, in the phase that needs it.
prebuild_e2e= prebuild_deploy= prebuild_bench=
if [ "$#" -eq 0 ]; then
  (
    nice -n 5 go build -tags nodev,sluice_testhooks -o /dev/null ./cmd/sluice
    nice -n 5 go test -count=1 -run '^$' ./e2e
  ) >/dev/null 2>&1 &
  prebuild_e2e=$!
  (cd deploy && go mod download && nice -n 19 go test -count=1 -run '^$' ./...) >/dev/null 2>&1 &
  prebuild_deploy=$!
  # bench/ (its own module: the peers, the plots) has no tests; building it
  # keeps ./scripts/bench.sh working when an API it calls changes.
  bench_log=$(mktemp)
  (cd bench && go mod download && nice -n 19 go vet . ) >"$bench_log" 2>&1 &
  prebuild_bench=$!
fi

# Tests start their own redis-server processes on free ports; the system one is not used.
# Most tests wait on windows, timers and processes, not on the CPU: -parallel lets more
# of a package's tests wait at once than the two cores' default of 2.
phase() { local t0=$SECONDS rc=0; "$@" || rc=$?; echo "test.sh: $((SECONDS - t0)) s: ${*:1:6} …"; return "$rc"; }
# tested runs a phase of tests with its output also kept: when one fails,
# the run ends with each failing test and its own messages (not the logs
# it printed), so a CI view that keeps only a run's head and tail still
# says which assertion failed.
test_log=$(mktemp)
trap 'rm -f "$test_log" ${bench_log:+"$bench_log"}' EXIT
tested() {
  local rc=0
  phase "$@" 2>&1 | tee -a "$test_log" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "test.sh: what failed, in short (the whole output is above):"
    awk '/--- FAIL|^panic:|^FAIL\t|^ +[A-Za-z0-9_]+\.go:[0-9]+: / && !/logbuffer\.go/ { print "  " substr($0, 1, 300) }' "$test_log" | head -80
  fi
  return "$rc"
}
# -p 4: most packages' tests wait on Redis, windows and timers (worker: 24 s of CPU
# in 140 s), so four test binaries run while others compile and link.
tested go test -race -count=1 -timeout 20m -p 4 -parallel 6 "$@" $packages
if [ -n "$prebuild_e2e" ]; then phase wait "$prebuild_e2e" || true; fi
# The end-to-end package runs after the others, alone: its audits time every
# receipt at the fake providers with no tolerance beyond the workers' send
# slack, and on two cores the other packages' race-detector load starved its
# sends by seconds (the soak's receipts 9.4-9.5 s apart under 1/10s). It runs
# without the race detector: what it tests is the sluice binary, built without
# it as the Dockerfile builds it, in processes of its own; -race would
# instrument only the harness — the fake providers that time every receipt,
# whose packages the race-detected tests above use too — and slow them: with it,
# six tests at once, a fresh clone's run saw receipts up to 3.6 s late (55
# windows "exceeded" in TestWorkerKilledMidFlight, 6 in the soak); the test
# process used 86 s of CPU with it, 65 s without (docs/development.md).
# Five tests at once (three before 2026-12-07): the audits now judge each receipt
# by the slot Redis gave it, with latency on a stated budget, so a late receipt
# no longer reads as a window exceeded (at six, in 2026-12-03, 21 receipts fell
# within 999.8 ms under 20/1s). The phase's tests wait far more than they
# compute (93 s of CPU in 313 s at three); at five it took 200-216 s. The soak (about 3 of the phase's 12 minutes of tests) runs in a
# process of its own beside three of the others, so that it starts at once: in
# turn with the rest it started a minute in and ended the phase 50 s after them.
e2e() {
  if [ "$#" -ne 0 ]; then
    go test -count=1 -timeout 20m -parallel 4 "$@" ./e2e
    return
  fi
  go test -count=1 -timeout 20m -run '^TestSoak$' ./e2e &
  local soak=$! rest=0 soaked=0
  go test -count=1 -timeout 20m -parallel 5 -skip '^TestSoak$' ./e2e || rest=$?
  wait "$soak" || soaked=$?
  [ "$rest" -eq 0 ] && [ "$soaked" -eq 0 ]
}
tested e2e "$@"
# deploy/ is its own module (Helm, k8s.io/api, Prometheus, the Grafana SDK):
# the chart, alert rules and dashboard, checked offline (docs/kubernetes.md).
# Without -race: its code renders files and shares nothing between goroutines,
# and the detector would instrument Helm's and Kubernetes' packages, the bulk
# of what this phase compiles on a fresh machine.
if [ "$#" -eq 0 ]; then
  phase wait "$prebuild_deploy" || true
  (cd deploy && tested go test -count=1 -timeout 5m ./...)
  if ! wait "$prebuild_bench"; then
    echo "test.sh: bench/ does not build (./scripts/bench.sh would fail):" >&2
    cat "$bench_log" >&2
    exit 1
  fi
  echo "test.sh: bench/ builds"
fi

# Fuzzing (the search for new failing inputs; every target's seed corpus and
# saved failures ran above as ordinary tests) is opt-in: on a fresh machine it
# builds a coverage-instrumented binary per parser package, 6 of the suite's
# 20 minutes (docs/development.md).
if [ -n "$fuzz" ] && [ "$#" -eq 0 ]; then
  ./scripts/fuzz.sh
fi
