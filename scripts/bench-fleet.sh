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
# load.txt (the load average before each part: the numbers are only
# comparable on a quiet machine) and cpu.txt (host CPU per create during
# each throughput run, by part: what bounds creates per second here).
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
: >"$OUT/cpu.txt"

# cpu_sample: CPU time used so far (clock ticks) by: the whole host (busy
# time in /proc/stat), API replicas, node agents, PostgreSQL processes.
cpu_sample() {
	local total api=0 node=0 pg=0 p cmd t
	total=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat)
	for p in /proc/[0-9]*; do
		cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
		t=$(sed 's/.*) //' "$p/stat" 2>/dev/null | awk '{print $12+$13}') || continue
		[ -n "$t" ] || continue
		case "$cmd" in
		*" api --listen"*) api=$((api + t)) ;;
		*" node --listen"*) node=$((node + t)) ;;
		*bin/postgres*|postgres:*) pg=$((pg + t)) ;;
		esac
	done
	echo "$total $api $node $pg"
}

# cpu_report NAME BEFORE AFTER CREATES: CPU per create by part, in ms.
cpu_report() {
	local hz b a
	hz=$(getconf CLK_TCK)
	read -ra b <<<"$2"
	read -ra a <<<"$3"
	awk -v n="$4" -v hz="$hz" -v name="$1" -v t="$((a[0] - b[0]))" -v api="$((a[1] - b[1]))" -v node="$((a[2] - b[2]))" -v pg="$((a[3] - b[3]))" 'BEGIN {
		ms = 1000 / hz / n
		printf "%s: CPU per create %.0f ms (host busy time over %d creates): API replica %.1f ms, node agents %.1f ms, PostgreSQL %.1f ms, the rest (sandboxes, runsc, kernel) %.0f ms\n", name, t*ms, n, api*ms, node*ms, pg*ms, (t-api-node-pg)*ms
	}' | tee -a "$OUT/cpu.txt"
}

note_load() { echo "$1: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt" >&2; }

fleet_up() {
	"$SPORE" fleet up --nodes "$1" --replicas 1 --dir "$FLEET_DIR" --prefix b --base-port "$PORT" \
		--node-arg=--rootfs-dir="$DATA_DIR/rootfs" --node-arg=--runsc="$DATA_DIR/bin/runsc" --api-arg=--pool=0 >&2
	sleep 20 # the nodes built their templates at start: let the load settle
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
before=$(cpu_sample)
"$SPORE" bench --sections throughput --no-bare --out "$OUT/throughput-1" >/dev/null
cpu_report "1 node" "$before" "$(cpu_sample)" 96
fleet_down

fleet_up 3
note_load "throughput, 3 nodes"
before=$(cpu_sample)
"$SPORE" bench --sections throughput --no-bare --out "$OUT/throughput-3" >/dev/null
cpu_report "3 nodes" "$before" "$(cpu_sample)" 96
fleet_down

"$SPORE" bench compare --names "spore up,fleet" "$OUT/local/report.json" "$OUT/fleet-1/report.json" | tee "$OUT/hop.md"
"$SPORE" bench compare --names "1 node,3 nodes" "$OUT/throughput-1/report.json" "$OUT/throughput-3/report.json" | tee "$OUT/throughput.md"
echo "bench-fleet: reports in $OUT" >&2
