#!/usr/bin/env bash
# Installs what AggBox needs on a fresh Debian machine of this kind and
# mounts the BPF file system. Safe to run again: it installs only what is
# missing. Needs root.
set -euo pipefail

packages=(clang-19 llvm-19 libbpf-dev iproute2 ethtool iperf3 libcap2-bin bpftool gcc g++ make fonts-dejavu-core
          pkgconf binutils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The BPF file system, where AggBox pins its programs and maps.
if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
  mount -t bpf bpf /sys/fs/bpf
fi

command -v cargo >/dev/null || { echo "setup: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }

# Go 1.24 or later, for the Go binding (bindings/go) and its tests; Debian
# 12's golang-go is too old, so it is not installed from apt. The binding
# and examples use no module from the network.
export PATH=$PATH:/usr/local/go/bin
if ! command -v go >/dev/null; then
  echo "setup: Go 1.24 or later is required for bindings/go: https://go.dev/dl (into /usr/local/go)" >&2; exit 1
fi
go_minor=$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
if [[ -z $go_minor ]] || ((go_minor < 24)); then
  echo "setup: $(go env GOVERSION) is too old for bindings/go: Go 1.24 or later is required" >&2; exit 1
fi
