"""Point-to-point of the torch backend: ``send``/``recv`` (torch's ``isend``/``irecv`` and
``batch_isend_irecv``) and their Works.

Sends and receives are queued on the backend and posted together, as one
pcclGroupStart/pcclGroupEnd group: a send or receive outside a batch at once, a batch that
torch coalesces at its end; with an older libpccl, when one of their Works is waited for or
polled, or before any other call on the group. So the separate isend/irecv of a ring cannot
deadlock; ``dist.send``/``dist.recv`` wait at once.

On CUDA (or HIP) tensors a batch is queued on PCCL's stream of the device, after the current
stream, as a collective is (``_streams.issue``): its Works make the current stream wait for it
(``wait()``), the host never waits. A batch that mixes devices, or device and host tensors,
goes through host copies instead.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from . import _streams
from ._tensors import _device_of, _dtype, _ptr
from ._work import _Op, _register


class _Pending:
    """One queued send or receive: its contiguous buffer (``post`` copies a receive back into
    a non-contiguous tensor), and the device of the buffer (None: host memory)."""

    __slots__ = ("kind", "buf", "count", "dtype", "peer", "post", "work", "dev")

    def __init__(self, kind, buf, count, dtype, peer, post, work, dev):
        self.kind = kind
        self.buf = buf
        self.count = count
        self.dtype = dtype
        self.peer = peer
        self.post = post
        self.work = work
        self.dev = dev

    def op(self):
        """The ``(kind, ptr, count, dtype, peer)`` tuple of ``_lib``'s group calls."""
        return (self.kind, _ptr(self.buf), self.count, self.dtype, self.peer)

    def on_host(self):
        """This one through host memory: a host copy of a device send, a host buffer (copied
        back after) for a device receive."""
        if self.dev is None:
            return self
        if self.kind == "send":
            buf, post = self.buf.detach().to("cpu").contiguous(), None
        else:
            buf = torch.empty(self.buf.shape, dtype=self.buf.dtype, device="cpu")
            dev_buf, back = self.buf, self.post

            def post():
                dev_buf.copy_(buf)
                if back is not None:
                    back()
        return _Pending(self.kind, buf, self.count, self.dtype, self.peer, post, self.work,
                        None)


class _P2PWork(dist._Work):
    """Work of a send or receive. Posted without blocking (torch >= 2.12: at once, or at the
    end of its batch) it shares the batch's in-flight operation; queued (torch <= 2.11),
    waiting for it (or polling it) posts every queued send and receive of its group as one
    PCCL group and completes them all."""

    def __init__(self, backend, call, seq, result):
        super().__init__()
        self._backend = backend
        self._call = call
        self._seq = seq
        self._result = result
        self._event = threading.Event()
        self._error = None
        self._op = None  # the posted batch, when posted without blocking (see _flush_p2p)
        self._future = None

    def _complete(self, err):
        self._error = err
        self._event.set()

    def _attach(self, op):
        self._op = op
        self._event.set()

    def _run(self):
        if not self._event.is_set():
            self._backend._flush_p2p()
            self._event.wait()
        op = self._op
        if op is not None:
            op.finish()
            if self._error is None:
                self._error = op.error

    def wait(self, timeout=None):
        self._run()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if self._op is None and not self._event.is_set():
            if self._backend._coalescing:
                return False  # queued in an open batch (posted at its end)
            # Posts the queued group: device memory queued on the stream (never blocks), host
            # memory of an older libpccl blocking (else it would never start).
            self._backend._flush_p2p()
        op = self._op
        if op is not None:  # posted: poll, never block
            try:
                if not op.test():
                    return False
            except BaseException:  # noqa: BLE001
                pass
            self._run()
            return True
        self._run()
        return True

    def is_success(self):
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def _get_sequence_number(self):
        return self._seq

    def get_future(self):
        """A future completed when the send or receive is (at once when it already is, else
        by a helper thread that waits for it); torch's wrapper asks it for ``is_completed``."""
        if self._future is not None:
            return self._future
        fut = torch.futures.Future()
        self._future = fut

        def run():
            try:
                self.wait()
                fut.set_result(self._result)
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

        if self.is_completed():
            run()
        else:
            threading.Thread(target=run, name="pccl-p2p-future", daemon=True).start()
        return fut


