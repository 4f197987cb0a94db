//! The cost model, the simulator that replays plans on a modelled cluster, and the tuner.
//!
//! * [`cache`]: the cache tier's parameters fitted to a copy sweep (`pccl-tune`).
//! * [`calibrate`]: a profile from `pccl-tune`'s raw timings, and the median of several runs.
//! * [`link_fit`]: a transport's message curve fitted to the link terms (`pccl-tune`).
//! * [`network_fit`]: the network's links and the messages' core time, fitted to timings
//!   taken on the network (`pccl-tune --transport tcp` under a launcher).
//! * [`oversub`]: the per-message cost of ranks outnumbering cores, from two timings.
//! * [`profile`]: machine parameters (TOML; `pccl-tune` writes them, `presets/` holds some).
//! * [`traffic`]: what a plan asks of the machine, phase by phase.
//! * [`nic_load`]: the bytes each NIC carries in a plan (the network floor).
//! * [`contention`]: max-min fair sharing of links by the messages in flight.
//! * [`sim`]: the simulator engines (all ranks as events; one node phase by phase).
//! * [`presets`]: named machines (Frontier, Perlmutter).
//! * [`quantized`]: the quantized all-gather's cost (records instead of data, plus kernels).
//! * [`vendor`]: the vendor baselines (NCCL/RCCL's ring, the MPI library's ring) in closed form.
//! * [`tuner`]: picks the algorithm and piece size from the simulator.
//! * [`online`]: refines the tuner's pick by timing its close candidates (`PCCL_TUNE_ONLINE`).
//! * [`goal`]: export of the plans as a GOAL schedule (LogGOPSim, ATLAHS).
//! * [`cost`]: the older per-message α-β-γ estimate (kept for its callers).

pub mod cache;
pub mod calibrate;
pub mod contention;
pub mod cost;
pub mod goal;
pub mod link_fit;
pub mod network_fit;
pub mod nic_load;
pub mod online;
pub mod oversub;
pub mod presets;
pub mod profile;
pub mod quantized;
mod shaper;
pub mod sim;
pub mod traffic;
pub mod tuner;
pub mod vendor;
