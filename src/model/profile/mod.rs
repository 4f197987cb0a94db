//! The machine parameters of the model: a documented TOML *profile*, written by `pccl-tune`
//! (measured where it runs) or by hand (the presets in `presets/`), read by the tuner
//! (`PCCL_TUNE_FILE`, else `$XDG_CONFIG_HOME/pccl/tune.toml`) and by `pccl-sim`.
//!
//! Units in the file are the ones people quote: microseconds and GB/s (10⁹ bytes per second).
//! Every field has a default, so a file may hold only what differs.

use super::cost::CostParams;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Links inside a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntraLevel {
    /// Latency of one message between two ranks of a node (µs).
    pub alpha_us: f64,
    /// Bandwidth of the link between two ranks of a node, each direction (GB/s).
    pub bandwidth_gbps: f64,
    /// Ranks grouped `pair_size` at a time (by local index) share a faster link, e.g. the two
    /// GCDs of one MI250X; `1` for none.
    pub pair_size: usize,
    /// Bandwidth between the ranks of such a group (GB/s); unused when `pair_size` is 1.
    pub pair_bandwidth_gbps: f64,
    /// Total bandwidth all intra-node messages of a node share (GB/s), e.g. the memory bus
    /// when ranks are threads or processes of one host; `0` for no such limit.
    pub node_bandwidth_gbps: f64,
}

impl Default for IntraLevel {
    fn default() -> Self {
        IntraLevel {
            alpha_us: 5.0,
            bandwidth_gbps: 8.0,
            pair_size: 1,
            pair_bandwidth_gbps: 8.0,
            node_bandwidth_gbps: 0.0,
        }
    }
}

/// The network between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InterLevel {
    /// Latency of one message between nodes (µs).
    pub alpha_us: f64,
    /// NICs per node (the topology's NIC map says which local rank uses which; without one
    /// the ranks are spread evenly, `NicMap::even`).
    pub nics: usize,
    /// Bandwidth of one NIC, each direction (GB/s).
    pub nic_bandwidth_gbps: f64,
    /// Fraction of the total injection bandwidth the network carries at once (global
    /// bandwidth taper; `1` for full bisection). With dragonfly groups (`group_nodes`), the
    /// share of a node's injection bandwidth the global links carry when every node of a
    /// group sends out of it at once.
    pub taper: f64,
    /// Nodes per dragonfly group, the job's nodes placed group after group; `0` for one flat
    /// network. Only messages between groups cross the global links (and the taper).
    pub group_nodes: usize,
    /// Extra latency of a message between dragonfly groups (µs): the global link's hop.
    pub global_hop_us: f64,
    /// Bytes a NIC direction lets through at once after an idle spell (a token bucket's
    /// depth: a NIC shaped by Linux `htb`/`tbf`, like the emulated cluster's 32 KiB); it
    /// refills at the NIC's rate while the NIC sends below it ([`super::shaper`]). `0` (the
    /// default) for a physical NIC. Only the event engine models it (worlds of up to 128
    /// ranks; the phase engine charges every byte the NIC's rate).
    pub burst_bytes: f64,
}

impl Default for InterLevel {
    fn default() -> Self {
        InterLevel {
            alpha_us: 5.0,
            nics: 1,
            nic_bandwidth_gbps: 12.5,
            taper: 1.0,
            group_nodes: 0,
            global_hop_us: 0.0,
            burst_bytes: 0.0,
        }
    }
}