class P2PMixin:
    """The point-to-point methods of :class:`pccl.torch.PcclBackend`."""

    def _p2p(self, kind, tensors, peer, call):
        if len(tensors) != 1:
            raise ValueError(f"pccl: {call} takes one tensor")
        t = tensors[0]
        dev = _device_of([t], call)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"pccl: {call}: peer {peer} is not another rank of the group of "
                             f"{self.size()}")
        dt = _dtype(t, call)
        if not _streams.is_device(dev):
            dev = None
            buf, post = (self._host_in(t), None) if kind == "send" else self._host_out(t)
        elif kind == "send":
            buf, post = t.contiguous(), None
        else:
            buf, post = self._out_buffer(t)
        work = _P2PWork(self, call, self._next_seq(), [t])
        with self._p2p_lock:
            self._p2p_pending.append(_Pending(kind, buf, t.numel(), dt, peer, post, work, dev))
        # Outside a batch: posted at once (NCCL's order semantics). Device sends and receives
        # of a torch that does not coalesce batches (2.11) wait for their Work to be waited
        # for or polled, or for the group's next call, so that a batch's sends and receives
        # are one group on the stream: posted one by one, a ring of them would run in series
        # on each rank's stream and could wait on each other.
        if self._async_p2p and not self._coalescing and (
                dev is None or self.supports_coalescing):
            self._flush_p2p()
        return work

    def send(self, tensors, dst, tag=0):
        return self._p2p("send", tensors, dst, "send")

    def recv(self, tensors, src, tag=0):
        return self._p2p("recv", tensors, src, "recv")

    def _flush_p2p(self):
        """Posts the queued sends and receives as one group: on a device, queued on PCCL's
        stream; on host memory without blocking where torch coalesces (the group's operation,
        shared by their Works, is returned), else blocking, completing their Works."""
        if not self._p2p_pending:  # the common case, without taking the locks
            return None
        with self._p2p_flush_lock:
            with self._p2p_lock:
                pending, self._p2p_pending = self._p2p_pending, []
            if not pending:
                return None
            devices = {str(e.dev) for e in pending}
            if len(devices) == 1 and pending[0].dev is not None:
                return self._post_device_p2p(pending, pending[0].dev)
            pending = [e.on_host() for e in pending]
            if self._async_p2p:
                return self._post_p2p(pending)
            err = None
            try:
                ops = [e.op() for e in pending if e.count]
                if ops:
                    self._live().group(ops)
                for e in pending:
                    if e.post is not None:
                        e.post()
            except BaseException as e:  # noqa: BLE001 (every Work of the group reports it)
                err = e
            for e in pending:
                e.work._complete(err)

    def _attach_all(self, pending, reqs, call):
        """An operation of ``reqs`` for the batch ``pending``, attached to its every Work."""
        works = [e.work for e in pending]
        result = [r for w in works for r in w._result]
        keep = [e.buf for e in pending] + result
        post = self._chain(*[e.post for e in pending])
        op = _Op(reqs, keep, post, result, call, works[-1]._seq)
        if reqs:
            _register(op)
        else:
            op.finish()
        for w in works:
            w._attach(op)
        return op

    @staticmethod
    def _batch_name(pending):
        return pending[0].work._call if len(pending) == 1 else "batch_isend_irecv"

    def _post_p2p(self, pending):
        """One non-blocking PCCL group for ``pending`` (host memory); its operation (in
        flight) is attached to every Work of the batch."""
        try:
            ops = [e.op() for e in pending if e.count]
            reqs = [self._live().igroup(ops)] if ops else []
        except BaseException as e:  # noqa: BLE001 (every Work of the batch reports it)
            for p in pending:
                p.work._complete(e)
            return None
        return self._attach_all(pending, reqs, self._batch_name(pending))

    def _post_device_p2p(self, pending, dev):
        """The batch ``pending`` (device memory of ``dev``) as one PCCL group queued on PCCL's
        stream of the device after the current stream; its Works make the current stream wait
        for it."""
        call = self._batch_name(pending)
        ops = [e.op() for e in pending if e.count]
        try:
            reqs = []
            if ops:
                comm = self._device_comm(dev)

                def launch(stream):
                    with _streams.device_context(dev):
                        comm.group(ops, stream)

                n = sum(e.count for e in pending)
                reqs = [_streams.issue(comm, self._dev_streams, dev, call, launch,
                                       f"pccl:{call} ({n} elements)")]
                _streams.keep_alive(reqs, [e.buf for e in pending])
        except BaseException as e:  # noqa: BLE001 (every Work of the batch reports it)
            for p in pending:
                p.work._complete(e)
            return None
        return self._attach_all(pending, reqs, call)
