//! What the model reads from a profile: the rates and latencies it derives from the file's
//! fields (reductions, the cache tier, the protocol steps, a host's oversubscribed cores,
//! links inside a node and NICs).

use super::{DeviceKind, Profile, Strided};

impl Profile {
    /// Reduction rate in bytes per second for `dtype` (a name such as `f32`) on `kind`.
    pub fn reduce_rate(&self, kind: DeviceKind, dtype: &str) -> f64 {
        let m = match kind {
            DeviceKind::Host => &self.reduce_host_gbps,
            DeviceKind::Device => &self.reduce_device_gbps,
        };
        m.get(dtype)
            .or_else(|| m.get("default"))
            .or_else(|| m.values().next())
            .copied()
            .unwrap_or(6.0)
            * 1e9
    }

    /// The share of a call's bytes served from the cache when it touches `working_set`
    /// bytes on a host: `min(1, cache / working_set)^sharpness`; 0 without a cache tier.
    pub fn cache_hit(&self, working_set: f64) -> f64 {
        let c = &self.cache;
        if c.bytes == 0 || working_set.is_nan() {
            return 0.0;
        }
        (c.bytes as f64 / working_set.max(1.0))
            .min(1.0)
            .powf(c.sharpness.max(1.0))
    }

    /// How many times faster than the memory rates a host moves bytes when a call touches
    /// `working_set` bytes on it: a share `h` ([`Self::cache_hit`]) of the bytes is served at
    /// the cache's copy rate, the rest at memory's (`copy_gbps`), so the time per byte is
    /// `h / cache_rate + (1 − h) / memory_rate`. `1` without a cache tier, or when the cache
    /// is no faster than memory.
    pub fn cache_speedup(&self, working_set: f64) -> f64 {
        let c = &self.cache;
        if c.bytes == 0 || c.copy_gbps <= self.copy_gbps || working_set.is_nan() {
            return 1.0;
        }
        let ratio = c.copy_gbps / self.copy_gbps;
        let h = self.cache_hit(working_set);
        1.0 / (h / ratio + (1.0 - h))
    }

    /// The cache's speed-up of transfers between ranks for `working_set` bytes: the share
    /// `cache.link_share` of [`Self::cache_speedup`]'s gain, `1 + share × (speed-up − 1)`.
    pub fn link_speedup(&self, working_set: f64) -> f64 {
        1.0 + self.cache.link_share * (self.cache_speedup(working_set) - 1.0)
    }

    /// Extra latency (seconds) of a message whose first piece holds `piece` bytes, from the
    /// transport's protocol steps ([`Protocol`]: leaving the small-message path, the
    /// rendezvous), beyond the oversubscription term (the caller adds that once more when
    /// this is not zero).
    pub fn rendezvous_seconds(&self, piece: f64) -> f64 {
        let p = &self.protocol;
        let above = |limit: usize| limit > 0 && piece > limit as f64;
        let mut us = 0.0;
        if above(p.small_bytes) {
            us += p.small_step_us;
        }
        if above(p.eager_bytes) {
            us += p.rendezvous_us;
        }
        us * 1e-6
    }

    /// The factor on a message's bytes from its protocol: [`Protocol::eager_slowdown`] for
    /// a message (of `bytes`, all in its first piece) at or below the eager limit, else 1.
    pub fn eager_factor(&self, bytes: f64) -> f64 {
        let p = &self.protocol;
        if p.eager_bytes == 0 || bytes > p.eager_bytes as f64 || bytes <= 0.0 {
            return 1.0;
        }
        p.eager_slowdown
    }

    /// Extra latency (seconds) of every message when `local_ranks` ranks share one host's
    /// `oversub.cores` cores: `per_message_us × (local_ranks / cores − 1)`, nothing when they
    /// do not outnumber the cores or the profile has no term.
    ///
    /// Why this form: with `k = local_ranks / cores` ranks per core, a rank whose message has
    /// arrived waits, on average, for the other `k − 1` runnable ranks of its core to give it
    /// up (a wake-up and a switch each for sleeping ranks, a time slice each for busy-polling
    /// ones), and each of those switches happens once per message, since every phase of a
    /// collective blocks every rank on a receive. Linear in `k − 1`, zero at `k ≤ 1`; the
    /// slope is what `pccl-tune` measures at `k = 2`.
    pub fn oversub_seconds(&self, local_ranks: usize) -> f64 {
        let o = &self.oversub;
        if o.cores == 0 || local_ranks <= o.cores {
            return 0.0;
        }
        o.per_message_us * (local_ranks as f64 / o.cores as f64 - 1.0) * 1e-6
    }

