#!/usr/bin/env bash
# Fuzzes every parser: each target for SLUICE_FUZZTIME executions (default
# 10000x). Run by `./scripts/test.sh --fuzz`, or alone. The plain test run
# already runs every target's seed corpus and saved failures
# (testdata/fuzz) as ordinary tests; this is the search for new ones.
#   ./scripts/fuzz.sh                           every target, 10,000 executions each
#   SLUICE_FUZZTIME=200000x ./scripts/fuzz.sh   longer
#   ./scripts/fuzz.sh tasks:FuzzDecode          one target
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with
# "context deadline exceeded" when a time budget ends (golang/go#75804, fixed
# in Go 1.27); a count has no deadline to race. The targets of a package share
# its instrumented test binary (built once, cached). scripts: TestFuzzTargetsListed
# keeps this list whole.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(
  throttle:FuzzParseRule throttle:FuzzKey throttle:FuzzParseRecord
  tasks:FuzzDecode tasks:FuzzReadBatch tasks:FuzzNormalizeRecipient tasks:FuzzParseKeyring
  tasks:FuzzHeaders tasks:FuzzListUnsubscribe tasks:FuzzReadTaskError
  plans:FuzzParse plans:FuzzParseQuietHours plans:FuzzZones plans:FuzzUSStates
  sender/smtp:FuzzEmailHeader
  api:FuzzParseIdempotencyKey api:FuzzDuplicateMember api:FuzzInvalidText api:FuzzDecodeNotification
  sender/twilio:FuzzParseStatusCallback sender/twilio:FuzzParseInbound sender/telnyx:FuzzParseEvent
  sender/whatsapp:FuzzParsePayload
  delivery:FuzzParseRecord consent:FuzzClassify consent:FuzzDecodeEvent
  unsubscribe:FuzzParseToken config:FuzzParseFromDomains
  webhook/sendgrid:FuzzParse webhook/mailgun:FuzzParse webhook/postmark:FuzzParse
  webhook/ses:FuzzParse webhook/ses:FuzzNotification
  digest:FuzzTemplateCheck
)
if [ "$#" -gt 0 ]; then targets=("$@"); fi

fuzztime=${SLUICE_FUZZTIME:-10000x}
t0=$SECONDS
for target in "${targets[@]}"; do
  pkg=${target%%:*} fn=${target##*:}
  echo "fuzz.sh: fuzzing $pkg $fn for $fuzztime"
  if ! out=$(go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$fuzztime" "./$pkg" 2>&1); then
    echo "$out"; echo "fuzz.sh: $pkg $fn failed; the input is saved under $pkg/testdata/fuzz/$fn" >&2; exit 1
  fi
done
echo "fuzz.sh: $((SECONDS - t0)) s: fuzzing ${#targets[@]} targets found nothing"
