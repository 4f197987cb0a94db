//! Handles of non-blocking collectives (MPI-style `wait` / `test`).

use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};

struct Slot<R> {
    value: Mutex<Option<Result<R>>>,
    cv: Condvar,
}

/// A collective in flight. `wait` returns its result (for the Rust API, the buffers it was
/// given); dropping a request does not cancel the collective, which still completes.
pub struct Request<R> {
    slot: Arc<Slot<R>>,
}

/// The worker's end of a [`Request`]. Dropped without completing (a panicking job), it
/// completes the request with an error, so `wait` never hangs.
pub(crate) struct Completer<R> {
    slot: Option<Arc<Slot<R>>>,
}

/// A new request and the handle that completes it.
pub(crate) fn pair<R>() -> (Request<R>, Completer<R>) {
    let slot = Arc::new(Slot {
        value: Mutex::new(None),
        cv: Condvar::new(),
    });
    (
        Request { slot: slot.clone() },
        Completer { slot: Some(slot) },
    )
}

fn fill<R>(slot: &Slot<R>, r: Result<R>) {
    *slot.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    slot.cv.notify_all();
}

impl<R> Completer<R> {
    pub(crate) fn complete(mut self, r: Result<R>) {
        if let Some(slot) = self.slot.take() {
            fill(&slot, r);
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            fill(&slot, Err(lost()));
        }
    }
}

impl<R> Request<R> {
    /// Blocks until the collective finishes; returns its result.
    pub fn wait(self) -> Result<R> {
        let mut v = self.slot.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = v.take() {
                return r;
            }
            v = self.slot.cv.wait(v).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// True once the collective has finished (successfully or not); never blocks.
    pub fn test(&self) -> bool {
        self.slot
            .value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl<R> std::fmt::Debug for Request<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("completed", &self.test())
            .finish()
    }
}

/// The error a request reports when its worker vanished (a bug, or a panic in a kernel).
pub(crate) fn lost() -> Error {
    Error::internal("the progress worker stopped before finishing this request")
}
