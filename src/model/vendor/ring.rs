//! NCCL's and RCCL's ring as the libraries run it, step by step, in closed form.
//!
//! A ring collective of `P` ranks on `N` nodes makes `P − 1` steps (all-reduce `2(P − 1)`);
//! in each, every rank forwards one block's share to its neighbour on every channel. What a
//! step costs comes from the library's mechanisms, each a parameter of the profile's
//! `[vendor]` table ([`VendorRing`], sources in `presets/*.toml`):
//!
//! * **protocol** (LL, LL128, Simple): a hop's latency, the share of bandwidth the data gets,
//!   the chunk a channel moves per step and the slices it leaves in. The library runs the
//!   protocol its *own* tuning table rates fastest (`tuner_*`), which is not always the one
//!   that is fastest on the machine;
//! * **channels**: a block is split over the channels, each share rounded up to the protocol's
//!   alignment, so the per-channel message is `b / channels` and shrinks as `P` grows (for a
//!   fixed output), and a small block leaves channels idle; channels go round-robin over the
//!   NICs;
//! * **proxy**: every network message is posted and completed by the CPU proxy thread of the
//!   GPU whose NIC it crosses, one after another; a step costs that thread
//!   `ops × net_op_us`, `ops` the network sends and receives of its channels — the term that
//!   grows the ring's time linearly in `P` where the messages are small;
//! * **rendezvous**: on a fabric that makes every message a rendezvous (Slingshot with
//!   `FI_CXI_RDZV_THRESHOLD=0`) each network hop pays one more round trip, and where the
//!   proxy is the slowest stage its receives are posted after their requests arrived, which
//!   the provider completes in software: one more operation per receive (the Get);
//! * **dragonfly**: a hop between dragonfly groups pays the extra latency of the global link.
//!
//! The time is the ring's fill — one block crossing every hop once (`base + (N − 1)·hop_net
//! + (P − N)·hop_intra` per pass) — plus every step at the pace of its slowest stage: the
//! proxy, the busiest NIC, the GPU's rings inside the node, the reduction kernel.
//! [`Mechanisms`] turns each mechanism off, to show what it contributes.

use super::params::{ProtoCost, VendorRing};
use crate::error::{Error, Result};
use crate::plan::Collective;

/// Which of the modelled mechanisms are on (all by default); off, each falls back to the
/// ideal ring of the simulator's first model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mechanisms {
    /// Protocol costs and the library's protocol choice (off: the profile's `alpha_us` per
    /// hop, full bandwidth, no chunking).
    pub protocols: bool,
    /// Channels idle on small blocks (off: every channel carries a share).
    pub channels: bool,
    /// The proxy thread's cost per network message (off: none).
    pub proxy: bool,
    /// The fabric's rendezvous per network message (off: none).
    pub rendezvous: bool,
    /// Dragonfly groups: global-link latency and taper (off: one flat network).
    pub dragonfly: bool,
}

impl Default for Mechanisms {
    fn default() -> Self {
        Mechanisms {
            protocols: true,
            channels: true,
            proxy: true,
            rendezvous: true,
            dragonfly: true,
        }
    }
}

/// The names [`Mechanisms::without`] accepts.
pub const MECHANISMS: &[&str] = &["protocols", "channels", "proxy", "rendezvous", "dragonfly"];

impl Mechanisms {
    /// All on except those named (comma-separated, from [`MECHANISMS`]).
    pub fn without(list: &str) -> Result<Self> {
        let mut m = Mechanisms::default();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "protocols" => m.protocols = false,
                "channels" => m.channels = false,
                "proxy" => m.proxy = false,
                "rendezvous" => m.rendezvous = false,
                "dragonfly" => m.dragonfly = false,
                o => {
                    return Err(Error::invalid(format!(
                        "unknown mechanism '{o}': expected one of {}",
                        MECHANISMS.join(", ")
                    )))
                }
            }
        }
        Ok(m)
    }
}

