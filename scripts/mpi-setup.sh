#!/usr/bin/env bash
# Installs Open MPI (openmpi-bin, libopenmpi-dev) if missing, for the MPI
# baseline in bench/mpi/, and prints its version. Safe to run again: it
# installs only what is missing, quietly. Needs root.
set -euo pipefail

packages=(openmpi-bin libopenmpi-dev gcc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "mpi-setup: installing ${missing[*]}" >&2
  log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "mpi-setup: apt-get failed" >&2; exit 1
  fi
  rm -f "$log"
fi

command -v mpirun.openmpi >/dev/null || { echo "mpi-setup: mpirun.openmpi not found after install" >&2; exit 1; }
command -v mpicc.openmpi >/dev/null || { echo "mpi-setup: mpicc.openmpi not found after install" >&2; exit 1; }
# "Open MPI v4.1.4" (the package's version in parentheses)
ver=$(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI v\(.*\)$/\1/p' | head -1)
echo "Open MPI ${ver:-unknown} ($(dpkg-query -W -f='${Version}' openmpi-bin))"
