#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, build, every test
# (Rust unit tests, BPF_PROG_TEST_RUN tests of each program, multi-process
# tests in virtual clusters of network namespaces, the C and C++ programs
# built against include/aggbox.h and libaggbox.so, the header drift check,
# the packaging checks, the Go binding),
# then the benchmark that prints the TCP throughput ratio. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads=2
# The Go binding and examples (go vet, go test -race, cgocheck2, static).
bash scripts/test-go.sh
# Measured in this run, printed, not asserted (this machine is shared).
./target/debug/aggbox bench tcp --seconds 2 --rounds 3
