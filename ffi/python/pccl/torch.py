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

CUDA tensors (a libpccl built with ``--features cuda``): the collective runs on device memory,
queued on the tensors' current CUDA stream through the C ABI's stream argument (as torch's
nccl backend orders its work): the call returns at once, and later work on that stream runs
after the collective; the returned work is complete from the host's point of view (wait on
the stream, e.g. ``torch.cuda.synchronize()``, before reading results on the host). All
tensors of one call must be on one device.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10DBackend
from torch._C._distributed_c10d import ReduceOp

from . import _lib

__all__ = ["PcclBackend", "PcclWork", "BACKEND_NAME", "register"]

BACKEND_NAME = "pccl"

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


class _Done:
    """The request of a device collective: queued on the stream, nothing to wait for on the
    host (the stream orders everything after it)."""

    @staticmethod
    def wait():
        return None

    @staticmethod
    def test():
        return True


def _stream_of(dev: torch.device) -> int:
    """The cudaStream_t of torch's current stream on ``dev``; the legacy default stream
    (handle 0, which the C ABI reads as "host memory") is passed as cudaStreamLegacy (1)."""
    s = torch.cuda.current_stream(dev).cuda_stream
    return s if s else 1


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class PcclWork(dist._Work):
    """Work of one (or several) PCCL requests; keeps the tensors alive until completion."""

    def __init__(self, requests=(), keep=(), post=None, result=None, call=""):
        super().__init__()
        self._requests = list(requests)
        self._keep = list(keep)
        self._post = post
        self._result = result if result is not None else []
        self._call = call
        self._lock = threading.Lock()
        self._finished = False
        self._error = None
        self._future = None

    def _finish(self):
        with self._lock:
            if not self._finished:
                try:
                    for r in self._requests:
                        r.wait()
                    if self._post is not None:
                        self._post()
                except BaseException as e:  # surfaced to every waiter
                    self._error = e
                self._finished = True
                self._requests = []
                self._keep = []
                self._post = None
            if self._error is not None:
                raise self._error

    def wait(self, timeout=None):
        self._finish()
        return True

    def is_completed(self):
        if self._finished:
            return True
        if all(r.test() for r in self._requests):
            try:
                self._finish()  # requests done: completes at once (runs any copy-back)
            except BaseException:  # noqa: BLE001 (kept for wait() / exception())
                pass
            return True
        return False

    def is_success(self):
        return self._finished and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self._finish()
        return self._result

    def get_future(self):
        if self._future is not None:
            return self._future
        fut = torch.futures.Future()
        self._future = fut

        def run():
            try:
                self._finish()
                fut.set_result(self._result)
            except BaseException as e:
                fut.set_exception(e)

        if self._finished or not self._requests:
            run()
        else:
            threading.Thread(target=run, name="pccl-future", daemon=True).start()
        return fut


def _done_work(result=None):
    w = PcclWork(result=result)
    w._finished = True
    return w


# Groups created with the same (group id, ranks) get distinct keys: every member of a group
# creates the same sequence of such groups, so a count per (group id, ranks) agrees across them
# (a single per-process count would not: ranks outside a group do not create it).
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


