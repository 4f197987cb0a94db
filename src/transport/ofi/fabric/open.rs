//! Opening the fabric: the provider and domain chosen (`FI_PROVIDER`, `PCCL_OFI_DOMAIN`, the
//! NIC map), the endpoint with its completion queue and address vector, and what each
//! provider offers (`pccl-info`).

use super::*;

pub(super) fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The domain the user named: `PCCL_OFI_DOMAIN`, else `FI_DOMAIN`.
pub fn chosen_domain() -> Option<String> {
    env("PCCL_OFI_DOMAIN").or_else(|| env("FI_DOMAIN"))
}

/// Domains of the NIC the topology maps this local rank to (`topology::apply`): the device
/// name (`cxi0`, `mlx5_0`) and its IP interface (what the tcp provider calls its domains).
pub(super) fn nic_map_domains() -> Vec<String> {
    crate::topology::apply::nic_for_local_rank()
        .map(|n| std::iter::once(n.name).chain(n.netdev).collect())
        .unwrap_or_default()
}

/// Opens the endpoint on the user's domain (strictly: a missing one is an error), else on the
/// NIC map's choice where the provider has that domain, else on the provider's first domain.
pub fn open_endpoint() -> Result<Endpoint> {
    if let Some(d) = chosen_domain() {
        return Endpoint::open(Some(&d));
    }
    for d in nic_map_domains() {
        if let Ok(ep) = Endpoint::open(Some(&d)) {
            return Ok(ep);
        }
    }
    Endpoint::open(None)
}

pub(super) struct InfoList(*mut FiInfo);

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once.
        unsafe { sys::pccl_ofi_freeinfo(self.0) };
    }
}

/// How often an endpoint open refused with `EBUSY` is tried ([`Endpoint::open`]).
pub(super) const OPEN_TRIES: usize = 4;
/// `FI_EBUSY` (= `EBUSY`), as libfabric returns it: negated.
pub(super) const EBUSY: i32 = 16;

/// Eager limit set for rxm over tcp where the user set none ([`tune_rxm`]).
pub const RXM_EAGER: usize = 256 << 10;

/// Sets `FI_OFI_RXM_EAGER_LIMIT` to [`RXM_EAGER`] when `FI_PROVIDER` asks for rxm over
/// tcp and the user did not set it, once, before libfabric's first `fi_getinfo` (rxm reads
/// it when it initialises). With rxm's default (16 KiB) every larger piece went through its
/// segmentation or rendezvous protocol, whose extra round trips each wait for the peer to
/// progress: 64 KiB all-reduces took 3–9× the TCP transport's time; an eager message costs
/// one pass over the socket (docs/OFI.md, "Small messages"). Larger pieces keep the
/// rendezvous, which places them without rxm's copy of an unexpected message. rxm over tcp
/// allows an eager limit above its buffer size (over verbs it does not, so nothing is set
/// unless `FI_PROVIDER` names tcp). Every rank of a job computes the same value (rxm's
/// connections require equal limits).
pub(super) fn tune_rxm() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let over_tcp = env("FI_PROVIDER").is_some_and(|p| {
            let p = p.to_ascii_lowercase();
            p.contains("rxm") && (p.contains("tcp") || p.contains("net"))
        });
        if over_tcp && env("FI_OFI_RXM_EAGER_LIMIT").is_none() {
            std::env::set_var("FI_OFI_RXM_EAGER_LIMIT", RXM_EAGER.to_string());
        }
    });
}

pub(super) fn getinfo(domain: Option<&str>, hmem: bool) -> std::result::Result<InfoList, i32> {
    tune_rxm();
    let dom = domain.map(|d| CString::new(d).unwrap_or_default());
    let mut info = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and outlive the call; `info` receives a list.
    let ret = unsafe {
        sys::pccl_ofi_getinfo(
            std::ptr::null(),
            dom.as_ref().map_or(std::ptr::null(), |d| d.as_ptr()),
            i32::from(hmem),
            &mut info,
        )
    };
    if ret != 0 || info.is_null() {
        return Err(ret);
    }
    Ok(InfoList(info))
}