/// The host's last-level cache, for the cache tier of the copy and transfer rates.
///
/// A rank's bytes move at the memory rates of the profile (`copy_gbps`, the intra links, the
/// node bus, the reduction rates) when the bytes the call touches on one host do not fit in
/// the cache, and up to `copy_gbps / Profile::copy_gbps` times faster when they do
/// ([`Profile::cache_speedup`]). Off (`bytes = 0`, the default) in presets and in profiles
/// written before it existed: those behave exactly as without it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheTier {
    /// Size of the last-level cache the ranks of one host share (bytes); `0` for no tier.
    pub bytes: usize,
    /// Local copy rate, read + write, when source and destination stay in that cache (GB/s).
    pub copy_gbps: f64,
    /// Share of the cache's speed-up that transfers between ranks get (0 … 1; default 1, as
    /// copies): a transport that moves bytes through buffers of its own (MPICH's shared-memory
    /// cells) gains less from the caller's bytes being in cache than a `memcpy` does.
    /// `pccl-tune` fits it to the exchange's curve ([`crate::model::link_fit`]).
    pub link_share: f64,
    /// How sharply the hit share falls once the working set outgrows the cache: the share
    /// served from it is `min(1, bytes / working_set)^sharpness` (≥ 1; default 1, profiles
    /// written before it existed). A last-level cache with LRU-like replacement streams a
    /// working set a little larger than itself almost entirely from memory, so `pccl-tune`'s
    /// `memcpy` sweep fits a steep edge (4–6 on the 2-core test VM) at a larger size, where a
    /// gentle one (1) would put the size at the start of the fall and price a collective
    /// whose buffers still fit as half-cached.
    pub sharpness: f64,
}

impl Default for CacheTier {
    fn default() -> Self {
        CacheTier {
            bytes: 0,
            copy_gbps: 0.0,
            link_share: 1.0,
            sharpness: 1.0,
        }
    }
}

/// The transport's protocol switches: from its small-message path to eager sends, and from
/// eager sends to a rendezvous (a handshake before the bytes).
///
/// MPI libraries (and libfabric's rxm) send a message up to an eager limit at once; a larger
/// one first asks the receiver for its buffer, one more round through both ranks' progress.
/// Below that, most have a path for small messages too (MPICH ch3's per-pair fastbox,
/// UCX's copy-in segment of 8 KiB under MPICH ch4 and Open MPI): a message just above it
/// pays a step of its own. `pccl-tune` finds the steps in the exchange's curve
/// ([`crate::model::link_fit`]). Off (`eager_bytes = 0`, `small_bytes = 0`, the default) in
/// presets and in profiles written before they existed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Protocol {
    /// Messages (pieces) above this many bytes pay the handshake; `0` for no step.
    pub eager_bytes: usize,
    /// Extra latency of such a message (µs); on an oversubscribed host it also pays
    /// [`Profile::oversub_seconds`] once more (the handshake is one more message).
    pub rendezvous_us: f64,
    /// How many times longer an eager message's bytes take than a rendezvous message's
    /// (≥ 1; default 1). MPICH copies an eager message into shared cells and out again, where
    /// its rendezvous reads the sender's buffer once (CMA): on the test VM a 16 KiB message
    /// took longer than a 32 KiB one.
    pub eager_slowdown: f64,
    /// Messages (pieces) above this many bytes leave the small-message path and pay
    /// [`Self::small_step_us`]; `0` for no such step. Below `eager_bytes` when both are set.
    pub small_bytes: usize,
    /// Extra latency of a message above `small_bytes` (µs); like the rendezvous, a step that
    /// also pays [`Profile::oversub_seconds`] once more on an oversubscribed host.
    pub small_step_us: f64,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            eager_bytes: 0,
            rendezvous_us: 0.0,
            eager_slowdown: 1.0,
            small_bytes: 0,
            small_step_us: 0.0,
        }
    }
}

