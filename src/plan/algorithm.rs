//! The algorithm of a collective as a value: per-level choices, the two- and three-level
//! and overlapped forms, their names (`PCCL_ALGO`, `--algo`) and what they build for each
//! collective.

use super::Collective;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Per-level algorithm choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LevelAlgo {
    /// Ring: `k-1` steps, one block per step.
    Ring,
    /// Recursive doubling / halving (XOR pairs for powers of two, Bruck-style dissemination
    /// otherwise): `ceil(lg k)` steps.
    Rd,
}

/// The algorithm of a whole collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One level over all ranks.
    Flat(LevelAlgo),
    /// Two levels: `inter` among ranks with the same local index, `intra` within a node.
    Hier {
        /// Algorithm among nodes.
        inter: LevelAlgo,
        /// Algorithm inside a node.
        intra: LevelAlgo,
    },
    /// Whole-vector recursive doubling ([`super::vector`]): `ceil(lg P)` rounds exchanging the
    /// whole vector, for latency-bound all-reduce. Other collectives run [`LevelAlgo::Rd`].
    VectorRd,
    /// Three levels ([`super::deep`]): `inter` among nodes, `mid` among a node's groups (the ranks
    /// of one position in their group), `inner` inside a group. Needs a topology with groups
    /// ([`crate::topology::Topology::has_groups`]); without them it runs as [`Algorithm::Hier`] of `inter` and
    /// `mid`, on unequal nodes as the flat `inter`.
    Deep {
        /// Algorithm among nodes.
        inter: LevelAlgo,
        /// Algorithm among the groups of a node.
        mid: LevelAlgo,
        /// Algorithm inside a group.
        inner: LevelAlgo,
        /// Pieces per block (`1..=MAX_PIECES`): above 1, the network level of piece `j + 1`
        /// runs beside the node's levels of piece `j` ([`super::overlap`]).
        pieces: usize,
    },
    /// Two levels overlapped: every block cut into `pieces` pieces whose inter-node and
    /// intra-node steps run in the same phases, staggered (see [`super::overlap`]).
    Overlap {
        /// Algorithm among nodes.
        inter: LevelAlgo,
        /// Algorithm inside a node.
        intra: LevelAlgo,
        /// Pieces per block, `1..=MAX_PIECES`.
        pieces: usize,
    },
}

/// The most pieces an overlapped algorithm cuts a block into.
pub const MAX_PIECES: usize = 64;

impl Algorithm {
    /// A small number naming the algorithm, equal on every rank (part of a call's
    /// fingerprint): cheaper than hashing its name on every call.
    pub fn code(self) -> u64 {
        let level = |l: LevelAlgo| match l {
            LevelAlgo::Ring => 1,
            LevelAlgo::Rd => 2,
        };
        match self {
            Algorithm::Flat(l) => level(l),
            Algorithm::VectorRd => 3,
            Algorithm::Hier { inter, intra } => 16 + 4 * level(inter) + level(intra),
            Algorithm::Deep {
                inter,
                mid,
                inner,
                pieces,
            } => ((pieces as u64) << 8) + 128 + 16 * level(inter) + 4 * level(mid) + level(inner),
            Algorithm::Overlap {
                inter,
                intra,
                pieces,
            } => ((pieces as u64) << 8) + 32 + 4 * level(inter) + level(intra),
        }
    }

    /// Whether its plans on `nodes` nodes exchange with several peers across the network in
    /// turn: recursive doubling or halving at the network level over three nodes or more
    /// (two nodes make one exchange). A receive of such a plan may meet its next partner's
    /// message while the current one still arrives; both then share the receiver's link and
    /// the late rank falls further behind (docs/CLUSTER.md: 1.3-2.5x the NIC floor). The
    /// stamp carries the answer ([`crate::transport::faults::RENDEZVOUS`]), and a transport
    /// with a rendezvous holds those plans' large messages until their receiver is ready.
    pub fn rendezvous(self, nodes: usize) -> bool {
        let network = match self {
            Algorithm::Flat(l)
            | Algorithm::Hier { inter: l, .. }
            | Algorithm::Deep { inter: l, .. }
            | Algorithm::Overlap { inter: l, .. } => l,
            Algorithm::VectorRd => LevelAlgo::Rd,
        };
        network == LevelAlgo::Rd && nodes >= 3
    }

