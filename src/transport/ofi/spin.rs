//! How long an idle waiter keeps reading the completion queue before it blocks on the
//! queue's descriptor: an adaptive window per endpoint (`PCCL_OFI_SPIN_US`).
//!
//! Blocking costs one wake-up (`poll(2)` returning, the scheduler running the waiter) per
//! protocol round; below 16 KiB that is most of a message's time. Reading on costs a core. The
//! window follows what completions did lately, as MPICH's and UCX's hybrid waits do: a wait
//! whose completion came within the window leaves it as it is; one whose completion came a
//! little after it (within the longest window) widens it to twice that delay, so the next
//! such wait is caught reading; one whose completion came later than the longest window
//! halves it (blocking was right, the reads were wasted), so a slow peer soon gets blocking
//! waits only.
//!
//! Between reads the waiter yields the core ([`super::link`]), never just spins: on a host
//! with more runnable threads than cores a spinning rank takes the core from the very peer
//! it waits for (pure spinning was 1.2–2× slower than blocking at once on the 2-core test
//! host, docs/OFI.md), a yielding one hands it over and costs a system call where nobody
//! else wants the core. Waits block at once by default where the ranks of the host outnumber
//! its cores, and while its 1-minute load average exceeds twice its cores (other processes
//! want them: yielding waiters lost to blocking ones there).

use super::fabric::env;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest window where every rank of the host has a core (µs).
const MAX_US: u32 = 500;
/// Longest window where ranks outnumber cores (µs): none, they block at once. Reading on
/// there won 0.64–0.84× at light load and lost 2.1–2.6× at load 14–29 (docs/OFI.md).
const OVERSUBSCRIBED_MAX_US: u32 = 0;
/// A yield that kept the waiter off its core this long handed the core to another process
/// for a time slice: the host is busier than its ranks (µs).
const SLOW_YIELD_US: u64 = 250;
/// How long waits block at once after a slow yield, before they read on again (ms).
const CONTENDED_MS: u64 = 50;
/// How often the host's load average is looked at (ms).
const LOAD_EVERY_MS: u64 = 100;

/// `PCCL_OFI_SPIN_US`: `None` for `auto` (the default), else the longest window in µs
/// (`0`: no spin, block at once as before; a number: that longest window, still adaptive).
pub fn setting() -> Result<Option<u32>> {
    match env("PCCL_OFI_SPIN_US").as_deref() {
        None | Some("auto") => Ok(None),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|&n| n <= 100_000)
            .map(Some)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "PCCL_OFI_SPIN_US={v}: expected auto or the longest spin before an idle \
                     ofi wait blocks, in microseconds (0 to 100000; 0 blocks at once)"
                ))
            }),
    }
}

/// One endpoint's spin window.
pub struct Spin {
    /// The longest window (µs); 0: block as soon as a few reads found nothing.
    max: u32,
    /// The current window (µs).
    window: AtomicU32,
    /// Until when (µs after `epoch`) waits block at once: a yield was slow.
    contended_until: AtomicU64,
    epoch: Instant,
    /// This host's cores; waits block at once while its 1-minute load average exceeds
    /// twice that (0: never looked at).
    cores: usize,
    /// When the load average was last looked at (µs after `epoch`), and what it said.
    load_at: AtomicU64,
    loaded: std::sync::atomic::AtomicBool,
}

