"""Device collectives of the torch backend with torch's stream semantics (those of
ProcessGroupNCCL).

Each collective on CUDA (or HIP) tensors runs on PCCL's own stream of the device, after an
event recorded on the caller's current stream; its end is an event recorded on PCCL's stream
after the library queued it (the library orders the collective on the stream it is given, as
NCCL does). A synchronous call (``async_op=False``) makes the current stream wait for that
event; with ``async_op=True`` nothing waits until ``work.wait()``, which makes the stream
current *then* wait. The tensors are marked used by PCCL's stream (``record_stream``), so the
caching allocator does not hand their memory out before the collective ended. Nothing here
waits on the host except ``synchronize()``.

A collective that fails in the library keeps the stream it was queued on held (work that
depends on its output never runs on a wrong result) and shows as the communicator's
asynchronous error: ``wait()``, ``is_completed()`` and ``synchronize()`` raise it.

``STREAMS`` (with ``is_device`` and ``device_context``) is the seam between this and
torch.cuda: the tests of the fake ROCm runtime (whose "device" tensors are CPU tensors) put
streams and events of the fake in its place.
"""

from __future__ import annotations

import time

import torch

from . import _lib


class TorchStreams:
    """torch.cuda's streams and events (on torch's ROCm build, HIP's)."""

    @staticmethod
    def current(dev):
        return torch.cuda.current_stream(dev)

    @staticmethod
    def new_stream(dev):
        return torch.cuda.Stream(device=dev)

    @staticmethod
    def new_event():
        return torch.cuda.Event()

    @staticmethod
    def handle(stream) -> int:
        """The raw cudaStream_t / hipStream_t; the legacy default stream (0, which the C ABI
        reads as "host memory") as cudaStreamLegacy (1)."""
        h = stream.cuda_stream
        return h if h else 1

    @staticmethod
    def keep_alive(tensor, stream) -> None:
        if tensor.device.type != "cpu":
            tensor.record_stream(stream)

    @staticmethod
    def capturing(dev) -> bool:
        with torch.cuda.device(dev):
            return torch.cuda.is_current_stream_capturing()


STREAMS = TorchStreams()


# Where a tensor lives, and which runtime its streams belong to: with STREAMS, the seams the
# fake-runtime tests replace (their "device" tensors are CPU tensors).

def device_runtime() -> int:
    """The runtime of torch's "cuda" tensors: HIP on torch's ROCm build (``torch.version.hip``
    set; its HIP tensors are called "cuda"), CUDA otherwise."""
    return _lib.pcclRuntimeHip if getattr(torch.version, "hip", None) else _lib.pcclRuntimeCuda


def is_device(dev: torch.device) -> bool:
    """Whether tensors on ``dev`` are GPU memory (CUDA, or HIP on torch's ROCm build)."""
    return dev.type != "cpu"


def device_context(dev: torch.device):
    """Makes ``dev`` torch's current device for the call."""
    return torch.cuda.device(dev)


class DeviceStreams:
    """PCCL's stream per device of one process group (made on first use)."""

    def __init__(self):
        self._streams = {}

    def of(self, dev):
        key = str(dev)
        s = self._streams.get(key)
        if s is None:
            s = STREAMS.new_stream(dev)
            self._streams[key] = s
        return s


class DeviceRequest:
    """The request of one device collective: its end event on PCCL's stream."""

    __slots__ = ("comm", "dev", "stream", "end", "call")

    def __init__(self, comm, dev, stream, end, call):
        self.comm = comm
        self.dev = dev
        self.stream = stream
        self.end = end
        self.call = call

    def check(self) -> None:
        """Raises the communicator's asynchronous error, if a queued collective failed."""
        err = self.comm.async_error() if self.comm.handle is not None else None
        if err is not None:
            raise err

    def wait(self) -> None:
        """torch's ``work.wait()``: the current stream waits (on the device) for the end."""
        self.check()
        STREAMS.current(self.dev).wait_event(self.end)

    def test(self) -> bool:
        """Whether the collective ended (an error when it failed)."""
        self.check()
        return bool(self.end.query())

    def synchronize(self, timeout_s) -> None:
        """Waits on the host for the end; the error when it failed, a timeout error when it
        has not ended within ``timeout_s`` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.0
        while not self.test():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pccl: {self.call} did not end on the device within "
                                   f"{timeout_s:g} s")
            time.sleep(pause)
            pause = min(0.0002 if pause == 0 else pause * 2, 0.005)


def issue(comm, streams: DeviceStreams, dev, call: str, launch, label: str):
    """Queues one device collective: PCCL's stream waits for the current stream, ``launch``
    (given the raw stream handle) calls the library, the end event is recorded; returns
    its :class:`DeviceRequest`. A stream capturing a CUDA graph is refused with a clear
    error before anything is queued."""
    if STREAMS.capturing(dev):
        raise RuntimeError(
            f"pccl: {call}: the current stream is capturing a CUDA graph; PCCL's device "
            "collectives run their inter-rank part on the host and cannot be captured: issue "
            "it outside torch.cuda.graph()")
    s = streams.of(dev)
    with torch.autograd.profiler.record_function(label):
        s.wait_stream(STREAMS.current(dev))
        launch(STREAMS.handle(s))
        end = STREAMS.new_event()
        end.record(s)
    return DeviceRequest(comm, dev, s, end, call)


def wait_last(requests) -> None:
    """The current stream waits for the device requests among ``requests``: for the last one
    of each PCCL stream only (one wait per coalesced group: the stream runs them in order)."""
    last = {}
    for r in requests:
        if isinstance(r, DeviceRequest):
            last[id(r.stream)] = r
    for r in last.values():
        r.wait()


def keep_alive(requests, tensors) -> None:
    """Marks the device tensors of an operation as used by the streams of its requests."""
    streams = [r.stream for r in requests if isinstance(r, DeviceRequest)]
    if not streams:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor):
            for s in streams:
                STREAMS.keep_alive(t, s)
