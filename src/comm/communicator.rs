//! [`Communicator`]: ranks, topology, the tuner's choices, scratch space and progress.

use super::progress::{Outstanding, Pool, Worker};
use super::request::{lost, pair, Request};
use super::scratch_pool::ScratchPool;
use crate::config::{Config, DebugLevel};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{abandon, execute, BlockLayout, ExecOptions, Memory};
use crate::plan::{Algorithm, Collective, Plan};
use crate::topology::agree::{self, NicView};
use crate::topology::Topology;
use crate::transport::faults::Tag;
use crate::transport::threads::ThreadWorld;
use crate::transport::{fnv1a, Transport};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod alltoallv;
mod calls;
mod collectives;
mod hooks;
mod membership;
mod p2p;
mod quantized;
mod quantized_agreement;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod quantized_device;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod quantized_encoded;
mod quantized_halving;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod quantized_members;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod quantized_queued;
mod rooted;
mod trust;
mod tuning;

use calls::len_mul;

#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(unused_imports))]
pub(crate) use alltoallv::AllToAllBlocks;
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(unused_imports))]
pub(crate) use p2p::StampedP2p;
pub use p2p::{Dir, Group, P2pOp};
pub use quantized_halving::QuantScheme;
pub use rooted::RawRooted;

/// A collective named for the raw-pointer entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawCollective {
    /// All-gather (`count` = elements sent per rank).
    AllGather,
    /// Reduce-scatter (`count` = elements received per rank).
    ReduceScatter(ReduceOp),
    /// All-reduce (`count` = elements).
    AllReduce(ReduceOp),
    /// Broadcast from the given root (`count` = elements).
    Broadcast(usize),
}

/// A group of ranks that run collectives together (MPI's communicator, NCCL's `ncclComm_t`).
///
/// Every rank must call the same collectives in the same order with matching counts; a rank
/// that disagrees (another collective, count, dtype, op or root) makes the call fail on every
/// rank, and so does a call one rank refuses (bad arguments). A communicator takes one call
/// at a time: a call made while another thread is inside one fails with an invalid-usage
/// error (calls from several threads one after another must come in the same order on every
/// rank, as with NCCL). Its non-blocking calls progress on a worker thread of its own, in
/// issue order.
pub struct Communicator {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Arc<dyn Transport>,
    topo: Topology,
    cfg: Config,
    /// The deadline of every call, in nanoseconds: `cfg.timeout` until `set_timeout`.
    timeout_ns: AtomicU64,
    seq: AtomicU32,
    /// Set while an application thread is inside a call (one call at a time).
    busy: AtomicBool,
    /// Shrinks made from this communicator (names each new one's context).
    shrinks: AtomicU32,
    /// Survivors' agreements run on this communicator (names each one's messages).
    agreements: AtomicU32,
    /// Held while a plan runs (one plan at a time per communicator).
    exec: Mutex<()>,
    /// Host scratch, shared with the communicators split from this one (`scratch_pool`).
    scratch: Arc<ScratchPool>,
    /// Bytes of scratch this communicator's plans have needed at most.
    scratch_peak: AtomicUsize,
    worker: Mutex<Option<Worker>>,
    outstanding: Outstanding,
    /// The tuner's algorithm and piece size (or its online trials) per collective and size
    /// bucket.
    choices: Mutex<HashMap<(Collective, u32), tuning::Tuning>>,
    /// Plans by collective, algorithm and whether out of place (`plan::build_for`).
    plans: Mutex<HashMap<(Collective, Algorithm, bool), Arc<Plan>>>,
    /// Working space of the device front end (`comm::device`), kept between calls.
    device: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Point-to-point message counters per pair.
    p2p: Mutex<p2p::P2pSeq>,
    /// Signalled when a point-to-point receive took its turn (see `p2p`).
    p2p_turn: Condvar,
    /// Non-blocking point-to-point requests whose receives have not all been taken yet:
    /// collectives wait for them (they read the same per-pair message order).
    recvs: Outstanding,
    /// Threads that finish non-blocking point-to-point requests (see `p2p`).
    p2p_pool: Arc<Pool>,
    /// Run by [`Communicator::abort`] (the device front end's stream gates).
    abort_hooks: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    /// The first error of a queued device collective (NCCL's asynchronous error).
    device_error: Arc<Mutex<Option<Error>>>,
    /// The node's and the network's sub-communicators of the two-hop quantized
    /// reduce-scatter (`quantized`), split once, on its first call.
    levels: Mutex<Option<(Communicator, Communicator)>>,
    /// The per-level quantized reduce-scatter's sub-communicators, innermost level first
    /// (split on first use).
    per_level: Mutex<Option<Vec<Communicator>>>,
}

