#!/usr/bin/env bash
# The Go binding's tests (called by scripts/test.sh): stages the libaggbox
# of the debug build, with its aggbox.pc, under target/go-prefix
# (scripts/install.sh), then in bindings/go runs gofmt, go vet, go test
# -race, go test under GOEXPERIMENT=cgocheck2 and go test linked
# statically (-tags aggbox_static, checked to need no libaggbox.so), and
# vets and builds examples/go. Needs Go 1.24 or later (scripts/setup.sh
# checks); the Go code needs no module from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "test-go: go is not on PATH (Go 1.24 or later: https://go.dev/dl)" >&2; exit 1; }
cargo build -p aggbox-ffi -p aggbox-cli
prefix=$root/target/go-prefix
PREFIX=$prefix NO_BUILD=1 PROFILE=debug LDCONFIG=true bash scripts/install.sh >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export AGGBOX_BIN=$root/target/debug/aggbox   # for the external-store test
export GOFLAGS=${GOFLAGS:--buildvcs=false}
# Ranks of the tests' groups are on loopback: none of the caller's AggBox
# or rendezvous variables may leak into them.
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT AGGBOX_IFACE AGGBOX_PORT AGGBOX_DATAPATH AGGBOX_TIMEOUT_MS AGGBOX_STORE

check_module() {
  local dir=$1
  echo "== $dir: gofmt, go vet"
  (cd "$dir"
   unformatted=$(gofmt -l .)
   [[ -z $unformatted ]] || { echo "test-go: not gofmt'ed: $unformatted" >&2; exit 1; }
   go vet ./...)
}

check_module bindings/go
(cd bindings/go
 echo "== bindings/go: go test -race"
 go test -race -count=1 ./...
 echo "== bindings/go: go test, GOEXPERIMENT=cgocheck2"
 GOEXPERIMENT=cgocheck2 go test -count=1 ./...
 echo "== bindings/go: go test -tags aggbox_static (libaggbox.a)"
 bin=$(mktemp -d)
 trap 'rm -rf "$bin"' EXIT
 go test -c -tags aggbox_static -o "$bin/static.test" .
 if readelf -d "$bin/static.test" | grep -q 'NEEDED.*libaggbox'; then
   echo "test-go: the aggbox_static test binary still needs libaggbox.so" >&2; exit 1
 fi
 (cd "$bin" && ./static.test -test.count=1 >/dev/null && echo "ok  	static")
)
if [[ -d examples/go ]]; then
  check_module examples/go
  (cd examples/go && go build ./...)
fi
echo "test-go: all passed"
