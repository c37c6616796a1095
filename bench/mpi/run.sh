#!/usr/bin/env bash
# Runs one of the Open MPI baselines of bench/mpi on an existing AggBox
# virtual cluster, one rank per namespace, the way ../shared/ARCHITECTURE.md
# ("What to beat") measured it:
#
#   bench/mpi/run.sh [--bench bcast|allreduce|barrier|train] PREFIX HOSTS [-- BENCH_ARGS...]
#   bench/mpi/run.sh mpib 8 -- 64 1K 64K 1M 64M
#   bench/mpi/run.sh --bench allreduce mpib 8 -- -s 1K 64K 1M 16M
#   bench/mpi/run.sh --bench train mpib 8 -- --steps 100 --params 1000000
#
# --bench picks the program: bcast (the default) runs bcast_bench.c
# (MPI_Bcast and MPI_Barrier), allreduce runs allreduce_bench.c
# (MPI_Allreduce of f32 with MPI_SUM, and MPI_Barrier), barrier runs
# barrier_bench.c (MPI_Barrier only; no SIZEs), train runs train_mpi.cpp
# (examples/cpp/train.cpp's training with MPI_Allreduce; its options, not
# SIZEs; built with mpicxx and -I examples/cpp for train_model.hpp).
#
# `aggbox bench broadcast|allreduce|barrier|train` run it on a plain cluster
# (`aggbox cluster up`: no program on any interface), the network a
# user runs Open MPI on; on a cluster without --plain, TCP runs without
# TSO/GSO (see README.md, Pitfalls).
#
# PREFIX is a cluster made by `aggbox cluster up --prefix PREFIX`; HOSTS ranks
# run in PREFIX-h0 .. PREFIX-h(HOSTS-1). BENCH_ARGS go to the program
# ([-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] SIZE...; see the
# top of its source). bcast_bench's SIZEs are bytes, default 64 1K 64K 1M
# 64M; allreduce_bench's are f32 element counts, default 1K 64K 1M 16M.
# Prints the program's lines on stdout:
#
#   mpi ranks=8 netns=8 library="Open MPI v4.1.4"
#   mpi op=bcast bytes=N rounds=R p50_us=X p99_us=Y     (one per size; or op=allreduce)
#   mpi op=barrier bytes=0 rounds=R p50_us=X p99_us=Y
#
# (train prints train.cpp's lines behind "mpi "; see train_mpi.cpp's top)
# and exits non-zero if anything failed (including a broadcast that delivered
# wrong data, or an allreduce whose result was wrong). Diagnostics go to stderr.
#
# How: mpirun runs inside PREFIX-h0 with a hostfile of the hosts' eth0
# addresses (slots=1 each), read from the namespaces themselves. A generated
# rsh agent maps each address to its namespace and runs the orted command
# there with `ip netns exec`; it refuses any other address. The namespaces
# have only lo and eth0 and no default route (checked), and MPI's and ORTE's
# TCP traffic is pinned to eth0 (PMIx, between a rank and its orted, uses
# loopback), so nothing goes anywhere but the cluster and loopback.
# Transport: ob1 + the TCP BTL, `mpi_yield_when_idle 1` (Open MPI busy-polls
# otherwise, which with 8 ranks on 2 cores makes it ~250x slower).
#
# The program is compiled with mpicc (-I this directory, for bench_common.h,
# the code the C programs share; train: mpicxx, -I examples/cpp) into a
# temporary directory that is removed at the end (with the hostfile and
# agent), or into $AGGBOX_MPI_BUILD_DIR if set (kept; rebuilt only when the
# source or its shared header is newer).
# $AGGBOX_MPI_TIMEOUT (seconds, default 900) bounds the whole mpirun.
# Needs root and Open MPI (scripts/mpi-setup.sh installs it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  echo "usage: $0 [--bench bcast|allreduce|barrier|train] PREFIX HOSTS [-- BENCH_ARGS...]" >&2
  exit 2
}
bench=bcast
if (($#)) && [[ $1 == --bench ]]; then
  (($# >= 2)) || usage
  bench=$2
  shift 2
fi
prog=${bench}_bench
src=$here/$prog.c
common=$here/bench_common.h
case $bench in
  bcast) default_args=(64 1K 64K 1M 64M) ;;
  allreduce) default_args=(1K 64K 1M 16M) ;;
  barrier) default_args=() ;;
  train)
    default_args=()
    prog=train_mpi src=$here/train_mpi.cpp common=$here/../../examples/cpp/train_model.hpp
    ;;
  *) echo "run.sh: unknown benchmark: $bench (bcast, allreduce, barrier or train)" >&2; exit 2 ;;
