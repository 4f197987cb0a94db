//! The progress worker: one thread per communicator that runs its non-blocking collectives
//! in the order they were issued, so requests advance while the caller computes.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Counts collectives queued but not finished, and lets the caller wait for zero.
#[derive(Default)]
pub struct Outstanding {
    n: AtomicUsize,
    idle: Mutex<()>,
    cv: Condvar,
}

impl Outstanding {
    /// One more in flight.
    pub fn add(&self) {
        self.n.fetch_add(1, Ordering::SeqCst);
    }
    /// One fewer in flight.
    pub fn done(&self) {
        let _g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        self.n.fetch_sub(1, Ordering::SeqCst);
        self.cv.notify_all();
    }
    /// Number in flight.
    pub fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }
    /// Blocks until nothing is in flight.
    pub fn wait_idle(&self) {
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while self.n.load(Ordering::SeqCst) > 0 {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A thread that runs queued jobs in order.
pub struct Worker {
    tx: Sender<Job>,
}

impl Worker {
    /// Starts the worker thread.
    pub fn start(name: String) -> Result<Self> {
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .map_err(|e| Error::system(format!("cannot start the progress thread: {e}")))?;
        Ok(Worker { tx })
    }

    /// Queues a job behind the ones already queued.
    pub fn submit(&self, job: Job) -> Result<()> {
        self.tx
            .send(job)
            .map_err(|_| Error::internal("the progress thread has stopped"))
    }
}

/// Shared handle to a lazily started worker.
pub type SharedWorker = Arc<Mutex<Option<Worker>>>;