/// An entry libfabric offers PCCL here (RDM, tagged, directed receive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// Provider name (`tcp;ofi_rxm`, `shm`, `cxi`).
    pub provider: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name (the NIC, or `lo`/`eth0` for tcp).
    pub domain: String,
    /// The entry also answers a request for `FI_HMEM` (device buffers).
    pub hmem: bool,
}

/// The entries libfabric offers PCCL here (`FI_PROVIDER` narrows the list), for diagnostics.
pub fn offers() -> Vec<Offer> {
    let list_of = |hmem: bool| {
        let Ok(list) = getinfo(None, hmem) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut p = list.0;
        while !p.is_null() {
            let mut d = Desc::default();
            // SAFETY: `p` is an entry of the live list.
            p = unsafe { sys::pccl_ofi_describe(p, &mut d) };
            out.push(Offer {
                provider: sys::field(&d.provider),
                fabric: sys::field(&d.fabric),
                domain: sys::field(&d.domain),
                hmem,
            });
        }
        out
    };
    let with_hmem = list_of(true);
    let mut all = list_of(false);
    for o in &mut all {
        o.hmem = with_hmem
            .iter()
            .any(|h| (&h.provider, &h.fabric, &h.domain) == (&o.provider, &o.fabric, &o.domain));
    }
    all
}

/// The providers (`provider  fabric  domain`) usable for PCCL here (RDM, tagged, directed
/// receive), for diagnostics (`FI_PROVIDER` narrows the list).
pub fn providers() -> Vec<String> {
    offers()
        .into_iter()
        .map(|o| format!("{}  {}  {}", o.provider, o.fabric, o.domain))
        .collect()
}

/// The domain the transport would open here and why, chosen as when it opens its endpoint
/// (without opening anything): `(domain, why)`, `None` for the provider's first.
pub fn domain_choice() -> (Option<String>, String) {
    if let Some(d) = chosen_domain() {
        return (Some(d), "PCCL_OFI_DOMAIN / FI_DOMAIN (the user's)".into());
    }
    let offered = offers();
    for d in nic_map_domains() {
        if offered.iter().any(|o| o.domain == d) {
            return (
                Some(d),
                "the NIC map's NIC for this local rank, which the provider offers".into(),
            );
        }
    }
    let why = match nic_map_domains().as_slice() {
        [] => "no NIC mapped to this rank: the provider's first domain".to_string(),
        ds => format!(
            "the mapped NIC ({}) is not among the provider's domains: its first",
            ds.join(" / ")
        ),
    };
    (None, why)
}

