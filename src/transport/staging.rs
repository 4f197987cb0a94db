//! Host staging buffers kept for reuse: the executor's packed sends and the MPI transport's
//! staged receives take them here instead of allocating per call.
//!
//! Why: glibc serves a large allocation with a fresh `mmap` and returns it with `munmap`, so
//! a buffer allocated per call is faulted in page by page on first write (and, in a virtual
//! machine, every fault and the `munmap`'s TLB shoot-down are expensive). On the 2-core CI VM
//! a hierarchical all-gather of 512 KiB blocks over MPI (4 processes, 2 per pretend node:
//! its second phase packs and unpacks strided blocks) took 3.3× the flat recursive doubling's
//! time with a buffer per call, and 1.1× with glibc told never to `mmap`
//! (docs/BENCHMARKS.md, "Staging buffers"). A buffer kept here is faulted in once.
//!
//! Buffers are `u64` words (every element type is aligned in them), handed out with their old
//! contents (always initialised: zeroed once when allocated). Idle buffers are kept up to
//! `PCCL_STAGING_POOL` bytes in all (default [`DEFAULT_CAP`]; `0` keeps none); the smallest
//! idle ones are freed first when a returned buffer would pass the cap.

use std::sync::{Mutex, OnceLock};

/// Idle bytes kept by default.
pub const DEFAULT_CAP: usize = 128 << 20;

/// Idle buffers, and their total bytes.
static IDLE: Mutex<(Vec<Vec<u64>>, usize)> = Mutex::new((Vec::new(), 0));

/// The cap on idle bytes: `PCCL_STAGING_POOL` (bytes, `K`/`M`/`G` suffixes), read once; a
/// value that does not parse keeps the default (`Config::from_env` reports it).
pub fn cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("PCCL_STAGING_POOL")
            .ok()
            .and_then(|v| crate::config::parse_bytes(v.trim()).ok())
            .unwrap_or(DEFAULT_CAP)
    })
}

fn lock() -> std::sync::MutexGuard<'static, (Vec<Vec<u64>>, usize)> {
    IDLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A staging buffer of at least the bytes asked for; back to the pool when dropped.
pub struct Staging {
    words: Vec<u64>,
    bytes: usize,
}

impl Staging {
    /// A buffer of `bytes` bytes (at least one word): the smallest idle one that is large
    /// enough, else a new one.
    pub fn take(bytes: usize) -> Staging {
        let need = bytes.div_ceil(8).max(1);
        let found = {
            let mut idle = lock();
            let best = idle
                .0
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= need)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| {
                let b = idle.0.swap_remove(i);
                idle.1 -= b.len() * 8;
                b
            })
        };
        Staging {
            words: found.unwrap_or_else(|| vec![0u64; need]),
            bytes,
        }
    }

    /// The buffer's first `bytes` bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.bytes;
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }

    /// The buffer's first `bytes` bytes, read only.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.bytes]
    }

    /// The buffer as `n` elements of `T` (`n · size_of::<T>()` must fit in the buffer; `T` of
    /// at most 8 bytes, as every PCCL element is).
    pub fn elems_mut<T: bytemuck::Pod>(&mut self, n: usize) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }

    /// Gives the buffer up for good (MPI may still write it: it must never be reused).
    pub fn leak(mut self) {
        std::mem::forget(std::mem::take(&mut self.words));
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.words);
        let size = b.len() * 8;
        let cap = cap();
        if b.is_empty() || size > cap {
            return;
        }
        let mut idle = lock();
        while idle.1 + size > cap {
            let Some(i) = (0..idle.0.len()).min_by_key(|&i| idle.0[i].len()) else {
                break;
            };
            let gone = idle.0.swap_remove(i);
            idle.1 -= gone.len() * 8;
        }
        idle.1 += size;
        idle.0.push(b);
    }
}

/// Idle bytes kept now (for tests and diagnostics).
pub fn idle_bytes() -> usize {
    lock().1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_handed_out_again_with_its_pages() {
        let p = {
            let mut a = Staging::take(1 << 20);
            a.bytes_mut()[0] = 7;
            a.bytes_mut().as_ptr() as usize
        };
        // Other tests may take it meanwhile; then a fresh one comes, which is also correct.
        let mut b = Staging::take((1 << 20) - 5);
        assert_eq!(b.bytes_mut().len(), (1 << 20) - 5);
        if b.bytes_mut().as_ptr() as usize == p {
            assert_eq!(b.bytes()[0], 7, "old contents are kept, not zeroed again");
        }
        let e: &mut [f32] = b.elems_mut(1000);
        e[999] = 1.5;
        assert_eq!(e.len(), 1000);
    }

    #[test]
    fn idle_bytes_stay_under_the_cap_and_a_leaked_buffer_never_returns() {
        let big: Vec<Staging> = (0..4).map(|_| Staging::take(cap() / 3)).collect();
        drop(big);
        assert!(idle_bytes() <= cap(), "{} > {}", idle_bytes(), cap());
        let before = idle_bytes();
        let s = Staging::take(12345);
        s.leak();
        assert!(idle_bytes() <= before);
        // Larger than the cap: freed, not kept.
        drop(Staging::take(cap() + 8));
        assert!(idle_bytes() <= cap());
    }
}
