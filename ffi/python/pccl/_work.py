"""The Work objects of the torch backend and the in-flight registry behind them: a
:class:`PcclWork` is a view of an operation (:class:`_Op`) that the registry owns from issue
to completion, so a Work dropped without ``wait()`` frees nothing the library still uses."""

from __future__ import annotations

import atexit
import threading
import time

import torch
import torch.distributed as dist

from . import _streams
from ._streams import DeviceRequest

class PcclTimeoutError(RuntimeError):
    """``Work.wait(timeout)`` ran out of time; the operation goes on (safely) in the
    background and is finished later (see :func:`inflight`)."""


def _seconds(timeout):
    """A torch timeout (timedelta, seconds or milliseconds-as-timedelta) in seconds; None for
    none (torch's ``kNoTimeout`` is 0)."""
    if timeout is None:
        return None
    if hasattr(timeout, "total_seconds"):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return s if s > 0 else None


class _DoneOp:
    """The operation of a synchronous call, finished when its Work is made (no lock, no
    registry: the cheap form of :class:`_Op` for the common case)."""

    __slots__ = ("result", "call", "seq")
    requests = ()
    keep = ()
    post = None
    finished = True
    error = None

    def __init__(self, result, call, seq):
        self.result = result
        self.call = call
        self.seq = seq

    @staticmethod
    def test() -> bool:
        return True

    @staticmethod
    def finish(blocking=True, timeout=-1) -> bool:
        return True


class _Op:
    """What one issued operation needs until it ends: its PCCL requests, the tensors their
    buffers belong to, the copy-back to run afterwards. Owned by the in-flight registry
    (:data:`_INFLIGHT`) from issue to completion, so a :class:`PcclWork` dropped without
    ``wait()`` frees nothing the worker thread still writes to; completed operations are
    reaped (``pcclWait``, which frees the request) on later calls and at exit."""

    __slots__ = ("requests", "keep", "post", "result", "call", "lock", "finished", "error",
                 "seq", "__weakref__")

    def __init__(self, requests, keep, post, result, call, seq):
        self.requests = list(requests)
        self.keep = list(keep)
        self.post = post
        self.result = result if result is not None else []
        self.call = call
        self.lock = threading.Lock()
        self.finished = False
        self.error = None
        self.seq = seq

    def test(self) -> bool:
        return self.finished or all(r.test() for r in self.requests)

    def finish(self, blocking=True, timeout=-1) -> bool:
        """Waits for the requests (frees them), runs the copy-back, releases the tensors and
        leaves the registry. Returns False when another thread holds it and this call does
        not block (or ``timeout`` seconds pass first)."""
        if not self.lock.acquire(blocking, timeout if blocking else -1):
            return False
        try:
            if not self.finished:
                try:
                    err = None
                    for r in self.requests:  # wait for every one (frees them), first error wins
                        if isinstance(r, DeviceRequest):
                            continue  # below, once per stream
                        try:
                            r.wait()
                        except BaseException as e:  # noqa: BLE001
                            err = err or e
                    try:
                        _streams.wait_last(self.requests)
                    except BaseException as e:  # noqa: BLE001
                        err = err or e
                    if err is not None:
                        raise err
                    if self.post is not None:
                        self.post()
                except BaseException as e:  # surfaced to every waiter
                    self.error = e
                self.finished = True
                self.requests = []
                self.keep = []
                self.post = None
                _unregister(self)
            return True
        finally:
            self.lock.release()


# In-flight operations, in issue order: id(op) -> op.
_INFLIGHT: dict = {}
_INFLIGHT_LOCK = threading.Lock()


def _register(op: _Op) -> None:
    with _INFLIGHT_LOCK:
        _INFLIGHT[id(op)] = op


def _unregister(op: _Op) -> None:
    with _INFLIGHT_LOCK:
        _INFLIGHT.pop(id(op), None)


def inflight() -> int:
    """How many issued operations have not been finished (waited for or reaped) yet."""
    return len(_INFLIGHT)


# How long reap() waits for another thread that is finishing an ended operation.
_FINISHING_S = 5.0


def reap() -> int:
    """Finishes every in-flight operation that has completed, without blocking (frees its
    requests and tensors); returns how many remain in flight."""
    with _INFLIGHT_LOCK:
        ops = list(_INFLIGHT.values())
    for op in ops:
        try:
            if op.test():
                # Its requests have ended, so whoever else holds it (a future's thread, a
                # wait() on another thread) is only finishing it: wait for that, briefly,
                # rather than count it as still in flight.
                op.finish(timeout=_FINISHING_S)
        except BaseException:  # noqa: BLE001 (kept on the op for a later wait())
            pass
    return len(_INFLIGHT)


def drain() -> None:
    """Waits for every in-flight operation (each ends by the communicator's timeout, or
    within a second of an abort). Run at exit so no buffer is freed under the worker."""
    while True:
        with _INFLIGHT_LOCK:
            ops = list(_INFLIGHT.values())
        if not ops:
            return
        for op in ops:
            op.finish()


