#!/usr/bin/env bash
# Builds libpccl in release mode and installs the C library, header and pkg-config file:
#   PREFIX/lib/libpccl.so, PREFIX/lib/libpccl.a, PREFIX/include/pccl.h,
#   PREFIX/lib/pkgconfig/pccl.pc
#
# usage: PREFIX=/opt/pccl scripts/install.sh [extra cargo build arguments, e.g. --features mpi]
# Without --features it builds every feature this machine can (scripts/features.sh: cuda and
# rocm always, mpi / hwloc / ofi where their libraries are found; PCCL_FEATURES overrides) and
# says which.
# Environment: PREFIX (default /usr/local), LIBDIR (default $PREFIX/lib), DESTDIR (staging
# root for packagers), CARGO (default cargo), CARGO_TARGET_DIR (honoured as by cargo).
# Then: cc app.c $(PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig pkg-config --cflags --libs pccl)
# (a static link of a library built with --features mpi also needs libmpi: link with mpicc).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${PREFIX:-/usr/local}
libdir=${LIBDIR:-$prefix/lib}
dest=${DESTDIR:-}
cargo=${CARGO:-cargo}

case "$prefix" in
  /*) ;;
  *) echo "install.sh: PREFIX must be an absolute path (got '$prefix')" >&2; exit 2 ;;
esac

cd "$here"
extra=()
case " $* " in
  *" --features"*|*" --all-features "*|*" -F "*) ;;
  *)
    features=${PCCL_FEATURES-$(scripts/features.sh -v)}
    echo "install.sh: building with features: ${features:-(none)}"
    [ -n "$features" ] && extra=(--features "$features")
    ;;
esac
"$cargo" build --release --lib "${extra[@]}" "$@"
target=${CARGO_TARGET_DIR:-$here/target}
case "$target" in /*) ;; *) target=$here/$target ;; esac
rel=$target/release
for f in libpccl.so libpccl.a; do
  [ -f "$rel/$f" ] || { echo "install.sh: $rel/$f was not built" >&2; exit 1; }
done

version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | head -n 1)

install -d "$dest$libdir/pkgconfig" "$dest$prefix/include"
install -m 0755 "$rel/libpccl.so" "$dest$libdir/libpccl.so"
install -m 0644 "$rel/libpccl.a" "$dest$libdir/libpccl.a"
install -m 0644 include/pccl.h "$dest$prefix/include/pccl.h"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@LIBDIR@|$libdir|g" -e "s|@VERSION@|$version|g" \
  pccl.pc.in > "$dest$libdir/pkgconfig/pccl.pc"
chmod 0644 "$dest$libdir/pkgconfig/pccl.pc"

echo "installed PCCL $version into $dest$prefix:"
echo "  $libdir/libpccl.so  $libdir/libpccl.a  $prefix/include/pccl.h  $libdir/pkgconfig/pccl.pc"