impl Spin {
    /// A window of at most `max_us`, starting there.
    pub fn new(max_us: u32) -> Self {
        Spin {
            max: max_us,
            window: AtomicU32::new(max_us),
            contended_until: AtomicU64::new(0),
            epoch: Instant::now(),
            cores: 0,
            load_at: AtomicU64::new(0),
            loaded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The window for a host with `local` ranks and `cores` cores under `setting`
    /// ([`setting`]: `None` for auto): at most 500 µs, or none (block at once) when ranks
    /// outnumber cores; a setting replaces the longest window (0: block at once).
    pub fn for_host(setting: Option<u32>, local: usize, cores: usize) -> Self {
        let over = local > cores;
        let auto = if over { OVERSUBSCRIBED_MAX_US } else { MAX_US };
        Spin {
            cores,
            ..Spin::new(setting.unwrap_or(auto))
        }
    }

    /// How long an idle wait reads the completion queue before it blocks now (zero for a
    /// while after a slow yield).
    pub fn window(&self) -> Duration {
        let now = self.since_epoch_us();
        if now < self.contended_until.load(Ordering::Relaxed) || self.host_loaded(now) {
            return Duration::ZERO;
        }
        self.learned()
    }

    /// The window learned from completions, whatever the host's load.
    fn learned(&self) -> Duration {
        Duration::from_micros(u64::from(self.window.load(Ordering::Relaxed)))
    }

    /// Whether the host's 1-minute load average exceeds twice its cores (looked at every
    /// [`LOAD_EVERY_MS`]): other processes want the cores, and yielding waiters lost to
    /// blocking ones there (docs/OFI.md).
    fn host_loaded(&self, now: u64) -> bool {
        if self.cores == 0 {
            return false;
        }
        let at = self.load_at.load(Ordering::Relaxed);
        if at == 0 || now.saturating_sub(at) > LOAD_EVERY_MS * 1000 {
            self.load_at.store(now.max(1), Ordering::Relaxed);
            let load = std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            self.loaded
                .store(load > 2.0 * self.cores as f64, Ordering::Relaxed);
        }
        self.loaded.load(Ordering::Relaxed)
    }

    /// Yields the core between two reads of the completion queue. A yield that kept this
    /// thread off its core for long gave it to another process (the host runs more threads
    /// than it has cores): then waits block at once for a while, since a woken waiter gets
    /// the core back sooner than a yielding one (measured: docs/OFI.md).
    pub fn pause(&self) {
        let t = Instant::now();
        std::thread::yield_now();
        self.yielded(t.elapsed());
    }

    /// Learns from a yield that kept this thread off its core for `took`.
    fn yielded(&self, took: Duration) {
        if took > Duration::from_micros(SLOW_YIELD_US) {
            self.contended_until.store(
                self.since_epoch_us() + CONTENDED_MS * 1000,
                Ordering::Relaxed,
            );
        }
    }

    fn since_epoch_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The longest window (µs).
    pub fn max_us(&self) -> u32 {
        self.max
    }

    /// Learns from a wait whose completion came `idle` after it found nothing to do.
    pub fn record(&self, idle: Duration) {
        let d = u32::try_from(idle.as_micros()).unwrap_or(u32::MAX);
        let w = self.window.load(Ordering::Relaxed);
        let n = next_window(w, d, self.max);
        if n != w {
            // Racing waiters of one endpoint may overwrite each other: either answer is fine.
            self.window.store(n, Ordering::Relaxed);
        }
    }
}

/// The window after a wait whose completion came `d` µs into its idle stretch, under a
/// window of `w` µs and a longest window of `max` µs.
fn next_window(w: u32, d: u32, max: u32) -> u32 {
    if d <= w {
        w // caught while spinning
    } else if d <= max {
        d.saturating_mul(2).min(max) // just missed: spin long enough next time
    } else {
        w / 2 // far beyond any window: blocking was right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_completions_keep_or_widen_the_window_and_slow_ones_close_it() {
        // Caught while spinning: unchanged.
        assert_eq!(next_window(100, 30, 200), 100);
        // Just missed: twice the delay, at most the longest window.
        assert_eq!(next_window(10, 40, 200), 80);
        assert_eq!(next_window(10, 150, 200), 200);
        // A closed window reopens when completions come quickly again.
        assert_eq!(next_window(0, 5, 200), 10);
        // Far beyond the longest window: halved, down to nothing.
        let mut w = 200;
        for _ in 0..10 {
            w = next_window(w, 5_000, 200);
        }
        assert_eq!(w, 0);
        // No window at all where the longest is 0.
        assert_eq!(next_window(0, 5, 0), 0);
    }

    #[test]
    fn a_peer_that_answers_slowly_closes_the_window_and_a_quick_one_reopens_it() {
        let s = Spin::new(200);
        assert_eq!(s.window(), Duration::from_micros(200));
        for _ in 0..4 {
            s.record(Duration::from_millis(3));
        }
        assert_eq!(s.window(), Duration::from_micros(12));
        s.record(Duration::from_micros(60));
        assert_eq!(s.window(), Duration::from_micros(120));
    }

    #[test]
    fn a_slow_yield_closes_the_window_for_a_while() {
        let s = Spin::new(200);
        s.yielded(Duration::from_micros(20)); // the peer ran briefly: read on
        assert_eq!(s.window(), Duration::from_micros(200));
        s.yielded(Duration::from_millis(3)); // another process took a time slice
        assert_eq!(s.window(), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(CONTENDED_MS + 10));
        assert_eq!(s.window(), Duration::from_micros(200));
    }
}