/// This rank's NIC view: discovery (cached per process) with the configured map and file.
fn nic_view(cfg: &Config) -> NicView {
    let env = crate::topology::env::ProcessEnv;
    let hw = crate::topology::discover::host_hardware(cfg.topo_file.as_deref());
    NicView::new(hw, &env, cfg.nic_map.clone())
        .with_group_size(cfg.group_size)
        .with_numa(crate::topology::numa::this_thread())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a collective call hands to the executor, with pointers (the safe front ends build it
/// from borrowed slices; the async ones from buffers they own until completion).
struct Call<T> {
    coll: Collective,
    op: ReduceOp,
    block_bytes: usize,
    input: (*const T, usize, BlockLayout),
    output: (*mut T, usize, BlockLayout),
    scratch: BlockLayout,
}

impl<T> Call<T> {
    /// Whether the output shares no element with the input (then plans may keep partial
    /// sums in the output).
    fn out_of_place(&self) -> bool {
        let es = std::mem::size_of::<T>();
        let (i, o) = (self.input.0 as usize, self.output.0 as usize);
        let (ie, oe) = (
            i.saturating_add(self.input.1 * es),
            o.saturating_add(self.output.1 * es),
        );
        self.input.1 == 0 || self.output.1 == 0 || oe <= i || ie <= o
    }
}

// SAFETY: a Call only carries pointers into buffers that the front end keeps alive and
// untouched until the call completes (borrowed for a blocking call, owned by the job of a
// non-blocking one).
unsafe impl<T: Send> Send for Call<T> {}

impl Communicator {
    /// A communicator over `transport`, reading settings from the `PCCL_*` variables.
    pub fn new(transport: Arc<dyn Transport>) -> Result<Self> {
        Self::with_config(transport, Config::from_env()?)
    }

    /// A communicator over `transport` with explicit settings. Collective over all ranks
    /// (it exchanges node keys unless `ranks_per_node` is set).
    pub fn with_config(transport: Arc<dyn Transport>, cfg: Config) -> Result<Self> {
        let p = transport.size();
        let view = nic_view(&cfg);
        let (topo, why) = match cfg.ranks_per_node {
            Some(m) => {
                let own = view.own_map(m);
                (
                    Topology::uniform(p, m)
                        .with_nic_map(own)
                        .with_groups(view.own_group(m)),
                    "own view, no exchange",
                )
            }
            None => {
                // Exchange host keys and NIC views with a flat ring on a provisional
                // single-node topology.
                let provisional =
                    Communicator::build(transport.clone(), Topology::uniform(p, p), cfg.clone());
                // Its collective is #u32::MAX, not #0: the real communicator's #0 may start on
                // a rank (and fail) while others are still here, and must not be taken for it.
                provisional.inner.seq.store(u32::MAX, Ordering::Relaxed);
                let mut all = vec![0u64; p * agree::WORDS];
                provisional.all_gather(&view.words(transport.node_key()), &mut all)?;
                let (topo, _, source) = view.agree(transport.rank(), &all)?;
                (topo, source.describe())
            }
        };
        let c = Communicator::build(transport, topo, cfg);
        if c.inner.cfg.debug >= DebugLevel::Info && c.rank() == 0 {
            eprintln!(
                "PCCL INFO comm of {} ranks, {} nodes as {} over {}; NIC map {} ({why}; {})",
                c.size(),
                c.inner.topo.nodes().len(),
                c.inner.topo.describe(),
                c.inner.transport.name(),
                c.inner.topo.nic_map().map_or("-".into(), |m| m.to_string()),
                view.hardware().source
            );
        }
        Ok(c)
    }

    fn build(transport: Arc<dyn Transport>, topo: Topology, cfg: Config) -> Self {
        Self::build_in(transport, topo, cfg, Arc::default())
    }

    /// A communicator whose scratch comes from `scratch` (its parent's, for a split).
    fn build_in(
        transport: Arc<dyn Transport>,
        topo: Topology,
        cfg: Config,
        scratch: Arc<ScratchPool>,
    ) -> Self {
        let rank = transport.rank();
        Communicator {
            inner: Arc::new(Inner {
                transport,
                topo,
                timeout_ns: AtomicU64::new(duration_ns(cfg.timeout)),
                cfg,
                seq: AtomicU32::new(0),
                busy: AtomicBool::new(false),
                shrinks: AtomicU32::new(0),
                agreements: AtomicU32::new(0),
                exec: Mutex::new(()),
                scratch,
                scratch_peak: AtomicUsize::new(0),
                worker: Mutex::new(None),
                outstanding: Outstanding::default(),
                choices: Mutex::new(HashMap::new()),
                plans: Mutex::new(HashMap::new()),
                device: Mutex::new(None),
                p2p: Mutex::new(p2p::P2pSeq::default()),
                p2p_turn: Condvar::new(),
                recvs: Outstanding::default(),
                p2p_pool: Arc::new(Pool::new(format!("pccl-p2p-{rank}"))),
                abort_hooks: Mutex::new(Vec::new()),
                device_error: Arc::new(Mutex::new(None)),
                levels: Mutex::new(None),
                per_level: Mutex::new(None),
            }),
        }
    }

    /// Runs `f` on `p` thread-ranks, each with its own communicator, and returns their
    /// results in rank order. The embedded way to use PCCL without MPI.
    pub fn run_threads<R: Send>(
        p: usize,
        cfg: Config,
        f: impl Fn(Communicator) -> R + Sync,
    ) -> Result<Vec<R>> {
        if p == 0 {
            return Err(Error::invalid("a thread world needs at least one rank"));
        }
        let world = ThreadWorld::new(p);
        let transports: Vec<_> = (0..p).map(|r| world.transport(r)).collect::<Result<_>>()?;
        std::thread::scope(|s| {
            let handles: Vec<_> = transports
                .into_iter()
                .enumerate()
                .map(|(r, t)| {
                    let cfg = cfg.clone();
                    let f = &f;
                    std::thread::Builder::new()
                        .name(format!("pccl-rank-{r}"))
                        .spawn_scoped(s, move || Communicator::with_config(t, cfg).map(f))
                        .map_err(|e| Error::system(format!("cannot start rank thread: {e}")))
                })
                .collect::<Result<_>>()?;
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| Error::internal("a rank thread panicked"))?
                })
                .collect()
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.transport.rank()
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.transport.size()
    }
    /// Node structure.
    pub fn topology(&self) -> &Topology {
        &self.inner.topo
    }
    /// Settings.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// How long any call may wait on its peers before it fails with a timeout
    /// (`PCCL_TIMEOUT` until [`Communicator::set_timeout`]).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    /// Sets the deadline of every later call (collective, rooted, all-to-all, point-to-point,
    /// device), including non-blocking calls issued earlier that have not started yet; torch's
    /// `ProcessGroup.set_timeout`. Local to this rank. Zero is refused.
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid(format!(
                "rank {}: a communicator's timeout must be positive",
                self.rank()
            )));
        }
        self.inner
            .timeout_ns
            .store(duration_ns(timeout), Ordering::SeqCst);
        Ok(())
    }
    /// Name of the transport (`threads`, `mpi`).
    pub fn transport_name(&self) -> &'static str {
        self.inner.transport.name()
    }

    /// The algorithm a collective of `coll` with `block_bytes` per block would use now (under
    /// `PCCL_TUNE_ONLINE`, the model's choice until the trials of its size end, then theirs).
    pub fn algorithm_for(&self, coll: Collective, block_bytes: usize) -> Result<Algorithm> {
        self.inner.algorithm_for(coll, block_bytes)
    }

    /// Calls of `coll` with `block_bytes` per block still to make before the online trials
    /// (`PCCL_TUNE_ONLINE`) settle the algorithm of its size; 0 when settled, when nothing is
    /// tried, or when the trials time another size of the same size bucket (a power of two).
    /// The same on every rank that made the same calls.
    pub fn online_calls_left(&self, coll: Collective, block_bytes: usize) -> Result<usize> {
        self.inner.online_calls_left(coll, block_bytes)
    }

    // ---- one call at a time, refusals, abort, shrink --------------------------------------

    /// Runs a blocking call: one call at a time, a sequence number taken whether or not the
    /// arguments are good, and the call refused on every rank when they are not.
    ///
    /// # Safety
    /// The buffers the built call points to must stay valid and otherwise untouched until
    /// this returns.
    unsafe fn blocking<T: Element>(
        &self,
        what: &str,
        build: impl FnOnce() -> Result<Call<T>>,
    ) -> Result<()> {
        let _one = self.inner.enter(what)?;
        let seq = self.inner.next_seq();
        let call = build().map_err(|e| self.inner.refuse(seq, what, e))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.run_blocking(call, seq) }
    }

    /// Queues a non-blocking call (as [`Communicator::blocking`]); the request yields `keep`.
    ///
    /// # Safety
    /// The buffers the built call points to must stay valid and untouched until the request
    /// completes; the callers guarantee it by moving their owners into `keep`.
    unsafe fn nonblocking<T: Element, K: Send + 'static>(
        &self,
        what: &str,
        build: impl FnOnce() -> Result<Call<T>>,
        keep: K,
    ) -> Result<Request<K>> {
        let _one = self.inner.enter(what)?;
        let seq = self.inner.next_seq();
        let call = build().map_err(|e| self.inner.refuse(seq, what, e))?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.submit(call, keep, seq) }
    }

    // ---- sub-communicators ----------------------------------------------------------------

    /// Splits into sub-communicators as `MPI_Comm_split`: ranks passing the same `color` form
    /// one, ordered by `key` then by rank; `None` (MPI_UNDEFINED) joins none and gets `None`.
    /// Collective over all ranks.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let mut cfg = self.inner.cfg.clone();
        cfg.timeout = self.timeout(); // the parent's current timeout (set_timeout included)
        self.split_with_config(color, key, cfg)
    }

    /// [`Communicator::split`] with other settings for the new communicator.
    pub fn split_with_config(
        &self,
        color: Option<u32>,
        key: i32,
        cfg: Config,
    ) -> Result<Option<Communicator>> {
        let p = self.size();
        let tag = self.inner.seq.load(Ordering::SeqCst);
        let mine = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * p];
        self.all_gather(&mine, &mut all)?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<usize> = (0..p).filter(|&r| all[2 * r] == i64::from(color)).collect();
        members.sort_by_key(|&r| (all[2 * r + 1], r));
        let ctx = fnv1a(&[u64::from(tag).to_le_bytes(), u64::from(color).to_le_bytes()].concat());
        let transport = self.inner.transport.subset(&members, ctx)?;
        let keys: Vec<u64> = members
            .iter()
            .map(|&r| self.inner.topo.position(r).0 as u64)
            .collect();
        let topo = Topology::from_node_keys(&keys)
            .inherit_nic_map(&self.inner.topo, &members)
            .inherit_groups(&self.inner.topo, &members);
        Ok(Some(self.child(transport, topo, cfg)))
    }

    /// A communicator over a subset of this one's ranks, sharing its scratch pool.
    pub(super) fn child(&self, transport: Arc<dyn Transport>, topo: Topology, cfg: Config) -> Self {
        Communicator::build_in(transport, topo, cfg, self.inner.scratch.clone())
    }
}

