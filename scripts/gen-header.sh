#!/usr/bin/env bash
# Regenerates include/aggbox.h from ffi/src with cbindgen (as a library, in
# ffi/tests/header.rs: no cbindgen binary needed). Commit the result; the same
# test fails in CI when the committed header is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
AGGBOX_BLESS_HEADER=1 cargo test -p aggbox-ffi --test header -- header_is_up_to_date
echo "include/aggbox.h regenerated"
