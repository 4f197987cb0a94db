#!/usr/bin/env bash
# Installs what PCCL's build, tests and benchmarks need on a Debian machine with Rust:
# MPICH (headers + mpiexec), libclang (rsmpi's bindgen), hwloc and udev headers, iproute2
# (ip, tc) and util-linux (unshare) for the emulated cluster (scripts/cluster.sh, tests/cluster.rs),
# g++ for the C++ example and the CPU emulator of the GPU kernels (tests/cuda_emu.rs).
set -euo pipefail
pkgs=(g++ mpich libmpich-dev libclang-dev libhwloc-dev libudev-dev pkg-config valgrind fonts-dejavu-core libfabric-dev libfabric-bin shellcheck iproute2 util-linux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true