esac
(($# >= 2)) || usage
prefix=$1 hosts=$2
shift 2
if (($#)); then
  [[ $1 == -- ]] || usage
  shift
fi
bench_args=("$@")
((${#bench_args[@]})) || bench_args=(${default_args[@]+"${default_args[@]}"})

[[ $prefix =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "run.sh: bad prefix: $prefix" >&2; exit 2; }
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1)) || { echo "run.sh: bad host count: $hosts" >&2; exit 2; }
((EUID == 0)) || { echo "run.sh: needs root (ip netns exec)" >&2; exit 1; }
for tool in ip timeout pgrep; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done
# Open MPI's own names, in case the mpirun/mpicc alternatives point at MPICH.
mpirun=$(command -v mpirun.openmpi || command -v mpirun || true)
mpicc=$(command -v mpicc.openmpi || command -v mpicc || true)
mpicxx=$(command -v mpicxx.openmpi || command -v mpicxx || true)
mpiver=$([[ -n $mpirun ]] && "$mpirun" --version 2>/dev/null || true)
if [[ -z $mpicc || ! ($mpiver == *"Open MPI"* || $mpiver == *OpenRTE*) ]]; then
  echo "run.sh: Open MPI not found; run scripts/mpi-setup.sh first" >&2
  exit 1
fi
timeout_s=${AGGBOX_MPI_TIMEOUT:-900}

# The hosts and their eth0 addresses, read from the namespaces.
addrs=()
for ((i = 0; i < hosts; i++)); do
  ns=$prefix-h$i
  [[ -e /run/netns/$ns ]] || {
    echo "run.sh: namespace $ns does not exist (aggbox cluster up --hosts $hosts --prefix $prefix)" >&2
    exit 1
  }
  a=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{split($4, p, "/"); print p[1]; exit}')
  [[ $a =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
    echo "run.sh: $ns has no IPv4 address on eth0" >&2
    exit 1
  }
  if [[ -n $(ip -n "$ns" route show default 2>/dev/null) ]]; then
    echo "run.sh: $ns has a default route; refusing (traffic must stay in the cluster)" >&2
    exit 1
  fi
  addrs+=("$a")
done

tmp=$(mktemp -d /tmp/aggbox-mpi.XXXXXX)
chmod 755 "$tmp" # the agent and binary are run from every namespace (same file system)
mpipid=
cleanup() {
  local rc=$?
  trap - INT TERM
  # An interrupted run: stop mpirun (timeout passes the TERM on; mpirun then
  # takes its orteds and ranks down), waiting at most ~15 s before KILL.
  if [[ -n $mpipid ]] && kill -0 "$mpipid" 2>/dev/null; then
    kill -TERM "$mpipid" 2>/dev/null || true
    local i
    for ((i = 0; i < 150; i++)); do kill -0 "$mpipid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$mpipid" 2>/dev/null && kill -KILL "$mpipid" 2>/dev/null || true
    wait "$mpipid" 2>/dev/null || true
  fi
  # The agent's processes (sh -> orted -> rank) normally exit on their own
  # within a second or two of mpirun; give them 5 s, then TERM what is left.
  if [[ -s $tmp/agent.pids ]]; then
    local pid alive kids i
    for ((i = 0; i < 50; i++)); do
      alive=()
      while read -r pid; do
        [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && alive+=("$pid")
      done <"$tmp/agent.pids"
      ((${#alive[@]})) || break
      sleep 0.1
    done
    for pid in "${alive[@]}"; do
      kids=$(pgrep -P "$pid" || true)
      kill -TERM "$pid" $kids 2>/dev/null || true
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build.
if [[ -n ${AGGBOX_MPI_BUILD_DIR:-} ]]; then
  mkdir -p "$AGGBOX_MPI_BUILD_DIR"
  bin=$(cd "$AGGBOX_MPI_BUILD_DIR" && pwd)/$prog
else
  bin=$tmp/$prog
fi
if [[ ! -x $bin || $src -nt $bin || $common -nt $bin ]]; then
  if [[ $bench == train ]]; then
    [[ -n $mpicxx ]] || { echo "run.sh: mpicxx not found (libopenmpi-dev); run scripts/mpi-setup.sh" >&2; exit 1; }
    "$mpicxx" -std=c++17 -O2 -Wall -Wextra -I "$(dirname "$common")" -o "$bin.new" "$src"
  else
    "$mpicc" -O2 -Wall -Wextra -I "$here" -o "$bin.new" "$src" -lm
  fi
  mv -f "$bin.new" "$bin"
fi

# The hostfile: one slot per host, so rank i runs on host i.
for a in "${addrs[@]}"; do echo "$a slots=1"; done >"$tmp/hostfile"

# The rsh agent. ORTE calls it as `agent [options] HOST COMMAND...` for every
# host but the one mpirun runs on (it recognizes its own address). Each host
# gets its own TMPDIR (so its own ORTE session directory and PMIx store): the
# namespaces share the file system and the hostname, and would otherwise all
# use /tmp/ompi.<hostname>.0/ and step on each other's files at teardown.
{
  echo '#!/bin/sh'
  echo "# generated by bench/mpi/run.sh for cluster $prefix"
  echo 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done'
  echo 'host=$1; shift'
  echo 'case "$host" in'
  for ((i = 0; i < hosts; i++)); do echo "  ${addrs[i]}) ns=$prefix-h$i; TMPDIR='$tmp/s$i' ;;"; done
  echo "  *) echo \"mpi agent: \$host is not a host of cluster $prefix\" >&2; exit 1 ;;"
  echo 'esac'
  echo 'export TMPDIR; mkdir -p "$TMPDIR"'
  echo "echo \$\$ >>'$tmp/agent.pids'"
  echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
} >"$tmp/agent.sh"
chmod 755 "$tmp/agent.sh"

mpi_args=(
  --allow-run-as-root
  -np "$hosts" --hostfile "$tmp/hostfile" --map-by slot --bind-to none
  --mca plm rsh --mca plm_rsh_agent "$tmp/agent.sh"
  --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
  --mca mpi_yield_when_idle 1
)

echo "run.sh: mpirun -np $hosts in $prefix-h0 over ${addrs[*]}: $prog ${bench_args[*]}" >&2
start=$(date +%s.%N)
# In the background and waited for, so that Ctrl-C/TERM reach the trap at
# once (timeout runs in its own process group). The setpgid warning is ORTE
# racing its own child (which has already called setpgid itself) and
# harmless; everything else on stderr is passed through.
mkdir -p "$tmp/s0"
TMPDIR=$tmp/s0 timeout -k 10 "$timeout_s" ip netns exec "$prefix-h0" \
  "$mpirun" "${mpi_args[@]}" "$bin" "${bench_args[@]}" \
  2> >(grep -v --line-buffered 'plm:rsh: Warning: setpgid(' >&2) &
mpipid=$!
set +e
wait "$mpipid"
rc=$?
set -e
mpipid=
end=$(date +%s.%N)
if ((rc == 124)); then
  echo "run.sh: mpirun timed out after ${timeout_s}s" >&2
elif ((rc != 0)); then
  echo "run.sh: mpirun failed (exit $rc)" >&2
else
  awk -v s="$start" -v e="$end" 'BEGIN { printf "run.sh: done in %.1f s\n", e - s }' >&2
fi
exit "$rc"
