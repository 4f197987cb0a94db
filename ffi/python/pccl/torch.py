"""The ``torch.distributed`` backend ``"pccl"`` (pure Python over the PCCL C ABI).

``import pccl.torch`` registers it; then::

    dist.init_process_group("pccl")            # or "cpu:pccl" / "cpu:pccl,cuda:nccl"
    dist.all_gather_into_tensor(out, inp)
    g = dist.new_group([0, 1], backend="pccl")

Bootstrap: rank 0 of every process group calls ``pcclGetUniqueId`` and publishes the 128
bytes in the group's c10d store under a key unique to the group; every rank reads it and calls
``pcclCommInitRank`` (TCP between hosts, shared memory inside one). With
``PCCL_TORCH_BOOTSTRAP=mpi`` (experimental) the default group of a job started by ``mpiexec``
uses ``pcclCommInitMPIWorld`` instead.

CPU tensors: every collective is issued as a PCCL non-blocking request (requests run in issue
order on the communicator's worker thread); a synchronous call waits for it before returning,
``async_op=True`` returns a :class:`PcclWork`.

CUDA tensors (a libpccl built with ``--features cuda``): the collective runs on device memory
with torch's nccl stream semantics (see ``_streams.py``): on PCCL's own stream per device,
after the current stream's work; a synchronous call makes the current stream wait for it (on
the device), ``async_op=True`` leaves the current stream free until ``work.wait()`` makes the
then current stream wait; ``work.synchronize()`` waits on the host. Nothing blocks the host.
A collective that failed holds its stream and raises at ``wait()`` / ``is_completed()`` /
``synchronize()`` (and every later call). All tensors of one call must be on one device. Each
device collective shows in the torch profiler as ``pccl:<name>``. On torch's ROCm build (``torch.version.hip`` set;
HIP tensors are called "cuda") the stream is a HIP stream, and the backend says so to the
library (``pcclCommSetDeviceRuntime``; needs a libpccl built with ``--features rocm``).
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10DBackend
from torch._C._distributed_c10d import ReduceOp

from . import _lib, _streams
from ._p2p import P2PMixin
from ._rooted import RootedMixin
from ._streams import DeviceRequest
from ._tensors import _FAST_DTYPES, _FAST_OPS, _FLOATS, _STRIDED, _device_of, _dtype, _ptr
# The quantized collectives live in _quantized; re-exported here, where users find them.
from ._quantized import (  # noqa: F401
    _BACKENDS,
    _QUANT_DEFAULT,
    all_gather_quantized,
    reduce_scatter_quantized,
    set_quantization,
    wire_bytes,
)
from ._work import (PcclTimeoutError, PcclWork, _done_work, _seconds,  # noqa: F401
                    drain, inflight, reap)
from ._shrink import shrink_group, shrink_to_survivors  # noqa: F401

__all__ = ["PcclBackend", "PcclWork", "PcclTimeoutError", "BACKEND_NAME", "register",
           "inflight", "reap", "drain", "shrink_group", "shrink_to_survivors"]

BACKEND_NAME = "pccl"

def _sync(opts) -> bool:
    """Whether a call is synchronous (torch's async_op=False) and not a coalesced piece."""
    return not getattr(opts, "asyncOp", True) and getattr(opts, "collect", None) is None


class _Done:
    """The request of a call that already ran (blocking, on host memory)."""

    @staticmethod
    def wait():
        return None

    @staticmethod
    def test():
        return True


_DONE = _Done()


# Groups created with the same (group id, ranks) get distinct keys: every member of a group
# creates the same sequence of such groups, so a count per (group id, ranks) agrees across them
# (a single per-process count would not: ranks outside a group do not create it).
# What rank 0 publishes in place of a group's unique id when it could not create one (a
# unique id is 128 bytes of binary and never starts with this).
_BOOTSTRAP_FAILED = b"pccl-bootstrap-failed:"
_group_counts: dict = {}
_group_counts_lock = threading.Lock()


def _base_class():
    """The c10d class a Python backend derives from: ``Backend`` where torch lets Python
    construct one (recent torch), else a Python ``ProcessGroup`` (torch 2.11 and older,
    whose ``Backend`` binding has no constructor; c10d then uses the object as the group)."""
    try:
        class _Probe(C10DBackend):
            pass

        _Probe(0, 1)
        return C10DBackend
    except TypeError:
        return dist.ProcessGroup


_BASE = _base_class()


class PcclBackend(P2PMixin, RootedMixin, _BASE):
    """c10d Backend over a PCCL communicator (CPU and CUDA tensors)."""

    def __init__(self, store, rank, size, timeout, group_id="", options=None, comm=None):
        super().__init__(rank, size)
        self._options = options if options is not None else C10DBackend.Options(
            BACKEND_NAME, timeout=timeout)
        self._group_id = group_id
        self._group_name = str(group_id)
        self._group_desc = "undefined"
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._timeout_s = _seconds(timeout)
        self._timeout_set = False  # set_timeout called: wait() gets the group's deadline
        self._p2p_pending = []  # queued sends/receives (see _flush_p2p)
        self._p2p_lock = threading.Lock()
        self._p2p_flush_lock = threading.RLock()
        # Sends and receives are posted without blocking (pcclGroupEndAsync), a send or
        # receive outside a batch at once: separate non-blocking requests progress together
        # in the library, so a ring of separate isend/irecv completes in any order. torch >=
        # 2.12 coalesces batch_isend_irecv (start/end_coalescing): a batch is posted at its
        # end; torch <= 2.11 (no coalescing for Python groups) posts each call of the batch
        # at once. An older libpccl (no pcclGroupEndAsync): queued until a Work is waited for
        # or another call is made, then posted as one blocking group.
        self._async_p2p = _lib.has("pcclGroupEndAsync")
        self._coalescing = False
        self._splits = {}  # (group name, ranks) -> child backend or None (see split)
        self._dev_streams = _streams.DeviceStreams()  # PCCL's stream per device
        self._split_count = 0
        ranks = tuple(getattr(self._options, "global_ranks_in_group", None) or ())
        self._global_ranks = list(ranks) if ranks else list(range(size))
        if comm is None:
            comm = self._bootstrap(store, rank, size, group_id, ranks,
                                   self._comm_timeout_s(self._timeout_s))
        self._comm = comm
        # The C entry points of the fast path (see _fast_handle), looked up once.
        lib = _lib.lib()
        self._c_allreduce = lib.pcclAllReduce
        self._c_allgather = lib.pcclAllGather
        self._c_reduce_scatter = lib.pcclReduceScatter
        self._c_alltoall = getattr(lib, "pcclAllToAll", None)
        # Quantized all-gather / reduce-scatter (set_quantization): bits per call kind, and
        # the bytes the calls meant to move and moved (wire_bytes).
        self._quant = dict(_QUANT_DEFAULT)
        self._bytes = {"logical": 0, "wire": 0, "intra_wire": 0, "inter_wire": 0, "calls": 0,
                       "quantized_calls": 0}
        # Whether every rank of this group is on one node (PCCL_RANKS_PER_NODE, else
        # torchrun's LOCAL_WORLD_SIZE): its bytes count as intra-node in wire_bytes.
        per_node = os.environ.get("PCCL_RANKS_PER_NODE") or os.environ.get("LOCAL_WORLD_SIZE")
        m = int(per_node) if per_node and per_node.isdigit() and int(per_node) > 0 else None
        self._intra_node = m is not None and len({r // m for r in self._global_ranks}) == 1
        _BACKENDS.add(self)
        if comm.size != size or comm.rank != rank:
            raise RuntimeError(
                f"pccl: communicator is rank {comm.rank} of {comm.size}, the group expects "
                f"rank {rank} of {size}")

    @staticmethod
    def _comm_timeout_s(timeout_s):
        """The PCCL_TIMEOUT a new communicator gets: the group's timeout, except that
        torch's default timeout leaves a PCCL_TIMEOUT set in the environment in force."""
        if timeout_s is None:
            return None
        default = _seconds(getattr(dist, "default_pg_timeout", None)
                           or getattr(dist.distributed_c10d, "default_pg_timeout", None))
        if os.environ.get("PCCL_TIMEOUT", "").strip() and default is not None \
                and abs(timeout_s - default) < 1e-6:
            return None
        return timeout_s

    @staticmethod
    def _bootstrap(store, rank, size, group_id, ranks=(), timeout_s=None):
        mode = os.environ.get("PCCL_TORCH_BOOTSTRAP", "tcp").lower()
        if (mode == "mpi" and str(group_id) in ("0", "default_pg", "")
                and "PMI_RANK" in os.environ and _lib.has_mpi()):
            return _lib.Communicator.init_mpi_world(timeout_s)
        with _group_counts_lock:
            n = _group_counts.get((group_id, ranks), 0)
            _group_counts[(group_id, ranks)] = n + 1
        key = f"pccl/unique_id/{group_id}/{n}"
        if rank == 0:
            try:
                uid = _lib.get_unique_id(timeout_s)
            except _lib.PcclError as e:
                # Every other rank waits for this key: give them rank 0's error instead of
                # leaving them to wait out the store's timeout (30 minutes by default).
                store.set(key, _BOOTSTRAP_FAILED + f"{e.code}:{e.detail}".encode())
                raise
            store.set(key, uid)
        else:
            store.wait([key])
            uid = bytes(store.get(key))
            if uid.startswith(_BOOTSTRAP_FAILED):
                why = uid[len(_BOOTSTRAP_FAILED):].decode(errors="replace")
                code, _, msg = why.partition(":")
                raise _lib.PcclError(
                    "pcclGetUniqueId", int(code) if code.isdigit() else -1,
                    f"rank 0 of the group could not create its unique id, so rank {rank} "
                    f"cannot join: {msg}")
        return _lib.Communicator.init_rank(size, uid, rank, timeout_s)

    # ---- timeouts, sequence numbers, names, abort ---------------------------------------

    def _wait_timeout_s(self):
        """The deadline of a plain ``wait()``: the group's timeout when ``set_timeout``
        changed it after the communicator was made (whose own timeout bounds every wait on
        a peer otherwise), else None (block until the communicator ends the operation)."""
        comm = self._comm
        t = self._timeout_s
        if t is None or not self._timeout_set or (
                comm is not None and comm.timeout_s is not None
                and abs(comm.timeout_s - t) < 1e-6):
            return None
        return t

    def set_timeout(self, timeout):
        """The group's timeout: every later operation on the communicator (and the queued
        ones not started yet) fails after it without its peers (``pcclCommSetTimeout``);
        with an older libpccl only ``wait()`` honours it."""
        secs = _seconds(timeout)
        self._timeout_s = secs
        self._timeout_set = True
        comm = self._comm
        if secs is not None and comm is not None and _lib.has("pcclCommSetTimeout"):
            comm.set_timeout(secs)
        try:
            self._options._timeout = timeout
        except Exception:  # noqa: BLE001
            pass

    def _next_seq(self):
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def _get_sequence_number_for_group(self):
        return self._seq

    def _set_sequence_number_for_group(self):
        pass  # numbers start at 0 on every member of the group and count the same calls

    # torch <= 2.11 (Python ProcessGroup): c10d keeps the group's name on its backends, and
    # a Python group has none; these overrides (called by c10d's trampoline under their C++
    # names) hold it on the group itself, for DeviceMesh, FSDP2 and functional collectives.
    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = str(name)

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = str(desc)

    @property
    def options(self):
        return self._options

    # ---- splitting (torch >= 2.12: dist.split_group, and new_group from an eager default
    # group) through pcclCommSplit: the new communicator runs over the parent's links, no
    # new bootstrap. Collective over the parent: every member of it must take part.

    @property
    def supports_splitting(self):
        return _lib.has("pcclCommSplit")

    def comm_split_count(self):
        """How many splits this group took part in (torch names split groups by it)."""
        return self._split_count

    def _split_comm(self, ranks):
        """``pcclCommSplit`` of the parent: ``ranks`` (parent-group ranks, in the new group's
        order) form the new communicator; a rank not in it (or ``ranks`` None) joins none.
        Disjoint groups have distinct smallest ranks: that is the color."""
        self._flush_p2p()
        me = self.rank()
        self._split_count += 1
        if ranks is None or me not in ranks:
            self._live().split(-1, 0)
            return None
        return self._live().split(min(ranks), ranks.index(me))

    def perform_nocolor_split(self, device=None):
        """A rank outside a new group takes part in the parent's split (torch's new_group
        calls this on non-members when it splits)."""
        self._split_comm(None)

    def _child(self, comm, store, ranks, timeout, group_name, options=None):
        """The backend of a split-off group over ``comm``."""
        opts = options if options is not None else C10DBackend.Options(BACKEND_NAME,
                                                                      timeout=timeout)
        try:
            opts.global_ranks_in_group = [self._global_ranks[r] for r in ranks]
            opts.group_name = group_name
        except Exception:  # noqa: BLE001
            pass
        secs = self._comm_timeout_s(_seconds(timeout))
        if secs is not None and _lib.has("pcclCommSetTimeout"):
            comm.set_timeout(secs)
        return PcclBackend(store, ranks.index(self.rank()), len(ranks), timeout,
                           group_id=group_name, options=opts, comm=comm)

    def split(self, store, ranks, opts):
        """``ProcessGroup.split_group`` (``dist.split_group``): a new backend of ``ranks``
        (ranks of this group, in order) over ``pcclCommSplit``; None on a rank outside."""
        ranks = [int(r) for r in ranks]
        name = str(getattr(opts, "group_name", "") or "")
        key = (name, tuple(ranks))
        if key in self._splits:  # c10d asks once per device type of the group (cpu, cuda)
            return self._splits[key]
        comm = self._split_comm(ranks)
        if comm is None:
            # torch's C++ side dereferences a None split (a crash), so a rank outside every
            # split is answered by the split_group wrapper below and never comes here; one
            # that does (ProcessGroup.split_group called directly) gets an error instead.
            raise RuntimeError(
                f"pccl: rank {self.rank()} is in none of the groups split from "
                f"{self._group_name!r}; use dist.split_group, which returns "
                "GroupMember.NON_GROUP_MEMBER here (it took part in the split)")
        child = None
        if comm is not None:
            timeout = getattr(opts, "_timeout", None) or self._options._timeout
            child = self._child(comm, store, ranks, timeout, name)
        self._splits[key] = child
        return child

    # ---- shrinking: torch's dist.shrink_group calls these where it can use a Python
    # backend; pccl.torch.shrink_group / shrink_to_survivors (_shrink.py) on any torch.

    @property
    def supports_shrinking(self):
        return _lib.has("pcclCommShrink")

    def shrink(self, ranks_to_exclude, shrink_flags=0, opts=None):
        """A backend of this group's ranks not in ``ranks_to_exclude`` over
        ``pcclCommShrink`` (the excluded ranks take no part)."""
        excluded = sorted({int(r) for r in ranks_to_exclude})
        if shrink_flags:  # SHRINK_ABORT: end what is in flight on the old communicator
            self._flush_p2p()
        ready, self._shrunk_ready = getattr(self, "_shrunk_ready", None), None
        if ready is not None and list(ready[0]) == excluded:
            comm = ready[1]  # made by the survivors' agreement (pccl.torch.shrink_to_survivors)
        else:
            if ready is not None:
                ready[1].destroy()
            comm = self._live().shrink(excluded)
        keep = [r for r in range(self.size()) if r not in excluded]
        timeout = getattr(opts, "_timeout", None) or self._options._timeout
        name = str(getattr(opts, "group_name", "") or f"{self._group_name}:shrunk")
        return self._child(comm, None, keep, timeout, name, opts)

    @property
    def supports_coalescing(self):
        return self._async_p2p and _BASE is C10DBackend

    def start_coalescing(self):
        """torch's coalescing manager (batch_isend_irecv): sends and receives are queued
        until ``end_coalescing``."""
        self._flush_p2p()
        self._coalescing = True

    def end_coalescing(self):
        """Posts the batch's sends and receives as one non-blocking group; its Work."""
        self._coalescing = False
        op = self._flush_p2p()
        if op is None:
            return _done_work(backend=self)
        return PcclWork(backend=self, op=op)

    def getBackendName(self):
        return BACKEND_NAME

    # ---- helpers -------------------------------------------------------------------------

    def _op(self, reduce_op, dtype, call):
        """Returns (pccl op code, premul factor or None)."""
        op = reduce_op.op if hasattr(reduce_op, "op") else reduce_op
        if dtype == torch.bool:
            if op in (ReduceOp.SUM, ReduceOp.MAX):
                return _lib.pcclMax, None
            if op in (ReduceOp.PRODUCT, ReduceOp.MIN):
                return _lib.pcclMin, None
            raise ValueError(f"pccl: {call} does not support {op} on torch.bool")
        if op == ReduceOp.SUM:
            return _lib.pcclSum, None
        if op == ReduceOp.PRODUCT:
            return _lib.pcclProd, None
        if op == ReduceOp.MAX:
            return _lib.pcclMax, None
        if op == ReduceOp.MIN:
            return _lib.pcclMin, None
        if op == ReduceOp.AVG:
            if dtype not in _FLOATS:
                raise ValueError(f"pccl: {call} with ReduceOp.AVG needs a floating dtype, "
                                 f"got {dtype}")
            return _lib.pcclAvg, None
        if op == ReduceOp.PREMUL_SUM:
            factor = getattr(reduce_op, "factor", None)
            if factor is None:
                raise ValueError(f"pccl: {call}: PREMUL_SUM without a factor (torch <= 2.11 "
                                 "does not show a ReduceOp's factor to Python backends)")
            return _lib.pcclSum, factor
        raise ValueError(f"pccl: {call} does not support reduce op {op}")

    @staticmethod
    def _premul(t: torch.Tensor, factor) -> torch.Tensor:
        if isinstance(factor, torch.Tensor):
            factor = factor.to(device=t.device, dtype=t.dtype)
        return t * factor

    def _start(self, name, dev, *args, sync=False, elements=None):
        """Issues collective ``name``: a PCCL request on host memory, or a device collective
        on PCCL's stream of CUDA device ``dev`` after the current stream's work (its
        :class:`DeviceRequest`). ``sync`` (a synchronous call on host memory) runs it
        blocking on this thread instead: no hand-off to the worker thread and back (the
        library first waits for this rank's earlier requests, so the order is the same)."""
        self._flush_p2p()  # queued sends/receives go first
        comm = self._live()
        if not _streams.is_device(dev):
            if sync:
                getattr(comm, name)(*args, None)  # stream NULL: host memory, blocking
                return _DONE
            return getattr(comm, "i" + name)(*args)
        comm = self._device_comm(dev)

        def launch(stream):
            with _streams.device_context(dev):
                getattr(comm, name)(*args, stream)

        n = args[2] if elements is None else elements
        return _streams.issue(comm, self._dev_streams, dev, name, launch,
                              f"pccl:{name} ({n} elements)")

    def _device_comm(self, dev):
        """The communicator, told (once) which runtime the streams of device calls belong
        to: the C ABI then reads a stream as a HIP or CUDA stream (a ROCm machine has no
        libcuda to ask)."""
        comm = self._live()
        runtime = _streams.device_runtime()
        if getattr(comm, "device_runtime", None) != runtime:
            comm.set_device_runtime(runtime)
            comm.device_runtime = runtime
        return comm

    def _fast_handle(self, opts, *tensors):
        """The communicator's C handle when a call may take the fast path: synchronous,
        nothing queued before it, every tensor a contiguous (strided) CPU tensor. Else None:
        the general path handles every other case (and reports every misuse). The fast path
        makes the same C call the general one makes for a synchronous call on host memory,
        with none of its Python-side bookkeeping (about 10 attribute look-ups and calls
        instead of about 60)."""
        comm = self._comm
        if comm is None or self._p2p_pending or getattr(opts, "asyncOp", True):
            return None
        for t in tensors:
            # `_streams.is_device` too: the one seam that says where a tensor lives (tests replace it).
            if not (t.is_cpu and t.layout is _STRIDED and t.is_contiguous()) or _streams.is_device(
                t.device
            ):
                return None
        return comm.handle

    def _fast_done(self, code, call, fn, handle, result):
        """The completed Work of a fast-path call that returned ``code``."""
        if code:
            _lib.check(fn, code, handle)
        return PcclWork._completed(result, call, self._next_seq(), self)

    def _live(self):
        comm = self._comm
        if comm is None:
            raise RuntimeError(f"pccl: process group {self._group_name!r} was shut down or "
                               "aborted")
        return comm

    def _issue(self, opts, requests, keep, post=None, result=None, call=""):
        collect = getattr(opts, "collect", None)
        if collect is not None:  # a piece of a coalesced call
            collect.append((requests, keep, post))
            return None
        _streams.keep_alive(requests, keep)
        if not getattr(opts, "asyncOp", True) and all(
                r is _DONE or isinstance(r, DeviceRequest) for r in requests):
            _streams.wait_last(requests)  # the current stream waits for it (on the device)
            if post is not None:  # ran blocking (see _start), or ordered after it: at once
                post()
            return PcclWork._completed(result, call, self._next_seq(), self)
        reap()  # finish what dropped Works left behind
        work = PcclWork(requests, keep, post, result, call, self._next_seq(), self)
        if not getattr(opts, "asyncOp", True):
            work.wait()
        return work

    def _done(self, opts, result):
        """The Work of a call with nothing to move (still counted: every member counts it)."""
        if getattr(opts, "collect", None) is not None:
            return None
        return PcclWork(result=result, call="", seq=self._next_seq(), backend=self)

    @staticmethod
    def _out_buffer(t: torch.Tensor):
        """A contiguous buffer for output tensor t and a copy-back (or None)."""
        if t.is_contiguous():
            return t, None
        buf = t.contiguous()
        return buf, (lambda: t.copy_(buf))

    def _issue_pieces(self, opts, pieces, result, call):
        reqs, keep, posts = [], [], []
        for r, k, p in pieces:
            reqs += r
            keep += k
            posts.append(p)
        return self._issue(opts, reqs, keep, self._chain(*posts), result, call)

    @staticmethod
    def _chain(*fns):
        fns = [f for f in fns if f is not None]
        if not fns:
            return None

        def run():
            for f in fns:
                f()
        return run

    # ---- collectives ---------------------------------------------------------------------

    def _quantized(self, kind, output, input, op=None):
        """The bits of a call routed to its quantized form (set_quantization), or None: float
        tensors of one dtype on one device (CPU or GPU), and for the reduce-scatter SUM or
        AVG."""
        bits = self._quant.get(kind)
        if not bits or input.dtype not in _FLOATS or output.dtype != input.dtype:
            return None
        if input.device != output.device:
            return None
        if op is not None and op not in (ReduceOp.SUM, ReduceOp.AVG):
            return None
        return bits

    def _count_bytes(self, logical, bits, elems):
        """Adds a call's bytes to wire_bytes: the data's, and what crossed the wire (the
        codes and one f32 scale per block when quantized)."""
        self._bytes["calls"] += 1
        self._bytes["logical"] += logical
        if bits:
            self._bytes["quantized_calls"] += 1
            block = self._quant["block"]
            wire = (elems * bits // 8 + 4 * -(-elems // block)) * self.size()
        else:
            wire = logical
        self._bytes["wire"] += wire
        self._bytes["intra_wire" if self._intra_node else "inter_wire"] += wire

    def all_gather_single(self, output, input, opts):
        call = "all_gather_into_tensor"
        bits = self._quantized("allgather", output, input)
        self._count_bytes(output.numel() * output.element_size(), bits, input.numel())
        if bits:
            all_gather_quantized(output, input, bits=bits, block=self._quant["block"],
                                 group=self)
            return PcclWork._completed([output], call, self._next_seq(), self)
        h = self._fast_handle(opts, output, input)
        if h is not None:
            dt = _FAST_DTYPES.get(input.dtype)
            n = input.numel()
            if dt is not None and output.dtype == input.dtype and n and \
                    output.numel() == n * self.size():
                code = self._c_allgather(input.data_ptr(), output.data_ptr(), n, dt, h, None)
                return self._fast_done(code, call, "pcclAllGather", h, [output])
        dev = _device_of([output, input], call)
        if output.dtype != input.dtype:
            raise TypeError(f"pccl: {call}: output dtype {output.dtype} != input {input.dtype}")
        n = input.numel()
        if output.numel() != n * self.size():
            raise ValueError(f"pccl: {call}: output has {output.numel()} elements, expected "
                             f"{n} x {self.size()}")
        if n == 0:
            return self._done(opts, [output])
        dt = _dtype(input, call)
        out, copy_back = self._out_buffer(output)
        inp = input.contiguous()
        # An input that is block `rank` of the output is the in-place form PCCL accepts.
        req = self._start("allgather", dev, _ptr(inp), _ptr(out), n, dt, sync=_sync(opts))
        return self._issue(opts, [req], [inp, out, input, output], copy_back, [output], call)

    def allgather(self, output_tensors, input_tensors, opts):
        call = "all_gather"
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one input tensor per process")
        inp = input_tensors[0]
        outs = output_tensors[0]
        dev = _device_of([inp, *outs], call)
        if len(outs) != self.size():
            raise ValueError(f"pccl: {call}: needs {self.size()} output tensors, got {len(outs)}")
        n = inp.numel()
        for o in outs:
            if o.numel() != n or o.dtype != inp.dtype:
                raise ValueError(f"pccl: {call}: every output must match the input's size and "
                                 "dtype (uneven all_gather is not supported)")
        if n == 0:
            return self._done(opts, output_tensors)
        dt = _dtype(inp, call)
        src = inp.contiguous()
        flat = torch.empty(n * self.size(), dtype=inp.dtype, device=dev)

        def copy_out():
            for i, o in enumerate(outs):
                o.copy_(flat.narrow(0, i * n, n).view(o.shape))

        req = self._start("allgather", dev, _ptr(src), _ptr(flat), n, dt)
        return self._issue(opts, [req], [src, flat, inp, *outs], copy_out, output_tensors, call)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        call = "all_gather_into_tensor_coalesced"
        opts = opts if opts is not None else _AsyncOpts()  # torch <= 2.11 passes none
        pieces = []
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, _AsyncOpts(collect=pieces))
        return self._issue_pieces(opts, pieces, list(outputs), call)

    def reduce_scatter_single(self, output, input, opts):
        call = "reduce_scatter_tensor"
        bits = self._quantized("reducescatter", output, input, opts.reduceOp.op)
        self._count_bytes(input.numel() * input.element_size(), bits, input.numel())
        if bits:
            reduce_scatter_quantized(output, input, bits=bits, block=self._quant["block"],
                                     average=opts.reduceOp.op == ReduceOp.AVG, group=self)
            return PcclWork._completed([output], call, self._next_seq(), self)
        h = self._fast_handle(opts, output, input)
        if h is not None:
            dt = _FAST_DTYPES.get(input.dtype)
            op = _FAST_OPS.get(opts.reduceOp.op)
            n = output.numel()
            if dt is not None and op is not None and output.dtype == input.dtype and n and \
                    input.numel() == n * self.size():
                code = self._c_reduce_scatter(input.data_ptr(), output.data_ptr(), n, dt, op,
                                              h, None)
                return self._fast_done(code, call, "pcclReduceScatter", h, [output])
        dev = _device_of([output, input], call)
        if output.dtype != input.dtype:
            raise TypeError(f"pccl: {call}: output dtype {output.dtype} != input {input.dtype}")
        n = output.numel()
        if input.numel() != n * self.size():
            raise ValueError(f"pccl: {call}: input has {input.numel()} elements, expected "
                             f"{n} x {self.size()}")
        if n == 0:
            return self._done(opts, [output])
        dt = _dtype(input, call)
        op, factor = self._op(opts.reduceOp, input.dtype, call)
        src = input.contiguous() if factor is None else self._premul(input.contiguous(), factor)
        out, copy_back = self._out_buffer(output)
        req = self._start("reduce_scatter", dev, _ptr(src), _ptr(out), n, dt, op,
                          sync=_sync(opts))
        return self._issue(opts, [req], [src, out, input, output], copy_back, [output], call)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        call = "reduce_scatter"
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one output tensor per process")
        out = output_tensors[0]
        ins = input_tensors[0]
        dev = _device_of([out, *ins], call)
        if len(ins) != self.size():
            raise ValueError(f"pccl: {call}: needs {self.size()} input tensors, got {len(ins)}")
        n = out.numel()
        for t in ins:
            if t.numel() != n or t.dtype != out.dtype:
                raise ValueError(f"pccl: {call}: every input must match the output's size and "
                                 "dtype")
        if n == 0:
            return self._done(opts, output_tensors)
        dt = _dtype(out, call)
        op, factor = self._op(opts.reduceOp, out.dtype, call)
        flat = torch.cat([t.reshape(-1) for t in ins])
        if factor is not None:
            flat = self._premul(flat, factor)
        buf, copy_back = self._out_buffer(out)
        req = self._start("reduce_scatter", dev, _ptr(flat), _ptr(buf), n, dt, op)
        return self._issue(opts, [req], [flat, buf, out], copy_back, output_tensors, call)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        call = "reduce_scatter_tensor_coalesced"
        opts = opts if opts is not None else _AsyncOpts(ReduceOp.SUM)
        pieces = []
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, _AsyncOpts(opts.reduceOp, collect=pieces))
        return self._issue_pieces(opts, pieces, list(outputs), call)

    def _allreduce_one(self, t, reduce_op, call, sync=False):
        """Issues an in-place all-reduce of t; returns (requests, keep, post)."""
        if t.numel() == 0:
            return [], [], None
        dt = _dtype(t, call)
        op, factor = self._op(reduce_op, t.dtype, call)
        buf, copy_back = self._out_buffer(t)
        if factor is not None:
            buf.copy_(self._premul(buf, factor))
        req = self._start("allreduce", buf.device, _ptr(buf), _ptr(buf), buf.numel(), dt, op,
                          sync=sync)
        return [req], [buf, t], copy_back

    def allreduce(self, tensors, opts):
        call = "all_reduce"
        if len(tensors) == 1:
            t = tensors[0]
            h = self._fast_handle(opts, t)
            if h is not None:
                dt = _FAST_DTYPES.get(t.dtype)
                op = _FAST_OPS.get(opts.reduceOp.op)
                n = t.numel()
                if dt is not None and op is not None and n:
                    ptr = t.data_ptr()
                    code = self._c_allreduce(ptr, ptr, n, dt, op, h, None)
                    return self._fast_done(code, call, "pcclAllReduce", h, [t])
        _device_of(tensors, call)
        reqs, keep, posts = [], [], []
        for t in tensors:
            r, k, p = self._allreduce_one(t, opts.reduceOp, call, _sync(opts))
            reqs += r
            keep += k
            posts.append(p)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(tensors), call)

    def allreduce_coalesced(self, tensors, opts):
        call = "all_reduce_coalesced"
        _device_of(tensors, call)
        if not tensors:
            return self._done(opts, [])
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            raise TypeError(f"pccl: {call}: all tensors must have one dtype")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        r, k, p = self._allreduce_one(flat, opts.reduceOp, call, _sync(opts))

        def unflatten():
            off = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat.narrow(0, off, n).view(t.shape))
                off += n

        return self._issue(opts, r, k + list(tensors), self._chain(p, unflatten),
                           list(tensors), call)

    def broadcast(self, tensors, opts):
        call = "broadcast"
        _device_of(tensors, call)
        root = opts.rootRank
        if not 0 <= root < self.size():
            raise ValueError(f"pccl: {call}: root {root} outside the group of {self.size()}")
        reqs, keep, posts = [], [], []
        for t in tensors:
            if t.numel() == 0:
                continue
            dt = _dtype(t, call)
            buf, copy_back = self._out_buffer(t)
            reqs.append(self._start("broadcast", buf.device, _ptr(buf), _ptr(buf), buf.numel(),
                                    dt, root, sync=_sync(opts)))
            keep += [buf, t]
            posts.append(copy_back)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(tensors), call)

    def barrier(self, opts):
        self._flush_p2p()
        req = self._live().ibarrier()
        return self._issue(opts, [req], [], None, [], "barrier")

    # Fallbacks for a libpccl without pcclReduce/Gather/Scatter (each moves size x the data).

    def _reduce_emulated(self, tensors, opts):
        call = "reduce"
        _device_of(tensors, call)
        root = opts.rootRank
        reqs, keep, posts = [], [], []
        for t in tensors:
            tmp = t.clone(memory_format=torch.contiguous_format)
            r, k, _ = self._allreduce_one(tmp, opts.reduceOp, call)
            reqs += r
            keep += k + [t]
            if self.rank() == root:
                posts.append(lambda t=t, tmp=tmp: t.copy_(tmp))
        return self._issue(opts, reqs, keep, self._chain(*posts), list(tensors), call)

    def _gather_emulated(self, output_tensors, input_tensors, opts):
        call = "gather"
        if len(input_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one input tensor per process")
        inp = input_tensors[0]
        dev = _device_of([inp], call)
        n = inp.numel()
        root = opts.rootRank
        if n == 0:
            return self._done(opts, output_tensors)
        src = inp.contiguous()
        flat = torch.empty(n * self.size(), dtype=inp.dtype, device=dev)
        outs = output_tensors[0] if self.rank() == root else []

        def copy_out():
            for i, o in enumerate(outs):
                o.copy_(flat.narrow(0, i * n, n).view(o.shape))

        req = self._start("allgather", dev, _ptr(src), _ptr(flat), n, _dtype(inp, call))
        return self._issue(opts, [req], [src, flat, *outs], copy_out, output_tensors, call)

    def _scatter_emulated(self, output_tensors, input_tensors, opts):
        call = "scatter"
        if len(output_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one output tensor per process")
        out = output_tensors[0]
        dev = _device_of([out], call)
        n = out.numel()
        root = opts.rootRank
        if n == 0:
            return self._done(opts, output_tensors)
        if self.rank() == root:
            flat = torch.cat([t.reshape(-1) for t in input_tensors[0]]).to(dev)
        else:
            flat = torch.empty(n * self.size(), dtype=out.dtype, device=dev)
        req = self._start("broadcast", dev, _ptr(flat), _ptr(flat), flat.numel(),
                          _dtype(out, call), root)
        me = self.rank()

        def copy_out():
            out.copy_(flat.narrow(0, me * n, n).view(out.shape))

        return self._issue(opts, [req], [flat, out], copy_out, output_tensors, call)

    def _unsupported(self, call):
        raise NotImplementedError(f"pccl: {call} is not supported by the pccl backend")

    def recv_anysource(self, tensors, tag=0):
        self._unsupported("recv_anysource")

    def allreduce_sparse(self, tensors, opts):
        self._unsupported("all_reduce (sparse)")

    def allgather_coalesced(self, output_lists, input_tensors, opts):
        self._unsupported("all_gather_coalesced")

    def shutdown(self):
        """``pcclCommDestroy`` (destroy_process_group): operations still in flight keep the
        communicator alive until they end (the in-flight registry finishes them)."""
        try:
            self._flush_p2p()
        except Exception:  # noqa: BLE001
            pass
        comm, self._comm = self._comm, None
        if comm is not None:
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001
                pass
        reap()

    def abort(self):
        """``pcclCommAbort``: every operation in flight on the group ends within a second
        with an error (raised by its ``wait()``), and the other ranks are told."""
        comm, self._comm = self._comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception:  # noqa: BLE001
                pass
        try:
            self._flush_p2p()  # the comm is gone: queued sends/receives fail
        except Exception:  # noqa: BLE001
            pass
        reap()

    # The names a Python ProcessGroup is called by on older torch (see _base_class).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = RootedMixin.all_to_all_single

    def __del__(self):
        # Communicators are freed by destroy_process_group (shutdown); nothing at exit.
        pass


class _AsyncOpts:
    asyncOp = True

    def __init__(self, reduce_op=None, collect=None):
        self.reduceOp = reduce_op
        self.collect = collect


def _create_backend(opts, backend_options):
    if backend_options is None:
        backend_options = C10DBackend.Options(BACKEND_NAME, timeout=opts.timeout)
    backend_options._timeout = opts.timeout
    try:
        backend_options.global_ranks_in_group = opts.global_ranks_in_group
        backend_options.group_name = opts.group_id
    except Exception:
        pass
    parent = getattr(opts, "split_from", None)
    ranks = list(getattr(opts, "global_ranks_in_group", None) or [])
    # new_group from an eagerly made default group (init_process_group(device_id=...)):
    # split the parent, as torch's nccl does (its non-members call perform_nocolor_split).
    # Not for use_local_synchronization=True groups (hashed names): their non-members do
    # not take part.
    if (isinstance(parent, PcclBackend) and parent._comm is not None and ranks
            and str(opts.group_id).isdigit()
            and all(r in parent._global_ranks for r in ranks)):
        local = [parent._global_ranks.index(r) for r in ranks]
        comm = parent._split_comm(local)
        return parent._child(comm, opts.store, local, opts.timeout, str(opts.group_id),
                             backend_options)
    return PcclBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                       group_id=opts.group_id, options=backend_options)


def _pccl_backend_of(pg):
    """The PcclBackend of process group ``pg`` (None when it is another backend's)."""
    if isinstance(pg, PcclBackend):
        return pg
    try:
        be = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001
        return None
    return be if isinstance(be, PcclBackend) else None


def _wrap_split_group() -> None:
    """``dist.split_group`` on a pccl group, for a rank in none of the splits: it takes part
    in the parent's pcclCommSplit (collective) and gets ``GroupMember.NON_GROUP_MEMBER``, as
    on nccl. torch's own path would hand our None to C++, which dereferences it."""
    c10d = dist.distributed_c10d
    orig = getattr(c10d, "split_group", None)
    if orig is None or getattr(orig, "_pccl", False):
        return

    def split_group(parent_pg=None, split_ranks=None, *args, **kwargs):
        pg = parent_pg
        if pg is None and c10d.is_initialized():
            pg = c10d._get_default_group()
        be = _pccl_backend_of(pg) if pg is not None else None
        if be is not None and split_ranks:
            me = c10d._world.pg_group_ranks.get(pg, {}).get(dist.get_rank())
            if me is not None and not any(me in s for s in split_ranks):
                if any(len(s) == 0 or len(set(s)) != len(s) for s in split_ranks):
                    raise ValueError("split groups must be non-empty, without duplicates")
                be._split_comm(None)
                if hasattr(c10d, "_process_group_name"):  # every rank counts every group
                    c10d._process_group_name(list(split_ranks[0]), use_hashed_name=True)
                return dist.GroupMember.NON_GROUP_MEMBER
        return orig(parent_pg, split_ranks, *args, **kwargs)

    split_group.__doc__ = orig.__doc__
    split_group.__wrapped__ = orig
    split_group._pccl = True
    c10d.split_group = split_group
    if getattr(dist, "split_group", None) is orig:
        dist.split_group = split_group


def _holds_device_tensors(value) -> bool:
    """Whether a future's value holds a tensor that is not on the CPU (lists searched)."""
    if isinstance(value, torch.Tensor):
        return value.device.type != "cpu"
    if isinstance(value, (list, tuple)):
        return any(_holds_device_tensors(v) for v in value)
    return False


def _forward_work_queries() -> None:
    """Newer torch (2.12+) hands the caller a C++ ``PyWorkHolder`` around the Work a Python
    backend returns; it forwards ``wait()`` and ``get_future()`` to it, but answers
    ``is_completed()`` from a flag of its own that only C++ sets, and ``result()`` not at all.
    So ``Work.is_completed`` and ``Work.result`` are extended, for every Work, with what the
    forwarded future says when torch's own answer is "not completed" / an error: a completed
    Work of another backend answers as before (torch's answer comes first), a future holding
    device tensors is not trusted (nccl completes its future when the work is enqueued, so
    an unfinished nccl Work stays "not completed"; pccl's async device Works do too), and
    any error of the fallback leaves torch's answer (or its exception) unchanged. Idempotent."""
    work_cls = getattr(torch._C._distributed_c10d, "Work", None)
    if work_cls is None or getattr(work_cls.is_completed, "_pccl", False):
        return
    orig_completed, orig_result = work_cls.is_completed, work_cls.result

    def is_completed(self):
        if orig_completed(self):
            return True
        try:
            fut = self.get_future()
            if not fut.done():
                return False
        except Exception:  # noqa: BLE001 (a Work without a future: torch's answer stands)
            return False
        try:
            value = fut.value()
        except Exception:  # noqa: BLE001 (completed with an error)
            return True
        # A future of device tensors may be "done" when the work is only enqueued (nccl
        # completes its future at enqueue; the stream finishes later): torch's answer stands.
        return not _holds_device_tensors(value)

    def result(self):
        try:
            return orig_result(self)
        except Exception as e:  # noqa: BLE001
            try:
                fut = self.get_future()
            except Exception:  # noqa: BLE001
                raise e from None
            self.wait()
            return fut.value()

    is_completed.__doc__ = orig_completed.__doc__
    is_completed._pccl = True
    result.__doc__ = orig_result.__doc__
    work_cls.is_completed = is_completed
    work_cls.result = result


def register() -> None:
    """Registers the backend "pccl" (done on import; calling again is harmless)."""
    if getattr(dist.Backend, BACKEND_NAME.upper(), None) is not None:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
    _wrap_split_group()
    if _BASE is C10DBackend:  # torch <= 2.11 hands out our Work itself
        _forward_work_queries()


register()