    /// Pieces per block of the plans it builds (1 but for [`Algorithm::Overlap`] and an
    /// overlapped [`Algorithm::Deep`]).
    pub fn pieces(self) -> usize {
        match self {
            Algorithm::Overlap { pieces, .. } | Algorithm::Deep { pieces, .. } => pieces,
            _ => 1,
        }
    }

    /// The same algorithm overlapped in `pieces` pieces per block (`None` for a flat one).
    pub fn overlapped(self, pieces: usize) -> Option<Algorithm> {
        match self {
            Algorithm::Deep {
                inter, mid, inner, ..
            } => Some(Algorithm::Deep {
                inter,
                mid,
                inner,
                pieces,
            }),
            Algorithm::Hier { inter, intra } | Algorithm::Overlap { inter, intra, .. } => {
                Some(Algorithm::Overlap {
                    inter,
                    intra,
                    pieces,
                })
            }
            Algorithm::Flat(_) | Algorithm::VectorRd => None,
        }
    }

    /// Every algorithm: the two flat ones, the four two-level combinations and the
    /// whole-vector all-reduce (last).
    pub const ALL: [Algorithm; 7] = [
        Algorithm::Flat(LevelAlgo::Ring),
        Algorithm::Flat(LevelAlgo::Rd),
        Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        },
        Algorithm::Hier {
            inter: LevelAlgo::Ring,
            intra: LevelAlgo::Ring,
        },
        Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Rd,
        },
        Algorithm::Hier {
            inter: LevelAlgo::Ring,
            intra: LevelAlgo::Rd,
        },
        Algorithm::VectorRd,
    ];

    /// The eight plain three-level algorithms (every choice of each level's algorithm),
    /// recursive doubling between nodes first.
    pub fn three_level_forms() -> Vec<Algorithm> {
        let mut v = Vec::with_capacity(8);
        for inter in [LevelAlgo::Rd, LevelAlgo::Ring] {
            for mid in [LevelAlgo::Ring, LevelAlgo::Rd] {
                for inner in [LevelAlgo::Ring, LevelAlgo::Rd] {
                    v.push(Algorithm::Deep {
                        inter,
                        mid,
                        inner,
                        pieces: 1,
                    });
                }
            }
        }
        v
    }

    /// The algorithm that runs `collective`: [`Algorithm::VectorRd`] is for all-reduce
    /// only, the others run recursive doubling instead.
    pub fn for_collective(self, collective: Collective) -> Algorithm {
        match (self, collective) {
            (Algorithm::VectorRd, Collective::AllReduce { .. }) => self,
            (Algorithm::VectorRd, _) => Algorithm::Flat(LevelAlgo::Rd),
            (a, _) => a,
        }
    }

    /// The name printed by `PCCL_DEBUG=INFO` and accepted by `PCCL_ALGO` / `--algo`.
    pub fn name(self) -> String {
        match self {
            Algorithm::Flat(LevelAlgo::Ring) => "ring".into(),
            Algorithm::Flat(LevelAlgo::Rd) => "rd".into(),
            Algorithm::VectorRd => "rdv".into(),
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            } => "hier-rd".into(),
            Algorithm::Hier {
                inter: LevelAlgo::Ring,
                intra: LevelAlgo::Ring,
            } => "hier-ring".into(),
            Algorithm::Hier { inter, intra } => {
                format!("hier-{}-{}", level_name(inter), level_name(intra))
            }
            Algorithm::Deep {
                inter,
                mid,
                inner,
                pieces,
            } => {
                let base = match (inter, mid, inner) {
                    (LevelAlgo::Rd, LevelAlgo::Ring, LevelAlgo::Ring) => "hier3-rd".into(),
                    (LevelAlgo::Ring, LevelAlgo::Ring, LevelAlgo::Ring) => "hier3-ring".into(),
                    _ => format!(
                        "hier3-{}-{}-{}",
                        level_name(inter),
                        level_name(mid),
                        level_name(inner)
                    ),
                };
                match pieces {
                    1 => base,
                    k => format!("{base}-pipe{k}"),
                }
            }
            Algorithm::Overlap {
                inter,
                intra,
                pieces,
            } => format!("{}-pipe{pieces}", Algorithm::Hier { inter, intra }.name()),
        }
    }
}

