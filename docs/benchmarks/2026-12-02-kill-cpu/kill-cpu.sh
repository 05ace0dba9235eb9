#!/bin/bash
# usage: kill-cpu.sh BIN_DIR LABEL: starts a private server from BIN_DIR (spore, spore-envd) on
# 127.0.0.1:3999, then three times forks 100 children of a sandbox, waits 8 s, kills them with one
# `spore kill` and reports the wall time of that call, the server process's CPU and the host's busy CPU
# over the call and the 5 s after it (the kills' background work); then removes all it made.
B=$1; L=$2
export SPORE_API_URL=http://127.0.0.1:3999 E2B_API_KEY=k1 SPORE_API_KEY=k1
rm -rf ${WORK:-/tmp/spore-killcpu}; mkdir -p ${WORK:-/tmp/spore-killcpu}
SPORE_API_KEY=k1 $B/spore up --data-dir ${WORK:-/tmp/spore-killcpu} --cache-dir /var/cache/spore --rootfs-dir /var/lib/spore/rootfs --runsc /var/lib/spore/bin/runsc --listen 127.0.0.1:3999 --restore-targets-burst 0 > ${WORK:-/tmp/spore-killcpu}.log 2>&1 &
SP=$!
for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:3999/health && break; sleep 1; done
sleep 15
ID=$($B/spore start base | tail -1)
cpu() { awk '{print $14+$15}' /proc/$SP/stat; }
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }
for r in 1 2 3; do
  $B/spore fork $ID -n 100 --json > /tmp/fk.json
  sleep 8
  kids=$(python3 -c "import json;print(' '.join(x['sandboxID'] for x in json.load(open('/tmp/fk.json'))))")
  c0=$(cpu); read b0 i0 < <(busy); t0=$(date +%s%N)
  $B/spore kill $kids > /dev/null
  t1=$(date +%s%N)
  sleep 5
  c1=$(cpu); read b1 i1 < <(busy)
  echo "$L rep $r: kill call $(( (t1-t0)/1000000 )) ms, server CPU $(( (c1-c0)*10 )) ms, host busy $(( (b1-b0)*10 )) ms (over the call + 5 s)"
done
$B/spore kill $ID >/dev/null
kill $SP; wait $SP
$B/spore fleet purge-node --data-dir ${WORK:-/tmp/spore-killcpu} --rootfs-dir /var/lib/spore/rootfs --runsc /var/lib/spore/bin/runsc --net-prefix sp
