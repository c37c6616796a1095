#!/usr/bin/env bash
# AggBox's main job on one machine: set-up, build, a 4-host virtual cluster,
# the collectives that exist so far (barrier, broadcast, the reductions, key-value reduce, approximate
# agreement with crash recovery) run by C programs (and the word count by a Go one)
# through the kernel datapath and the user datapath, what ran where and how
# long it took, then tear-down. Needs root.
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

# Runs examples/c/$1 (arguments $3...) on every host with datapath $2 and
# prints what each host reported.
run_everywhere() {
  local program=$1 datapath=$2
  shift 2
  local pids=() out
  out=$(mktemp -d)
  for ((i = 0; i < HOSTS; i++)); do
    RANK=$i WORLD_SIZE=$HOSTS MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 AGGBOX_DATAPATH=$datapath \
      ip netns exec "$PREFIX-h$i" "examples/c/$program" "$@" >"$out/$i" 2>/dev/null &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for ((i = 0; i < HOSTS; i++)); do sed "s/^/  host $PREFIX-h$i: /" "$out/$i"; done
  rm -rf "$out"
}

for datapath in kernel user; do
  echo "== $BARRIERS barriers on $HOSTS ranks, $datapath datapath (examples/c/barrier.c)"
  run_everywhere barrier "$datapath" "$BARRIERS"
  echo "== broadcasts of 1 KiB, 1 MiB and 16 MiB from rank 0, $datapath datapath, every byte checked (examples/c/broadcast.c)"
  run_everywhere broadcast "$datapath" 1024 1048576 16777216
  echo "== allreduce (f32 sum, i64 max, f64 avg), reduce, reduce-scatter, allgather and iallreduce of 1, 1000 and 1M elements, $datapath datapath, every element checked (examples/c/allreduce.c)"
  run_everywhere allreduce "$datapath" 1 1000 1048576
  echo "== word count of /usr/share/common-licenses, split across $HOSTS ranks, $datapath datapath: each rank's words and the three most frequent of those it owns (examples/c/wordcount.c)"
  run_everywhere wordcount "$datapath" /usr/share/common-licenses/*
done

# Approximate agreement on every host with datapath $1 while rank
# HOSTS-1 is killed forever and rank 1 is killed and started again
# (examples/c/agree.c; an `aggbox store` lets the restarted rank rejoin).
agree_with_crashes() {
  local datapath=$1 out pids=() store
  out=$(mktemp -d)
  ip netns exec "$PREFIX-h0" "$aggbox" store --world-size "$HOSTS" --addr 10.77.0.1 --port 29600 >/dev/null &
  store=$!
  start() {
    RANK=$1 WORLD_SIZE=$HOSTS MASTER_ADDR=10.77.0.1 MASTER_PORT=29600 AGGBOX_STORE=external AGGBOX_PORT=47600 \
      AGGBOX_DATAPATH=$datapath ip netns exec "$PREFIX-h$1" examples/c/agree "$(($1 * 1000000 / (HOSTS - 1)))" \
      "$out/store$1" 1 1e-6 0 1000000 500 >>"$out/$1" 2>&1 &
    pids[$1]=$!
  }
  for ((i = 0; i < HOSTS; i++)); do start "$i"; done
  for ((i = 0; i < HOSTS; i++)); do
    until grep -q joined "$out/$i" 2>/dev/null; do sleep 0.01; done
  done
  kill -9 "${pids[$((HOSTS - 1))]}" "${pids[1]}"
  wait "${pids[$((HOSTS - 1))]}" "${pids[1]}" 2>/dev/null || true
  echo "  killed rank $((HOSTS - 1)) for good and rank 1, which starts again from its store"
  sleep 0.05
  start 1
  for ((i = 0; i < HOSTS - 1; i++)); do wait "${pids[$i]}" || true; done
  kill "$store"
  for ((i = 0; i < HOSTS; i++)); do grep -v joined "$out/$i" | sed "s/^/  host $PREFIX-h$i: /" || true; done
  rm -rf "$out"
}

for datapath in kernel user; do
  echo "== approximate agreement, $HOSTS ranks with f = 1, inputs 0 to 1e6, epsilon 1e-6, $datapath datapath, with a rank killed for good and another killed and restarted mid-agreement (examples/c/agree.c)"
  agree_with_crashes "$datapath"
done

# The same library from Go (bindings/go): the examples of examples/go built
# against the release libaggbox staged under target/go-prefix-release.
export PATH=$PATH:/usr/local/go/bin
go_prefix=$PWD/target/go-prefix-release
PREFIX=$go_prefix NO_BUILD=1 PROFILE=release LDCONFIG=true bash scripts/install.sh >/dev/null
(cd examples/go && PKG_CONFIG_PATH=$go_prefix/lib/pkgconfig GOFLAGS=-buildvcs=false \
  go build -o "$go_prefix/bin/" ./wordcount ./paramavg)

# Runs the Go example $1 (arguments $3...) on every host with datapath $2.
run_go_everywhere() {
  local program=$1 datapath=$2
  shift 2
  local pids=() out
  out=$(mktemp -d)
  for ((i = 0; i < HOSTS; i++)); do
    RANK=$i WORLD_SIZE=$HOSTS MASTER_ADDR=10.77.0.1 MASTER_PORT=29700 AGGBOX_DATAPATH=$datapath \
      LD_LIBRARY_PATH=$go_prefix/lib ip netns exec "$PREFIX-h$i" "$go_prefix/bin/$program" "$@" >"$out/$i" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  for ((i = 0; i < HOSTS; i++)); do sed "s/^/  host $PREFIX-h$i: /" "$out/$i"; done
  rm -rf "$out"
  return "$rc"
}

for datapath in kernel user; do
  echo "== from Go: parameter averaging, 1M f32 parameters averaged by allreduce every 5 of 50 steps, $datapath datapath (examples/go/paramavg)"
  run_go_everywhere paramavg "$datapath" -params 1048576 -steps 50 -sync 5
  echo "== from Go: the word count of /usr/share/common-licenses, $datapath datapath (examples/go/wordcount)"
  run_go_everywhere wordcount "$datapath" /usr/share/common-licenses/*
done

echo "== kernel vs user datapath, barrier latency on $HOSTS hosts (measured now)"
"$aggbox" bench barrier --hosts "$HOSTS" --barriers "$BARRIERS"
echo "== kernel vs user datapath, broadcast on $HOSTS hosts (measured now; Open MPI too where installed: scripts/mpi-setup.sh)"
"$aggbox" bench broadcast --hosts "$HOSTS" --rounds 100
