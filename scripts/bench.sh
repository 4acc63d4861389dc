#!/usr/bin/env bash
# The benchmark harness, one command. It starts its own redis-server, runs
# every scenario interleaved (A B A B, 3 rounds) against its peers in the same
# run — a bare EVALSHA (the floor), go-redis/redis_rate (GCRA), the textbook
# own script — and prints one table of medians and ratios, then writes the
# figures to docs/. The peers live in bench/, a separate Go module, so the
# product's go.mod does not depend on them.
#
#   ./scripts/bench.sh            everything (~15 min; the 1,000-task backlog runs once per policy)
#   ./scripts/bench.sh --quick    a few-minute subset
#   ./scripts/bench.sh --only micro,memory
#   ./scripts/bench.sh --only throttled,coincide   denials, bookings, wake-and-admit; drains whose slots coincide
#   ./scripts/bench.sh --only booked   a throttled backlog's Redis CPU and round trips per send vs a send admitted at once
#   ./scripts/bench.sh --only replicas   what SLUICE_REDIS_WAIT_REPLICAS=1 costs (about a minute)
#   ./scripts/bench.sh --only worker -commandstats -monitor   a task's Redis commands by kind, and the calls clients send (MONITOR slows the runs)
#   ./scripts/bench.sh --only calls     what one redis.call costs inside a function, by kind; the worker's check made alone
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench.sh: redis-server not found (sudo apt-get install redis-server)" >&2; exit 1; }
echo "bench.sh: $(nproc) cores, $(go version | cut -d' ' -f3), $(redis-server --version | cut -d' ' -f3), load average $(cut -d' ' -f1-3 /proc/loadavg)"
cd bench
exec go run . -docs ../docs "$@"
