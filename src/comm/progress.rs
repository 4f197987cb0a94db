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

/// Threads that finish point-to-point requests (their receives and the waits for their
/// sends) apart from the in-order worker, so separate requests progress together. Every job
/// gets a thread at once (one is started when none is idle): a job never waits behind
/// another, which could be blocked on a message the first one's peer sends only later. Idle
/// threads end after a while; dropping the pool ends them all once the queue is empty.
pub struct Pool {
    name: String,
    state: Arc<PoolState>,
}

#[derive(Default)]
struct PoolQueue {
    jobs: std::collections::VecDeque<Job>,
    idle: usize,
    closed: bool,
}

#[derive(Default)]
struct PoolState {
    q: Mutex<PoolQueue>,
    cv: Condvar,
}

/// How long an idle pool thread waits for a job before it ends.
const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

impl Pool {
    /// An empty pool; threads are named `name`.
    pub fn new(name: String) -> Self {
        Pool {
            name,
            state: Arc::default(),
        }
    }

    /// Runs `job` on a pool thread (an idle one, else a new one). When no thread can be
    /// started the job comes back, for the caller to run itself.
    pub fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        let mut q = self.state.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.jobs.len() < q.idle {
            q.jobs.push_back(job);
            self.state.cv.notify_one();
            return Ok(());
        }
        // The new thread takes the lock (and the job) only after this returns.
        let state = self.state.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || pool_thread(&state));
        if spawned.is_err() {
            return Err(job);
        }
        q.jobs.push_back(job);
        Ok(())
    }
}

fn pool_thread(state: &PoolState) {
    let mut q = state.q.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            // A panicking job completes its request with an error (its Completer's drop).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            q = state.q.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        if q.closed {
            return;
        }
        q.idle += 1;
        let (g, to) = state
            .cv
            .wait_timeout(q, POOL_IDLE)
            .unwrap_or_else(|e| e.into_inner());
        q = g;
        q.idle -= 1;
        if to.timed_out() && q.jobs.is_empty() {
            return;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut q = self.state.q.lock().unwrap_or_else(|e| e.into_inner());
        q.closed = true;
        self.state.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn pool_runs_jobs_that_wait_on_later_jobs() {
        // Job k waits for job k+1's signal: with fewer threads than jobs this would hang.
        let pool = Pool::new("test-pool".into());
        let n = 16;
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..=n).map(|_| mpsc::channel::<()>()).unzip();
        let (done_tx, done_rx) = mpsc::channel();
        let mut rxs = rxs.into_iter();
        let _first = rxs.next();
        for (k, rx) in rxs.enumerate() {
            let tx_prev = txs[k].clone();
            let done = done_tx.clone();
            let last = k + 1 == n;
            pool.submit(Box::new(move || {
                if !last {
                    rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
                }
                let _ = tx_prev.send(());
                done.send(()).unwrap();
            }))
            .unwrap_or_else(|_| panic!("cannot start a pool thread"));
        }
        for _ in 0..n {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .expect("a pool job never ran");
        }
    }
}
