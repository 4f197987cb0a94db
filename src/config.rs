//! Configuration from `PCCL_*` environment variables (all optional).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `PCCL_DEBUG` | `WARN`, `INFO` (print each algorithm choice) or `TRACE` | `WARN` |
//! | `PCCL_ALGO` | `auto`, `ring`, `rd`, `rdv` (whole-vector all-reduce; `rd` elsewhere), `hier-rd`, `hier-ring`, `hier-INTER-INTRA`, any hierarchy overlapped in K pieces as `HIER-pipeK` (`hier-rd-pipe8`, K ≤ 64), or per collective `allgather:hier-rd;reducescatter:ring` (a bare entry: the rest) | `auto` |
//! | `PCCL_TUNE_ONLINE` | timed calls per candidate with which the first calls of each collective and size try the algorithms the model predicts within 1.5× of its best (at most 3) in turn, each for that many calls in a row after one that warms up, the ranks then keeping the fastest by the slowest rank's median; `on` = `8`, `0`/`off` keeps the model's choice. Choices then depend on timing: floating-point sums may round differently from run to run | `0` |
//! | `PCCL_TUNE_MARGIN` | how much faster (a fraction) the model must predict a more involved plan than the simpler one it would replace, per step: each doubling of an overlapped hierarchy's pieces beyond two, recursive doubling inside the node instead of the ring; `0` takes the model's fastest as is (every rank must set the same) | `0` |
//! | `PCCL_TUNE_OVERLAP_MARGIN` | how much faster (a fraction) the model must predict the best overlapped hierarchy (`…-pipeK`) than the best plain candidate for the tuner to take it; `0` with `PCCL_TUNE_MARGIN=0` takes the model's fastest as is (every rank must set the same) | `0` |
//! | `PCCL_TUNE_FILE` | the tuner's machine profile (TOML, written by `pccl-tune`) | `$XDG_CONFIG_HOME/pccl/tune.toml` if present, else built in |
//! | `PCCL_RANKS_PER_NODE` | pretend nodes of this many consecutive ranks | real hosts |
//! | `PCCL_GROUP_SIZE` | ranks per group inside a node (the level of three-level algorithms) | GPUs under one PCI parent, else none |
//! | `PCCL_TIMEOUT` | seconds a whole collective may take before a timeout error (one deadline per collective) | `300` |
//! | `PCCL_CHUNK_SIZE` | bytes per pipelined piece of a large message; when set it wins over the tuner's per-call piece (every rank must set the same) | the tuner's piece per call (`1048576` where nothing is tuned) |
//! | `PCCL_ALLTOALL_DIRECT` | largest block (bytes per peer) of an equal-block all-to-all run as one phase posting every message at once; larger ones take `P−1` pairwise phases; `0`: always pairwise | `16K` |
//! | `PCCL_MODEL` | cost-model parameters `a_intra,bw_intra,a_inter,bw_inter,bw_reduce` (µs, GB/s) | built in |
//! | `PCCL_NCCL` | intra-node level of device collectives on NCCL (RCCL on ROCm): `auto`, `1` (required), `0` (never) | `auto` |
//! | `PCCL_DEVICE_DIRECT` | `1`: device collectives hand device pointers to a transport that moves device memory (CUDA-aware MPI, thread world in device mode); `0`: always pinned host staging (every rank must agree) | `1` |
//! | `PCCL_DEVICE_RUNTIME` | runtime of the streams given to the C ABI when the communicator does not say (`pcclCommSetDeviceRuntime`): `cuda`, `hip`, `auto` (CUDA where libcuda loads, else HIP) | `auto` |
//! | `PCCL_FAULT` | fault injection for tests: `rank:seq:kind[,...]`, kind `kill`, `stall`, `slow`, `drop`, `corrupt` (see `pccl::fault`) | none |
//! | `PCCL_CHECKS` | `0`: messages carry only the sequence number, not the call's fingerprint (to measure what the checks cost) | `1` |
//! | `PCCL_NIC_MAP` | NIC of each local rank in Cray MPICH syntax, e.g. `0:0-1;1:2-3` (NIC : local ranks); overrides discovery | discovered (feature `hwloc`), else one NIC |
//! | `PCCL_TOPO_FILE` | hwloc XML file describing the node, read instead of the live host (`HWLOC_XMLFILE` also works) | live host |
//! | `PCCL_CXI_RENDEZVOUS` | `1`: set the Slingshot rendezvous variables `FI_CXI_RDZV_*` (see docs/TOPOLOGY.md) where unset | off |
//! | `PCCL_MPI_CUDA_AWARE` | whether MPI moves device memory: `auto` (ask `MPIX_Query_cuda_support`), `1` (assert it does), `0` (it does not) | `auto` |
//! | `PCCL_TRANSPORT` | transport of communicators made from the environment (`pcclCommInitRank`, `pccl-bench`): `auto`, `threads`, `tcp`, `mpi`, `ofi` | `auto` |
//! | `PCCL_OFI_DOMAIN` | libfabric domain the `ofi` transport opens (`FI_DOMAIN` too; `FI_PROVIDER` picks the provider) | NIC map's choice, else the provider's first |
//! | `PCCL_OFI_MR` | `1`: the `ofi` transport registers every buffer (cached) even where the provider does not ask | only where asked |
//! | `PCCL_OFI_CQ_DATA` | `0`: `ofi` messages do not carry their length as remote completion data | on where available |
//! | `PCCL_OFI_WAIT` | idle `ofi` waits: `fd` (block on the completion queue's descriptor where the provider has one; not `shm`) or `poll` | `fd` |
//! | `PCCL_OFI_HMEM` | device buffers to libfabric (`FI_HMEM`): `auto` (where the provider and every rank can), `0` (stage through host), `1` (fail init where this rank cannot) | `auto` |
//! | `PCCL_OFI_HMEM_IFACE` | test hook: iface of device registrations, `cuda`, `rocr` or `system` | `cuda` |
//! | `PCCL_TCP_RENDEZVOUS` | bytes from which a TCP message of a recursive-doubling or -halving plan over three nodes or more waits until its receiver is ready for it (so partners that drift apart do not share a link); each link uses the larger of its two ranks' settings; `off`: never wait. Each held message can cost a one-way latency: raise it (or `off`) where a 64 KiB message crosses its NIC in a few round trips (fast NICs); at 200 Mbit/s `16K` and `64K` measured alike and `off` up to 1.6× slower (docs/CLUSTER.md) | `64K` |
//! | `PCCL_TCP_CONGESTION` | congestion control of the TCP transport's sockets, a name from `net.ipv4.tcp_available_congestion_control` (`cubic`, `reno`, `bbr`); a socket that refuses it fails the communicator's creation naming it | the host's default |
//! | `PCCL_STAGING_POOL` | bytes of idle host staging buffers (packed sends, staged MPI receives) kept for reuse per process; `0` keeps none | `128M` |