class PcclBackend(_BASE):
    """c10d Backend over a PCCL communicator (CPU and CUDA tensors)."""

    def __init__(self, store, rank, size, timeout, group_id="", options=None, comm=None):
        super().__init__(rank, size)
        self._options = options if options is not None else C10DBackend.Options(
            BACKEND_NAME, timeout=timeout)
        self._group_id = group_id
        if comm is None:
            ranks = tuple(getattr(self._options, "global_ranks_in_group", None) or ())
            comm = self._bootstrap(store, rank, size, group_id, ranks)
        self._comm = comm
        if comm.size != size or comm.rank != rank:
            raise RuntimeError(
                f"pccl: communicator is rank {comm.rank} of {comm.size}, the group expects "
                f"rank {rank} of {size}")

    @staticmethod
    def _bootstrap(store, rank, size, group_id, ranks=()):
        mode = os.environ.get("PCCL_TORCH_BOOTSTRAP", "tcp").lower()
        if (mode == "mpi" and str(group_id) in ("0", "default_pg", "")
                and "PMI_RANK" in os.environ and _lib.has_mpi()):
            return _lib.Communicator.init_mpi_world()
        with _group_counts_lock:
            n = _group_counts.get((group_id, ranks), 0)
            _group_counts[(group_id, ranks)] = n + 1
        key = f"pccl/unique_id/{group_id}/{n}"
        if rank == 0:
            uid = _lib.get_unique_id()
            store.set(key, uid)
        else:
            store.wait([key])
            uid = bytes(store.get(key))
        return _lib.Communicator.init_rank(size, uid, rank)

    @property
    def options(self):
        return self._options

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return False

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
                raise ValueError(f"pccl: {call}: PREMUL_SUM without a factor")
            return _lib.pcclSum, factor
        raise ValueError(f"pccl: {call} does not support reduce op {op}")

    @staticmethod
    def _premul(t: torch.Tensor, factor) -> torch.Tensor:
        if isinstance(factor, torch.Tensor):
            factor = factor.to(device=t.device, dtype=t.dtype)
        return t * factor

    def _start(self, name, dev, *args):
        """Issues collective ``name``: a PCCL request on host memory, or a device collective
        queued on the current stream of CUDA device ``dev``."""
        if dev.type == "cpu":
            return getattr(self._comm, "i" + name)(*args)
        with torch.cuda.device(dev):
            getattr(self._comm, name)(*args, _stream_of(dev))
        return _Done()

    def _issue(self, opts, requests, keep, post=None, result=None, call=""):
        work = PcclWork(requests, keep, post, result, call)
        if not getattr(opts, "asyncOp", True):
            work.wait()
        return work

    @staticmethod
    def _out_buffer(t: torch.Tensor):
        """A contiguous buffer for output tensor t and a copy-back (or None)."""
        if t.is_contiguous():
            return t, None
        buf = t.contiguous()
        return buf, (lambda: t.copy_(buf))

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

    def all_gather_single(self, output, input, opts):
        call = "all_gather_into_tensor"
        dev = _device_of([output, input], call)
        if output.dtype != input.dtype:
            raise TypeError(f"pccl: {call}: output dtype {output.dtype} != input {input.dtype}")
        n = input.numel()
        if output.numel() != n * self.size():
            raise ValueError(f"pccl: {call}: output has {output.numel()} elements, expected "
                             f"{n} x {self.size()}")
        if n == 0:
            return _done_work([output])
        dt = _dtype(input, call)
        out, copy_back = self._out_buffer(output)
        inp = input.contiguous()
        # An input that is block `rank` of the output is the in-place form PCCL accepts.
        req = self._start("allgather", dev, _ptr(inp), _ptr(out), n, dt)
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
            return _done_work(output_tensors)
        dt = _dtype(inp, call)
        src = inp.contiguous()
        flat = torch.empty(n * self.size(), dtype=inp.dtype, device=dev)

        def copy_out():
            for i, o in enumerate(outs):
                o.copy_(flat.narrow(0, i * n, n).view(o.shape))

        req = self._start("allgather", dev, _ptr(src), _ptr(flat), n, dt)
        return self._issue(opts, [req], [src, flat, inp, *outs], copy_out, output_tensors, call)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        call = "all_gather_into_tensor_coalesced"
        reqs, keep, posts = [], [], []
        for o, i in zip(outputs, inputs):
            w = self.all_gather_single(o, i, _AsyncOpts())
            reqs += w._requests
            keep += w._keep
            posts.append(w._post)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(outputs), call)

    def reduce_scatter_single(self, output, input, opts):
        call = "reduce_scatter_tensor"
        dev = _device_of([output, input], call)
        if output.dtype != input.dtype:
            raise TypeError(f"pccl: {call}: output dtype {output.dtype} != input {input.dtype}")
        n = output.numel()
        if input.numel() != n * self.size():
            raise ValueError(f"pccl: {call}: input has {input.numel()} elements, expected "
                             f"{n} x {self.size()}")
        if n == 0:
            return _done_work([output])
        dt = _dtype(input, call)
        op, factor = self._op(opts.reduceOp, input.dtype, call)
        src = input.contiguous() if factor is None else self._premul(input.contiguous(), factor)
        out, copy_back = self._out_buffer(output)
        req = self._start("reduce_scatter", dev, _ptr(src), _ptr(out), n, dt, op)
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
            return _done_work(output_tensors)
        dt = _dtype(out, call)
        op, factor = self._op(opts.reduceOp, out.dtype, call)
        flat = torch.cat([t.reshape(-1) for t in ins])
        if factor is not None:
            flat = self._premul(flat, factor)
        buf, copy_back = self._out_buffer(out)
        req = self._start("reduce_scatter", dev, _ptr(flat), _ptr(buf), n, dt, op)
        return self._issue(opts, [req], [flat, buf, out], copy_back, output_tensors, call)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        call = "reduce_scatter_tensor_coalesced"
        reqs, keep, posts = [], [], []
        for o, i in zip(outputs, inputs):
            a = _AsyncOpts(opts.reduceOp)
            w = self.reduce_scatter_single(o, i, a)
            reqs += w._requests
            keep += w._keep
            posts.append(w._post)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(outputs), call)

    def _allreduce_one(self, t, reduce_op, call):
        """Issues an in-place all-reduce of t; returns (requests, keep, post)."""
        if t.numel() == 0:
            return [], [], None
        dt = _dtype(t, call)
        op, factor = self._op(reduce_op, t.dtype, call)
        buf, copy_back = self._out_buffer(t)
        if factor is not None:
            buf.copy_(self._premul(buf, factor))
        req = self._start("allreduce", buf.device, _ptr(buf), _ptr(buf), buf.numel(), dt, op)
        return [req], [buf, t], copy_back

    def allreduce(self, tensors, opts):
        call = "all_reduce"
        _device_of(tensors, call)
        reqs, keep, posts = [], [], []
        for t in tensors:
            r, k, p = self._allreduce_one(t, opts.reduceOp, call)
            reqs += r
            keep += k
            posts.append(p)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(tensors), call)

    def allreduce_coalesced(self, tensors, opts):
        call = "all_reduce_coalesced"
        _device_of(tensors, call)
        if not tensors:
            return _done_work([])
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            raise TypeError(f"pccl: {call}: all tensors must have one dtype")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        r, k, p = self._allreduce_one(flat, opts.reduceOp, call)

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
                                    dt, root))
            keep += [buf, t]
            posts.append(copy_back)
        return self._issue(opts, reqs, keep, self._chain(*posts), list(tensors), call)

    def barrier(self, opts):
        req = self._comm.ibarrier()
        return self._issue(opts, [req], [], None, [], "barrier")

    # Built from the collectives above (each moves size x the data a rooted call needs).

    def reduce(self, tensors, opts):
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

    def gather(self, output_tensors, input_tensors, opts):
        call = "gather"
        if len(input_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one input tensor per process")
        inp = input_tensors[0]
        dev = _device_of([inp], call)
        n = inp.numel()
        root = opts.rootRank
        if n == 0:
            return _done_work(output_tensors)
        src = inp.contiguous()
        flat = torch.empty(n * self.size(), dtype=inp.dtype, device=dev)
        outs = output_tensors[0] if self.rank() == root else []

        def copy_out():
            for i, o in enumerate(outs):
                o.copy_(flat.narrow(0, i * n, n).view(o.shape))

        req = self._start("allgather", dev, _ptr(src), _ptr(flat), n, _dtype(inp, call))
        return self._issue(opts, [req], [src, flat, *outs], copy_out, output_tensors, call)

    def scatter(self, output_tensors, input_tensors, opts):
        call = "scatter"
        if len(output_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one output tensor per process")
        out = output_tensors[0]
        dev = _device_of([out], call)
        n = out.numel()
        root = opts.rootRank
        if n == 0:
            return _done_work(output_tensors)
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

    def alltoall(self, output_tensors, input_tensors, opts):
        self._unsupported("all_to_all")

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        self._unsupported("all_to_all_single")

    def send(self, tensors, dst, tag=0):
        self._unsupported("send")

    def recv(self, tensors, src, tag=0):
        self._unsupported("recv")

    def recv_anysource(self, tensors, tag=0):
        self._unsupported("recv_anysource")

    def allreduce_sparse(self, tensors, opts):
        self._unsupported("all_reduce (sparse)")

    def allgather_coalesced(self, output_lists, input_tensors, opts):
        self._unsupported("all_gather_coalesced")

    def shutdown(self):
        comm, self._comm = self._comm, None
        if comm is not None:
            try:
                comm.destroy()
            except Exception:
                pass

    def abort(self):
        self.shutdown()

    # The names a Python ProcessGroup is called by on older torch (see _base_class).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    def __del__(self):
        # Communicators are freed by destroy_process_group (shutdown); nothing at exit.
        pass


class _AsyncOpts:
    asyncOp = True

    def __init__(self, reduce_op=None):
        self.reduceOp = reduce_op


def _create_backend(opts, backend_options):
    if backend_options is None:
        backend_options = C10DBackend.Options(BACKEND_NAME, timeout=opts.timeout)
    backend_options._timeout = opts.timeout
    try:
        backend_options.global_ranks_in_group = opts.global_ranks_in_group
        backend_options.group_name = opts.group_id
    except Exception:
        pass
    return PcclBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                       group_id=opts.group_id, options=backend_options)


def register() -> None:
    """Registers the backend "pccl" (done on import; calling again is harmless)."""
    if getattr(dist.Backend, BACKEND_NAME.upper(), None) is not None:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])


register()
