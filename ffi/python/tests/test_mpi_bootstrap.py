"""PCCL_TORCH_BOOTSTRAP=mpi under mpiexec: the default group over pcclCommInitMPIWorld."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

import pccl

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_mpi_world_bootstrap():
    from pccl import _lib

    if not _lib.has_mpi():
        pytest.skip("libpccl built without --features mpi")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PCCL_TORCH_BOOTSTRAP="mpi", PCCL_DEBUG="INFO",
               PCCL_LIBRARY=pccl.library_path())
    p = subprocess.run(["mpiexec", "-n", "3", sys.executable, os.path.join(HERE, "_mpi_worker.py"),
                        f"tcp://127.0.0.1:{port}"], env=env, capture_output=True, text=True,
                       timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count(" ok") == 3, out[-4000:]
    assert "over mpi" in out, out[-4000:]  # PCCL_DEBUG=INFO names the transport
