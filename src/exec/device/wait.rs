//! Every wait of the device executor for device work: polled, under the collective's
//! deadline and (mid-collective) the communicator's failure board, never a blocking
//! `cudaStreamSynchronize`/`hipEventSynchronize` that a hung kernel or copy would turn into a
//! rank that never returns.
//!
//! A wait that runs out of time ends in a timeout error naming the rank, the device and what
//! it waited for. When the final drain (the wait that lets the collective return) runs out,
//! device work may still use the staging and the caller's buffers: the staging is marked stuck
//! ([`DeviceStaging::stuck`]) and the communicator's later device collectives are refused.

use super::DeviceStaging;
use crate::device::api::Device;
use crate::error::{Error, Result};
use crate::transport::{Tag, Transport};
use std::time::{Duration, Instant};

/// Spinning before napping: device work of a small collective ends within microseconds, and
/// a sleep costs tens of them.
const SPIN: Duration = Duration::from_micros(100);
/// The nap between polls after [`SPIN`].
const NAP: Duration = Duration::from_micros(20);
/// How long the final drain may run past the collective's deadline (a healthy device ends a
/// copy queued before an error well within it; one that does not is stuck).
pub(super) const DRAIN_GRACE: Duration = Duration::from_millis(250);

/// The limits of one collective's device waits.
pub(super) struct Watch<'a> {
    pub(super) tr: &'a dyn Transport,
    pub(super) tag: Tag,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
}

impl Watch<'_> {
    /// The error of a wait for `what` on `dev` that ran out of time.
    pub(super) fn timed_out<D: Device>(&self, dev: &D, what: &str) -> Error {
        Error::timeout(format!(
            "rank {} waited {:?} for its {} device {} to finish {what}, which never completed \
             (a hung kernel or copy, or a device far slower than expected); PCCL_TIMEOUT or \
             set_timeout sets the limit",
            self.tr.rank(),
            self.timeout,
            D::VENDOR,
            dev.ordinal()
        ))
    }

    /// A peer's failure `e` that ended a wait for `what` still unfinished on `dev` after
    /// `waited`: the same kind, and the message also names this rank's unfinished device
    /// work, which is often why the peer gave up (it timed out waiting for this rank).
    fn peer_gave_up<D: Device>(&self, dev: &D, e: Error, what: &str, waited: Duration) -> Error {
        Error::new(
            e.kind(),
            format!(
                "{}; meanwhile rank {}'s {} device {} had not finished {what} after {waited:?} \
                 (a hung kernel or copy would make peers give up on this rank)",
                e.message(),
                self.tr.rank(),
                D::VENDOR,
                dev.ordinal()
            ),
        )
    }

    /// Waits, polling, until `ev` completed. With `board`, a failure the communicator's board
    /// records for this collective (a peer's refusal or death, an abort) ends the wait at once
    /// with that error; `until` is the deadline.
    pub(super) fn event<D: Device>(
        &self,
        dev: &D,
        ev: &D::Event,
        until: Instant,
        board: bool,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if dev.event_done(ev)? {
                return Ok(());
            }
            if board {
                if let Err(e) = self.tr.faults().check(self.tag, self.tr.rank()) {
                    return Err(self.peer_gave_up(dev, e, &what(), t0.elapsed()));
                }
            }
            let now = Instant::now();
            if now >= until {
                return Err(self.timed_out(dev, &what()));
            }
            if now - t0 < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(NAP.min(until - now));
            }
        }
    }

    /// Waits until the work queued so far on `dev`'s stream (and, with `copies`, on the
    /// staging's copy stream) finished, then surfaces any error the streams hold. Mid-collective
    /// (`board`) up to the deadline; as the final drain, [`DRAIN_GRACE`] past it.
    pub(super) fn streams<D: Device>(
        &self,
        dev: &D,
        st: &DeviceStaging<D>,
        copies: bool,
        board: bool,
        what: &str,
    ) -> Result<()> {
        let until = if board {
            self.deadline
        } else {
            self.deadline
                .max(Instant::now() + DRAIN_GRACE.min(self.timeout))
        };
        let (main, copy) = &st.marks;
        if copies {
            dev.record(copy, Some(&st.d2h))?;
        }
        dev.record(main, None)?;
        if copies {
            self.event(dev, copy, until, board, || {
                format!("{what} (its device-to-host copy stream)")
            })?;
        }
        self.event(dev, main, until, board, || what.to_string())?;
        // The work is done: these return at once, with any error a stream holds.
        if copies {
            dev.sync_stream(&st.d2h)?;
        }
        dev.synchronize()
    }
}
