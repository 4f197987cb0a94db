//! Thread ranks on fake GPUs and a caller stream the test holds shut: the helpers of the
//! tests of queued device calls on the fake ROCm runtime.

#![allow(dead_code)]

use pccl::device::api::{DevSpan, Device};
use pccl::device::hip::HipDevice;
use pccl::{Communicator, ThreadWorld};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `body(rank, comm, device)` on `p` thread ranks, each on fake GPU `rank` (all on GPU
/// 0 with `shared`), and returns the results in rank order.
pub fn on_ranks<R: Send>(
    p: usize,
    shared: bool,
    body: impl Fn(usize, Communicator, HipDevice, &Barrier) -> R + Sync,
) -> Vec<R> {
    let world = ThreadWorld::new(p);
    let barrier = Barrier::new(p);
    let (body, barrier) = (&body, &barrier);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                s.spawn(move || {
                    let c = Communicator::new(t).unwrap();
                    let dev = HipDevice::open(if shared { 0 } else { r }).unwrap();
                    body(r, c, dev, barrier)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Queues a copy of `n` f32 at `src` into `dst` on `dev`'s stream and records an event
/// after it: the event tells when the copy ran.
pub fn copy_back(dev: &HipDevice, src: u64, dst: &mut [f32]) -> <HipDevice as Device>::Event {
    // SAFETY: `src` is a device buffer of at least `dst.len()` f32; `dst` outlives the
    // stream's synchronisation in every caller.
    unsafe {
        let span = DevSpan::new(src, dst.len() * 4, dev.ordinal()).unwrap();
        dev.copy_dtoh(None, dst.as_mut_ptr() as *mut u8, span)
            .unwrap();
    }
    let ev = dev.new_event().unwrap();
    dev.record(&ev, None).unwrap();
    ev
}

/// Holds `dev`'s stream shut until the returned closure (or a 3 s watchdog) releases it.
pub struct Held {
    gate: <HipDevice as Device>::Gate,
    ticket: u32,
}

impl Drop for Held {
    /// A rank that fails mid-test lets its stream go, so that the others fail instead of
    /// waiting for it forever (freeing memory waits for every stream of the device).
    fn drop(&mut self) {
        self.release();
    }
}

impl Held {
    pub fn new(dev: &HipDevice) -> Held {
        let mut gate = dev.new_gate().unwrap();
        let ticket = dev.gate_hold(&mut gate).unwrap();
        Held { gate, ticket }
    }

    pub fn release(&self) {
        HipDevice::gate_releaser(&self.gate).release(self.ticket);
    }

    /// Runs `call` while the stream is held; a watchdog releases it after 3 s, so a call that
    /// waits for the stream returns late instead of hanging. Returns its result and duration.
    pub fn during<R>(&self, call: impl FnOnce() -> R) -> (R, Duration) {
        let done = AtomicBool::new(false);
        let release = HipDevice::gate_releaser(&self.gate);
        let ticket = self.ticket;
        std::thread::scope(|w| {
            let done = &done;
            w.spawn(move || {
                let t = Instant::now();
                while !done.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(3) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if !done.load(Ordering::SeqCst) {
                    release.release(ticket);
                }
            });
            let t0 = Instant::now();
            let r = call();
            let took = t0.elapsed();
            done.store(true, Ordering::SeqCst);
            (r, took)
        })
    }
}
