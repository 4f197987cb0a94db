//! The free burst of a shaped NIC: one token bucket per NIC direction.
//!
//! A NIC whose rate is set by a token bucket (Linux `htb` or `tbf`, as on the emulated
//! cluster of `scripts/cluster.sh`: a class of the NIC's rate with a burst of 32 KiB on each
//! side of every veth) lets the first `burst` bytes after an idle spell through at the speed
//! of what lies behind it, and refills at its rate whenever it sends below that rate. So a
//! NIC that is busy only part of the time moves small messages without charging them its
//! rate: on the emulated 4×4 cluster the world's CPU-bound 1 KiB ring all-gather took 1.19×
//! its 64 B time where a NIC charging every byte gives 1.5× (docs/CLUSTER.md). A physical NIC
//! has no such burst ([`super::profile::InterLevel::burst_bytes`] = 0, the default).
//!
//! Each bucket holds `min(burst, tokens + rate × elapsed − bytes carried)`: the fluid never
//! runs a NIC above its rate, so between two looks a bucket only fills, and capping at the
//! end of the span is exact. A message takes what both its NICs' buckets hold (its sender's
//! and its receiver's side) at once and moves the rest through the fluid at the shared rate.

use super::contention::Fluid;

/// The token buckets of the NIC resources `0..n` of a fluid.
pub(super) struct Buckets {
    burst: f64,
    tokens: Vec<f64>,
    /// When each bucket was last brought up to date, and the bytes its NIC had carried then.
    seen: Vec<(f64, f64)>,
}

impl Buckets {
    /// `n` buckets of depth `burst` bytes holding `start` (each its own, or full when
    /// `None`).
    pub(super) fn new(n: usize, burst: f64, start: Option<&[f64]>) -> Self {
        let tokens = match start {
            Some(s) if s.len() == n => s.iter().map(|t| t.clamp(0.0, burst)).collect(),
            _ => vec![burst; n],
        };
        Buckets {
            burst,
            tokens,
            seen: vec![(0.0, 0.0); n],
        }
    }

    /// Brings bucket `r` up to time `now`.
    fn update(&mut self, r: usize, now: f64, fluid: &Fluid) {
        let (t, carried) = self.seen[r];
        let served = fluid.served(r as u32);
        let refill = fluid.cap(r as u32) * (now - t).max(0.0) - (served - carried);
        self.tokens[r] = (self.tokens[r] + refill.max(0.0)).min(self.burst);
        self.seen[r] = (now, served);
    }

    /// The bytes of a message of `bytes` crossing `res` (the NIC resources among them, those
    /// below the buckets' count) that pass at once: what every bucket it crosses holds, taken
    /// from each. 0 where it crosses no NIC.
    pub(super) fn take(&mut self, now: f64, bytes: f64, res: &[u32], fluid: &Fluid) -> f64 {
        let n = self.tokens.len();
        let nics: smallvec::SmallVec<[usize; 4]> =
            res.iter().map(|&r| r as usize).filter(|&r| r < n).collect();
        if nics.is_empty() {
            return 0.0;
        }
        let mut free = bytes;
        for &r in &nics {
            self.update(r, now, fluid);
            free = free.min(self.tokens[r]);
        }
        for &r in &nics {
            self.tokens[r] -= free;
        }
        free
    }

    /// Every bucket's tokens at time `now`.
    pub(super) fn at(&mut self, now: f64, fluid: &Fluid) -> Vec<f64> {
        for r in 0..self.tokens.len() {
            self.update(r, now, fluid);
        }
        self.tokens.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_only_while_its_nic_sends_below_it() {
        // One NIC of 1000 B/s, a burst of 500 B.
        let mut fluid = Fluid::new(vec![1000.0]);
        let mut b = Buckets::new(1, 500.0, None);
        assert_eq!(b.take(0.0, 300.0, &[0], &fluid), 300.0);
        // 400 B more: 200 pass at once, 200 go through the NIC at its rate.
        assert_eq!(b.take(0.0, 400.0, &[0], &fluid), 200.0);
        fluid.add(200.0, &[0]);
        assert!((fluid.next_finish() - 0.2).abs() < 1e-12);
        fluid.advance(0.2);
        // Busy at its rate for 0.2 s: nothing refilled.
        assert!(b.at(0.2, &fluid)[0].abs() < 1e-9);
        // Idle for 0.3 s: 300 B back; then full, never more than the burst.
        assert!((b.at(0.5, &fluid)[0] - 300.0).abs() < 1e-9);
        assert!((b.at(5.0, &fluid)[0] - 500.0).abs() < 1e-9);
    }

    #[test]
    fn a_message_takes_what_both_of_its_nics_hold() {
        let fluid = Fluid::new(vec![1000.0, 1000.0, 1e12]);
        let mut b = Buckets::new(2, 500.0, Some(&[100.0, 400.0]));
        // The third resource is not a NIC: it has no bucket.
        assert_eq!(b.take(0.0, 1000.0, &[0, 1, 2], &fluid), 100.0);
        assert_eq!(b.at(0.0, &fluid), vec![0.0, 300.0]);
        assert_eq!(b.take(0.0, 1000.0, &[2], &fluid), 0.0);
    }
}