atexit.register(drain)


def _on_device(op) -> bool:
    """Whether an unfinished operation is made of device collectives only."""
    reqs = op.requests
    return bool(reqs) and all(isinstance(r, DeviceRequest) for r in reqs)


class PcclWork(dist._Work):
    """Work of one (or several) PCCL requests. The operation itself lives in the in-flight
    registry until it ends, so dropping the Work is safe."""

    def __init__(self, requests=(), keep=(), post=None, result=None, call="", seq=0,
                 backend=None, op=None):
        super().__init__()
        self._backend = backend
        self._future = None
        if op is not None:  # shares an operation already registered (a p2p batch)
            self._op = op
            return
        self._op = _Op(requests, keep, post, result, call, seq)
        if self._op.requests:
            _register(self._op)
        else:
            self._op.finish()

    @classmethod
    def _completed(cls, result, call, seq, backend):
        """The Work of an operation that already ended (a synchronous call)."""
        w = cls.__new__(cls)
        dist._Work.__init__(w)
        w._backend = backend
        w._future = None
        w._op = _DoneOp(result, call, seq)
        return w

    # The pieces the coalesced calls merge (see all_gather_single_coalesced).
    @property
    def _requests(self):
        return self._op.requests

    @property
    def _keep(self):
        return self._op.keep

    @property
    def _post(self):
        return self._op.post

    @property
    def _finished(self):
        return self._op.finished

    def _raise(self):
        if self._op.error is not None:
            raise self._op.error

    def wait(self, timeout=None):
        """Waits for the operation; raises its error. ``timeout`` (a timedelta or seconds;
        default: the group's timeout when one was set with ``set_timeout`` after the
        communicator was made, else the communicator's own, PCCL_TIMEOUT) raises
        :class:`PcclTimeoutError` when it passes, leaving the operation running safely."""
        op = self._op
        if op.finished:  # a synchronous call's Work (torch waits on it): nothing to wait for
            if op.error is not None:
                raise op.error
            return True
        secs = _seconds(timeout)
        if secs is None and self._backend is not None:
            secs = self._backend._wait_timeout_s()
        if _on_device(op):
            # torch's semantics: the current stream waits for the collective, the host does
            # not (synchronize() does).
            secs = None
        if not op.finished and secs is not None:
            deadline = time.monotonic() + secs
            pause = 0.0
            while not op.test():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PcclTimeoutError(
                        f"pccl: {op.call or 'operation'} (sequence number {op.seq}) did not "
                        f"complete within {secs:g} s; it goes on in the background")
                time.sleep(min(pause, left))
                pause = min(0.0005 if pause == 0 else pause * 2, 0.01)
        op.finish()
        self._raise()
        return True

    def synchronize(self):
        """Waits on the host until the operation ended (device collectives included), then
        finishes it as ``wait()`` does; raises its error. Bounded by the group's timeout."""
        op = self._op
        secs = self._backend._wait_timeout_s() if self._backend is not None else None
        for r in list(op.requests):
            if isinstance(r, DeviceRequest):
                try:
                    r.synchronize(secs)
                except TimeoutError as e:
                    raise PcclTimeoutError(f"{e} (sequence number {op.seq})") from None
        return self.wait()

    def is_completed(self):
        op = self._op
        if op.finished:
            return True
        try:
            done = op.test()
        except BaseException:  # noqa: BLE001
            done = True
        if done:
            op.finish()  # completes at once (runs any copy-back); an error stays for wait()
            return True
        return False

    def is_success(self):
        return self._op.finished and self._op.error is None

    def exception(self):
        return self._op.error

    def result(self):
        self.wait()
        return self._op.result

    def _get_sequence_number(self):
        return self._op.seq

    def get_future(self):
        if self._future is not None:
            return self._future
        fut = torch.futures.Future()
        self._future = fut
        op = self._op

        def run():
            try:
                if _on_device(op):  # the future completes once the device work ended
                    self.synchronize()
                op.finish()
                if op.error is not None:
                    raise op.error
                fut.set_result(op.result)
            except BaseException as e:
                fut.set_exception(e)

        try:
            done = op.finished or op.test()
        except BaseException:  # noqa: BLE001 (finish() reports it)
            done = True
        if done:  # already over: complete now (is_completed through torch's wrapper asks this)
            run()
        else:
            # Not a daemon: the interpreter's shutdown waits for it (its wait ends by the
            # collective's deadline at the latest). A daemon thread completing its future while
            # the interpreter finalised was killed inside torch's C++ (`set_result` releases the
            # GIL) and aborted the process after its work was done ("terminate called without
            # an active exception", seen once in CI on the fake-ROCm async test, 2026-12-02).
            threading.Thread(target=run, name="pccl-future", daemon=False).start()
        return fut


def _done_work(result=None, backend=None):
    return PcclWork(result=result, backend=backend)

