"""ctypes loader and thin wrappers for the PCCL C ABI (include/pccl.h).

The shared library is found, in this order, at:
  1. ``$PCCL_LIBRARY`` (a path to ``libpccl.so``);
  2. ``$CARGO_TARGET_DIR/{release,debug}`` when that is set, then the repository's
     ``target/release`` and ``target/debug`` (this package lives in ``<repo>/ffi/python/pccl``);
  3. next to this package (``pccl/libpccl.so``);
  4. the system loader path (``ctypes.util.find_library("pccl")``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
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
}

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
    dirs = []
    tdir = os.environ.get("CARGO_TARGET_DIR")
    if tdir:  # where cargo builds when it is set
        dirs.append(Path(tdir) if Path(tdir).is_absolute() else repo / tdir)
    dirs.append(repo / "target")
    for d in dirs:
        for sub in ("release", "debug"):
            for n in names:
                yield d / sub / n
    for n in names:
        yield here / n


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


def version() -> int:
    v = _int(0)
    check("pcclGetVersion", lib().pcclGetVersion(ctypes.byref(v)))
    return v.value


def has_mpi() -> bool:
    return hasattr(lib(), "pcclCommInitMPIWorld")


def get_unique_id() -> bytes:
    uid = pcclUniqueId()
    check("pcclGetUniqueId", lib().pcclGetUniqueId(ctypes.byref(uid)))
    return uid.to_bytes()


class Communicator:
    """An owning handle of a pcclComm_t."""

    def __init__(self, handle: int):
        self.handle = ctypes.c_void_p(handle)
        n = _int(0)
        r = _int(0)
        check("pcclCommCount", lib().pcclCommCount(self.handle, ctypes.byref(n)), self.handle)
        check("pcclCommUserRank", lib().pcclCommUserRank(self.handle, ctypes.byref(r)), self.handle)
        self.size = n.value
        self.rank = r.value

    @classmethod
    def init_rank(cls, nranks: int, uid: bytes, rank: int) -> "Communicator":
        c = _comm_t()
        code = lib().pcclCommInitRank(ctypes.byref(c), nranks, pcclUniqueId.from_bytes(uid), rank)
        check("pcclCommInitRank", code)
        return cls(c.value)

    @classmethod
    def init_mpi_world(cls) -> "Communicator":
        if not has_mpi():
            raise RuntimeError("pccl: this libpccl has no pcclCommInitMPIWorld")
        c = _comm_t()
        check("pcclCommInitMPIWorld", lib().pcclCommInitMPIWorld(ctypes.byref(c)))
        return cls(c.value)

    def destroy(self) -> None:
        if self.handle is not None and self.handle.value:
            h = self.handle
            self.handle = None
            check("pcclCommDestroy", lib().pcclCommDestroy(h))

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


class Request:
    """A pcclRequest_t: ``wait()`` (idempotent, thread-safe) and ``test()``."""

    def __init__(self, comm: Communicator, req, call: str):
        self.comm = comm
        self.req = req
        self.call = call
        self._lock = threading.Lock()
        self._done = False
        self._error = None

    def test(self) -> bool:
        # Never blocks: while another thread is inside wait(), the request is not done yet.
        if not self._lock.acquire(blocking=False):
            return self._done
        try:
            if self._done:
                return True
            flag = _int(0)
            check("pcclTest", lib().pcclTest(self.req, ctypes.byref(flag)), self.comm.handle)
            return bool(flag.value)
        finally:
            self._lock.release()

    def wait(self) -> None:
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