/// A duration in nanoseconds, saturating (u64 nanoseconds cover 584 years).
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Inner {
    /// Waits until this rank's earlier calls have taken their place in the per-pair message
    /// order: queued non-blocking calls started (collectives finished, point-to-point sends
    /// posted) and point-to-point receives done. A blocking call runs after this.
    fn quiesce(&self) {
        self.outstanding.wait_idle();
        self.recvs.wait_idle();
    }

    fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::SeqCst))
    }

    /// Runs `call` as collective `seq` on the calling thread, after any queued non-blocking
    /// collectives.
    ///
    /// # Safety
    /// The buffers `call` points to must stay valid and otherwise untouched until it returns.
    unsafe fn run_blocking<T: Element>(&self, call: Call<T>, seq: u32) -> Result<()> {
        let (coll, block_bytes) = (call.coll, call.block_bytes);
        let p = self
            .plan(coll, block_bytes, true, call.out_of_place())
            .map_err(|e| self.refuse(seq, "planning", e))?;
        self.quiesce();
        let t0 = Instant::now();
        self.execute(&p.plan, call, seq, p.piece)?;
        if let Some(i) = p.trial {
            self.record_trial(coll, block_bytes, i, t0.elapsed());
        }
        Ok(())
    }

    /// Queues `call` as collective `seq` on the progress worker; the request yields `keep`
    /// when it completes.
    ///
    /// # Safety
    /// The buffers `call` points to must stay valid and untouched until the job completes;
    /// the callers guarantee it by moving their owners into `keep`.
    unsafe fn submit<T: Element, K: Send + 'static>(
        self: &Arc<Self>,
        call: Call<T>,
        keep: K,
        seq: u32,
    ) -> Result<Request<K>> {
        let (coll, block_bytes) = (call.coll, call.block_bytes);
        let p = self
            .plan(coll, block_bytes, true, call.out_of_place())
            .map_err(|e| self.refuse(seq, "planning", e))?;
        let (req, done) = pair();
        let me = self.clone();
        self.outstanding.add();
        let job = Box::new(move || {
            // A panic inside a kernel must not leave the request or the queue stuck.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let t0 = Instant::now();
                me.execute(&p.plan, call, seq, p.piece)?;
                if let Some(i) = p.trial {
                    me.record_trial(coll, block_bytes, i, t0.elapsed());
                }
                Ok(())
            }))
            .unwrap_or_else(|_| {
                Err(Error::internal(
                    "a collective panicked on the progress thread",
                ))
            })
            .map(|()| keep);
            me.outstanding.done();
            // Release the communicator before waking the waiter: the last reference must not
            // be dropped on this thread after the application finalised MPI.
            drop(me);
            done.complete(r);
        });
        let mut w = lock(&self.worker);
        if w.is_none() {
            match Worker::start(format!("pccl-progress-{}", self.transport.rank())) {
                Ok(worker) => *w = Some(worker),
                Err(e) => {
                    self.outstanding.done();
                    return Err(self.refuse(seq, "starting the progress thread", e));
                }
            }
        }
        if let Some(worker) = w.as_ref() {
            if let Err(e) = worker.submit(job) {
                self.outstanding.done();
                return Err(self.refuse(seq, "queueing", e));
            }
        } else {
            return Err(lost());
        }
        Ok(req)
    }

    /// Runs `call` as collective `seq`: the stamp, the fault board, injected faults, then the
    /// plan under one deadline. Any failure is made known to every peer.
    fn execute<T: Element>(
        &self,
        plan: &Plan,
        call: Call<T>,
        seq: u32,
        piece: Option<usize>,
    ) -> Result<()> {
        // Earlier point-to-point receives take their messages first (per-pair order).
        self.recvs.wait_idle();
        let tag = self.stamp_of(plan, &call, seq);
        let tr = self.transport.as_ref();
        let r = (|| {
            tr.faults().check(tag, tr.rank())?;
            let corrupt = self.inject(seq)?;
            self.execute_plan(plan, call, tag, corrupt, piece)
        })();
        if let Err(e) = &r {
            abandon(tr, tag, e);
        }
        // A timeout names the rank behind it from the others' reports (transport::diagnose).
        r.map_err(|e| {
            let grace = crate::transport::diagnose::grace(self.timeout());
            crate::transport::diagnose::timeout(tr.faults(), seq, tr.rank(), e, grace)
        })
    }

    fn execute_plan<T: Element>(
        &self,
        plan: &Plan,
        call: Call<T>,
        tag: Tag,
        corrupt: bool,
        piece: Option<usize>,
    ) -> Result<()> {
        let _one_plan = lock(&self.exec);
        // Only the scratch blocks the plan touches (the ring reduce-scatter: two).
        let call = Call {
            scratch: call.scratch.first(plan.scratch_blocks()),
            ..call
        };
        let words = (call.scratch.total() * std::mem::size_of::<T>()).div_ceil(8);
        self.scratch_peak.fetch_max(words * 8, Ordering::Relaxed);
        let mut scratch = self.scratch.take(words);
        let s: &mut [T] = bytemuck::cast_slice_mut(scratch.words(words));
        let s_len = s.len();
        // SAFETY: the front end guarantees input/output validity (see `run_blocking` and
        // `submit`); the scratch slice is borrowed from the pool for the whole call.
        let mem = unsafe {
            Memory::from_raw(
                call.input,
                call.output,
                (s.as_mut_ptr(), s_len, call.scratch),
            )?
            .with_pieces(plan.pieces)
        };
        let opt = ExecOptions {
            tag,
            deadline: Instant::now() + self.timeout(),
            op: call.op,
            corrupt,
            piece,
        };
        execute(plan, self.transport.as_ref(), &mem, &opt)
    }
}
