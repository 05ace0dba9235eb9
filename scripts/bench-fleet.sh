#!/usr/bin/env bash
# The fleet's benchmark (docs/benchmarks.md, "Fleet"): what the hop through
# an API replica and a remote node adds to each operation, against the same
# operations in one process (`spore bench --local`), and create throughput
# with 1 node and with 3 nodes on this machine.
#
#   scripts/bench-fleet.sh [OUT]        (make bench-fleet BENCH_OUT=...)
#
# Env: COUNT (repetitions per operation, default 20), SPORE (the spore
# binary, default bin/spore), DATA_DIR (runsc and root filesystems,
# default /var/lib/spore). Both sides run without a warm pool (a fleet
# replica's default), so a create is a restore on both. Writes into OUT:
# local/, fleet-1/ (one node, one replica), throughput-1/, throughput-3/
# (report.json + report.md each), hop.md and throughput.md (the deltas),
# and load.txt (the load average before each part: the numbers are only
# comparable on a quiet machine).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-fleet-$(date -u +%Y%m%d-%H%M%S)}
COUNT=${COUNT:-20}
SPORE=${SPORE:-bin/spore}
DATA_DIR=${DATA_DIR:-/var/lib/spore}
FLEET_DIR=$DATA_DIR/bench-fleet
PORT=${PORT:-3190}
mkdir -p "$OUT"
: >"$OUT/load.txt"

note_load() { echo "$1: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt" >&2; }

fleet_up() {
	"$SPORE" fleet up --nodes "$1" --replicas 1 --dir "$FLEET_DIR" --prefix b --base-port "$PORT" \
		--node-arg=--rootfs-dir="$DATA_DIR/rootfs" --node-arg=--runsc="$DATA_DIR/bin/runsc" --api-arg=--pool=0 >&2
	export SPORE_API_URL=http://127.0.0.1:$PORT
	SPORE_API_KEY=$(tr -d '\n' <"$FLEET_DIR/api-key")
	export SPORE_API_KEY
}
fleet_down() {
	if [ -e "$FLEET_DIR/fleet.json" ]; then "$SPORE" fleet down --dir "$FLEET_DIR" >&2; fi
}
trap fleet_down EXIT
fleet_down # a previous run killed outright

ops=(--sections ops,fork --fork-levels 1 --count "$COUNT" --no-bare)

note_load "local ops"
"$SPORE" bench --local --local-pool 0 "${ops[@]}" --out "$OUT/local" >/dev/null

fleet_up 1
note_load "fleet (1 node, 1 replica) ops"
"$SPORE" bench "${ops[@]}" --out "$OUT/fleet-1" >/dev/null
note_load "throughput, 1 node"
"$SPORE" bench --sections throughput --no-bare --out "$OUT/throughput-1" >/dev/null
fleet_down

fleet_up 3
note_load "throughput, 3 nodes"
"$SPORE" bench --sections throughput --no-bare --out "$OUT/throughput-3" >/dev/null
fleet_down

"$SPORE" bench compare --names "spore up,fleet" "$OUT/local/report.json" "$OUT/fleet-1/report.json" | tee "$OUT/hop.md"
"$SPORE" bench compare --names "1 node,3 nodes" "$OUT/throughput-1/report.json" "$OUT/throughput-3/report.json" | tee "$OUT/throughput.md"
echo "bench-fleet: reports in $OUT" >&2
