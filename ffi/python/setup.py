"""Builds libpccl with cargo and puts it inside the package (``pccl/libpccl.so``).

``pip install ./ffi/python`` (or ``pip wheel``) runs ``cargo build --release --lib`` on the
repository's Cargo.toml with the features in ``PCCL_FEATURES`` (default: what ``scripts/features.sh`` finds this machine can build, ``cuda,rocm`` always and ``mpi``, ``hwloc``, ``ofi`` where their libraries are; ``cuda`` and ``rocm`` are
device kernels through libcuda/libnvrtc, or HIP/hipRTC/RCCL on torch's ROCm build, all loaded
at run time, so it builds and runs without CUDA or ROCm installed). Cargo builds in ``PCCL_WHEEL_TARGET_DIR`` (default ``<repo>/target/wheel``), apart
from the development builds in ``target/release``. ``PCCL_SKIP_CARGO=1`` packages nothing
(a pure-Python install that finds libpccl through ``PCCL_LIBRARY`` or ``target/release``);
an editable install (``pip install -e``) never builds.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIB = "libpccl.dylib" if sys.platform == "darwin" else "libpccl.so"


def _cargo_build() -> Path:
    manifest = REPO / "Cargo.toml"
    if not manifest.is_file():
        raise RuntimeError(f"pccl: {manifest} not found: build from a checkout of the "
                           "repository (pip install ./ffi/python)")
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    target = Path(os.environ.get("PCCL_WHEEL_TARGET_DIR") or REPO / "target" / "wheel")
    features = os.environ.get("PCCL_FEATURES")
    if features is None:
        # Every feature this machine can build (cuda and rocm always; mpi, hwloc, ofi where
        # their libraries are found).
        probe = REPO / "scripts" / "features.sh"
        try:
            features = subprocess.run(["bash", str(probe), "-v"], check=True,
                                      capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            features = "cuda,rocm"
    features = features.strip()
    print(f"pccl: building with features: {features or '(none)'}", flush=True)
    cmd = [cargo, "build", "--release", "--lib", "--manifest-path", str(manifest)]
    if features:
        cmd += ["--features", features]
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    print("pccl: " + " ".join(cmd) + f"  (CARGO_TARGET_DIR={target})", flush=True)
    subprocess.run(cmd, check=True, env=env)
    built = target / "release" / LIB
    if not built.is_file():
        raise RuntimeError(f"pccl: cargo did not produce {built}")
    return built


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        if self.editable_mode or os.environ.get("PCCL_SKIP_CARGO") == "1":
            return
        dest = Path(self.build_lib) / "pccl"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_cargo_build(), dest / LIB)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: platform-specific, not pure Python."""

    def has_ext_modules(self):
        return os.environ.get("PCCL_SKIP_CARGO") != "1"


setup(cmdclass={"build_py": BuildPyWithLib}, distclass=BinaryDistribution)