    /// Core time (seconds) one message costs the host (`inter`: between nodes), and the
    /// cores one node's messages share: `oversub.cores / oversub.nodes_per_host`. `None`
    /// without the term (no cores known, or no time per message).
    pub fn message_cpu_seconds(&self, inter: bool) -> Option<(f64, f64)> {
        let o = &self.oversub;
        let us = if inter {
            o.inter_cpu_us
        } else {
            o.intra_cpu_us
        };
        (o.cores > 0 && (o.inter_cpu_us > 0.0 || o.intra_cpu_us > 0.0))
            .then(|| (us * 1e-6, o.cores as f64 / o.nodes_per_host.max(1) as f64))
    }

    /// Whether a send of `blocks` blocks of `block_bytes` gathered from `spans` separate
    /// spans, to a rank of the same node or not, is packed first ([`Strided`]). A send from
    /// one span never is.
    pub fn packs(&self, block_bytes: f64, blocks: usize, spans: usize, same_node: bool) -> bool {
        if spans <= 1 {
            return false;
        }
        match self.strided {
            Strided::Packed => true,
            Strided::PackedBelowPiece => block_bytes < self.piece_bytes as f64,
            Strided::Gathered => false,
            Strided::PackedSmall => {
                let len = (block_bytes * blocks as f64).min(usize::MAX as f64) as usize;
                crate::transport::tcp::packs_vectored(len, spans, same_node)
            }
        }
    }

    /// How many times slower every host byte rate (copies, transfers, reductions) runs when
    /// `local_ranks` ranks share one host's cores: `1 + rate_share × (k − 1)` with `k` ranks
    /// per core, `1` when they do not outnumber the cores. A rank copying shares its core
    /// with `k − 1` others; each that spins instead of sleeping takes its slice of the core,
    /// so with `rate_share = 1` a copy gets `1/k` of the core's time.
    pub fn oversub_slowdown(&self, local_ranks: usize) -> f64 {
        let o = &self.oversub;
        if o.cores == 0 || local_ranks <= o.cores {
            return 1.0;
        }
        1.0 + o.rate_share * (local_ranks as f64 / o.cores as f64 - 1.0)
    }

    /// How many times slower a rank's own work on the host's cores (its reductions) runs
    /// with `local_ranks` ranks on the host: `local_ranks / cores` when they outnumber the
    /// cores (each gets that share of one), never less than [`Self::oversub_slowdown`].
    /// (Thread ranks sleep while they wait, so `rate_share` is 0 for them and their copies'
    /// sharing is in the node bus they measure; their reductions were left at a whole core.)
    pub fn oversub_cpu_share(&self, local_ranks: usize) -> f64 {
        let o = &self.oversub;
        let share = if o.cores == 0 || local_ranks <= o.cores {
            1.0
        } else {
            local_ranks as f64 / o.cores as f64
        };
        share.max(self.oversub_slowdown(local_ranks))
    }

    /// Bandwidth in bytes per second between local ranks `a` and `b` of one node.
    pub fn intra_rate(&self, a: usize, b: usize) -> f64 {
        let ps = self.intra.pair_size;
        let gbps = if ps > 1 && a / ps == b / ps {
            self.intra.pair_bandwidth_gbps
        } else {
            self.intra.bandwidth_gbps
        };
        gbps * 1e9 * self.efficiency
    }

