#!/usr/bin/env bash
# Runs the Gloo baseline (gloo_bench.cc) on an existing AggBox virtual
# cluster, one rank per namespace:
#
#   bench/gloo/run.sh PREFIX HOSTS -- OP [ARGS...]
#   bench/gloo/run.sh gb 8 -- bcast -s 64 1K 64K 1M 64M
#   bench/gloo/run.sh gb 8 -- allreduce -s 1K 64K 1M 16M
#   bench/gloo/run.sh gb 8 -- barrier -r 1000 -t 0
#
# PREFIX is a cluster made by `aggbox cluster up --prefix PREFIX` (`aggbox
# bench` uses a plain one, --plain: no program on any interface, the network
# a user runs Gloo on); HOSTS ranks run in PREFIX-h0 .. PREFIX-h(HOSTS-1).
# OP and ARGS go to gloo_bench (see the top of its source). Prints rank 0's
# lines on stdout:
#
#   gloo ranks=8 library="Gloo"
#   gloo op=bcast bytes=N rounds=R p50_us=X p99_us=Y [span_p50_us=A span_p99_us=B]
#
# and exits non-zero if any rank failed (a wrong result included).
# Diagnostics go to stderr.
#
# How: the program is compiled with g++ against Debian's libgloo-dev
# (scripts/gloo-setup.sh installs it) into a temporary directory, or into
# $AGGBOX_GLOO_BUILD_DIR if set (kept; rebuilt when the source is newer).
# The ranks meet through Gloo's FileStore in that temporary directory (the
# namespaces share the file system) and connect a full mesh of Gloo's TCP
# transport on eth0. The namespaces have only lo and eth0 and no default
# route (checked), so nothing goes anywhere but the cluster.
# $AGGBOX_GLOO_TIMEOUT (seconds, default 900) bounds the whole run. Needs root.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$here/gloo_bench.cc

usage() {
  echo "usage: $0 PREFIX HOSTS -- bcast|allreduce|barrier [ARGS...]" >&2
  exit 2
}
(($# >= 4)) || usage
prefix=$1 hosts=$2
[[ $3 == -- ]] || usage
shift 3
args=("$@")

[[ $prefix =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "run.sh: bad prefix: $prefix" >&2; exit 2; }
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1)) || { echo "run.sh: bad host count: $hosts" >&2; exit 2; }
((EUID == 0)) || { echo "run.sh: needs root (ip netns exec)" >&2; exit 1; }
for tool in ip timeout g++; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done
[[ -e /usr/include/gloo/allreduce.h ]] || {
  echo "run.sh: Gloo not found (/usr/include/gloo); run scripts/gloo-setup.sh first" >&2
  exit 1
}
timeout_s=${AGGBOX_GLOO_TIMEOUT:-900}

for ((i = 0; i < hosts; i++)); do
  ns=$prefix-h$i
  [[ -e /run/netns/$ns ]] || {
    echo "run.sh: namespace $ns does not exist (aggbox cluster up --hosts $hosts --prefix $prefix)" >&2
    exit 1
  }
  if [[ -n $(ip -n "$ns" route show default 2>/dev/null) ]]; then
    echo "run.sh: $ns has a default route; refusing (traffic must stay in the cluster)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d /tmp/aggbox-gloo.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  local rc=$? pid
  trap - INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n ${AGGBOX_GLOO_BUILD_DIR:-} ]]; then
  mkdir -p "$AGGBOX_GLOO_BUILD_DIR"
  bin=$(cd "$AGGBOX_GLOO_BUILD_DIR" && pwd)/gloo_bench
else
  bin=$tmp/gloo_bench
fi
if [[ ! -x $bin || $src -nt $bin ]]; then
  g++ -O2 -std=c++17 -Wall -Wextra -o "$bin.new" "$src" -lgloo -pthread
  mv -f "$bin.new" "$bin"
fi

mkdir -p "$tmp/store"
echo "run.sh: $hosts Gloo ranks in $prefix-h0..$prefix-h$((hosts - 1)): gloo_bench ${args[*]}" >&2
start=$(date +%s.%N)
for ((i = 0; i < hosts; i++)); do
  out=/dev/null
  ((i == 0)) && out=$tmp/rank0.out
  RANK=$i WORLD_SIZE=$hosts GLOO_STORE=$tmp/store GLOO_IFACE=eth0 \
    timeout -k 10 "$timeout_s" ip netns exec "$prefix-h$i" "$bin" "${args[@]}" >"$out" &
  pids+=($!)
done
# Rank 0's lines as they come.
touch "$tmp/rank0.out"
tail -n +1 -f --pid="${pids[0]}" "$tmp/rank0.out" &
tailpid=$!
rc=0
for pid in "${pids[@]}"; do
  set +e
  wait "$pid"
  r=$?
  set -e
  if ((r != 0 && rc == 0)); then
    rc=$r
    # One rank failed: the others would wait for it until Gloo's timeout.
    for other in "${pids[@]}"; do kill -TERM "$other" 2>/dev/null || true; done
  fi
done
wait "$tailpid" 2>/dev/null || true
pids=()
end=$(date +%s.%N)
if ((rc == 124)); then
  echo "run.sh: timed out after ${timeout_s}s" >&2
elif ((rc != 0)); then
  echo "run.sh: a rank failed (exit $rc)" >&2
else
  awk -v s="$start" -v e="$end" 'BEGIN { printf "run.sh: done in %.1f s\n", e - s }' >&2
fi
exit "$rc"