/// The machine around the ring: what the vendor model needs of a profile.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    /// NICs per node.
    pub nics: usize,
    /// One NIC's achieved rate (bytes/s).
    pub nic_rate: f64,
    /// The profile's hop latencies (µs) for [`Mechanisms::protocols`] off: intra, inter.
    pub alpha_us: (f64, f64),
    /// Nodes per dragonfly group (0: none) and the extra latency of a global hop (µs).
    pub group: (usize, f64),
}

/// What the model says about one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Predicted seconds.
    pub seconds: f64,
    /// The protocol the library runs (its own table's choice).
    pub protocol: String,
    /// Channels that carry a share of the block.
    pub channels: usize,
    /// Ring steps.
    pub steps: usize,
    /// The fill: one block crossing every hop (seconds).
    pub fill: f64,
    /// One step at the pace of its slowest stage (seconds).
    pub step: f64,
    /// That stage: `proxy`, `nic`, `intra` or `reduce`.
    pub bound: &'static str,
}

fn div_up(a: usize, b: usize) -> usize {
    a.div_ceil(b.max(1))
}

/// Ring passes and steps of `coll` on `p` ranks.
fn passes(coll: Collective) -> Result<usize> {
    match coll {
        Collective::AllGather | Collective::ReduceScatter { .. } => Ok(1),
        Collective::AllReduce { .. } => Ok(2),
        o => Err(Error::invalid(format!(
            "the vendor ring model covers all-gather, reduce-scatter and all-reduce, not {o:?}"
        ))),
    }
}

/// The library's own estimate for protocol `p` (its tuning table): what it picks by.
fn tuner_seconds(pc: &ProtoCost, p: usize, nodes: usize, total_bytes: f64, pass: usize) -> f64 {
    let inter = pass * (nodes - 1);
    let steps = pass * (p - 1);
    let lat =
        pc.base_us + (steps - inter) as f64 * pc.tuner_intra_us + inter as f64 * pc.hop_net_us;
    let idx = ((total_bytes / 64.0).max(1.0).log2().floor() as usize)
        .min(pc.tuner_correction.len().saturating_sub(1));
    let corr = pc.tuner_correction.get(idx).copied().unwrap_or(1.0);
    lat * 1e-6 + total_bytes / (pc.tuner_busbw_gbps * 1e9 * corr)
}

/// Seconds of the ring with protocol `pc` (the physical side of the model).
#[allow(clippy::too_many_arguments)]
fn ring_with(
    v: &VendorRing,
    pc: &ProtoCost,
    mach: &Machine,
    mech: Mechanisms,
    (p, nodes): (usize, usize),
    block: f64,
    pass: usize,
    reduce: bool,
) -> Estimate {
    let c = v.channels;
    let block_b = block.max(1.0).ceil() as usize;
    let active = if mech.channels {
        div_up(block_b, pc.align_bytes).clamp(1, c)
    } else {
        c
    };
    let per_ch = block / active as f64;
    let chunk = if mech.protocols {
        pc.chunk_bytes as f64
    } else {
        f64::INFINITY
    };
    let iters = (per_ch / chunk).ceil().max(1.0);
    let m = per_ch / iters; // bytes per channel per step
    let msgs = if mech.protocols {
        (m / pc.slice_bytes as f64).ceil().max(1.0)
    } else {
        1.0
    };
    let bw = if mech.protocols { pc.bw_factor } else { 1.0 };
    let multi = nodes > 1;
    // The busiest proxy: each active channel enters a node through one GPU and leaves it
    // through another; the channels spread over the GPUs that own NICs.
    let ops = div_up(2 * active, v.net_gpus).max(1) as f64 * msgs;
    let t_proxy = if multi && mech.proxy {
        ops * pc.net_op_us * 1e-6
    } else {
        0.0
    };
    // Channels go round-robin over the NICs: the busiest carries ⌈active / nics⌉ of them.
    let t_nic = if multi {
        div_up(active, mach.nics) as f64 * m / (mach.nic_rate * bw)
    } else {
        0.0
    };
    // A channel gets its share of the GPU's ring bandwidth inside the node.
    let t_intra = m * c as f64 / (v.intra_ring_gbps * 1e9 * bw);
    let t_red = if reduce {
        active as f64 * m / (v.reduce_gbps * 1e9)
    } else {
        0.0
    };
    // A proxy that is the slowest stage posts each receive after its message's rendezvous
    // request has arrived: the request waits in the NIC's overflow list and the provider
    // completes it in software, one more operation (the Get) on the receiving proxy. Half
    // the operations are receives, so the proxy's step grows by half. (Where the NIC or
    // the GPUs set the pace, the proxies run ahead and receives are posted in time.)
    let others = t_nic.max(t_intra).max(t_red);
    let t_proxy = if mech.rendezvous && v.rendezvous_us > 0.0 && t_proxy > others {
        1.5 * t_proxy
    } else {
        t_proxy
    };
    let (step, bound) = [
        (t_proxy, "proxy"),
        (t_nic, "nic"),
        (t_intra, "intra"),
        (t_red, "reduce"),
    ]
    .into_iter()
    .fold((0.0, "intra"), |a, b| if b.0 > a.0 { b } else { a });
    let (hop_intra, hop_net, base) = if mech.protocols {
        (pc.hop_intra_us, pc.hop_net_us, pc.base_us)
    } else {
        (mach.alpha_us.0, mach.alpha_us.1, 0.0)
    };
    let rdzv = if mech.rendezvous {
        v.rendezvous_us
    } else {
        0.0
    };
    // Hops between dragonfly groups (nodes placed group after group): one per boundary.
    let (g, global_us) = mach.group;
    let crossings = if mech.dragonfly && g > 0 && nodes > g {
        div_up(nodes, g) as f64
    } else {
        0.0
    };
    let per_pass = (nodes - 1) as f64 * (hop_net + rdzv)
        + (p - nodes) as f64 * hop_intra
        + crossings * global_us;
    let fill = (base + pass as f64 * per_pass) * 1e-6;
    let steps = pass * (p - 1);
    Estimate {
        seconds: fill + iters * steps as f64 * step,
        protocol: String::new(),
        channels: active,
        steps,
        fill,
        step,
        bound,
    }
}

