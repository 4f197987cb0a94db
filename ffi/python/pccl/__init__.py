"""Python bindings for PCCL (ctypes over the C ABI of ``libpccl.so``).

``import pccl.torch`` registers the ``torch.distributed`` backend ``"pccl"``.
The low-level API lives in :mod:`pccl._lib` (``lib()``, ``PcclError``, dtype/op codes).
"""

from ._lib import PcclError, features, lib, library_path, version  # noqa: F401

__all__ = ["PcclError", "features", "lib", "library_path", "version"]