use crate::error::{Error, Result};
use crate::model::cost::CostParams;
use crate::model::profile::Profile;
use crate::model::tuner::AlgoOverrides;
use crate::plan::Algorithm;
use std::time::Duration;

/// Verbosity of PCCL's diagnostics on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Only warnings.
    Warn,
    /// Algorithm choices and communicator shapes.
    Info,
    /// Everything.
    Trace,
}

/// Whether device collectives run their intra-node level on NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclMode {
    /// Use NCCL where every rank can load it and no two ranks of a node share a GPU (by UUID).
    Auto,
    /// Use NCCL, and fail the first device collective with the reason when it cannot be used.
    On,
    /// Never: every level runs through the transport (host-staged).
    Off,
}

/// Settings of a communicator.
#[derive(Clone, Debug)]
pub struct Config {
    /// Diagnostics level.
    pub debug: DebugLevel,
    /// Forced algorithm, or `None` for the tuner's choice.
    pub algo: Option<Algorithm>,
    /// Per-collective forced algorithms (`PCCL_ALGO=allgather:hier-rd;...`), before `algo`.
    pub algo_by_coll: AlgoOverrides,
    /// The tuner's machine profile (`PCCL_TUNE_FILE`; `PCCL_MODEL` overrides its levels).
    pub profile: Profile,
    /// Pretend nodes of this many consecutive ranks.
    pub ranks_per_node: Option<usize>,
    /// Ranks per group inside a node (`PCCL_GROUP_SIZE`; `None`: what discovery finds).
    pub group_size: Option<usize>,
    /// Limit of a whole collective (one deadline for every wait in it).
    pub timeout: Duration,
    /// Bytes per pipelined piece.
    pub chunk_bytes: usize,
    /// Whether the user set `chunk_bytes` (`PCCL_CHUNK_SIZE`): it then wins over the tuner's
    /// per-call piece size.
    pub chunk_explicit: bool,
    /// Largest all-to-all block run as one phase (`PCCL_ALLTOALL_DIRECT`; 0: never).
    pub alltoall_direct_max: usize,
    /// Cost-model parameters for the tuner.
    pub model: CostParams,
    /// Timed calls per candidate of the online trials (`PCCL_TUNE_ONLINE`; 0: none, the
    /// model's choice stands).
    pub tune_online: usize,
    /// Near-tie margin of the tuner (`PCCL_TUNE_MARGIN`, [`crate::model::tuner::TIE_MARGIN`]).
    pub tune_margin: f64,
    /// How far ahead of the plain candidates the model must put an overlapped hierarchy
    /// (`PCCL_TUNE_OVERLAP_MARGIN`, [`crate::model::tuner::OVERLAP_MARGIN`]).
    pub tune_overlap_margin: f64,
    /// NCCL for the intra-node level of device collectives.
    pub nccl: NcclMode,
    /// Device collectives on a transport that moves device memory hand it device pointers
    /// (no pinned host staging); `false` always stages. Every rank must agree.
    pub device_direct: bool,
    /// Faults to inject (tests only; `PCCL_FAULT`).
    pub faults: Vec<crate::fault::Fault>,
    /// Whether messages carry the call's fingerprint (`PCCL_CHECKS`, on by default).
    pub checks: bool,
    /// NIC map overriding discovery (`PCCL_NIC_MAP`).
    pub nic_map: Option<crate::topology::NicMap>,
    /// hwloc XML file read instead of the live host (`PCCL_TOPO_FILE`, `HWLOC_XMLFILE`).
    pub topo_file: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            debug: DebugLevel::Warn,
            algo: None,
            algo_by_coll: AlgoOverrides::default(),
            profile: Profile::default(),
            ranks_per_node: None,
            group_size: None,
            timeout: Duration::from_secs(300),
            chunk_bytes: 1 << 20,
            chunk_explicit: false,
            alltoall_direct_max: crate::plan::alltoall::DIRECT_MAX_BLOCK_BYTES,
            model: CostParams::default(),
            tune_online: 0,
            tune_margin: crate::model::tuner::TIE_MARGIN,
            tune_overlap_margin: crate::model::tuner::OVERLAP_MARGIN,
            nccl: NcclMode::Auto,
            device_direct: true,
            faults: Vec::new(),
            checks: true,
            nic_map: None,
            topo_file: None,
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A tuner margin: a fraction from 0 to 1; `hint` says what a value means.
fn parse_margin(name: &str, v: &str, hint: &str) -> Result<f64> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|m| (0.0..=1.0).contains(m))
        .ok_or_else(|| {
            Error::invalid(format!(
                "{name}={v}: expected a fraction from 0 to 1 ({hint})"
            ))
        })
}

fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|_| Error::invalid(format!("{name}={v} is not a valid number")))
}

/// The TCP transport's rendezvous threshold (`PCCL_TCP_RENDEZVOUS`: a byte size, or `off`
/// for none), [`crate::transport::tcp::RENDEZVOUS`] where unset.
pub fn tcp_rendezvous() -> Result<usize> {
    parse_tcp_rendezvous(var("PCCL_TCP_RENDEZVOUS"))
}

fn parse_tcp_rendezvous(v: Option<String>) -> Result<usize> {
    match v {
        None => Ok(crate::transport::tcp::RENDEZVOUS),
        Some(v) if v.trim().eq_ignore_ascii_case("off") => Ok(usize::MAX),
        Some(v) => parse_bytes(&v).ok().filter(|&b| b > 0).ok_or_else(|| {
            Error::invalid(format!(
                "PCCL_TCP_RENDEZVOUS={v}: expected a byte size above 0 (e.g. 16K, 64K) \
                     or off"
            ))
        }),
    }
}

/// The TCP transport's congestion control (`PCCL_TCP_CONGESTION`: a name the kernel offers,
/// such as `cubic` or `reno`), None for the host's default.
pub fn tcp_congestion() -> Result<Option<String>> {
    parse_tcp_congestion(var("PCCL_TCP_CONGESTION"))
}

fn parse_tcp_congestion(v: Option<String>) -> Result<Option<String>> {
    match v {
        None => Ok(None),
        // The kernel's names are at most 15 bytes (TCP_CA_NAME_MAX).
        Some(v) if v.len() < 16 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
            Ok(Some(v))
        }
        Some(v) => Err(Error::invalid(format!(
            "PCCL_TCP_CONGESTION={v}: expected a congestion control the kernel offers \
             (net.ipv4.tcp_available_congestion_control, e.g. cubic or reno)"
        ))),
    }
}

