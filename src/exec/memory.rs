//! The buffers a plan runs on, and how its blocks map to elements.
//!
//! Buffers are held as raw regions because the front ends hand them over in forms safe Rust
//! cannot express together: the in-place collectives alias input and output, the C ABI
//! passes pointers, and a transport reads a send buffer while the executor writes elsewhere.
//! Every access goes through [`Memory::slice`] / [`Memory::slice_mut`] on ranges the planner
//! proved disjoint within a phase (see `plan::check`).

use crate::error::{Error, Result};
use crate::plan::{Buf, Span};

use std::marker::PhantomData;
use std::ops::Range;

/// How a buffer is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockLayout {
    /// `parts` blocks of `count` elements each.
    Uniform {
        /// Elements per block.
        count: usize,
        /// Number of blocks.
        parts: usize,
    },
    /// `total` elements cut into `parts` blocks whose sizes differ by at most one.
    Balanced {
        /// Elements in all.
        total: usize,
        /// Number of blocks.
        parts: usize,
    },
}

impl BlockLayout {
    /// Element offset of block `b` (`b == parts` gives the total).
    pub fn offset(&self, b: usize) -> usize {
        match *self {
            BlockLayout::Uniform { count, .. } => b * count,
            BlockLayout::Balanced { total, parts } => {
                let q = total / parts;
                let r = total % parts;
                b * q + b.min(r)
            }
        }
    }
    /// The layout of the first `blocks` blocks only (a uniform layout; a balanced one is
    /// kept whole, its block sizes depending on the number of parts, unless no block is
    /// used at all).
    pub fn first(&self, blocks: usize) -> BlockLayout {
        match *self {
            BlockLayout::Uniform { count, parts } => BlockLayout::Uniform {
                count,
                parts: parts.min(blocks),
            },
            BlockLayout::Balanced { .. } if blocks == 0 => {
                BlockLayout::Uniform { count: 0, parts: 0 }
            }
            b => b,
        }
    }

    /// Total elements.
    pub fn total(&self) -> usize {
        match *self {
            BlockLayout::Uniform { count, parts } => count * parts,
            BlockLayout::Balanced { total, .. } => total,
        }
    }
    /// Element range of `len` blocks from `start`.
    pub fn range(&self, start: usize, len: usize) -> Range<usize> {
        self.offset(start)..self.offset(start + len)
    }

    /// Element offset of sub-block `x` when every block is cut into `k` balanced pieces:
    /// piece `x % k` of block `x / k` (`plan::Plan::pieces`).
    pub fn piece_offset(&self, x: usize, k: usize) -> usize {
        let (b, j) = (x / k, x % k);
        let base = self.offset(b);
        if j == 0 {
            return base;
        }
        let n = self.offset(b + 1) - base;
        base + j * (n / k) + j.min(n % k)
    }

    /// Element range of `len` sub-blocks from `start`, `k` pieces per block.
    pub fn piece_range(&self, start: usize, len: usize, k: usize) -> Range<usize> {
        if k == 1 {
            return self.range(start, len);
        }
        self.piece_offset(start, k)..self.piece_offset(start + len, k)
    }
}

/// One buffer: a base pointer, its length in elements and its block layout.
#[derive(Clone, Copy, Debug)]
pub struct Region<T> {
    ptr: *mut T,
    len: usize,
    layout: BlockLayout,
}

/// The input, output and scratch buffers of one collective call.
#[derive(Debug)]
pub struct Memory<'a, T> {
    input: Region<T>,
    output: Region<T>,
    scratch: Region<T>,
    pieces: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a Memory only refers to buffers the caller lent for the call; the executor that
// owns it is the only user, and element types are `Send + Sync` plain data.
unsafe impl<T: Send> Send for Memory<'_, T> {}