    /// One NIC's bandwidth in bytes per second.
    pub fn nic_rate(&self) -> f64 {
        self.inter.nic_bandwidth_gbps * 1e9 * self.efficiency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_tier_speeds_up_only_what_fits_and_is_off_by_default() {
        let mut p = Profile::default();
        assert_eq!(p.cache_speedup(1.0), 1.0);
        assert_eq!(p.cache_speedup(1e12), 1.0);
        p = Profile::from_toml("copy_gbps = 10\n[cache]\nbytes = 1000\ncopy_gbps = 40\n").unwrap();
        assert_eq!(p.cache_speedup(500.0), 4.0);
        assert_eq!(p.cache_speedup(1000.0), 4.0);
        // Half of it fits: half the bytes at 40, half at 10 GB/s.
        assert!((p.cache_speedup(2000.0) - 1.0 / (0.5 / 4.0 + 0.5)).abs() < 1e-12);
        assert!(p.cache_speedup(1e9) < 1.001 && p.cache_speedup(1e9) >= 1.0);
        // A cache slower than memory is no tier.
        p.cache.copy_gbps = 5.0;
        assert_eq!(p.cache_speedup(10.0), 1.0);
        let e = Profile::from_toml("[cache]\nbytes = 1000\n").unwrap_err();
        assert!(e.message().contains("cache.copy_gbps"), "{e}");
    }

    #[test]
    fn pairs_get_their_faster_link() {
        let p = Profile::from_toml(
            "[intra]\nbandwidth_gbps = 50\npair_size = 2\npair_bandwidth_gbps = 200\n",
        )
        .unwrap();
        assert_eq!(p.intra_rate(0, 1), 200e9);
        assert_eq!(p.intra_rate(1, 2), 50e9);
    }

    #[test]
    fn oversubscription_costs_only_past_the_cores_and_grows_with_ranks_per_core() {
        let p = Profile::from_toml("[oversub]\ncores = 2\nper_message_us = 30\n").unwrap();
        assert_eq!(p.oversub_seconds(1), 0.0);
        assert_eq!(p.oversub_seconds(2), 0.0, "as many ranks as cores");
        assert!(
            (p.oversub_seconds(4) - 30e-6).abs() < 1e-12,
            "two ranks per core"
        );
        assert!(
            (p.oversub_seconds(8) - 90e-6).abs() < 1e-12,
            "four ranks per core"
        );
        assert!((p.oversub_seconds(3) - 15e-6).abs() < 1e-12);
        // Off by default and in files without the section.
        assert_eq!(Profile::default().oversub_seconds(64), 0.0);
        assert_eq!(
            Profile::from_toml("copy_gbps = 5\n")
                .unwrap()
                .oversub_seconds(64),
            0.0
        );
        let e = Profile::from_toml("[oversub]\ncores = 2\nper_message_us = -1\n").unwrap_err();
        assert!(e.message().contains("oversub.per_message_us"), "{e}");
        assert!(Profile::from_toml("[oversub]\nslice_us = 1\n").is_err());
        // The rate share: copies slow down with the spinning ranks per core.
        let q = Profile::from_toml("[oversub]\ncores = 2\nrate_share = 0.5\n").unwrap();
        assert_eq!(q.oversub_slowdown(2), 1.0);
        assert_eq!(q.oversub_slowdown(4), 1.5);
        assert_eq!(q.oversub_slowdown(8), 2.5);
        assert_eq!(p.oversub_slowdown(8), 1.0, "sleeping ranks take no share");
        let r = Profile::from_toml("[oversub]\ncores = 2\nrate_share = 1.5\n").unwrap();
        assert_eq!(r.oversub_slowdown(4), 2.5, "beyond the fair slices");
        assert!(Profile::from_toml("[oversub]\nrate_share = 4.5\n").is_err());
        assert_eq!(
            Profile::default().strided,
            Strided::Packed,
            "old profiles pack"
        );
        assert!(
            !Profile::default().packs(1.0, 1, 1, false),
            "one span is never packed"
        );
        let g = Profile::from_toml("strided = \"gathered\"\n").unwrap();
        assert!(!g.packs(1.0, 2, 2, false));
        let m =
            Profile::from_toml("strided = \"packed_below_piece\"\npiece_bytes = 1024\n").unwrap();
        assert!(m.packs(1023.0, 2, 2, false) && !m.packs(1024.0, 2, 2, false));
        // TCP: small messages and short runs packed, long runs sent from where they lie.
        let t = Profile::from_toml("strided = \"packed_small\"\n").unwrap();
        let kib = 1024.0;
        assert!(
            t.packs(32.0 * kib, 2, 2, false),
            "64 KiB in all: the poster writes it"
        );
        assert!(
            !t.packs(64.0 * kib, 2, 2, false),
            "two 64 KiB runs go as they lie"
        );
        assert!(t.packs(64.0 * kib, 2, 2, true), "a ring slot inside a node");
        assert!(!t.packs(512.0 * kib, 2, 2, true));
        assert!(t.packs(16.0 * kib, 64, 64, false), "runs under 32 KiB");
        assert!(!t.packs(16.0 * kib, 64, 16, false), "four blocks a run");
        assert!(Profile::from_toml("strided = \"sometimes\"\n").is_err());
        assert!(Profile::from_toml("[oversub]\nrate_share = -0.1\n").is_err());
    }
}