/// The vendor library's ring for `coll` on `p` ranks in `nodes` equal nodes, `block` bytes per
/// rank and step (all-gather input, reduce-scatter output, all-reduce buffer ÷ `p`).
pub fn ring(
    v: &VendorRing,
    mach: &Machine,
    mech: Mechanisms,
    coll: Collective,
    (p, nodes): (usize, usize),
    block: f64,
) -> Result<Estimate> {
    if p == 0 || nodes == 0 || p % nodes != 0 {
        return Err(Error::invalid(format!(
            "the vendor ring needs equal nodes: {p} ranks on {nodes} nodes"
        )));
    }
    let pass = passes(coll)?;
    if p == 1 {
        return Ok(Estimate {
            seconds: 0.0,
            protocol: "none".into(),
            channels: 0,
            steps: 0,
            fill: 0.0,
            step: 0.0,
            bound: "intra",
        });
    }
    let reduce = !matches!(coll, Collective::AllGather);
    let total = block * p as f64;
    // The protocol the library's own table rates fastest.
    let chosen = if mech.protocols {
        v.protocols
            .iter()
            .min_by(|a, b| {
                tuner_seconds(a.1, p, nodes, total, pass)
                    .total_cmp(&tuner_seconds(b.1, p, nodes, total, pass))
            })
            .map(|(n, pc)| (n.clone(), pc.clone()))
    } else {
        v.protocols
            .get("simple")
            .or_else(|| v.protocols.values().next())
            .map(|pc| ("ideal".to_string(), pc.clone()))
    }
    .ok_or_else(|| Error::invalid("the vendor ring lists no protocol"))?;
    let mut e = ring_with(v, &chosen.1, mach, mech, (p, nodes), block, pass, reduce);
    e.protocol = chosen.0;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simple() -> ProtoCost {
        ProtoCost {
            base_us: 0.0,
            hop_intra_us: 2.0,
            hop_net_us: 10.0,
            net_op_us: 5.0,
            chunk_bytes: 1 << 20,
            slice_bytes: 1 << 20,
            bw_factor: 1.0,
            align_bytes: 4096,
            tuner_intra_us: 2.0,
            tuner_busbw_gbps: 100.0,
            tuner_correction: Vec::new(),
        }
    }

    fn vendor(channels: usize) -> VendorRing {
        let mut v = VendorRing {
            channels,
            net_gpus: 4,
            intra_ring_gbps: 1e6,
            ..VendorRing::default()
        };
        v.protocols.insert("simple".into(), simple());
        v
    }

    const MACH: Machine = Machine {
        nics: 4,
        nic_rate: 25e9,
        alpha_us: (1.0, 4.0),
        group: (0, 0.0),
    };

    fn off() -> Mechanisms {
        Mechanisms {
            proxy: false,
            rendezvous: false,
            dragonfly: false,
            ..Mechanisms::default()
        }
    }

    #[test]
    fn a_ring_pays_each_hop_once_per_pass_and_each_step_at_its_slowest_stage() {
        // 8 ranks on 2 nodes, 1 channel, a tiny block: fill = 1 net hop... per pass.
        let v = vendor(1);
        let e = ring(&v, &MACH, off(), Collective::AllGather, (8, 2), 8.0).unwrap();
        assert_eq!(e.steps, 7);
        let fill = (1.0 * 10.0 + 6.0 * 2.0) * 1e-6;
        assert!((e.fill - fill).abs() < 1e-12, "{e:?}");
        // All-reduce: two passes, twice the steps.
        let a = ring(
            &v,
            &MACH,
            off(),
            Collective::AllReduce { average: false },
            (8, 2),
            8.0,
        )
        .unwrap();
        assert_eq!(a.steps, 14);
        assert!((a.fill - 2.0 * fill).abs() < 1e-12);
    }

    #[test]
    fn the_proxy_pays_its_network_operations_every_step() {
        let v = vendor(16);
        let on = Mechanisms {
            proxy: true,
            ..off()
        };
        // 64 KiB per rank: 16 channels of 4 KiB, 4 net GPUs: 8 operations a step at 5 µs.
        let e = ring(&v, &MACH, on, Collective::AllGather, (64, 8), 65536.0).unwrap();
        assert_eq!((e.channels, e.bound), (16, "proxy"));
        assert!((e.step - 40e-6).abs() < 1e-12, "{e:?}");
        assert!((e.seconds - (e.fill + 63.0 * 40e-6)).abs() < 1e-12);
        // One node: no network, no proxy.
        let one = ring(&v, &MACH, on, Collective::AllGather, (8, 1), 65536.0).unwrap();
        assert_eq!(one.fill, 7.0 * 2e-6);
    }

    #[test]
    fn a_share_larger_than_the_chunk_loops_one_ring_pass_per_chunk() {
        let v = vendor(1);
        let on = Mechanisms {
            proxy: true,
            ..off()
        };
        // 4 MiB per rank, one channel, 1 MiB chunks: 4 passes of P − 1 steps, each step one
        // 1 MiB message through the proxy (5 µs) or the NIC (1 MiB / 25 GB/s = 42 µs).
        let b = 4.0 * 1048576.0;
        let e = ring(&v, &MACH, on, Collective::AllGather, (16, 4), b).unwrap();
        let step = 1048576.0 / 25e9;
        assert_eq!(e.bound, "nic");
        assert!((e.step - step).abs() < 1e-15, "{e:?}");
        assert!((e.seconds - (e.fill + 4.0 * 15.0 * step)).abs() < 1e-12);
    }

    #[test]
    fn channels_split_the_block_and_small_blocks_leave_channels_idle() {
        let v = vendor(16);
        // 8 KiB per rank with a 4 KiB alignment: two channels carry it.
        let e = ring(&v, &MACH, off(), Collective::AllGather, (16, 4), 8192.0).unwrap();
        assert_eq!(e.channels, 2);
        // Off: all 16.
        let all = Mechanisms {
            channels: false,
            ..off()
        };
        let e = ring(&v, &MACH, all, Collective::AllGather, (16, 4), 8192.0).unwrap();
        assert_eq!(e.channels, 16);
        // Large blocks: the NIC is the bound, and the per-channel share is b / 16; with
        // 16 channels over 4 NICs each NIC carries 4 shares a step.
        let b = 16.0 * 1048576.0;
        let e = ring(&v, &MACH, off(), Collective::AllGather, (16, 4), b).unwrap();
        assert_eq!(e.bound, "nic");
        assert!((e.step - 4.0 * (b / 16.0) / 25e9).abs() < 1e-12, "{e:?}");
    }

    #[test]
    fn a_late_proxy_completes_each_rendezvous_in_software() {
        let mut v = vendor(16);
        v.rendezvous_us = 3.0;
        let proxy = Mechanisms {
            proxy: true,
            ..off()
        };
        let both = Mechanisms {
            proxy: true,
            rendezvous: true,
            ..off()
        };
        // Proxy-bound (4 KiB shares): 8 operations, 4 of them receives, each one more.
        let a = ring(&v, &MACH, proxy, Collective::AllGather, (64, 8), 65536.0).unwrap();
        let b = ring(&v, &MACH, both, Collective::AllGather, (64, 8), 65536.0).unwrap();
        assert_eq!((a.bound, b.bound), ("proxy", "proxy"));
        assert!((b.step - 1.5 * a.step).abs() < 1e-15, "{a:?} {b:?}");
        // NIC-bound (1 MiB shares): receives are posted in time, the step is unchanged.
        let big = 16.0 * 1048576.0;
        let a = ring(&v, &MACH, proxy, Collective::AllGather, (64, 8), big).unwrap();
        let b = ring(&v, &MACH, both, Collective::AllGather, (64, 8), big).unwrap();
        assert_eq!(b.bound, "nic");
        assert_eq!(a.step, b.step);
    }

    #[test]
    fn the_rendezvous_and_the_dragonfly_add_latency_per_network_hop() {
        let mut v = vendor(1);
        v.rendezvous_us = 3.0;
        let base = ring(&v, &MACH, off(), Collective::AllGather, (32, 16), 8.0).unwrap();
        let on = Mechanisms {
            rendezvous: true,
            ..off()
        };
        let r = ring(&v, &MACH, on, Collective::AllGather, (32, 16), 8.0).unwrap();
        assert!((r.fill - base.fill - 15.0 * 3e-6).abs() < 1e-12);
        let mach = Machine {
            group: (4, 2.0),
            ..MACH
        };
        let on = Mechanisms {
            dragonfly: true,
            ..off()
        };
        let d = ring(&v, &mach, on, Collective::AllGather, (32, 16), 8.0).unwrap();
        assert!((d.fill - base.fill - 4.0 * 2e-6).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn the_library_runs_the_protocol_its_own_table_prefers() {
        let mut v = vendor(1);
        // LL: cheaper hops in the table, a fifth of the bandwidth.
        let ll = ProtoCost {
            hop_net_us: 2.0,
            tuner_intra_us: 0.5,
            tuner_busbw_gbps: 20.0,
            bw_factor: 0.2,
            ..simple()
        };
        v.protocols.insert("ll".into(), ll);
        let small = ring(&v, &MACH, off(), Collective::AllGather, (64, 8), 1024.0).unwrap();
        assert_eq!(small.protocol, "ll");
        let large = ring(&v, &MACH, off(), Collective::AllGather, (64, 8), 8e6).unwrap();
        assert_eq!(large.protocol, "simple");
        // A correction that makes LL's bandwidth 100× worse above 64 KiB in total.
        v.protocols.get_mut("ll").unwrap().tuner_correction = vec![1.0; 10]
            .into_iter()
            .chain(std::iter::repeat_n(0.01, 20))
            .collect();
        let mid = ring(&v, &MACH, off(), Collective::AllGather, (64, 8), 65536.0).unwrap();
        assert_eq!(mid.protocol, "simple");
    }

    #[test]
    fn other_collectives_and_uneven_nodes_are_refused() {
        let v = vendor(1);
        assert!(ring(&v, &MACH, off(), Collective::AllGather, (10, 4), 8.0).is_err());
        assert!(ring(
            &v,
            &MACH,
            off(),
            Collective::Broadcast { root: 0 },
            (8, 2),
            8.0
        )
        .is_err());
        assert!(Mechanisms::without("proxy,bogus").is_err());
        assert!(!Mechanisms::without("proxy, rendezvous").unwrap().rendezvous);
    }
}
