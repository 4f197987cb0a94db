//! Building a call from a front end's arguments: lengths checked against the communicator's
//! size, in-place forms recognised, block layouts for the executor. Nothing here
//! communicates; a call that fails here is refused on every rank by the caller.

use super::{Call, Communicator, RawCollective};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::BlockLayout;
use crate::plan::Collective;

pub(super) fn len_mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(format!("{what}: count {a} x {b} ranks overflows usize")))
}

impl Communicator {
    pub(super) unsafe fn raw_call<T: Element>(
        &self,
        coll: RawCollective,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<Call<T>> {
        let p = self.size();
        let es = std::mem::size_of::<T>();
        let (in_len, out_len) = match coll {
            RawCollective::AllGather => (count, len_mul(count, p, "all_gather")?),
            RawCollective::ReduceScatter(_) => (len_mul(count, p, "reduce_scatter")?, count),
            RawCollective::AllReduce(_) | RawCollective::Broadcast(_) => (count, count),
        };
        len_mul(in_len.max(out_len), es, "buffer size in bytes")?;
        let needs_send = match coll {
            RawCollective::Broadcast(root) => root == self.rank(),
            _ => true,
        };
        if (needs_send && in_len > 0 && send.is_null()) || (out_len > 0 && recv.is_null()) {
            return Err(Error::invalid(
                "a buffer pointer is NULL but the count is above zero",
            ));
        }
        let align = std::mem::align_of::<T>();
        if (in_len > 0 && needs_send && send as usize % align != 0)
            || (out_len > 0 && recv as usize % align != 0)
        {
            return Err(Error::invalid(format!(
                "buffers of dtype {} must be aligned to {align} bytes",
                T::DTYPE
            )));
        }
        let (s0, s1) = (send as usize, send as usize + in_len * es);
        let (r0, r1) = (recv as usize, recv as usize + out_len * es);
        let overlap = needs_send && in_len > 0 && out_len > 0 && s0 < r1 && r0 < s1;
        let inplace = match coll {
            RawCollective::AllGather => s0 == r0 + self.rank() * count * es,
            RawCollective::ReduceScatter(_) => r0 == s0 + self.rank() * count * es,
            RawCollective::AllReduce(_) | RawCollective::Broadcast(_) => s0 == r0,
        };
        if overlap && !inplace {
            return Err(Error::invalid(
                "send and receive buffers overlap without being the in-place form \
                 (all-gather: send = recv + rank*count; reduce-scatter: recv = send + rank*count; \
                 all-reduce/broadcast: send = recv)",
            ));
        }
        match coll {
            RawCollective::AllGather => self.all_gather_call(send, in_len, recv, out_len),
            RawCollective::ReduceScatter(op) => {
                self.reduce_scatter_call(send, in_len, recv, out_len, op)
            }
            RawCollective::AllReduce(op) => self.all_reduce_call(send, in_len, recv, out_len, op),
            RawCollective::Broadcast(root) => {
                let mut c = self.broadcast_call(recv, count, root)?;
                if needs_send {
                    c.input.0 = send;
                }
                Ok(c)
            }
        }
    }

    // ---- argument checking ----------------------------------------------------------------

    pub(super) fn block_of(&self, len: usize, what: &str) -> Result<usize> {
        let p = self.size();
        if len % p != 0 {
            return Err(Error::invalid(format!(
                "{what}: buffer of {len} elements is not {p} equal blocks (one per rank)"
            )));
        }
        Ok(len / p)
    }

    pub(super) fn all_gather_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
    ) -> Result<Call<T>> {
        let p = self.size();
        let need = len_mul(in_len, p, "all_gather")?;
        if out_len != need {
            return Err(Error::invalid(format!(
                "all_gather: output holds {out_len} elements but {p} ranks x {in_len} needs {need}"
            )));
        }
        Ok(Call {
            coll: Collective::AllGather,
            op: ReduceOp::Sum,
            block_bytes: in_len * std::mem::size_of::<T>(),
            input: (
                inp,
                in_len,
                BlockLayout::Uniform {
                    count: in_len,
                    parts: 1,
                },
            ),
            output: (
                out,
                out_len,
                BlockLayout::Uniform {
                    count: in_len,
                    parts: p,
                },
            ),
            scratch: BlockLayout::Uniform { count: 0, parts: 0 },
        })
    }

    pub(super) fn reduce_scatter_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
        op: ReduceOp,
    ) -> Result<Call<T>> {
        T::DTYPE.check_op(op)?;
        let p = self.size();
        let need = len_mul(out_len, p, "reduce_scatter")?;
        if in_len != need {
            return Err(Error::invalid(format!(
                "reduce_scatter: input holds {in_len} elements but {p} ranks x {out_len} needs {need}"
            )));
        }
        let lay = BlockLayout::Uniform {
            count: out_len,
            parts: p,
        };
        Ok(Call {
            coll: Collective::ReduceScatter {
                average: op == ReduceOp::Avg,
            },
            op,
            block_bytes: out_len * std::mem::size_of::<T>(),
            input: (inp, in_len, lay),
            output: (
                out,
                out_len,
                BlockLayout::Uniform {
                    count: out_len,
                    parts: 1,
                },
            ),
            scratch: lay,
        })
    }

    pub(super) fn all_reduce_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
        op: ReduceOp,
    ) -> Result<Call<T>> {
        T::DTYPE.check_op(op)?;
        if in_len != out_len {
            return Err(Error::invalid(format!(
                "all_reduce: input has {in_len} elements but output has {out_len}; they must match"
            )));
        }
        let p = self.size();
        let lay = BlockLayout::Balanced {
            total: in_len,
            parts: p,
        };
        Ok(Call {
            coll: Collective::AllReduce {
                average: op == ReduceOp::Avg,
            },
            op,
            block_bytes: in_len.div_ceil(p) * std::mem::size_of::<T>(),
            input: (inp, in_len, lay),
            output: (out, out_len, lay),
            scratch: lay,
        })
    }

    pub(super) fn broadcast_call<T: Element>(
        &self,
        buf: *mut T,
        len: usize,
        root: usize,
    ) -> Result<Call<T>> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "broadcast: root {root} is not a rank of this communicator of {}",
                self.size()
            )));
        }
        let lay = BlockLayout::Uniform {
            count: len,
            parts: 1,
        };
        Ok(Call {
            coll: Collective::Broadcast { root },
            op: ReduceOp::Sum,
            block_bytes: len * std::mem::size_of::<T>(),
            input: (buf, len, lay),
            output: (buf, len, lay),
            scratch: BlockLayout::Uniform { count: 0, parts: 0 },
        })
    }

    pub(super) fn barrier_call(&self) -> Call<u8> {
        let none = BlockLayout::Uniform { count: 0, parts: 0 };
        Call {
            coll: Collective::Barrier,
            op: ReduceOp::Sum,
            block_bytes: 0,
            input: (std::ptr::null(), 0, none),
            output: (std::ptr::null_mut(), 0, none),
            scratch: none,
        }
    }
}
