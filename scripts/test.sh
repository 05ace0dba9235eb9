#!/usr/bin/env bash
# Runs Spore's tests in two tiers, then prints one summary:
#
#   fast  SPORE_TIER=fast go test -race ./...: every test that needs no
#         real runtime (control, api, proxy over a fake node; envd; store;
#         ...); the real-runtime tests skip themselves (internal/testenv).
#   real  everything, real gVisor sandboxes included, each package once;
#         a skipped test fails the tier. The fleet group (internal/fleet,
#         test/fleet, test/k8s) runs beside the rest, which runs -p 1: the node, the
#         gVisor driver, the egress proxy and netns with -race, then the
#         others without (see below).
#
# Nothing is rerun, except a test listed in scripts/flaky.txt (with its
# entry in docs/reliability.md), once; every rerun is counted in the
# summary. The whole suite has a time budget (SPORE_TEST_BUDGET, default
# 60m: the suite takes ~47 min on a busy 2-core machine, and CI has 90 for
# everything) and each tier a go test -timeout; running over fails loudly.
#
#   SPORE_TEST_TIERS="fast" scripts/test.sh    # one tier only
#   SPORE_TEST_SEED=123 scripts/test.sh        # replay the random delays of crash/chaos tests
set -uo pipefail
GO=${GO:-go}
BUDGET=${SPORE_TEST_BUDGET:-60m}
TIERS=${SPORE_TEST_TIERS:-fast real}
cd "$(dirname "$0")/.."

# The budget guard: rerun this script under timeout(1), which ends the
# whole process group (go test and the test binaries) when it runs out.
if [ -z "${SPORE_TEST_GUARDED:-}" ]; then
  SPORE_TEST_GUARDED=1 timeout -k 60s "$BUDGET" "$0" "$@"
  status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo
    echo "=================================================================="
    echo "FAIL: the test suite ran over its time budget of $BUDGET and was stopped"
    echo "=================================================================="
  fi
  exit "$status"
fi

logs=${SPORE_TEST_LOGDIR:-$(mktemp -d /tmp/spore-test.XXXXXX)}
mkdir -p "$logs"
summary="$logs/summary.txt"
: >"$summary"
# The race detector needs cgo (a C compiler).
if [[ " $TIERS " == *" fast "* ]] && ! command -v "$($GO env CC)" >/dev/null; then
  echo "FAIL: the fast tier runs with -race, which needs a C compiler ($($GO env CC)): apt-get install gcc"
  exit 1
fi
$GO build -o "$logs/testrun" ./scripts/testrun || exit 1

status=0
for tier in $TIERS; do
  echo
  echo "=== $tier tier ==="
  case $tier in
    fast)
      SPORE_TIER=fast "$logs/testrun" -tier fast -json-out "$logs/fast.json" -summary "$summary" \
        -- -race -count=1 -timeout=10m ./... || status=1 ;;
    real)
      # Runs in two lanes at once, sharing no host resource:
      #  - the fleet group (internal/fleet, test/fleet, test/k8s), one
      #    package at a time (each brings fleets up in the one 10.201/16
      #    range, "another fleet is up" otherwise): a fleet's nodes live in
      #    network namespaces of their own (10.201.K.0/30 links, their own
      #    cgroup parents and data directories), its replicas, PostgreSQL
      #    and S3 server on free ports; the Kubernetes control plane on free
      #    ports. Nothing of theirs meets the host's 10.200/16 sandbox
      #    networks the other packages make in the root namespace. Then
      #    test/sdk, whose servers make such networks (slots taken under the
      #    host-wide lock /run/spore-netns.lock, names and leftover checks
      #    under its own prefix "spa", cgroup parents of its own).
      #  - meanwhile, one after the other: the most concurrent host
      #    packages (the node, the gVisor driver, the egress proxy, the
      #    network namespaces) with -race, then every other package.
      # Each package runs once; each run's summary line says which it was.
      racy="./internal/node ./internal/runtime/gvisor ./internal/egress ./internal/netns"
      # Three node tests hash and copy a whole root filesystem (~340 MB)
      # or runsc builds through the chunker and the blob store: under -race
      # on 2 busy cores they took 203 s, 234 s and 78 s (20 s and 36 s
      # without, for the first two), two of them past their 3-minute
      # contexts. They run without -race right after the race group; their
      # code's concurrency is raced in the fast tier (internal/chunk,
      # internal/snapsync, internal/rootfs).
      heavy='^(TestExportBaseToLayout|TestRootFSSharedThroughBlobStore|TestVersionsKeptAcrossUpgrades)$'
      others=$($GO list ./... | grep -v -E '/test/(fleet|k8s|sdk)$|/internal/(fleet|node|runtime/gvisor|egress|netns)$')
      # The fleet group, then the stock SDKs' package (test/sdk, 13 min:
      # servers of their own, network prefix spa, own cgroup parents, free
      # ports), in the background: the two groups take about as long as
      # the race group, the heavy tests and the other packages.
      (
        env -u SPORE_TIER "$logs/testrun" -tier "real (fleet)" -forbid-skips -json-out "$logs/real-fleet.json" -summary "$summary" \
          -- -count=1 -p=1 -timeout=30m ./internal/fleet ./test/fleet ./test/k8s >"$logs/real-fleet.log" 2>&1
        st=$?
        env -u SPORE_TIER "$logs/testrun" -tier "real (stock SDKs)" -forbid-skips -json-out "$logs/real-sdk.json" -summary "$summary" \
          -- -count=1 -timeout=30m ./test/sdk >"$logs/real-sdk.log" 2>&1 || st=1
        exit $st
      ) &
      fleet=$!
      # shellcheck disable=SC2086
      env -u SPORE_TIER "$logs/testrun" -tier "real (race)" -forbid-skips -json-out "$logs/real-race.json" -summary "$summary" \
        -- -race -count=1 -p=1 -timeout=30m -skip "$heavy" $racy || status=1
      env -u SPORE_TIER "$logs/testrun" -tier "real (node, whole root filesystems)" -forbid-skips -json-out "$logs/real-heavy.json" -summary "$summary" \
        -- -count=1 -timeout=15m -run "$heavy" ./internal/node || status=1
      # shellcheck disable=SC2086
      env -u SPORE_TIER "$logs/testrun" -tier real -forbid-skips -json-out "$logs/real.json" -summary "$summary" \
        -- -count=1 -p=1 -timeout=30m $others || status=1
      wait "$fleet" || status=1
      echo "--- the fleet group's output ($logs/real-fleet.log):"
      cat "$logs/real-fleet.log"
      echo "--- the stock SDKs' package's output ($logs/real-sdk.log):"
      cat "$logs/real-sdk.log" ;;
    *) echo "unknown tier $tier"; exit 2 ;;
  esac
done
echo
echo "=================================================================="
cat "$summary"
[ "$status" -eq 0 ] && echo "PASS" || echo "FAIL (raw go test -json in $logs)"
echo "=================================================================="
exit "$status"