/// The host's cores and what a message costs when ranks outnumber them (oversubscription).
///
/// With more ranks on a host than cores, a rank that waits for a message must be scheduled
/// again before it can take it, behind the other runnable ranks of its core: threads and TCP
/// ranks sleep on futexes and pay a wake-up and a context switch, MPICH's ranks busy-poll and
/// pay up to a time slice. `pccl-tune` measures the cost per message of one extra rank per
/// core. Off (`cores = 0`, the default) in presets and in profiles written before it existed:
/// those behave exactly as without it.
/// The largest [`Oversub::rate_share`] a profile may hold: a copy slowed 4× beyond its fair
/// slice of a core is no longer a rate but a scheduling failure.
pub const MAX_RATE_SHARE: f64 = 4.0;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Oversub {
    /// Cores of one host the ranks may run on; `0` for unknown (no term).
    pub cores: usize,
    /// Extra latency of each message per extra rank sharing a core (µs), see
    /// [`Profile::oversub_seconds`].
    pub per_message_us: f64,
    /// Share of a core's time each extra rank per core takes from the copies and transfers
    /// of the others (0 … [`MAX_RATE_SHARE`]), see [`Profile::oversub_slowdown`]: 0 for ranks
    /// that sleep, about 1 for busy-polling ranks (MPICH), which spin for their whole time
    /// slice; above 1 where sharing costs more than the slices (context switches, a cache
    /// the spinning processes evict).
    pub rate_share: f64,
    /// Nodes whose ranks share one host's `cores` (1, the default: every node is a host of
    /// its own). An emulated cluster (`scripts/cluster.sh`: network namespaces of one machine
    /// as nodes) runs all its nodes' ranks on the machine's cores, so the term counts the
    /// ranks of that many nodes, while each node keeps its own NICs.
    pub nodes_per_host: usize,
    /// Core time one message between nodes costs (µs, both ends together: system calls, the
    /// kernel's network stack, wake-ups; LogP's overhead `o`, where `inter.alpha_us` is its
    /// latency `L`). The messages of the ranks of `nodes_per_host` nodes share the host's
    /// `cores`, each overhead running while its message's bytes move: a phase in which many
    /// small messages start at once waits for their overheads
    /// ([`Profile::message_cpu_seconds`]). `0` (the default): no such term, as with
    /// `cores = 0`.
    pub inter_cpu_us: f64,
    /// The same for a message between two ranks of one node (µs).
    pub intra_cpu_us: f64,
    /// Core time the receiver spends on a message it reduces, beyond its bytes at the
    /// reduction rate (µs): the receive into scratch and the reduction's own start, on the
    /// receiving rank's core, shared like the messages' overheads. Only with the
    /// overheads above (`cores` and `inter_cpu_us` or `intra_cpu_us` set).
    pub reduce_cpu_us: f64,
}

impl Default for Oversub {
    fn default() -> Self {
        Oversub {
            cores: 0,
            per_message_us: 0.0,
            rate_share: 0.0,
            nodes_per_host: 1,
            inter_cpu_us: 0.0,
            intra_cpu_us: 0.0,
            reduce_cpu_us: 0.0,
        }
    }
}

/// Where reductions run, for the reduction rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU.
    Host,
    /// A GPU.
    Device,
}

