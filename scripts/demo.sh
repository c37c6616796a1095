#!/usr/bin/env bash
# AggBox's main job on one machine: set-up, build, a 4-host virtual cluster,
# the collectives that exist so far (barrier) run by a C program through the
# kernel datapath and the user datapath, what ran where and how long it took,
# then tear-down. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

HOSTS=${HOSTS:-4}
BARRIERS=${BARRIERS:-1000}
PREFIX=aggbox-demo

bash scripts/setup.sh
cargo build --release --workspace
make -s -C examples/c PROFILE=release >/dev/null
aggbox=./target/release/aggbox

"$aggbox" cluster down --prefix "$PREFIX" >/dev/null 2>&1 || true
trap '"$aggbox" cluster down --prefix "$PREFIX" >/dev/null' EXIT
echo "== a virtual cluster of $HOSTS hosts (network namespaces on one bridge)"
"$aggbox" cluster up --hosts "$HOSTS" --prefix "$PREFIX"

echo "== aggbox doctor, inside host 0"
ip netns exec "$PREFIX-h0" "$aggbox" doctor --iface eth0

for datapath in kernel user; do
  echo "== $BARRIERS barriers on $HOSTS ranks, $datapath datapath (examples/c/barrier.c)"
  pids=()
  out=$(mktemp -d)
  for ((i = 0; i < HOSTS; i++)); do
    RANK=$i WORLD_SIZE=$HOSTS MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 AGGBOX_DATAPATH=$datapath \
      ip netns exec "$PREFIX-h$i" examples/c/barrier "$BARRIERS" >"$out/$i" 2>/dev/null &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for ((i = 0; i < HOSTS; i++)); do echo "  host $PREFIX-h$i: $(cat "$out/$i")"; done
  rm -rf "$out"
done

echo "== kernel vs user datapath, barrier latency on $HOSTS hosts (measured now)"
"$aggbox" bench barrier --hosts "$HOSTS" --barriers "$BARRIERS"
