"""Rooted collectives and all-to-all of the torch backend: ``reduce``, ``gather``,
``scatter``, ``all_to_all_single`` (even and uneven splits) and ``alltoall``.

On CUDA (or HIP) tensors each is queued on PCCL's stream of the device after the current
stream's work, as the other collectives are (``PcclBackend._start``, ``_streams``): no host
copies, nothing blocks the host. On CPU tensors, ``pcclReduce``/``Gather``/``Scatter``/
``AllToAll(v)`` are blocking calls: they run on the calling thread (after the communicator's
earlier non-blocking requests and any queued sends and receives) and return a completed Work,
also for ``async_op=True``. A libpccl without the rooted entry points falls back to the
emulations on the backend (``_reduce_emulated`` and the others).
"""

from __future__ import annotations

import torch

from . import _lib, _streams
from ._tensors import _FAST_DTYPES, _device_of, _dtype, _ptr
from ._work import PcclWork


class RootedMixin:
    """The rooted collectives and all-to-all of :class:`pccl.torch.PcclBackend`."""

    def _blocking(self, opts, call, fn, result):
        """Runs blocking C call ``fn`` (after any pending sends/receives) and returns a
        completed Work for ``result``."""
        self._flush_p2p()
        self._live()
        fn()
        return PcclWork._completed(result, call, self._next_seq(), self)

    @staticmethod
    def _host_in(t: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor with t's data (t itself when it already is one)."""
        return t.contiguous() if t.device.type == "cpu" else t.detach().to("cpu").contiguous()

    @staticmethod
    def _host_out(t: torch.Tensor):
        """A contiguous host buffer for output t, and the copy-back (or None)."""
        if t.device.type == "cpu" and t.is_contiguous():
            return t, None
        buf = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        return buf, (lambda: t.copy_(buf))

    @staticmethod
    def _has(name):
        return _lib.has(name)

    def reduce(self, tensors, opts):
        call = "reduce"
        if not self._has("pcclReduce"):
            return self._reduce_emulated(tensors, opts)
        dev = _device_of(tensors, call)
        root = opts.rootRank
        if len(tensors) != 1:
            raise ValueError(f"pccl: {call} takes one tensor per process")
        t = tensors[0]
        if t.numel() == 0:
            return self._done(opts, list(tensors))
        dt = _dtype(t, call)
        op, factor = self._op(opts.reduceOp, t.dtype, call)
        me = self.rank()
        if _streams.is_device(dev):  # queued on PCCL's stream (see _start)
            buf, copy_back = self._out_buffer(t)
            if factor is not None:
                buf.copy_(self._premul(buf, factor))
            req = self._start("reduce", dev, _ptr(buf), _ptr(buf), buf.numel(), dt, op, root)
            post = copy_back if me == root else None
            return self._issue(opts, [req], [buf, t], post, list(tensors), call)
        buf, copy_back = self._host_out(t)
        if buf is not t:
            buf.copy_(t)
        if factor is not None:
            buf.copy_(self._premul(buf, factor))

        def run():
            self._live().reduce(_ptr(buf), _ptr(buf), buf.numel(), dt, op, root)
            if me == root and copy_back is not None:
                copy_back()

        return self._blocking(opts, call, run, list(tensors))

    def gather(self, output_tensors, input_tensors, opts):
        call = "gather"
        if not self._has("pcclGather"):
            return self._gather_emulated(output_tensors, input_tensors, opts)
        if len(input_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one input tensor per process")
        inp = input_tensors[0]
        root = opts.rootRank
        me = self.rank()
        outs = output_tensors[0] if (me == root and output_tensors) else []
        dev = _device_of([inp, *outs], call)
        n = inp.numel()
        if me == root:
            if len(outs) != self.size():
                raise ValueError(f"pccl: {call}: needs {self.size()} output tensors on the "
                                 f"root, got {len(outs)}")
            for o in outs:
                if o.numel() != n or o.dtype != inp.dtype:
                    raise ValueError(f"pccl: {call}: every output must match the input's size "
                                     "and dtype")
        if n == 0:
            return self._done(opts, output_tensors)
        dt = _dtype(inp, call)
        if _streams.is_device(dev):  # queued on PCCL's stream (see _start)
            src = inp.contiguous()
            flat = (torch.empty(n * self.size(), dtype=inp.dtype, device=inp.device)
                    if me == root else None)
            req = self._start("gather", dev, _ptr(src),
                              _ptr(flat) if flat is not None else None, n, dt, root)

            def copy_out():
                for i, o in enumerate(outs):
                    o.copy_(flat.narrow(0, i * n, n).view(o.shape))

            keep = [src, inp, *outs] + ([flat] if flat is not None else [])
            return self._issue(opts, [req], keep, copy_out, output_tensors, call)
        src = self._host_in(inp)
        flat = torch.empty(n * self.size(), dtype=inp.dtype) if me == root else None

        def run():
            self._live().gather(_ptr(src), _ptr(flat) if flat is not None else None, n, dt,
                                root)
            for i, o in enumerate(outs):
                o.copy_(flat.narrow(0, i * n, n).view(o.shape))

        return self._blocking(opts, call, run, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        call = "scatter"
        if not self._has("pcclScatter"):
            return self._scatter_emulated(output_tensors, input_tensors, opts)
        if len(output_tensors) != 1:
            raise ValueError(f"pccl: {call} takes one output tensor per process")
        out = output_tensors[0]
        root = opts.rootRank
        me = self.rank()
        ins = input_tensors[0] if (me == root and input_tensors) else []
        dev = _device_of([out, *ins], call)
        n = out.numel()
        if me == root:
            if len(ins) != self.size():
                raise ValueError(f"pccl: {call}: needs {self.size()} input tensors on the "
                                 f"root, got {len(ins)}")
            for t in ins:
                if t.numel() != n or t.dtype != out.dtype:
                    raise ValueError(f"pccl: {call}: every input must match the output's size "
                                     "and dtype")
        if n == 0:
            return self._done(opts, output_tensors)
        dt = _dtype(out, call)
        if _streams.is_device(dev):  # queued on PCCL's stream (see _start)
            flat = torch.cat([t.reshape(-1) for t in ins]) if me == root else None
            buf, copy_back = self._out_buffer(out)
            req = self._start("scatter", dev, _ptr(flat) if flat is not None else None,
                              _ptr(buf), n, dt, root)
            keep = [buf, out] + ([flat] if flat is not None else [])
            return self._issue(opts, [req], keep, copy_back, output_tensors, call)
        flat = (torch.cat([self._host_in(t).reshape(-1) for t in ins]) if me == root else None)
        buf, copy_back = self._host_out(out)

        def run():
            self._live().scatter(_ptr(flat) if flat is not None else None, _ptr(buf), n, dt,
                                 root)
            if copy_back is not None:
                copy_back()

        return self._blocking(opts, call, run, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        call = "all_to_all_single"
        if not output_split_sizes and not input_split_sizes and self._c_alltoall is not None:
            h = self._fast_handle(opts, output, input)
            if h is not None:
                dt = _FAST_DTYPES.get(input.dtype)
                total = input.numel()
                p = self.size()
                src, dst = input.data_ptr(), output.data_ptr()
                if dt is not None and output.dtype == input.dtype and total and \
                        output.numel() == total and total % p == 0 and src != dst:
                    code = self._c_alltoall(src, dst, total // p, dt, h, None)
                    return self._fast_done(code, call, "pcclAllToAll", h, [output])
        dev = _device_of([output, input], call)
        if output.dtype != input.dtype:
            raise TypeError(f"pccl: {call}: output dtype {output.dtype} != input {input.dtype}")
        p = self.size()
        dt = _dtype(input, call)
        even = not output_split_sizes and not input_split_sizes
        if (_streams.is_device(dev) and even and input.numel() == output.numel()
                and input.numel() % p == 0 and input.numel()):
            # Queued on PCCL's stream (see _start); uneven splits go through the host below.
            src = input.contiguous()
            buf, copy_back = self._out_buffer(output)
            if buf.data_ptr() == src.data_ptr():  # the buffers must not overlap
                src = src.clone()
            req = self._start("alltoall", dev, _ptr(src), _ptr(buf), src.numel() // p, dt)
            return self._issue(opts, [req], [src, buf, input, output], copy_back, [output],
                               call)
        out_split = list(output_split_sizes or [])
        in_split = list(input_split_sizes or [])
        if not out_split and not in_split:
            if input.numel() != output.numel() or input.numel() % p:
                raise ValueError(f"pccl: {call}: input ({input.numel()}) and output "
                                 f"({output.numel()}) must have the same number of elements, "
                                 f"a multiple of {p}")
            n = input.numel() // p
            src = self._host_in(input)
            buf, copy_back = self._host_out(output)
            if buf.data_ptr() == src.data_ptr() and src.numel():  # must not overlap
                src = src.clone()

            def run():
                if n:
                    self._live().alltoall(_ptr(src), _ptr(buf), n, dt)
                if copy_back is not None:
                    copy_back()

            return self._blocking(opts, call, run, [output])

        def counts(t, split, which):
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if not split:
                if rows % p:
                    raise ValueError(f"pccl: {call}: {which} dim 0 ({rows}) is not a multiple "
                                     f"of {p} and no split sizes were given")
                split = [rows // p] * p
            if len(split) != p or sum(split) != rows:
                raise ValueError(f"pccl: {call}: {which} split sizes {split} do not cover dim "
                                 f"0 ({rows}) in {p} parts")
            c = [int(s) * row for s in split]
            d = [sum(c[:i]) for i in range(p)]
            return c, d

        sc, sd = counts(input, in_split, "input")
        rc, rd = counts(output, out_split, "output")
        if _streams.is_device(dev):
            return self._alltoallv_device(opts, call, dev, input, output, sc, sd, rc, rd, dt)
        src = self._host_in(input)
        buf, copy_back = self._host_out(output)
        if buf.data_ptr() == src.data_ptr() and src.numel():  # the buffers must not overlap
            src = src.clone()

        def run():
            self._live().alltoallv(_ptr(src), sc, sd, _ptr(buf), rc, rd, dt)
            if copy_back is not None:
                copy_back()

        return self._blocking(opts, call, run, [output])

    def _alltoallv_device(self, opts, call, dev, input, output, sc, sd, rc, rd, dt,
                          post=None, result=None):
        """An uneven all-to-all of device tensors queued on PCCL's stream (``pcclAllToAllv``
        with a stream): no host copies; ``post`` runs after it (on the current stream)."""
        src = input.contiguous()
        buf, copy_back = self._out_buffer(output)
        if buf.data_ptr() == src.data_ptr() and src.numel():  # the buffers must not overlap
            src = src.clone()
        req = self._start("alltoallv", dev, _ptr(src), sc, sd, _ptr(buf), rc, rd, dt,
                          elements=sum(rc))
        return self._issue(opts, [req], [src, buf, input, output],
                           self._chain(copy_back, post), result or [output], call)

    def alltoall(self, output_tensors, input_tensors, opts):
        call = "all_to_all"
        p = self.size()
        dev = _device_of([*output_tensors, *input_tensors], call)
        if len(output_tensors) != p or len(input_tensors) != p:
            raise ValueError(f"pccl: {call}: needs {p} input and {p} output tensors")
        dtype = input_tensors[0].dtype
        if any(t.dtype != dtype for t in [*output_tensors, *input_tensors]):
            raise TypeError(f"pccl: {call}: all tensors must have one dtype")
        dt = _dtype(input_tensors[0], call)
        sc = [t.numel() for t in input_tensors]
        rc = [t.numel() for t in output_tensors]
        sd = [sum(sc[:i]) for i in range(p)]
        rd = [sum(rc[:i]) for i in range(p)]
        if _streams.is_device(dev):
            # One uneven all-to-all of the concatenated tensors on PCCL's stream; the blocks
            # are copied into the outputs after it, on the current stream.
            src = torch.cat([t.reshape(-1) for t in input_tensors])
            flat = torch.empty(sum(rc), dtype=dtype, device=output_tensors[0].device)

            def scatter_out():
                for o, off, c in zip(output_tensors, rd, rc):
                    o.copy_(flat.narrow(0, off, c).view(o.shape))

            return self._alltoallv_device(opts, call, dev, src, flat, sc, sd, rc, rd, dt,
                                          post=scatter_out, result=list(output_tensors))
        src = torch.cat([self._host_in(t).reshape(-1) for t in input_tensors])
        flat = torch.empty(sum(rc), dtype=dtype)

        def run():
            self._live().alltoallv(_ptr(src), sc, sd, _ptr(flat), rc, rd, dt)
            for o, off, c in zip(output_tensors, rd, rc):
                o.copy_(flat.narrow(0, off, c).view(o.shape))

        return self._blocking(opts, call, run, list(output_tensors))
