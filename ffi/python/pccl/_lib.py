"""ctypes loader and thin wrappers for the PCCL C ABI (include/pccl.h).

The shared library is found, in this order, at:
  1. ``$PCCL_LIBRARY`` (a path to ``libpccl.so``);
  2. next to this package (``pccl/libpccl.so``: what ``pip install ./ffi/python`` builds and
     puts in the wheel);
  3. ``$CARGO_TARGET_DIR/{release,debug}`` when that is set, then the repository's
     ``target/release`` and ``target/debug`` (a source checkout: this package lives in
     ``<repo>/ffi/python/pccl``);
  4. the system loader path (``ctypes.util.find_library("pccl")``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

# Result codes (include/pccl.h).
pcclSuccess = 0
RESULT_NAMES = {
    0: "pcclSuccess",
    1: "pcclUnhandledDeviceError",
    2: "pcclSystemError",
    3: "pcclInternalError",
    4: "pcclInvalidArgument",
    5: "pcclInvalidUsage",
    6: "pcclRemoteError",
    7: "pcclTimeout",
}

# Data types.
pcclInt8 = 0
pcclUint8 = 1
pcclInt32 = 2
pcclUint32 = 3
pcclInt64 = 4
pcclUint64 = 5
pcclFloat16 = 6
pcclFloat32 = 7
pcclFloat64 = 8
pcclBfloat16 = 9

# Reduction ops.
pcclSum = 0
pcclProd = 1
pcclMax = 2
pcclMin = 3
pcclAvg = 4

# Device runtimes of the streams given to device calls (pcclCommSetDeviceRuntime).
pcclRuntimeAuto = 0
pcclRuntimeCuda = 1
pcclRuntimeHip = 2

UNIQUE_ID_BYTES = 128


class pcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]

    @classmethod
    def from_bytes(cls, data: bytes) -> "pcclUniqueId":
        if len(data) != UNIQUE_ID_BYTES:
            raise ValueError(f"pccl: a unique id has {UNIQUE_ID_BYTES} bytes, got {len(data)}")
        uid = cls()
        ctypes.memmove(ctypes.byref(uid), data, UNIQUE_ID_BYTES)
        return uid

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.byref(self), UNIQUE_ID_BYTES)


class PcclError(RuntimeError):
    """A PCCL call failed; ``code`` is the pcclResult_t, the message is pcclGetLastError's."""

    def __init__(self, call: str, code: int, message: str):
        self.call = call
        self.code = code
        self.detail = message
        name = RESULT_NAMES.get(code, f"code {code}")
        super().__init__(f"{call} failed: {name}: {message}")


_comm_t = ctypes.c_void_p
_req_t = ctypes.c_void_p
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_int = ctypes.c_int

