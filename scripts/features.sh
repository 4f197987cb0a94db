#!/usr/bin/env bash
# Prints the cargo features this machine can build PCCL with, comma-separated: cuda and rocm
# always (their runtimes load when a program runs, not at build time); mpi where an MPI
# library and libclang are found (rsmpi generates its bindings), hwloc where hwloc 2 is,
# ofi where libfabric is. `scripts/install.sh` and `pip install ./ffi/python` build these
# unless told otherwise (PCCL_FEATURES, or --features for install.sh). -v: say why on stderr.
set -euo pipefail
verbose=0
[ "${1:-}" = -v ] && verbose=1
say() { [ "$verbose" = 1 ] && echo "features.sh: $*" >&2 || true; }
have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$@" 2>/dev/null; }
have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] && return 0
    ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' && return 0
    compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null
}
f=(cuda rocm)
if { command -v mpicc >/dev/null || have_pc mpich || have_pc ompi; } && have_libclang; then
    f+=(mpi)
else
    say "no mpi: needs an MPI library (mpicc or pkg-config mpich/ompi) and libclang"
fi
if have_pc 'hwloc >= 2.0'; then f+=(hwloc); else say "no hwloc: needs hwloc >= 2 (pkg-config hwloc)"; fi
if have_pc libfabric; then f+=(ofi); else say "no ofi: needs libfabric (pkg-config libfabric)"; fi
(IFS=,; echo "${f[*]}")
