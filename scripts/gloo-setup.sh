#!/usr/bin/env bash
# Installs Gloo (Debian's libgloo-dev) and g++ if missing, for the Gloo
# baseline in bench/gloo/, and prints its version. Safe to run again: it
# installs only what is missing, quietly. Needs root.
set -euo pipefail

packages=(libgloo-dev g++)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "gloo-setup: installing ${missing[*]}" >&2
  log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "gloo-setup: apt-get failed" >&2; exit 1
  fi
  rm -f "$log"
fi

[[ -e /usr/include/gloo/allreduce.h ]] || { echo "gloo-setup: /usr/include/gloo not found after install" >&2; exit 1; }
echo "Gloo $(dpkg-query -W -f='${Version}' libgloo-dev) (Debian's libgloo-dev)"
