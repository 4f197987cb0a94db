//! Device events reused from call to call: a queued collective records two to four of them
//! (the caller's stream's point, each host section's `staged`, the vendor steps' `done`), and
//! creating and destroying events costs host time on every call of a real driver. An event
//! goes back to the pool once nothing will wait on its record again: right after a stream was
//! made to wait on it (a wait takes the record current at the call, in CUDA and HIP alike),
//! or after the progress thread saw it complete. The end event a caller may keep is never
//! pooled.

use crate::device::api::Device;
use crate::error::Result;
use std::sync::Mutex;

/// Free events kept at most per pool (a burst of queued calls makes more; the rest are
/// destroyed when given back).
const KEEP: usize = 64;

/// Free events of one device.
pub(crate) struct EventPool<D: Device> {
    free: Mutex<Vec<D::Event>>,
}

impl<D: Device> Default for EventPool<D> {
    fn default() -> Self {
        EventPool {
            free: Mutex::new(Vec::new()),
        }
    }
}

impl<D: Device> EventPool<D> {
    /// A free event of `dev`'s device, or a new one.
    pub(crate) fn take(&self, dev: &D) -> Result<D::Event> {
        match self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            Some(ev) => Ok(ev),
            None => dev.new_event(),
        }
    }

    /// Gives `ev` back: nothing waits on its last record any more.
    pub(crate) fn give(&self, ev: D::Event) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < KEEP {
            free.push(ev);
        }
    }
}