/// A machine description for the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Profile {
    /// A name for reports.
    pub name: String,
    /// Where the numbers come from (a command line, a paper, a data sheet).
    pub source: String,
    /// Inside a node.
    pub intra: IntraLevel,
    /// Between nodes.
    pub inter: InterLevel,
    /// Share of every link's nominal bandwidth that messages achieve (0 < e ≤ 1).
    pub efficiency: f64,
    /// Local copy rate, read + write of the bytes copied (GB/s): the executor's `Copy` steps
    /// and the packing of strided messages.
    pub copy_gbps: f64,
    /// The last-level cache tier (optional; off by default).
    pub cache: CacheTier,
    /// Oversubscription of the host's cores (optional; off by default).
    pub oversub: Oversub,
    /// The eager/rendezvous step of the transport's messages (optional; off by default).
    pub protocol: Protocol,
    /// Every "node" is on one host (thread-ranks, or `PCCL_RANKS_PER_NODE` pretending): all
    /// messages, between nodes too, share one memory bus (`intra.node_bandwidth_gbps`), and
    /// no pretend node has a network port its ranks share (each rank sends at the inter
    /// level's rate; `inter.nics` is not used).
    pub one_host: bool,
    /// Ranks per node the machine usually runs (one per GPU); `pccl-sim`'s default.
    pub ranks_per_node: usize,
    /// Bytes per pipelined piece (the transport's `PCCL_CHUNK_SIZE`).
    pub piece_bytes: usize,
    /// Extra cost of each piece after the first (µs).
    pub piece_overhead_us: f64,
    /// Piece sizes the tuner compares per call (bytes, each ≥ 4096); empty: its built-in
    /// list ([`crate::model::tuner::PIECES`]). The chosen one is what the transports cut
    /// messages at, unless `PCCL_CHUNK_SIZE` is set.
    pub piece_candidates: Vec<usize>,
    /// The flat ring as NCCL/RCCL run it: one node's share of a step leaves through all its
    /// NICs (one channel per NIC) and the steps are pipelined, so a block pays each hop's
    /// latency once (presets for comparison with NCCL; PCCL's own executor does neither).
    pub nccl_ring: bool,
    /// NCCL's or RCCL's ring as the library runs it (optional; the presets' vendor baseline,
    /// [`crate::model::vendor`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<super::vendor::params::VendorRing>,
    /// The MPI library's own ring (optional; the presets' MPI baseline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mpich: Option<super::vendor::params::MpiRing>,
    /// Reduction rates in GB/s of output bytes, per dtype name (`f32`, `bf16`, ...), on the
    /// host; `default` for a dtype not listed.
    pub reduce_host_gbps: BTreeMap<String, f64>,
    /// The same on a GPU.
    pub reduce_device_gbps: BTreeMap<String, f64>,
    /// Which strided (multi-block) sends the transport packs into one buffer first (a copy
    /// the model charges at `copy_gbps`); see [`Strided`].
    pub strided: Strided,
    /// How a received block is reduced against the transfer; see [`ReceiveReduce`].
    pub receive_reduce: ReceiveReduce,
    /// What `pccl-tune` measured, the terms above derived from it
    /// ([`crate::model::calibrate`]): kept so that `pccl-tune --merge` can take the median
    /// of several runs. Absent in presets and hand-written profiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<super::calibrate::Measured>,
    /// What `pccl-tune --transport tcp|ofi` measured on the network, the network's terms
    /// above fitted to it ([`crate::model::network_fit`]): kept so that `pccl-tune --refit`
    /// can fit them again (a later model, another NIC burst) without the network. Absent
    /// elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_network: Option<super::network_fit::NetworkTimings>,
}

/// How the reduction of a received message overlaps its transfer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiveReduce {
    /// Each piece is reduced once it has arrived, while the next one moves (a NIC or another
    /// core moves the bytes; profiles written before 2026-11-26).
    #[default]
    Pieces,
    /// The receiver reduces straight out of the sender's memory, the transfer and the
    /// reduction one pass (PCCL's thread ranks): the slower of the two rates decides.
    Fused,
    /// The receiver's own core moves the bytes and then reduces them (MPI on one host: a
    /// rendezvous reads the sender's memory with the receiver's core): no overlap.
    After,
}

/// How a transport sends a message made of several blocks (`Transport::isendv`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strided {
    /// Every such message is packed first (libfabric until 2026-12-07; profiles written
    /// before 2026-11-24).
    #[default]
    Packed,
    /// Pieces within one block go as they are, pieces over several are packed (MPI;
    /// libfabric since 2026-12-07): blocks smaller than `piece_bytes` are packed.
    PackedBelowPiece,
    /// Never packed: the receiver copies out of the sender's blocks (thread ranks).
    Gathered,
    /// Small messages (64 KiB, 512 KiB inside a node) and messages of runs averaging under
    /// 32 KiB are packed; the rest are written from their blocks (TCP since 2026-12-07:
    /// `transport::tcp::packs_vectored`).
    PackedSmall,
}

impl Default for Profile {
    /// Sane defaults without a tune file: the 2-core CI host's figures inside a node
    /// (α ≈ 5 µs, ≈ 8 GB/s copies, ≈ 6 GB/s f32 sums), a 100 Gb/s NIC between nodes.
    fn default() -> Self {
        let mut host = BTreeMap::new();
        host.insert("default".to_string(), 6.0);
        let mut dev = BTreeMap::new();
        dev.insert("default".to_string(), 1000.0);
        Profile {
            name: "default".into(),
            source: "built-in defaults (no tune file)".into(),
            intra: IntraLevel::default(),
            inter: InterLevel::default(),
            efficiency: 1.0,
            copy_gbps: 8.0,
            cache: CacheTier::default(),
            oversub: Oversub::default(),
            protocol: Protocol::default(),
            one_host: false,
            ranks_per_node: 1,
            piece_bytes: 1 << 20,
            piece_overhead_us: 0.0,
            piece_candidates: Vec::new(),
            nccl_ring: false,
            vendor: None,
            mpich: None,
            strided: Strided::Packed,
            receive_reduce: ReceiveReduce::Pieces,
            reduce_host_gbps: host,
            reduce_device_gbps: dev,
            measured: None,
            measured_network: None,
        }
    }
}