_SIGNATURES = {
    "pcclGetVersion": [ctypes.POINTER(_int)],
    "pcclGetUniqueId": [ctypes.POINTER(pcclUniqueId)],
    "pcclCommInitRank": [ctypes.POINTER(_comm_t), _int, pcclUniqueId, _int],
    "pcclCommInitMPIWorld": [ctypes.POINTER(_comm_t)],
    "pcclCommDestroy": [_comm_t],
    "pcclCommAbort": [_comm_t],
    "pcclCommCount": [_comm_t, ctypes.POINTER(_int)],
    "pcclCommUserRank": [_comm_t, ctypes.POINTER(_int)],
    "pcclCommSplit": [_comm_t, _int, _int, ctypes.POINTER(_comm_t)],
    "pcclCommShrink": [_comm_t, ctypes.POINTER(_int), _int, ctypes.POINTER(_comm_t)],
    "pcclCommShrinkSurvivors": [_comm_t, ctypes.POINTER(_comm_t)],
    "pcclCommSetTimeout": [_comm_t, ctypes.c_uint64],
    "pcclCommGetTimeout": [_comm_t, ctypes.POINTER(ctypes.c_uint64)],
    "pcclCommGetAsyncError": [_comm_t, ctypes.POINTER(ctypes.c_int)],
    "pcclCommSetDeviceRuntime": [_comm_t, _int],
    "pcclAllGather": [_vp, _vp, _sz, _int, _comm_t, _vp],
    "pcclReduceScatter": [_vp, _vp, _sz, _int, _int, _comm_t, _vp],
    "pcclAllReduce": [_vp, _vp, _sz, _int, _int, _comm_t, _vp],
    "pcclBroadcast": [_vp, _vp, _sz, _int, _int, _comm_t, _vp],
    "pcclBarrier": [_comm_t],
    "pcclIallGather": [_vp, _vp, _sz, _int, _comm_t, ctypes.POINTER(_req_t)],
    "pcclIreduceScatter": [_vp, _vp, _sz, _int, _int, _comm_t, ctypes.POINTER(_req_t)],
    "pcclIallReduce": [_vp, _vp, _sz, _int, _int, _comm_t, ctypes.POINTER(_req_t)],
    "pcclIbroadcast": [_vp, _vp, _sz, _int, _int, _comm_t, ctypes.POINTER(_req_t)],
    "pcclIbarrier": [_comm_t, ctypes.POINTER(_req_t)],
    "pcclWait": [_req_t],
    "pcclTest": [_req_t, ctypes.POINTER(_int)],
    # Rooted, all-to-all and point-to-point calls (host memory: stream must be NULL). Older
    # libraries lack them: see ``has()``.
    "pcclReduce": [_vp, _vp, _sz, _int, _int, _int, _comm_t, _vp],
    "pcclGather": [_vp, _vp, _sz, _int, _int, _comm_t, _vp],
    "pcclScatter": [_vp, _vp, _sz, _int, _int, _comm_t, _vp],
    "pcclAllToAll": [_vp, _vp, _sz, _int, _comm_t, _vp],
    "pcclAllToAllv": [_vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz), _vp, ctypes.POINTER(_sz),
                      ctypes.POINTER(_sz), _int, _comm_t, _vp],
    "pcclSend": [_vp, _sz, _int, _int, _comm_t, _vp],
    "pcclRecv": [_vp, _sz, _int, _int, _comm_t, _vp],
    "pcclGroupStart": [],
    "pcclGroupEnd": [],
    "pcclGroupEndAsync": [ctypes.POINTER(_req_t)],
    "pcclIsend": [_vp, _sz, _int, _int, _comm_t, ctypes.POINTER(_req_t)],
    "pcclIrecv": [_vp, _sz, _int, _int, _comm_t, ctypes.POINTER(_req_t)],
    # Quantized collectives (host memory).
    "pcclAllGatherQuantized": [_vp, _vp, _sz, _int, ctypes.c_uint32, _sz, ctypes.c_uint32,
                               _comm_t, _vp],
    "pcclReduceScatterQuantized": [_vp, _vp, _sz, _int, ctypes.c_uint32, _sz, ctypes.c_uint32,
                                   _comm_t, _vp],
}

#: ``flags`` bit of ``pcclAllGatherQuantized``: send NaN/infinite blocks (as NaN) instead of
#: refusing the call.
PCCL_QUANT_ALLOW_NONFINITE = 1
#: ``flags`` bit of ``pcclReduceScatterQuantized``: average instead of sum.
PCCL_QUANT_AVERAGE = 2
#: ``flags`` bit of ``pcclReduceScatterQuantized``: recursive halving at each level instead
#: of the two quantized all-to-alls.
PCCL_QUANT_HALVING = 4
PCCL_QUANT_PER_LEVEL = 8

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("PCCL_LIBRARY")
    if env:
        yield Path(env)
        return
    here = Path(__file__).resolve().parent
    repo = here.parent.parent.parent  # <repo>/ffi/python/pccl -> <repo>
    names = ["libpccl.so", "libpccl.dylib"]
    for n in names:  # the library packaged in the wheel
        yield here / n
    dirs = []
    tdir = os.environ.get("CARGO_TARGET_DIR")
    if tdir:  # where cargo builds when it is set
        dirs.append(Path(tdir) if Path(tdir).is_absolute() else repo / tdir)
    dirs.append(repo / "target")
    for d in dirs:
        for sub in ("release", "debug"):
            for n in names:
                yield d / sub / n