/// Parses a byte size such as `4096`, `64K`, `16M`, `1G`.
pub fn parse_bytes(v: &str) -> Result<usize> {
    let v = v.trim();
    let (num, mult) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&v[..v.len() - 1], 1usize << 10),
        Some('M') => (&v[..v.len() - 1], 1 << 20),
        Some('G') => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    let n: usize = num.parse().map_err(|_| {
        Error::invalid(format!(
            "'{v}' is not a byte size (e.g. 4096, 64K, 16M, 1G)"
        ))
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| Error::invalid(format!("byte size '{v}' overflows")))
}

/// Parses an on/off switch `name=v`: `1`/`on`/`yes`/`true` or `0`/`off`/`no`/`false`.
pub fn parse_switch(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(Error::invalid(format!("{name}={v}: expected 1 or 0"))),
    }
}

/// Parses `PCCL_TUNE_ONLINE`: timed calls per candidate (`0`…`32`), `on` or `off`.
pub fn parse_tune_online(v: &str) -> Result<usize> {
    use crate::model::online::{DEFAULT_TRIALS, MAX_TRIALS};
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "yes" | "true" => return Ok(DEFAULT_TRIALS),
        "off" | "no" | "false" => return Ok(0),
        _ => {}
    }
    match v.trim().parse::<usize>() {
        Ok(n) if n <= MAX_TRIALS => Ok(n),
        _ => Err(Error::invalid(format!(
            "PCCL_TUNE_ONLINE={v}: expected the timed calls per candidate (0 to {MAX_TRIALS}), on or off"
        ))),
    }
}

impl Config {
    /// Reads the `PCCL_*` variables; a malformed value is an error naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut c = Config::default();
        if let Some(v) = var("PCCL_DEBUG") {
            c.debug = match v.to_ascii_uppercase().as_str() {
                "WARN" | "VERSION" => DebugLevel::Warn,
                "INFO" => DebugLevel::Info,
                "TRACE" => DebugLevel::Trace,
                _ => {
                    return Err(Error::invalid(format!(
                        "PCCL_DEBUG={v}: expected WARN, INFO or TRACE"
                    )))
                }
            };
        }
        if let Some(v) = var("PCCL_ALGO") {
            c.algo_by_coll = AlgoOverrides::parse(&v)?;
            c.algo = c.algo_by_coll.default;
        }
        c.profile = Profile::from_env()?;
        if let Some(v) = var("PCCL_RANKS_PER_NODE") {
            let m: usize = parse_num("PCCL_RANKS_PER_NODE", &v)?;
            if m == 0 {
                return Err(Error::invalid("PCCL_RANKS_PER_NODE must be at least 1"));
            }
            c.ranks_per_node = Some(m);
        }
        if let Some(v) = var("PCCL_GROUP_SIZE") {
            let g: usize = parse_num("PCCL_GROUP_SIZE", &v)?;
            if g == 0 || g > 0xfff {
                return Err(Error::invalid(format!(
                    "PCCL_GROUP_SIZE={v}: expected 1 (no groups) to 4095 ranks per group"
                )));
            }
            c.group_size = Some(g);
        }
        if let Some(v) = var("PCCL_FAULT") {
            c.faults = crate::fault::parse(&v)?;
        }
        if let Some(v) = var("PCCL_CHECKS") {
            c.checks = parse_switch("PCCL_CHECKS", &v)?;
        }
        if let Some(v) = var("PCCL_TIMEOUT") {
            let s: f64 = parse_num("PCCL_TIMEOUT", &v)?;
            if !(s > 0.0 && s.is_finite()) {
                return Err(Error::invalid(
                    "PCCL_TIMEOUT must be a positive number of seconds",
                ));
            }
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(v) = var("PCCL_CHUNK_SIZE") {
            let b = parse_bytes(&v)?;
            if b < 4096 {
                return Err(Error::invalid(
                    "PCCL_CHUNK_SIZE must be at least 4096 bytes",
                ));
            }
            c.chunk_bytes = b & !63;
            c.chunk_explicit = true;
        }
        if let Some(v) = var("PCCL_STAGING_POOL") {
            parse_bytes(&v)
                .map_err(|e| Error::invalid(format!("PCCL_STAGING_POOL: {}", e.message())))?;
        }
        if let Some(v) = var("PCCL_ALLTOALL_DIRECT") {
            c.alltoall_direct_max = parse_bytes(&v)
                .map_err(|e| Error::invalid(format!("PCCL_ALLTOALL_DIRECT: {}", e.message())))?;
        }
        if let Some(v) = var("PCCL_MODEL") {
            c.model = v.parse()?;
            c.profile = c.profile.with_cost_params(&c.model);
        }
        if let Some(v) = var("PCCL_TUNE_ONLINE") {
            c.tune_online = parse_tune_online(&v)?;
        }
        if let Some(v) = var("PCCL_TUNE_MARGIN") {
            c.tune_margin = parse_margin(
                "PCCL_TUNE_MARGIN",
                &v,
                "0.05: a more involved plan must be predicted 5% faster per step",
            )?;
        }
        if let Some(v) = var("PCCL_TUNE_OVERLAP_MARGIN") {
            c.tune_overlap_margin = parse_margin(
                "PCCL_TUNE_OVERLAP_MARGIN",
                &v,
                "0.05: an overlapped hierarchy must be predicted 5% faster than the best plain \
                 candidate; 1: never",
            )?;
        }
        if let Some(v) = var("PCCL_NCCL") {
            c.nccl = match v.to_ascii_lowercase().as_str() {
                "auto" => NcclMode::Auto,
                "1" | "on" | "yes" => NcclMode::On,
                "0" | "off" | "no" => NcclMode::Off,
                _ => {
                    return Err(Error::invalid(format!(
                        "PCCL_NCCL={v}: expected auto, 1 or 0"
                    )))
                }
            };
        }
        if let Some(v) = var("PCCL_NIC_MAP") {
            c.nic_map = Some(v.parse()?);
        }
        c.topo_file = crate::topology::discover::topo_file(&crate::topology::env::ProcessEnv);
        if let Some(v) = var("PCCL_DEVICE_DIRECT") {
            c.device_direct = parse_switch("PCCL_DEVICE_DIRECT", &v)?;
        }
        // Read by the TCP transport; checked here with the rest.
        tcp_rendezvous()?;
        tcp_congestion()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_direct_switch_parses() {
        assert!(Config::default().device_direct);
        for v in ["1", "on", "Yes", " true "] {
            assert!(parse_switch("PCCL_DEVICE_DIRECT", v).unwrap(), "{v}");
        }
        for v in ["0", "OFF", "no", "false"] {
            assert!(!parse_switch("PCCL_DEVICE_DIRECT", v).unwrap(), "{v}");
        }
        let e = parse_switch("PCCL_DEVICE_DIRECT", "2").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.message().contains("PCCL_DEVICE_DIRECT=2"), "{e}");
    }