impl<'a, T> Memory<'a, T> {
    /// Builds the memory of a call.
    ///
    /// # Safety
    /// `input` (`in_len` elements, read-only) and `output` (`out_len` elements) must be valid
    /// for the lifetime `'a`, not accessed by anyone else meanwhile, and may overlap only in
    /// the in-place forms the collectives define. `scratch` must be valid for writes.
    pub unsafe fn from_raw(
        input: (*const T, usize, BlockLayout),
        output: (*mut T, usize, BlockLayout),
        scratch: (*mut T, usize, BlockLayout),
    ) -> Result<Self> {
        let check = |name: &str, len: usize, l: &BlockLayout| {
            if l.total() > len {
                return Err(Error::invalid(format!(
                    "{name} buffer holds {len} elements but the collective needs {}",
                    l.total()
                )));
            }
            Ok(())
        };
        check("input", input.1, &input.2)?;
        check("output", output.1, &output.2)?;
        check("scratch", scratch.1, &scratch.2)?;
        Ok(Memory {
            input: Region {
                ptr: input.0 as *mut T,
                len: input.1,
                layout: input.2,
            },
            output: Region {
                ptr: output.0,
                len: output.1,
                layout: output.2,
            },
            scratch: Region {
                ptr: scratch.0,
                len: scratch.1,
                layout: scratch.2,
            },
            pieces: 1,
            _borrow: PhantomData,
        })
    }

    fn region(&self, b: Buf) -> &Region<T> {
        match b {
            Buf::Input => &self.input,
            Buf::Output => &self.output,
            Buf::Scratch => &self.scratch,
        }
    }

    /// Pointer to element `off` of buffer `b`, checking that `len` elements fit.
    pub fn ptr_at(&self, b: Buf, off: usize, len: usize) -> Result<*const T> {
        let r = self.region(b);
        if off + len > r.len {
            return Err(Error::internal(format!(
                "{len} elements at {off} run past {b:?}"
            )));
        }
        // SAFETY: `off` is within the region (checked above), so the offset stays in bounds.
        Ok(unsafe { r.ptr.add(off) })
    }

    /// Addresses blocks as `k` pieces each, as a plan with `pieces == k` does.
    pub fn with_pieces(mut self, k: usize) -> Self {
        self.pieces = k.max(1);
        self
    }

    /// Pieces per block the spans address (see [`Memory::with_pieces`]).
    pub fn pieces(&self) -> usize {
        self.pieces
    }

    /// Element range of a span within its buffer.
    pub fn elems(&self, s: Span) -> Range<usize> {
        self.region(s.buf)
            .layout
            .piece_range(s.start, s.len, self.pieces)
    }

    /// Reads `len` elements at element `off` of buffer `b`.
    ///
    /// # Safety
    /// No slice obtained from [`Memory::slice_mut`] may overlap this range while the returned
    /// slice lives (the plan checker proves this for every phase).
    pub unsafe fn slice(&self, b: Buf, off: usize, len: usize) -> &[T] {
        let r = self.region(b);
        assert!(off + len <= r.len, "slice past end of {b:?}");
        if len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(r.ptr.add(off), len)
    }

    /// Writes `len` elements at element `off` of buffer `b`.
    ///
    /// # Safety
    /// No other live slice may overlap this range (the plan checker proves this per phase).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, b: Buf, off: usize, len: usize) -> &mut [T] {
        let r = self.region(b);
        assert!(off + len <= r.len, "slice past end of {b:?}");
        if len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(r.ptr.add(off), len)
    }

    /// Address of element `off` of buffer `b` (to recognise aliased positions).
    pub fn addr(&self, b: Buf, off: usize) -> usize {
        let r = self.region(b);
        r.ptr as usize + off * std::mem::size_of::<T>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_every_block_into_balanced_contiguous_runs() {
        for lay in [
            BlockLayout::Uniform { count: 7, parts: 3 },
            BlockLayout::Balanced {
                total: 10,
                parts: 4,
            },
            BlockLayout::Uniform { count: 2, parts: 3 },
            BlockLayout::Uniform { count: 0, parts: 2 },
        ] {
            let parts = match lay {
                BlockLayout::Uniform { parts, .. } | BlockLayout::Balanced { parts, .. } => parts,
            };
            for k in [1, 2, 3, 4, 8] {
                let mut at = 0;
                for x in 0..parts * k {
                    let r = lay.piece_range(x, 1, k);
                    assert_eq!(r.start, at, "{lay:?} k={k} x={x}");
                    let n = lay.range(x / k, 1).len();
                    assert!(
                        r.len() == n / k || r.len() == n / k + 1,
                        "{lay:?} k={k} x={x}"
                    );
                    at = r.end;
                    if x % k == k - 1 {
                        assert_eq!(at, lay.offset(x / k + 1));
                    }
                }
                assert_eq!(at, lay.total());
                assert_eq!(lay.piece_range(0, parts * k, k), 0..lay.total());
            }
        }
    }
}
