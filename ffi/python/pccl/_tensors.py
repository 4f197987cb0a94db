"""torch tensors as the C ABI takes them: dtype codes, the device of a call's tensors, and
their addresses."""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import ReduceOp

from . import _lib

_DTYPES = {
    torch.int8: _lib.pcclInt8,
    torch.uint8: _lib.pcclUint8,
    torch.int32: _lib.pcclInt32,
    torch.int64: _lib.pcclInt64,
    torch.float16: _lib.pcclFloat16,
    torch.bfloat16: _lib.pcclBfloat16,
    torch.float32: _lib.pcclFloat32,
    torch.float64: _lib.pcclFloat64,
    torch.bool: _lib.pcclUint8,  # as NCCL: bytes; SUM/MAX -> MAX (or), PRODUCT/MIN -> MIN (and)
}
for _name, _code in (("uint32", _lib.pcclUint32), ("uint64", _lib.pcclUint64)):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The fast path of synchronous calls on contiguous CPU tensors (see PcclBackend._fast): the
# dtypes and reduce ops that need no translation beyond a table look-up (not bool, whose ops
# are remapped; not AVG, which needs a floating dtype; not PREMUL_SUM, which needs a factor).
_FAST_DTYPES = {k: v for k, v in _DTYPES.items() if k is not torch.bool}
_FAST_OPS = {ReduceOp.SUM: _lib.pcclSum,  # keyed by RedOpType (ReduceOp.op)
             ReduceOp.PRODUCT: _lib.pcclProd,
             ReduceOp.MAX: _lib.pcclMax, ReduceOp.MIN: _lib.pcclMin}
_STRIDED = torch.strided


def _dtype(t: torch.Tensor, call: str) -> int:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError(f"pccl: {call} does not support dtype {t.dtype}") from None


def _device_of(tensors, call: str) -> torch.device:
    """The one device of all ``tensors`` (CPU or CUDA); raises on a mix or another kind."""
    devices = {t.device for t in tensors}
    for t in tensors:
        if t.is_sparse:
            raise RuntimeError(f"pccl: {call} does not support sparse tensors")
    if len(devices) > 1:
        raise RuntimeError(f"pccl: {call} got tensors on several devices: "
                           f"{sorted(str(d) for d in devices)}")
    dev = devices.pop() if devices else torch.device("cpu")
    if dev.type not in ("cpu", "cuda"):
        raise RuntimeError(f"pccl: {call} got a tensor on {dev}; the pccl backend takes CPU "
                           "and CUDA tensors")
    return dev


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()
