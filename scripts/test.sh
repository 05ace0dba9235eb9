#!/usr/bin/env bash
# Runs every Go test package one at a time. A package that fails is run once
# more, and the rerun's verdict stands, with a loud notice: two rare flakes
# (a stream through the proxy or to a fork cut mid-response under load; see
# docs/reliability.md, "Known limits") are open and must not hide behind a
# silent retry. A real failure fails both runs.
set -uo pipefail
GO=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
$GO test -count=1 -p 1 -timeout 60m ./... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && exit 0
failed=$(grep -E '^FAIL[[:space:]]+github.com/' "$log" | awk '{print $2}' | sort -u)
if [ -z "$failed" ]; then
  echo "go test failed without a failing package (build or vet error)"
  exit "$status"
fi
echo
echo "=================================================================="
echo "RERUN: these packages failed once; running them again:"
echo "$failed"
echo "=================================================================="
$GO test -count=1 -p 1 -timeout 30m $failed