impl Endpoint {
    /// Opens an endpoint on the first provider libfabric offers (`FI_PROVIDER` selects),
    /// on `domain` if given. Prefers an `FI_HMEM`-capable entry.
    pub fn open(domain: Option<&str>) -> Result<Self> {
        let list = match getinfo(domain, true) {
            Ok(l) => l,
            Err(_) => getinfo(domain, false).map_err(|e| {
                Error::system(format!(
                    "libfabric: no provider offers reliable-datagram tagged messaging{} \
                     ({}); FI_PROVIDER={} (try FI_PROVIDER='tcp;ofi_rxm' or shm; `fi_info` \
                     lists them)",
                    domain.map_or(String::new(), |d| format!(" on domain '{d}'")),
                    sys::strerror(i64::from(e)),
                    env("FI_PROVIDER").unwrap_or_else(|| "(unset)".into())
                ))
            })?,
        };
        // Providers may ignore the domain-name hint (1.17's rxm does): pick the entry here.
        let mut d = Desc::default();
        let mut entry = list.0;
        let mut seen = Vec::new();
        loop {
            // SAFETY: `entry` is an entry of the live list.
            let next = unsafe { sys::pccl_ofi_describe(entry, &mut d) };
            let name = sys::field(&d.domain);
            if domain.is_none_or(|want| want == name) {
                break;
            }
            seen.push(name);
            if next.is_null() {
                return Err(Error::system(format!(
                    "libfabric: provider {} has no domain '{}' (PCCL_OFI_DOMAIN / FI_DOMAIN); \
                     its domains: {}",
                    sys::field(&d.provider),
                    domain.unwrap_or_default(),
                    seen.join(", ")
                )));
            }
            entry = next;
        }
        let force = env("PCCL_OFI_MR").as_deref() == Some("1");
        let caps = Caps {
            provider: sys::field(&d.provider),
            fabric: sys::field(&d.fabric),
            domain: sys::field(&d.domain),
            hmem: d.caps & sys::fi_hmem() != 0,
            register: force
                || d.mr_mode & sys::fi_mr_local() != 0
                || d.mode & sys::fi_local_mr() != 0,
            cq_data: d.cq_data_size >= 8 && env("PCCL_OFI_CQ_DATA").as_deref() != Some("0"),
            wait_fd: false,
        };
        let want_fd = wants_wait_fd(&caps.provider)?;
        let mut raw = RawEp::default();
        // A killed job's shm regions stay in /dev/shm named after its pids; a process that
        // later gets such a pid has its first endpoint refused with EBUSY (shm takes the
        // region for a live process's: its own), the stale file removed. Opening again
        // succeeds; a few tries cover a process that inherits several such names.
        let mut ret = 0;
        for _ in 0..OPEN_TRIES {
            // SAFETY: `entry` is a live fi_info of the list; `raw` receives the opened
            // objects (on failure the shim has closed whatever it opened).
            ret = unsafe { sys::pccl_ofi_open(entry, &mut raw, i32::from(want_fd)) };
            if ret != -EBUSY {
                break;
            }
        }
        sys::check(
            &format!(
                "opening provider {} domain {} (fi_fabric/fi_domain/fi_endpoint)",
                caps.provider, caps.domain
            ),
            i64::from(ret),
        )
        .map_err(|e| match ret {
            r if r == -EBUSY => Error::system(format!(
                "{} after {OPEN_TRIES} tries (on shm: regions of dead processes left in \
                 /dev/shm can block new ones; remove /dev/shm/<pid>:* of jobs that ended)",
                e.message()
            )),
            _ => e,
        })?;
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: `raw` is open; `name` has `len` writable bytes.
        let ret = unsafe { sys::pccl_ofi_getname(&mut raw, name.as_mut_ptr().cast(), &mut len) };
        let fd = if want_fd && ret == 0 {
            // SAFETY: `raw` is open (checked after pccl_ofi_open above).
            unsafe { sys::pccl_ofi_wait_fd(&mut raw) }
        } else {
            -1
        };
        let wait_fd = (fd >= 0).then_some(fd);
        let mut caps = caps;
        caps.wait_fd = wait_fd.is_some();
        let cache = MrCache::new(caps.register);
        let registrations = cache.made.clone();
        let mut st = State {
            raw,
            done: HashMap::new(),
            broken: None,
            in_flight: 0,
            cache,
            cq_data: caps.cq_data,
            junk: VecDeque::new(),
            junk_seen: VecDeque::new(),
            board_gen: 0,
            limbo: HashMap::new(),
            scratch: Vec::new(),
            backlog: VecDeque::new(),
            wait_fd,
        };
        if ret != 0 {
            st.close();
            return Err(Error::system(format!(
                "libfabric: fi_getname failed: {}",
                sys::strerror(i64::from(ret))
            )));
        }
        name.truncate(len);
        Ok(Endpoint {
            state: Mutex::new(st),
            caps,
            name,
            registrations,
        })
    }

    /// Locks the endpoint.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks the endpoint if nobody holds it.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// Whether idle waits should block on the completion queue's file descriptor:
/// `PCCL_OFI_WAIT=fd` (default) or `poll`. On `shm` a peer's message does not signal the
/// descriptor (no kernel object in its path), so shm always polls.
pub(super) fn wants_wait_fd(provider: &str) -> Result<bool> {
    let fd = match env("PCCL_OFI_WAIT").as_deref() {
        None | Some("fd") => true,
        Some("poll") => false,
        Some(v) => {
            return Err(Error::invalid(format!(
                "PCCL_OFI_WAIT={v}: expected fd (block on the completion queue's descriptor) \
                 or poll (read it on a timer)"
            )))
        }
    };
    Ok(fd && provider != "shm")
}