fn level_name(l: LevelAlgo) -> &'static str {
    match l {
        LevelAlgo::Ring => "ring",
        LevelAlgo::Rd => "rd",
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if let Some((base, k)) = s.rsplit_once("-pipe") {
            let pieces = k
                .parse::<usize>()
                .ok()
                .filter(|k| (1..=MAX_PIECES).contains(k));
            return match (base.parse::<Algorithm>(), pieces) {
                (Ok(a @ (Algorithm::Hier { .. } | Algorithm::Deep { pieces: 1, .. })), Some(k)) => {
                    Ok(a.overlapped(k).unwrap_or(a))
                }
                _ => Err(Error::invalid(format!(
                    "unknown algorithm '{s}': an overlapped hierarchy is HIER-pipeK with HIER one \
                     of hier-rd, hier-ring, hier-INTER-INTRA, hier3-rd, hier3-ring, \
                     hier3-INTER-MID-INNER and K in 1..={MAX_PIECES} (e.g. hier-rd-pipe4)"
                ))),
            };
        }
        let lvl = |x: &str| match x {
            "ring" => Some(LevelAlgo::Ring),
            "rd" => Some(LevelAlgo::Rd),
            _ => None,
        };
        let parsed = match s {
            "ring" => Some(Algorithm::Flat(LevelAlgo::Ring)),
            "rd" => Some(Algorithm::Flat(LevelAlgo::Rd)),
            "rdv" => Some(Algorithm::VectorRd),
            "hier-rd" => Some(Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            }),
            "hier-ring" => Some(Algorithm::Hier {
                inter: LevelAlgo::Ring,
                intra: LevelAlgo::Ring,
            }),
            "hier3-rd" => Some(Algorithm::Deep {
                inter: LevelAlgo::Rd,
                mid: LevelAlgo::Ring,
                inner: LevelAlgo::Ring,
                pieces: 1,
            }),
            "hier3-ring" => Some(Algorithm::Deep {
                inter: LevelAlgo::Ring,
                mid: LevelAlgo::Ring,
                inner: LevelAlgo::Ring,
                pieces: 1,
            }),
            _ if s.starts_with("hier3-") => {
                let mut it = s["hier3-".len()..].split('-').map(lvl);
                match (it.next(), it.next(), it.next(), it.next()) {
                    (Some(Some(inter)), Some(Some(mid)), Some(Some(inner)), None) => {
                        Some(Algorithm::Deep {
                            inter,
                            mid,
                            inner,
                            pieces: 1,
                        })
                    }
                    _ => None,
                }
            }
            _ => s.strip_prefix("hier-").and_then(|rest| {
                let (a, b) = rest.split_once('-')?;
                Some(Algorithm::Hier {
                    inter: lvl(a)?,
                    intra: lvl(b)?,
                })
            }),
        };
        parsed.ok_or_else(|| {
            Error::invalid(format!(
                "unknown algorithm '{s}': expected ring, rd, rdv, hier-rd, hier-ring or hier-INTER-INTRA \
                 with INTER, INTRA in {{ring, rd}}, optionally overlapped in K pieces as \
                 HIER-pipeK (hier-rd-pipe4), or three levels as hier3-rd, hier3-ring or \
                 hier3-INTER-MID-INNER (inside nodes cut into groups: PCCL_GROUP_SIZE)"
            ))
        })
    }
}
