#!/usr/bin/env bash
# Installs AggBox's C library the way a system library is installed: the
# header, the shared library (libaggbox.so.<major>.<minor>.<patch> with its
# SONAME link libaggbox.so.<major> and the link libaggbox.so), the static
# library and the pkg-config files aggbox.pc (shared) and aggbox-static.pc
# (static), under a prefix:
#
#   bash scripts/install.sh                  # builds (release), installs under /usr/local
#   PREFIX=/opt/aggbox bash scripts/install.sh
#   DESTDIR=/tmp/stage bash scripts/install.sh   # staged: files under /tmp/stage/usr/local,
#                                                # aggbox.pc still says /usr/local
#   bash scripts/install.sh uninstall        # removes what install put there (same PREFIX, DESTDIR)
#
# Variables: PREFIX (/usr/local), DESTDIR (empty), LIBDIR ($PREFIX/lib),
# INCLUDEDIR ($PREFIX/include), PROFILE (release: the cargo profile whose
# libraries are installed), NO_BUILD=1 (install what target/$PROFILE holds,
# without running cargo), LDCONFIG (ldconfig: run after a real install or
# uninstall as root; set it to true to skip), FROM (target/$PROFILE: the
# directory holding the built libraries, for tests). The major of the
# SONAME is AGGBOX_ABI_VERSION - 1 (ffi/build.rs); minor and patch are the
# package's.
set -euo pipefail
cd "$(dirname "$0")/.."

action=${1:-install}
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
LIBDIR=${LIBDIR:-$PREFIX/lib}
INCLUDEDIR=${INCLUDEDIR:-$PREFIX/include}
PROFILE=${PROFILE:-release}
LDCONFIG=${LDCONFIG:-ldconfig}

die() { echo "install: $*" >&2; exit 1; }
[[ $PREFIX == /* ]] || die "PREFIX must be an absolute path, not $PREFIX"
[[ $LIBDIR == /* && $INCLUDEDIR == /* ]] || die "LIBDIR and INCLUDEDIR must be absolute paths"
[[ -z $DESTDIR || $DESTDIR == /* ]] || die "DESTDIR must be empty or an absolute path, not $DESTDIR"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
abi=$(sed -n 's/^pub const AGGBOX_ABI_VERSION: u32 = \([0-9]*\);$/\1/p' ffi/src/lib.rs)
[[ $version =~ ^[0-9]+\.([0-9]+)\.([0-9]+)$ ]] || die "cannot read the version from Cargo.toml"
minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]}
[[ -n $abi ]] || die "cannot read AGGBOX_ABI_VERSION from ffi/src/lib.rs"
major=$((abi - 1))
soname=libaggbox.so.$major
real=libaggbox.so.$major.$minor.$patch

lib=$DESTDIR$LIBDIR
inc=$DESTDIR$INCLUDEDIR
pc=$lib/pkgconfig
files=("$inc/aggbox.h" "$lib/$real" "$lib/$soname" "$lib/libaggbox.so" "$lib/libaggbox.a"
       "$pc/aggbox.pc" "$pc/aggbox-static.pc")

refresh_cache() {
  if [[ -z $DESTDIR && $(id -u) == 0 ]] && command -v "$LDCONFIG" >/dev/null; then
    "$LDCONFIG" || true
  fi
}

case $action in
  uninstall)
    for f in "${files[@]}"; do
      if [[ -e $f || -L $f ]]; then rm -f "$f" && echo "removed $f"; fi
    done
    rmdir "$pc" 2>/dev/null || true
    refresh_cache
    exit 0 ;;
  install) ;;
  *) die "unknown action $action: expected install or uninstall" ;;
esac

if [[ ${NO_BUILD:-} != 1 ]]; then
  if [[ $PROFILE == release ]]; then
    cargo build --release -p aggbox-ffi
  else
    cargo build --profile "$PROFILE" -p aggbox-ffi
  fi
fi
built=${FROM:-target/$PROFILE}
for f in libaggbox.so libaggbox.a; do
  [[ -f $built/$f ]] || die "$built/$f is missing: build it first (cargo build --profile $PROFILE -p aggbox-ffi)"
done

install -d "$inc" "$lib" "$pc"
install -m 644 include/aggbox.h "$inc/aggbox.h"
install -m 755 "$built/libaggbox.so" "$lib/$real"
ln -sfn "$real" "$lib/$soname"
ln -sfn "$soname" "$lib/libaggbox.so"
install -m 644 "$built/libaggbox.a" "$lib/libaggbox.a"

# pkg-config paths relative to ${prefix} where they lie under it, so that
# PKG_CONFIG_SYSROOT_DIR or a relocated tree still works.
rel() { if [[ $1 == "$PREFIX" || $1 == "$PREFIX"/* ]]; then echo "\${prefix}${1#"$PREFIX"}"; else echo "$1"; fi; }
# What a Rust staticlib needs from the system (rustc --print native-static-libs).
native="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
header() {
  cat <<PC
prefix=$PREFIX
libdir=$(rel "$LIBDIR")
includedir=$(rel "$INCLUDEDIR")

PC
}
{
  header
  cat <<PC
Name: aggbox
Description: AggBox: in-kernel eBPF broadcast and aggregation collectives (C ABI $abi)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -laggbox
Libs.private: $native
PC
} >"$pc/aggbox.pc"
{
  header
  cat <<PC
Name: aggbox-static
Description: AggBox, linked statically (libaggbox.a and what it needs from the system)
Version: $version
Cflags: -I\${includedir}
Libs: \${libdir}/libaggbox.a $native
PC
} >"$pc/aggbox-static.pc"
chmod 644 "$pc/aggbox.pc" "$pc/aggbox-static.pc"

refresh_cache
for f in "${files[@]}"; do echo "installed $f"; done
