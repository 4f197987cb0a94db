"""The quantized collectives of the torch API (ZeRO++'s qwZ and qgZ): ``all_gather_quantized``
and ``reduce_scatter_quantized`` on CPU or GPU tensors, ``set_quantization`` (FSDP's
all-gathers and reduce-scatters routed to them) and ``wire_bytes``. Re-exported by
``pccl.torch``; the backend (``pccl.torch.PcclBackend``) keeps the per-group settings and
byte counts these read and write."""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist

from . import _lib, _streams
from ._tensors import _FLOATS, _dtype, _ptr


def _pccl_backend_of(pg):
    """The pccl backend of process group ``pg`` (None for another backend's); imported late:
    pccl.torch imports this module."""
    from .torch import _pccl_backend_of as of
    return of(pg)


def _quantized_args(call, output, input, group):
    """The communicator, contiguous buffers and stream of a quantized call, after the checks:
    CPU tensors (stream None), or tensors of one GPU (the communicator told its runtime, the
    stream torch's current one there)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    be = _pccl_backend_of(pg)
    if be is None:
        raise RuntimeError(f"pccl: {call} needs a process group of the pccl backend")
    comm = be._live()
    if be._p2p_pending:
        raise RuntimeError(f"pccl: {call}: finish the batch of point-to-point operations "
                           "first")
    if input.dtype not in _FLOATS or output.dtype != input.dtype:
        raise TypeError(f"pccl: {call}: input and output must share one of float32, float16, "
                        f"bfloat16, float64 (got {input.dtype}, {output.dtype})")
    if output.device != input.device:
        raise ValueError(f"pccl: {call}: input on {input.device}, output on {output.device}: "
                         "both must be on one device")
    stream = None
    if _streams.is_device(input.device):
        comm = be._device_comm(input.device)
        with _streams.device_context(input.device):
            stream = _streams.STREAMS.handle(_streams.STREAMS.current(input.device))
    inp = input.contiguous()
    out = output if output.is_contiguous() else torch.empty_like(
        output, memory_format=torch.contiguous_format)
    return be, comm, inp, out, stream


def _on_device_of(t):
    """torch's current device set to ``t``'s for a call on device memory (else nothing)."""
    if _streams.is_device(t.device):
        return _streams.device_context(t.device)
    return contextlib.nullcontext()


# A flag no version of the library knows: the call then fails this rank's part of the
# agreement, so every rank's call fails too (naming this rank) instead of waiting for it.
_REFUSE_FLAG = 1 << 31


def _refuse(method, args, err):
    """Takes this rank's part in the call's agreement as a refusal (no buffer is touched:
    host path, NULL pointers), then raises ``err`` here; the other ranks' calls fail naming
    this rank."""
    n, dtype, bits, block, flags = args
    try:
        method(None, None, n, dtype, bits, block, flags | _REFUSE_FLAG)
    except _lib.PcclError:
        pass
    raise err


def _run(method, tensors, args):
    """Calls the communicator's ``method(send, recv, *args)`` on the contiguous ``inp`` and
    ``out`` (on their GPU, if any), then copies ``out`` into the caller's ``output`` where
    they differ; returns ``output``."""
    inp, out, output = tensors
    with _on_device_of(inp):
        method(_ptr(inp), _ptr(out), *args)
    if out is not output:
        output.copy_(out)
    return output


def _issue(be, comm, method, tensors, stream, call, args):
    """``method(send, recv, *args, stream)``: on CPU tensors (``stream`` None) as
    :func:`_run`; on a GPU queued as the backend's collectives are (torch's stream semantics,
    ``_streams.issue``): on PCCL's stream after the current one, which then waits for it, the
    tensors kept alive for PCCL's stream (the library may read and write them after this
    returns)."""
    inp, out, output = tensors
    if stream is None:
        return _run(method, tensors, args + (None,))
    dev = inp.device

    def launch(h):
        with _streams.device_context(dev):
            method(_ptr(inp), _ptr(out), *args, h)

    req = _streams.issue(comm, be._dev_streams, dev, call, launch,
                         f"pccl:{call} ({out.numel()} elements)")
    _streams.keep_alive([req], [inp, out])
    _streams.wait_last([req])
    if out is not output:
        output.copy_(out)
    return output


def all_gather_quantized(output, input, bits=8, block=2048, allow_nonfinite=False, group=None):
    """All-gathers ``input`` of every rank into ``output`` (``input.numel() x world`` elements,
    rank ``r``'s at block ``r``) with the data block-quantized on the wire (ZeRO++'s qwZ):
    ``bits`` 8 or 4, one float32 scale per ``block`` elements (a power of two, 32...8192).
    Every element arrives within half its block's step (``max|x| / 127``, or ``/ 7`` for 4
    bits), zeros exactly. float32, float16, bfloat16 or float64 tensors of one dtype, on the
    CPU or one GPU (there encoded and decoded by PCCL's kernels, ordered after the work on the
    current stream). NaN or infinity in any rank's input raises on every rank before any data
    moves, unless ``allow_nonfinite`` (those blocks then arrive as NaN). Every rank must pass
    the same ``bits``, ``block`` and sizes; one that does not makes the call raise on every
    rank, naming it. On the CPU it returns when ``output`` holds the result. On a GPU it is
    ordered on the current stream as torch's collectives are: queued (it returns at once; the
    current stream waits for the result; a refusal found while it runs is the group's
    asynchronous error, raised by its next call) where the communicator queues its device
    calls, else blocking. ``group``: a process group of the pccl backend (default: the
    default group)."""
    call = "all_gather_quantized"
    be, comm, inp, out, stream = _quantized_args(call, output, input, group)
    n = input.numel()
    flags = _lib.PCCL_QUANT_ALLOW_NONFINITE if allow_nonfinite else 0
    if output.numel() != n * be.size():
        _refuse(comm.allgather_quantized, (n, _dtype(inp, call), int(bits), int(block), flags),
                ValueError(f"pccl: {call}: output has {output.numel()} elements, expected "
                           f"{n} x {be.size()}"))
    return _issue(be, comm, comm.allgather_quantized, (inp, out, output), stream, call,
                  (n, _dtype(inp, call), int(bits), int(block), flags))


def reduce_scatter_quantized(output, input, bits=8, block=2048, average=False,
                             allow_nonfinite=False, group=None, scheme="two-hop"):
    """Reduce-scatter (sum, or mean with ``average``) of ``input`` (``output.numel() x world``
    elements, block ``r`` for rank ``r``) into ``output`` with the data block-quantized on the
    wire: ``scheme="two-hop"`` (ZeRO++'s qgZ: an all-to-all of quantized pieces inside the
    node, summed in float32 and requantized, then between nodes), ``"per-level"`` (one such
    all-to-all per level of the topology: inside the group — a GPU pair, a NUMA node,
    ``PCCL_GROUP_SIZE`` — among the node's groups, between nodes; without groups the same as
    two-hop) or ``"halving"`` (recursive halving inside the node and between nodes, every
    partial sum quantized: log2 steps per level). Every element is within half a step of every quantized piece it passed through
    (docs/QUANTIZED.md). Dtypes, refusals and ``group`` as ``all_gather_quantized``; every
    rank must pass the same scheme. On a GPU ordered on the current stream as
    ``all_gather_quantized``, every scheme."""
    call = "reduce_scatter_quantized"
    schemes = {"two-hop": 0, "halving": _lib.PCCL_QUANT_HALVING,
               "per-level": _lib.PCCL_QUANT_PER_LEVEL}
    if scheme not in schemes:
        raise ValueError(f"pccl: {call}: scheme must be 'two-hop', 'per-level' or 'halving', "
                         f"not {scheme!r}")
    be, comm, inp, out, stream = _quantized_args(call, output, input, group)
    n = output.numel()
    flags = (_lib.PCCL_QUANT_ALLOW_NONFINITE if allow_nonfinite else 0) | (
        _lib.PCCL_QUANT_AVERAGE if average else 0) | schemes[scheme]
    if input.numel() != n * be.size():
        _refuse(comm.reduce_scatter_quantized,
                (n, _dtype(inp, call), int(bits), int(block), flags),
                ValueError(f"pccl: {call}: input has {input.numel()} elements, expected "
                           f"{n} x {be.size()}"))
    return _issue(be, comm, comm.reduce_scatter_quantized, (inp, out, output), stream, call,
                  (n, _dtype(inp, call), int(bits), int(block), flags))


_QUANT_BITS = {None: None, "none": None, "int8": 8, "int4": 4, 8: 8, 4: 4}
# Every live pccl backend of this process (wire_bytes(all_groups=True)), and the quantization
# a new one starts with (set_quantization(group="all")).
_BACKENDS = weakref.WeakSet()
_QUANT_DEFAULT = {"allgather": None, "reducescatter": None, "block": 2048}


def set_quantization(all_gather=None, reduce_scatter=None, block=2048, group=None):
    """Routes the group's ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (SUM, AVG)
    on float tensors (CPU, or GPU: there ordered on the current stream) to the quantized forms: ``"int8"``, ``"int4"`` or None (off) for
    each, one float32 scale per ``block`` elements. What FSDP / ZeRO-3 call then moves block-
    quantized weights (ZeRO++'s qwZ) and gradients (qgZ); the other collectives and dtypes are
    untouched. Every rank must set the same (a rank that differs fails those calls on every
    rank). ``group="all"``: every pccl group of this process, those made later too (FSDP's
    hpZ groups are made at the first forward). ``wire_bytes(group)`` reports what the calls
    moved."""
    if group == "all":
        bes = list(_BACKENDS)
    else:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        be = _pccl_backend_of(pg)
        if be is None:
            raise RuntimeError("pccl: set_quantization needs a process group of the pccl "
                               "backend")
        bes = [be]
    try:
        ag, rs = _QUANT_BITS[all_gather], _QUANT_BITS[reduce_scatter]
    except (KeyError, TypeError):
        raise ValueError(f"pccl: set_quantization: expected 'int8', 'int4' or None, got "
                         f"{all_gather!r}, {reduce_scatter!r}") from None
    q = {"allgather": ag, "reducescatter": rs, "block": int(block)}
    if group == "all":
        _QUANT_DEFAULT.update(q)
    for be in bes:
        be._quant = dict(q)


def wire_bytes(group=None, reset=False, all_groups=False):
    """The all-gathers' and reduce-scatters' bytes on this rank's group so far: ``logical``
    (the data: all-gather output, reduce-scatter input), ``wire`` (what the calls moved:
    codes and scales where quantized), of it ``intra_wire`` (groups inside one node, by
    PCCL_RANKS_PER_NODE or LOCAL_WORLD_SIZE) and ``inter_wire``, ``calls``,
    ``quantized_calls``. ``all_groups``: summed over every pccl group of this process (FSDP's
    hpZ all-gathers run on groups of its own). ``reset`` zeroes what it read."""
    if all_groups:
        bes = list(_BACKENDS)
    else:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        be = _pccl_backend_of(pg)
        if be is None:
            raise RuntimeError("pccl: wire_bytes needs a process group of the pccl backend")
        bes = [be]
    out = {}
    for be in bes:
        for k, v in be._bytes.items():
            out[k] = out.get(k, 0) + v
        if reset:
            be._bytes = {k: 0 for k in be._bytes}
    return out