    #[test]
    fn tuner_margins_take_fractions_and_name_themselves_when_wrong() {
        assert_eq!(
            parse_margin("PCCL_TUNE_OVERLAP_MARGIN", " 0 ", "").unwrap(),
            0.0
        );
        assert_eq!(parse_margin("PCCL_TUNE_MARGIN", "0.05", "").unwrap(), 0.05);
        assert_eq!(
            parse_margin("PCCL_TUNE_OVERLAP_MARGIN", "1", "").unwrap(),
            1.0
        );
        for bad in ["-0.1", "1.5", "five", "NaN"] {
            let e = parse_margin("PCCL_TUNE_OVERLAP_MARGIN", bad, "hint").unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            assert!(e.message().contains("PCCL_TUNE_OVERLAP_MARGIN="), "{e}");
            assert!(e.message().contains("hint"), "{e}");
        }
        let d = Config::default();
        assert_eq!(d.tune_overlap_margin, crate::model::tuner::OVERLAP_MARGIN);
    }

    #[test]
    fn tcp_rendezvous_takes_sizes_and_off_and_names_itself_when_wrong() {
        let p = |v: Option<&str>| parse_tcp_rendezvous(v.map(str::to_string));
        assert_eq!(p(None).unwrap(), 64 * 1024);
        assert_eq!(p(Some("16K")).unwrap(), 16 * 1024);
        assert_eq!(p(Some("100000")).unwrap(), 100_000);
        assert_eq!(p(Some("Off")).unwrap(), usize::MAX);
        for bad in ["0", "abc", "-4K"] {
            let e = p(Some(bad)).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            assert!(e.message().contains("PCCL_TCP_RENDEZVOUS"), "{e}");
        }
    }

    #[test]
    fn tcp_congestion_takes_a_kernel_name_and_refuses_others() {
        let p = |v: Option<&str>| parse_tcp_congestion(v.map(str::to_string));
        assert_eq!(p(None).unwrap(), None);
        assert_eq!(p(Some("cubic")).unwrap().as_deref(), Some("cubic"));
        for bad in ["a b", "cubic;reno", "sixteen_letters_"] {
            let e = p(Some(bad)).unwrap_err();
            assert!(e.message().contains("PCCL_TCP_CONGESTION"), "{e}");
        }
    }
}
