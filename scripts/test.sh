#!/usr/bin/env bash
# The test command: makes sure redis-server exists (installing Debian's
# package when run as root with apt and it is missing), runs every test with
# the race detector, then a short fuzz pass over every parser.
#   SLUICE_FUZZTIME=30s ./scripts/test.sh   longer fuzzing (0 skips it)
#   ./scripts/test.sh -run TestBoundary     extra arguments go to `go test`
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: redis-server missing; installing Debian's redis-server" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "test.sh: redis-server not found. Install Redis 7 (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) and run again." >&2
    exit 1
  fi
fi
echo "test.sh: $(redis-server --version)"
# Tests start their own redis-server processes on free ports; the system one is not used.
go test -race -count=1 -timeout 20m "$@" ./...

fuzztime=${SLUICE_FUZZTIME:-5s}
if [ "$#" -eq 0 ] && [ "$fuzztime" != "0" ]; then
  for target in throttle:FuzzParseRule throttle:FuzzKey tasks:FuzzDecode tasks:FuzzReadBatch \
                tasks:FuzzNormalizeRecipient tasks:FuzzParseKeyring tasks:FuzzHeaders tasks:FuzzListUnsubscribe \
                plans:FuzzParse worker:FuzzEmailHeader plans:FuzzParseQuietHours plans:FuzzZones \
                api:FuzzParseIdempotencyKey api:FuzzParseStateRecord api:FuzzParseLastErr api:FuzzDecodeNotification \
                api:FuzzParseStatusCallback delivery:FuzzParseRecord; do
    pkg=${target%%:*} fn=${target##*:}
    echo "test.sh: fuzzing $pkg $fn for $fuzztime"
    if ! out=$(go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" "./$pkg" 2>&1); then
      echo "$out"; echo "test.sh: $pkg $fn failed; the input is saved under $pkg/testdata/fuzz/$fn" >&2; exit 1
    fi
  done
  echo "test.sh: fuzzing found nothing"
fi