def library_path() -> str:
    """The path of the libpccl that ``lib()`` loads (or would load)."""
    if _lib_path is not None:
        return _lib_path
    for c in _candidates():
        if c.is_file():
            return str(c)
    if os.environ.get("PCCL_LIBRARY"):
        raise OSError(f"pccl: PCCL_LIBRARY={os.environ['PCCL_LIBRARY']} does not exist")
    found = ctypes.util.find_library("pccl")
    if found:
        return found
    raise OSError(
        "pccl: libpccl.so not found; build it with `cargo build --release --features mpi` "
        "in the repository, or set PCCL_LIBRARY to its path"
    )


def lib() -> ctypes.CDLL:
    """Loads libpccl once and returns it with argtypes/restype set."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        # RTLD_GLOBAL so that an MPI-enabled lib's libmpi symbols resolve for plugins.
        handle = ctypes.CDLL(path, mode=getattr(os, "RTLD_GLOBAL", 0))
        for name, args in _SIGNATURES.items():
            fn = getattr(handle, name, None)
            if fn is None:
                continue
            fn.argtypes = args
            fn.restype = _int
        handle.pcclGetErrorString.argtypes = [_int]
        handle.pcclGetErrorString.restype = ctypes.c_char_p
        handle.pcclGetLastError.argtypes = [_comm_t]
        handle.pcclGetLastError.restype = ctypes.c_char_p
        _lib_path = path
        _lib = handle
        return _lib


def last_error(comm=None) -> str:
    msg = lib().pcclGetLastError(comm)
    return msg.decode("utf-8", "replace") if msg else ""


def check(call: str, code: int, comm=None) -> None:
    """Raises PcclError (with pcclGetLastError's message) when ``code`` is not success."""
    if code != pcclSuccess:
        msg = last_error(comm) or last_error(None)
        if not msg:
            s = lib().pcclGetErrorString(code)
            msg = s.decode() if s else ""
        raise PcclError(call, code, msg)


def has(name: str) -> bool:
    """Whether the loaded libpccl exports C function ``name`` (e.g. ``"pcclSend"``)."""
    return getattr(lib(), name, None) is not None


def version() -> int:
    v = _int(0)
    check("pcclGetVersion", lib().pcclGetVersion(ctypes.byref(v)))
    return v.value


def features() -> list:
    """The optional parts the loaded libpccl was built with (``["mpi", "cuda", "rocm",
    "hwloc", "ofi"]`` when all are); empty for a library too old to say."""
    f = getattr(lib(), "pcclGetFeatures", None)
    if f is None:
        return []
    f.argtypes = []
    f.restype = ctypes.c_char_p
    return [x for x in (f() or b"").decode().split(",") if x]


def has_mpi() -> bool:
    return hasattr(lib(), "pcclCommInitMPIWorld")


_env_lock = threading.Lock()


@contextmanager
def timeout_env(seconds):
    """Sets ``PCCL_TIMEOUT`` to ``seconds`` for the duration of the block (the C ABI reads it
    when a rendezvous opens and when a communicator is made); ``None`` leaves it as it is.
    Serialised, so concurrent inits each see their own value."""
    with _env_lock:
        if seconds is None:
            yield
            return
        old = os.environ.get("PCCL_TIMEOUT")
        os.environ["PCCL_TIMEOUT"] = repr(float(seconds))
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("PCCL_TIMEOUT", None)
            else:
                os.environ["PCCL_TIMEOUT"] = old


def get_unique_id(timeout_s=None) -> bytes:
    uid = pcclUniqueId()
    with timeout_env(timeout_s):
        check("pcclGetUniqueId", lib().pcclGetUniqueId(ctypes.byref(uid)))
    return uid.to_bytes()


class Communicator:
    """An owning handle of a pcclComm_t."""

    def __init__(self, handle: int, timeout_s=None):
        self.handle = ctypes.c_void_p(handle)
        self.timeout_s = timeout_s  # PCCL_TIMEOUT the communicator was made with (None: its own)
        self.device_runtime = None  # the runtime told by set_device_runtime, if any
        n = _int(0)
        r = _int(0)
        check("pcclCommCount", lib().pcclCommCount(self.handle, ctypes.byref(n)), self.handle)
        check("pcclCommUserRank", lib().pcclCommUserRank(self.handle, ctypes.byref(r)), self.handle)
        self.size = n.value
        self.rank = r.value

    @classmethod
    def init_rank(cls, nranks: int, uid: bytes, rank: int, timeout_s=None) -> "Communicator":
        """``pcclCommInitRank``; ``timeout_s`` (seconds) becomes the communicator's
        ``PCCL_TIMEOUT`` (every wait on a peer), ``None`` keeps the environment's."""
        c = _comm_t()
        with timeout_env(timeout_s):
            code = lib().pcclCommInitRank(ctypes.byref(c), nranks, pcclUniqueId.from_bytes(uid),
                                          rank)
        check("pcclCommInitRank", code)
        return cls(c.value, timeout_s)

    @classmethod
    def init_mpi_world(cls, timeout_s=None) -> "Communicator":
        if not has_mpi():
            raise RuntimeError("pccl: this libpccl has no pcclCommInitMPIWorld")
        c = _comm_t()
        with timeout_env(timeout_s):
            check("pcclCommInitMPIWorld", lib().pcclCommInitMPIWorld(ctypes.byref(c)))
        return cls(c.value, timeout_s)

    def split(self, color: int, key: int):
        """``pcclCommSplit`` (collective over this communicator): the ranks passing the same
        ``color`` >= 0 form a new communicator ordered by ``key``; a negative color joins
        none and returns None. No new bootstrap: the new one runs over this one's links."""
        c = _comm_t()
        code = lib().pcclCommSplit(self.handle, int(color), int(key), ctypes.byref(c))
        check("pcclCommSplit", code, self.handle)
        if not c.value:
            return None
        return Communicator(c.value, self.get_timeout())

    def shrink(self, excluded) -> "Communicator":
        """``pcclCommShrink``: a communicator of this one's ranks not in ``excluded`` (dead
        ranks; they take no part), made by the ranks that stay, which pass the same list."""
        ranks = [int(r) for r in excluded]
        arr = (_int * max(1, len(ranks)))(*ranks)
        c = _comm_t()
        code = lib().pcclCommShrink(self.handle, arr, len(ranks), ctypes.byref(c))
        check("pcclCommShrink", code, self.handle)
        return Communicator(c.value, self.get_timeout())

    def shrink_to_survivors(self) -> "Communicator":
        """``pcclCommShrinkSurvivors``: the ranks that still reach each other agree on who
        goes on and form a new communicator; on the minority side of a partition (or counted
        out by the others) a :class:`PcclError` instead."""
        if not has("pcclCommShrinkSurvivors"):
            raise RuntimeError(
                f"pccl: libpccl at {library_path()} has no pcclCommShrinkSurvivors: rebuild it")
        c = _comm_t()
        code = lib().pcclCommShrinkSurvivors(self.handle, ctypes.byref(c))
        check("pcclCommShrinkSurvivors", code, self.handle)
        return Communicator(c.value, self.get_timeout())

    def set_timeout(self, seconds: float) -> None:
        """``pcclCommSetTimeout``: every later call on this communicator (and requests not
        started yet) fails with pcclTimeout after ``seconds`` without its peers."""
        ms = max(1, int(round(float(seconds) * 1000)))
        check("pcclCommSetTimeout", lib().pcclCommSetTimeout(self.handle, ms), self.handle)
        self.timeout_s = ms / 1000

    def set_device_runtime(self, runtime: int) -> None:
        """``pcclCommSetDeviceRuntime``: the streams of this communicator's device calls are
        CUDA (``pcclRuntimeCuda``) or HIP (``pcclRuntimeHip``) streams. An error when the
        library was built without that runtime, or is too old to be told (then only CUDA,
        the default, is possible)."""
        if not has("pcclCommSetDeviceRuntime"):
            if runtime == pcclRuntimeHip:
                raise RuntimeError(
                    f"pccl: libpccl at {library_path()} has no pcclCommSetDeviceRuntime: "
                    "rebuild it (with --features rocm) to run collectives on HIP tensors")
            return
        check("pcclCommSetDeviceRuntime",
              lib().pcclCommSetDeviceRuntime(self.handle, int(runtime)), self.handle)

    def get_timeout(self):
        """The communicator's timeout in seconds (None for a libpccl without
        pcclCommGetTimeout)."""
        if not has("pcclCommGetTimeout"):
            return self.timeout_s
        ms = ctypes.c_uint64(0)
        check("pcclCommGetTimeout", lib().pcclCommGetTimeout(self.handle, ctypes.byref(ms)),
              self.handle)
        return ms.value / 1000

    def async_error(self):
        """``pcclCommGetAsyncError``: a :class:`PcclError` for the error a collective queued
        on a device stream met while running, or None (also for a libpccl without it)."""
        if self.handle is None or not has("pcclCommGetAsyncError"):
            return None
        code = ctypes.c_int(0)
        check("pcclCommGetAsyncError",
              lib().pcclCommGetAsyncError(self.handle, ctypes.byref(code)), self.handle)
        if code.value == pcclSuccess:
            return None
        return PcclError("queued device collective", code.value, last_error(self.handle))

    def destroy(self) -> None:
        if self.handle is not None and self.handle.value:
            h = self.handle
            self.handle = None
            check("pcclCommDestroy", lib().pcclCommDestroy(h))

    def abort(self) -> None:
        """``pcclCommAbort``: every call and request in flight on it ends within a second
        (with an error), the peers are told; the handle is freed."""
        if self.handle is not None and self.handle.value:
            h = self.handle
            self.handle = None
            check("pcclCommAbort", lib().pcclCommAbort(h))

    # Blocking calls on device memory, ordered on a CUDA stream (a non-zero cudaStream_t:
    # 1 is cudaStreamLegacy, 2 cudaStreamPerThread); they return once the work is done.
    def allgather(self, send, recv, count, dtype, stream) -> None:
        code = lib().pcclAllGather(send, recv, count, dtype, self.handle, stream)
        check("pcclAllGather", code, self.handle)

    def reduce_scatter(self, send, recv, recvcount, dtype, op, stream) -> None:
        code = lib().pcclReduceScatter(send, recv, recvcount, dtype, op, self.handle, stream)
        check("pcclReduceScatter", code, self.handle)

    def allreduce(self, send, recv, count, dtype, op, stream) -> None:
        code = lib().pcclAllReduce(send, recv, count, dtype, op, self.handle, stream)
        check("pcclAllReduce", code, self.handle)

    def broadcast(self, send, recv, count, dtype, root, stream) -> None:
        code = lib().pcclBroadcast(send, recv, count, dtype, root, self.handle, stream)
        check("pcclBroadcast", code, self.handle)

    # Non-blocking calls return a request handle (int); see Request.
    def iallgather(self, send, recv, count, dtype) -> "Request":
        req = _req_t()
        code = lib().pcclIallGather(send, recv, count, dtype, self.handle, ctypes.byref(req))
        check("pcclIallGather", code, self.handle)
        return Request(self, req, "pcclIallGather")

    def ireduce_scatter(self, send, recv, recvcount, dtype, op) -> "Request":
        req = _req_t()
        code = lib().pcclIreduceScatter(send, recv, recvcount, dtype, op, self.handle,
                                        ctypes.byref(req))
        check("pcclIreduceScatter", code, self.handle)
        return Request(self, req, "pcclIreduceScatter")

    def iallreduce(self, send, recv, count, dtype, op) -> "Request":
        req = _req_t()
        code = lib().pcclIallReduce(send, recv, count, dtype, op, self.handle, ctypes.byref(req))
        check("pcclIallReduce", code, self.handle)
        return Request(self, req, "pcclIallReduce")

    def ibroadcast(self, send, recv, count, dtype, root) -> "Request":
        req = _req_t()
        code = lib().pcclIbroadcast(send, recv, count, dtype, root, self.handle,
                                    ctypes.byref(req))
        check("pcclIbroadcast", code, self.handle)
        return Request(self, req, "pcclIbroadcast")

    def ibarrier(self) -> "Request":
        req = _req_t()
        check("pcclIbarrier", lib().pcclIbarrier(self.handle, ctypes.byref(req)), self.handle)
        return Request(self, req, "pcclIbarrier")


    # Rooted collectives, all-to-all(v) and point-to-point: host memory with stream None
    # (blocking: they return once this rank's part is done), device memory queued on a
    # stream otherwise.
    def allgather_quantized(self, send, recv, count, dtype, bits, block, flags=0,
                            stream=None) -> None:
        """``pcclAllGatherQuantized``: block-quantized (``bits`` 8 or 4, one f32 scale per
        ``block`` elements) on the wire, decoded into ``dtype`` on every rank. Host memory
        with ``stream`` None; device memory of the stream's GPU otherwise (encoded and
        decoded by the GPU's kernels). Blocking either way."""
        code = lib().pcclAllGatherQuantized(send, recv, count, dtype, bits, block, flags,
                                            self.handle, stream)
        check("pcclAllGatherQuantized", code, self.handle)

    def reduce_scatter_quantized(self, send, recv, recvcount, dtype, bits, block,
                                 flags=0, stream=None) -> None:
        """``pcclReduceScatterQuantized`` (qgZ: quantized all-to-alls inside the node, then
        between nodes; ``flags`` may add ``PCCL_QUANT_AVERAGE`` and ``PCCL_QUANT_HALVING``
        (or ``PCCL_QUANT_PER_LEVEL``)). Memory and blocking as ``allgather_quantized``."""
        code = lib().pcclReduceScatterQuantized(send, recv, recvcount, dtype, bits, block,
                                                flags, self.handle, stream)
        check("pcclReduceScatterQuantized", code, self.handle)

    def reduce(self, send, recv, count, dtype, op, root, stream=None) -> None:
        code = lib().pcclReduce(send, recv, count, dtype, op, root, self.handle, stream)
        check("pcclReduce", code, self.handle)

    def gather(self, send, recv, sendcount, dtype, root, stream=None) -> None:
        code = lib().pcclGather(send, recv, sendcount, dtype, root, self.handle, stream)
        check("pcclGather", code, self.handle)

    def scatter(self, send, recv, recvcount, dtype, root, stream=None) -> None:
        code = lib().pcclScatter(send, recv, recvcount, dtype, root, self.handle, stream)
        check("pcclScatter", code, self.handle)

    def alltoall(self, send, recv, count, dtype, stream=None) -> None:
        code = lib().pcclAllToAll(send, recv, count, dtype, self.handle, stream)
        check("pcclAllToAll", code, self.handle)

    def alltoallv(self, send, sendcounts, sdispls, recv, recvcounts, rdispls, dtype,
                  stream=None) -> None:
        """Counts and displacements are sequences of ``size`` ints, in elements."""
        arr = _sz * self.size
        code = lib().pcclAllToAllv(send, arr(*sendcounts), arr(*sdispls), recv,
                                   arr(*recvcounts), arr(*rdispls), dtype, self.handle, stream)
        check("pcclAllToAllv", code, self.handle)

    def send(self, buf, count, dtype, peer, stream=None) -> None:
        check("pcclSend", lib().pcclSend(buf, count, dtype, peer, self.handle, stream),
              self.handle)

    def recv(self, buf, count, dtype, peer, stream=None) -> None:
        check("pcclRecv", lib().pcclRecv(buf, count, dtype, peer, self.handle, stream),
              self.handle)

    def group(self, ops, stream=None) -> None:
        """Runs ``ops`` (``("send" | "recv", ptr, count, dtype, peer)`` tuples) as one
        pcclGroupStart/pcclGroupEnd group: posted together, so rings cannot deadlock. On
        host memory (``stream`` None) it returns once all completed (raises the first
        error); on device memory it is queued on ``stream`` and returns at once."""
        check("pcclGroupStart", lib().pcclGroupStart())
        err = None
        try:
            for kind, ptr, count, dtype, peer in ops:
                if kind == "send":
                    self.send(ptr, count, dtype, peer, stream)
                else:
                    self.recv(ptr, count, dtype, peer, stream)
        except PcclError as e:
            err = e
        code = lib().pcclGroupEnd()  # always close the group (posts what was queued)
        if err is not None:
            raise err
        check("pcclGroupEnd", code, self.handle)


    def igroup(self, ops) -> "Request":
        """Posts ``ops`` (as for ``group``) as one non-blocking request
        (``pcclGroupEndAsync``), behind this rank's earlier non-blocking calls; the buffers
        must stay valid until the request completes."""
        check("pcclGroupStart", lib().pcclGroupStart())
        err = None
        try:
            for kind, ptr, count, dtype, peer in ops:
                if kind == "send":
                    self.send(ptr, count, dtype, peer)
                else:
                    self.recv(ptr, count, dtype, peer)
        except PcclError as e:
            err = e
        req = _req_t()
        code = lib().pcclGroupEndAsync(ctypes.byref(req))  # always closes the group
        if err is not None:
            if code == pcclSuccess and req.value:
                Request(self, req, "pcclGroupEndAsync").wait()
            raise err
        check("pcclGroupEndAsync", code, self.handle)
        return Request(self, req, "pcclGroupEndAsync")


class Request:
    """A pcclRequest_t: ``wait()`` (idempotent, thread-safe; frees the request) and
    ``test()`` (never blocks). Every request must be waited for once: that frees it."""

    def __init__(self, comm: Communicator, req, call: str):
        self.comm = comm
        self.req = req
        self.call = call
        self._lock = threading.Lock()
        self._done = False
        self._error = None

    def test(self) -> bool:
        """Whether the request has completed (successfully or not); never blocks: while
        another thread is inside wait(), the request is not done yet."""
        if not self._lock.acquire(blocking=False):
            return self._done
        try:
            if self._done:
                return True
            flag = _int(0)
            code = lib().pcclTest(self.req, ctypes.byref(flag))
            # An error from pcclTest itself: done (wait() reports the request's error).
            return code != pcclSuccess or bool(flag.value)
        finally:
            self._lock.release()

    def wait(self, timeout_s=None) -> bool:
        """Waits for the request and frees it; raises PcclError if it failed. With
        ``timeout_s``, returns False (the request goes on) when it has not completed by then."""
        if timeout_s is not None:
            deadline = time.monotonic() + timeout_s
            pause = 0.0
            while not self.test():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause, left))
                pause = min(0.001 if pause == 0 else pause * 2, 0.01)
        with self._lock:
            if not self._done:
                code = lib().pcclWait(self.req)
                self._done = True
                self.req = None
                if code != pcclSuccess:
                    msg = last_error(self.comm.handle) or last_error(None)
                    self._error = PcclError(self.call, code, msg)
            if self._error is not None:
                raise self._error
        return True
