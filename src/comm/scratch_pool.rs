//! [`ScratchPool`]: the host scratch a family of communicators shares.
//!
//! A rank's communicators split from one another (`split`, `shrink`, the quantized
//! collectives' levels) take their scratch from one pool instead of each keeping its own
//! largest buffer until it is destroyed: eight process groups that each once ran a 16 MiB
//! hierarchical reduce-scatter held eight copies of the same idle working space (the emulated
//! cluster's 16 MiB run was killed for it, docs/CLUSTER.md). A call borrows a buffer for its
//! duration; the pool keeps as many as were ever borrowed at once, so calls that never overlap
//! share one, and concurrent calls (a worker thread beside the application's) still get
//! their own.

use std::sync::Mutex;

/// Buffers of u64 words (every dtype's alignment), lent to one call at a time.
#[derive(Debug, Default)]
pub(crate) struct ScratchPool {
    free: Mutex<Vec<Vec<u64>>>,
}

/// A buffer borrowed from a [`ScratchPool`]; goes back to it when dropped.
pub(crate) struct Lent<'a> {
    pool: &'a ScratchPool,
    buf: Vec<u64>,
}

impl ScratchPool {
    /// A buffer of at least `words` words: the smallest idle one that is large enough, else
    /// the largest idle one replaced by a larger (zeroed lazily by the allocator: no copy of
    /// the old contents), else a new one.
    pub(crate) fn take(&self, words: usize) -> Lent<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let fit = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= words)
            .min_by_key(|(_, b)| b.len())
            .or_else(|| free.iter().enumerate().max_by_key(|(_, b)| b.len()))
            .map(|(i, _)| i);
        let mut buf = fit.map(|i| free.swap_remove(i)).unwrap_or_default();
        drop(free);
        if buf.len() < words {
            buf = vec![0u64; words];
        }
        Lent { pool: self, buf }
    }

    /// Bytes the pool holds while no call borrows from it (for tests and reports).
    pub(crate) fn idle_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.iter().map(|b| b.len() * 8).sum()
    }
}

impl Lent<'_> {
    /// The first `words` words of the buffer.
    pub(crate) fn words(&mut self, words: usize) -> &mut [u64] {
        &mut self.buf[..words]
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_that_do_not_overlap_share_one_buffer_grown_to_the_largest() {
        let pool = ScratchPool::default();
        drop(pool.take(100));
        drop(pool.take(1000));
        drop(pool.take(10));
        assert_eq!(pool.idle_bytes(), 8000);
    }

    #[test]
    fn overlapping_calls_get_distinct_buffers_and_both_are_kept() {
        let pool = ScratchPool::default();
        let mut a = pool.take(16);
        let mut b = pool.take(16);
        a.words(16).fill(1);
        b.words(16).fill(2);
        assert!(a.words(16).iter().all(|&w| w == 1));
        drop((a, b));
        assert_eq!(pool.idle_bytes(), 2 * 16 * 8);
        // The smallest buffer that fits is taken first: the larger stays for a larger call.
        let big = pool.take(8);
        drop(pool.take(64));
        drop(big);
        assert_eq!(pool.idle_bytes(), 16 * 8 + 64 * 8);
    }
}
