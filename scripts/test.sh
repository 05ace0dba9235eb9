#!/usr/bin/env bash
# Runs every Go test package one at a time. Tests that fail are run again,
# by name, up to twice more, with a loud notice; the last verdict stands.
# Two rare flakes are open (a stream through the proxy or to a fork cut
# mid-response; see docs/reliability.md, "Known limits") and must not hide
# behind a silent retry. A real failure fails every run.
set -uo pipefail
GO=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
$GO test -count=1 -p 1 -timeout 60m ./... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
for attempt in 2 3; do
  [ "$status" -eq 0 ] && exit 0
  pkgs=$(grep -E '^FAIL[[:space:]]+github.com/' "$log" | awk '{print $2}' | sort -u)
  tests=$(grep -E '^--- FAIL: ' "$log" | awk '{print $3}' | sort -u | paste -sd'|')
  if [ -z "$pkgs" ] || [ -z "$tests" ]; then
    echo "go test failed without a failing test (build or vet error)"
    exit "$status"
  fi
  echo
  echo "=================================================================="
  echo "RERUN (attempt $attempt of 3): failed tests $tests"
  echo "in: $pkgs"
  echo "=================================================================="
  $GO test -count=1 -p 1 -timeout 30m -run "^($tests)\$" $pkgs 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
done
exit "$status"
