//! The handles the C ABI hands out: numbered tokens looked up in one registry, never
//! addresses of memory, so a destroyed, foreign or garbage handle is an error with a message
//! instead of undefined behaviour. Numbers are never reused, so a stale handle cannot reach a
//! newer object either.

use crate::comm::request::Request;
use crate::error::{Error, Result};
use crate::{Communicator, ThreadWorld};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning (a panic elsewhere leaves these maps consistent: every
/// update is a single insert or remove).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A `pcclComm_t`.
    Comm = 1,
    /// A `pcclRequest_t`.
    Request = 2,
    /// A `pcclThreadWorld_t`.
    World = 3,
}

impl Kind {
    fn from_tag(t: usize) -> Option<Kind> {
        match t {
            1 => Some(Kind::Comm),
            2 => Some(Kind::Request),
            3 => Some(Kind::World),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Comm => "communicator (pcclComm_t)",
            Kind::Request => "request (pcclRequest_t)",
            Kind::World => "thread world (pcclThreadWorld_t)",
        }
    }
    fn gone(self) -> &'static str {
        match self {
            Kind::Comm => {
                "was destroyed by pcclCommDestroy or pcclCommAbort and cannot be used any more"
            }
            Kind::Request => "was already completed and freed by pcclWait",
            Kind::World => "was destroyed by pcclThreadWorldDestroy",
        }
    }
}

/// A live communicator and the last error reported on it.
pub(super) struct CommEntry {
    /// The communicator.
    pub comm: Communicator,
    /// Message of the last failed call on this communicator ("" if none).
    pub last_error: Mutex<String>,
    /// The device runtime its streams belong to (`pcclCommSetDeviceRuntime`; 0: auto).
    pub runtime: std::sync::atomic::AtomicI32,
}

/// A non-blocking collective in flight.
pub(super) struct RequestEntry {
    /// The request; taken by `pcclWait`.
    pub req: Mutex<Option<Request<()>>>,
    /// The communicator it runs on (kept alive until the request is waited for).
    pub comm: Arc<CommEntry>,
    /// The entry point that started it, for error messages.
    pub what: &'static str,
}

/// A group of thread-ranks and which of its ranks have a communicator already.
pub(super) struct WorldEntry {
    /// The world.
    pub world: ThreadWorld,
    /// Ranks that `pcclCommInitThreads` is building or has built.
    pub claimed: Mutex<BTreeSet<usize>>,
}

enum Entry {
    Comm(Arc<CommEntry>),
    Request(Arc<RequestEntry>),
    World(Arc<WorldEntry>),
}

impl Entry {
    fn kind(&self) -> Kind {
        match self {
            Entry::Comm(_) => Kind::Comm,
            Entry::Request(_) => Kind::Request,
            Entry::World(_) => Kind::World,
        }
    }
}

struct Registry {
    next: usize,
    live: BTreeMap<usize, Entry>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 1,
    live: BTreeMap::new(),
});

/// Handles are `BASE + id * STRIDE + kind`: far from small integers and from NULL, and
/// telling a destroyed handle (its id was given out) from one PCCL never gave out.
const BASE: usize = 0x5cc1_0000;
const STRIDE: usize = 16;

fn encode(id: usize, kind: Kind) -> Option<usize> {
    id.checked_mul(STRIDE)?.checked_add(BASE + kind as usize)
}

/// Registers an entry and returns its handle value.
fn insert(e: Entry) -> Result<usize> {
    let mut reg = lock(&REGISTRY);
    let id = reg.next;
    let h =
        encode(id, e.kind()).ok_or_else(|| Error::system("PCCL has run out of handle numbers"))?;
    reg.next += 1;
    reg.live.insert(h, e);
    Ok(h)
}

/// Finds (and with `take`, unregisters) the entry of handle `h`, which should be a `want`.
/// `arg` names the argument in messages.
fn find(h: usize, want: Kind, arg: &str, take: bool) -> Result<Entry> {
    if h == 0 {
        return Err(Error::invalid(format!(
            "{arg} is NULL; it must be a {}",
            want.name()
        )));
    }
    let mut reg = lock(&REGISTRY);
    let found = if take {
        reg.live.remove(&h)
    } else {
        reg.live.get(&h).map(Entry::clone_ref)
    };
    match found {
        Some(e) if e.kind() == want => return Ok(e),
        Some(e) => {
            let kind = e.kind();
            if take {
                reg.live.insert(h, e);
            }
            return Err(Error::invalid(format!(
                "{arg} is a {}, not a {}",
                kind.name(),
                want.name()
            )));
        }
        None => {}
    }
    let decoded = h
        .checked_sub(BASE)
        .filter(|o| o / STRIDE >= 1 && o / STRIDE < reg.next)
        .and_then(|o| Kind::from_tag(o % STRIDE));
    Err(match decoded {
        Some(k) if k == want => Error::usage(format!("{arg} {}", want.gone())),
        Some(k) => Error::invalid(format!(
            "{arg} is a {} (since freed), not a {}",
            k.name(),
            want.name()
        )),
        None => Error::invalid(format!(
            "{arg} ({h:#x}) is not a {}: it was never created by PCCL (uninitialised or corrupted)",
            want.name()
        )),
    })
}

impl Entry {
    fn clone_ref(&self) -> Entry {
        match self {
            Entry::Comm(c) => Entry::Comm(c.clone()),
            Entry::Request(r) => Entry::Request(r.clone()),
            Entry::World(w) => Entry::World(w.clone()),
        }
    }
}

fn unexpected() -> Error {
    Error::internal("handle registry returned an entry of the wrong kind")
}

/// Registers a communicator; returns its handle value.
pub(super) fn add_comm(comm: Communicator) -> Result<usize> {
    insert(Entry::Comm(Arc::new(CommEntry {
        comm,
        last_error: Mutex::new(String::new()),
        runtime: std::sync::atomic::AtomicI32::new(0),
    })))
}

/// The communicator of handle `h` (`take`: and unregisters it).
pub(super) fn comm(h: usize, arg: &str, take: bool) -> Result<Arc<CommEntry>> {
    match find(h, Kind::Comm, arg, take)? {
        Entry::Comm(c) => Ok(c),
        _ => Err(unexpected()),
    }
}

/// Registers a request; returns its handle value.
pub(super) fn add_request(
    req: Request<()>,
    comm: Arc<CommEntry>,
    what: &'static str,
) -> Result<usize> {
    insert(Entry::Request(Arc::new(RequestEntry {
        req: Mutex::new(Some(req)),
        comm,
        what,
    })))
}

/// The request of handle `h` (`take`: and unregisters it).
pub(super) fn request(h: usize, arg: &str, take: bool) -> Result<Arc<RequestEntry>> {
    match find(h, Kind::Request, arg, take)? {
        Entry::Request(r) => Ok(r),
        _ => Err(unexpected()),
    }
}

/// Registers a thread world; returns its handle value.
pub(super) fn add_world(world: ThreadWorld) -> Result<usize> {
    insert(Entry::World(Arc::new(WorldEntry {
        world,
        claimed: Mutex::new(BTreeSet::new()),
    })))
}

/// The thread world of handle `h` (`take`: and unregisters it).
pub(super) fn world(h: usize, arg: &str, take: bool) -> Result<Arc<WorldEntry>> {
    match find(h, Kind::World, arg, take)? {
        Entry::World(w) => Ok(w),
        _ => Err(unexpected()),
    }
}