mod rates;
mod validate;

impl Profile {
    /// Parses a profile from TOML text and checks it.
    pub fn from_toml(text: &str) -> Result<Self> {
        let p: Profile =
            toml::from_str(text).map_err(|e| Error::invalid(format!("profile: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    /// Reads a profile file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid(format!("cannot read profile {}: {e}", path.display())))?;
        Self::from_toml(&text)
            .map_err(|e| Error::invalid(format!("{}: {}", path.display(), e.message())))
    }

    /// The profile as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The profile the communicator uses: `PCCL_TUNE_FILE`, else
    /// `$XDG_CONFIG_HOME/pccl/tune.toml` (`~/.config/...`) when it exists, else the defaults.
    /// A named file that cannot be read or parsed is an error.
    pub fn from_env() -> Result<Self> {
        if let Some(f) = std::env::var_os("PCCL_TUNE_FILE").filter(|s| !s.is_empty()) {
            return Self::load(Path::new(&f))
                .map_err(|e| Error::invalid(format!("PCCL_TUNE_FILE: {}", e.message())));
        }
        match Self::default_path() {
            Some(p) if p.is_file() => Self::load(&p),
            _ => Ok(Profile::default()),
        }
    }

    /// `$XDG_CONFIG_HOME/pccl/tune.toml`, or `$HOME/.config/pccl/tune.toml`.
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(base.join("pccl").join("tune.toml"))
    }

    /// The profile with the levels of the old five-number `PCCL_MODEL` parameters.
    pub fn with_cost_params(mut self, c: &CostParams) -> Self {
        self.intra.alpha_us = c.alpha_intra * 1e6;
        self.intra.bandwidth_gbps = 1e-9 / c.beta_intra;
        self.intra.pair_size = 1;
        self.inter.alpha_us = c.alpha_inter * 1e6;
        self.inter.nic_bandwidth_gbps = 1e-9 / c.beta_inter;
        self.copy_gbps = self.intra.bandwidth_gbps;
        self.reduce_host_gbps.clear();
        self.reduce_host_gbps
            .insert("default".into(), 1e-9 / c.gamma);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_round_trips_through_toml() {
        let mut p = Profile::default();
        p.inter.nics = 4;
        p.reduce_host_gbps.insert("bf16".into(), 2.5);
        let q = Profile::from_toml(&p.to_toml()).unwrap();
        assert_eq!(p, q);
        assert_eq!(q.reduce_rate(DeviceKind::Host, "bf16"), 2.5e9);
        assert_eq!(q.reduce_rate(DeviceKind::Host, "f64"), 6e9);
    }

    #[test]
    fn partial_file_keeps_defaults_and_bad_values_are_refused() {
        let p = Profile::from_toml("[inter]\nnics = 4\n").unwrap();
        assert_eq!(p.inter.nics, 4);
        assert_eq!(p.intra, IntraLevel::default());
        let e = Profile::from_toml("[inter]\nnic_bandwidth_gbps = 0\n").unwrap_err();
        assert!(e.message().contains("nic_bandwidth_gbps"), "{e}");
        let e = Profile::from_toml("bogus = 1\n").unwrap_err();
        assert!(e.message().contains("bogus"), "{e}");
        assert!(Profile::from_toml("efficiency = 1.5\n").is_err());
    }

    #[test]
    fn a_missing_or_broken_file_is_an_error_naming_it() {
        let e = Profile::load(Path::new("/nonexistent/pccl-tune.toml")).unwrap_err();
        assert!(e.message().contains("/nonexistent/pccl-tune.toml"), "{e}");
        let dir = std::env::temp_dir().join(format!("pccl-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.toml");
        std::fs::write(&f, "[intra]\nalpha_us = \"fast\"\n").unwrap();
        let e = Profile::load(&f).unwrap_err();
        assert!(
            e.message().contains("bad.toml") && e.message().contains("alpha_us"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_small_message_step_adds_below_the_rendezvous_and_must_lie_below_it() {
        let p = Profile::from_toml(
            "[protocol]\nsmall_bytes = 8192\nsmall_step_us = 3\neager_bytes = 262144\n\
             rendezvous_us = 30\n",
        )
        .unwrap();
        assert_eq!(p.rendezvous_seconds(8192.0), 0.0);
        assert!((p.rendezvous_seconds(8193.0) - 3e-6).abs() < 1e-15);
        assert!((p.rendezvous_seconds(262145.0) - 33e-6).abs() < 1e-15);
        assert_eq!(Profile::from_toml(&p.to_toml()).unwrap(), p);
        let e = Profile::from_toml("[protocol]\nsmall_bytes = 65536\neager_bytes = 8192\n")
            .unwrap_err();
        assert!(e.message().contains("small_bytes (65536)"), "{e}");
        let e = Profile::from_toml("[protocol]\nsmall_step_us = -2\n").unwrap_err();
        assert!(e.message().contains("protocol.small_step_us"), "{e}");
    }

    #[test]
    fn receive_reduce_parses_and_defaults_to_pieces() {
        assert_eq!(Profile::default().receive_reduce, ReceiveReduce::Pieces);
        let f = Profile::from_toml("receive_reduce = \"fused\"\n").unwrap();
        assert_eq!(f.receive_reduce, ReceiveReduce::Fused);
        let a = Profile::from_toml("receive_reduce = \"after\"\n").unwrap();
        assert_eq!(a.receive_reduce, ReceiveReduce::After);
        assert_eq!(Profile::from_toml(&a.to_toml()).unwrap(), a);
        assert!(Profile::from_toml("receive_reduce = \"later\"\n").is_err());
    }

    #[test]
    fn link_share_and_rendezvous_step_parse_check_and_default_to_off() {
        let p = Profile::from_toml(
            "copy_gbps = 10\n[cache]\nbytes = 1000\ncopy_gbps = 40\nlink_share = 0.5\n\
             [protocol]\neager_bytes = 16384\nrendezvous_us = 12\n",
        )
        .unwrap();
        assert_eq!(p.link_speedup(500.0), 2.5, "half of the 4× gain");
        assert_eq!(p.rendezvous_seconds(16384.0), 0.0);
        assert!((p.rendezvous_seconds(16385.0) - 12e-6).abs() < 1e-15);
        assert_eq!(p.eager_factor(100.0), 1.0, "no eager slowdown unless given");
        let slow = Profile::from_toml(
            "[protocol]\neager_bytes = 16384\nrendezvous_us = 12\neager_slowdown = 2.5\n",
        )
        .unwrap();
        assert_eq!(slow.eager_factor(16384.0), 2.5);
        assert_eq!(slow.eager_factor(16385.0), 1.0);
        let e = Profile::from_toml("[protocol]\neager_slowdown = 0.5\n").unwrap_err();
        assert!(e.message().contains("protocol.eager_slowdown"), "{e}");
        assert_eq!(Profile::from_toml(&p.to_toml()).unwrap(), p);
        // Files without the fields: transfers get the whole gain, no step.
        let q =
            Profile::from_toml("copy_gbps = 10\n[cache]\nbytes = 1000\ncopy_gbps = 40\n").unwrap();
        assert_eq!(q.link_speedup(500.0), 4.0);
        assert_eq!(q.rendezvous_seconds(1e12), 0.0);
        assert!(Profile::from_toml("[cache]\nlink_share = 2\n").is_err());
        let e = Profile::from_toml("[protocol]\nrendezvous_us = -1\n").unwrap_err();
        assert!(e.message().contains("protocol.rendezvous_us"), "{e}");
    }
}
