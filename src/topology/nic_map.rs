//! Which NIC of a node each local rank sends through, in Cray MPICH's `MPICH_OFI_NIC_MAPPING`
//! syntax: `"0:0-1;1:2-3;2:4-5;3:6-7"` (NIC index `:` local ranks, ranges and commas allowed).

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// The NIC of every local rank of a node (the same map on every node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicMap {
    nic_of_local: Vec<usize>,
    nics: usize,
}

impl NicMap {
    /// `local_ranks` ranks spread evenly over `nics` NICs in blocks: with 8 ranks and 4 NICs,
    /// ranks 2k and 2k+1 use NIC k; with 8 ranks and 3 NICs, NICs get 3, 3 and 2 ranks.
    /// No NIC (`nics == 0`) is treated as one.
    pub fn even(local_ranks: usize, nics: usize) -> Self {
        let nics = nics.max(1);
        let nic_of_local = (0..local_ranks)
            .map(|l| l * nics / local_ranks.max(1))
            .collect();
        NicMap { nic_of_local, nics }
    }

    /// A map from an explicit NIC per local rank; `nics` is at least one more than the largest.
    pub fn from_nics(nic_of_local: Vec<usize>, nics: usize) -> Self {
        let nics = nics.max(nic_of_local.iter().map(|&n| n + 1).max().unwrap_or(1));
        NicMap { nic_of_local, nics }
    }

    /// NIC used by local rank `local` (ranks past the map's end wrap around it).
    pub fn nic_of(&self, local: usize) -> usize {
        if self.nic_of_local.is_empty() {
            0
        } else {
            self.nic_of_local[local % self.nic_of_local.len()]
        }
    }

    /// NICs per node.
    pub fn nics(&self) -> usize {
        self.nics
    }

    /// NICs that carry at least one local rank: what a node's ranks can load at once (a map
    /// of two ranks on NICs 0 and 2 of four uses two, though its syntax implies at least three).
    pub fn in_use(&self) -> usize {
        (0..self.nics)
            .filter(|&n| self.nic_of_local.contains(&n))
            .count()
            .max(1)
    }

    /// Local ranks the map covers.
    pub fn local_ranks(&self) -> usize {
        self.nic_of_local.len()
    }

    /// The local ranks that send through NIC `nic`.
    pub fn ranks_of(&self, nic: usize) -> Vec<usize> {
        (0..self.nic_of_local.len())
            .filter(|&l| self.nic_of_local[l] == nic)
            .collect()
    }

    /// The most local ranks sharing one NIC.
    pub fn max_sharing(&self) -> usize {
        (0..self.nics)
            .map(|n| self.ranks_of(n).len())
            .max()
            .unwrap_or(0)
    }
}

impl fmt::Display for NicMap {
    /// Cray syntax with runs of consecutive ranks as ranges, NICs in order, unused NICs left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for nic in 0..self.nics {
            let ranks = self.ranks_of(nic);
            if ranks.is_empty() {
                continue;
            }
            if !first {
                f.write_str(";")?;
            }
            first = false;
            write!(f, "{nic}:")?;
            let mut i = 0;
            let mut first_run = true;
            while i < ranks.len() {
                let mut j = i;
                while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
                    j += 1;
                }
                if !first_run {
                    f.write_str(",")?;
                }
                first_run = false;
                if j > i {
                    write!(f, "{}-{}", ranks[i], ranks[j])?;
                } else {
                    write!(f, "{}", ranks[i])?;
                }
                i = j + 1;
            }
        }
        Ok(())
    }
}

/// Largest NIC index or local rank a map may name (a typo, not a node, beyond this).
const MAX_INDEX: usize = 4096;

impl FromStr for NicMap {
    type Err = Error;
    /// Parses `"0:0-1;1:2-3"`. Every local rank from 0 to the largest named must be named
    /// exactly once.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "NIC map '{s}': {why} (expected e.g. '0:0-1;1:2-3')"
            ))
        };
        let num = |t: &str| -> Result<usize> {
            let v: usize = t
                .trim()
                .parse()
                .map_err(|_| bad(&format!("'{t}' is not a number")))?;
            if v > MAX_INDEX {
                return Err(bad(&format!("{v} is larger than {MAX_INDEX}")));
            }
            Ok(v)
        };
        let mut pairs: Vec<(usize, usize)> = Vec::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (nic, ranks) = part
                .split_once(':')
                .ok_or_else(|| bad(&format!("'{part}' has no ':'")))?;
            let nic = num(nic)?;
            for item in ranks.split(',').map(str::trim) {
                let (lo, hi) = match item.split_once('-') {
                    Some((a, b)) => (num(a)?, num(b)?),
                    None => (num(item)?, num(item)?),
                };
                if lo > hi {
                    return Err(bad(&format!("range '{item}' runs backwards")));
                }
                pairs.extend((lo..=hi).map(|l| (l, nic)));
            }
        }
        if pairs.is_empty() {
            return Err(bad("no ranks"));
        }
        let n = pairs.iter().map(|p| p.0).max().unwrap_or(0) + 1;
        let mut nic_of: Vec<Option<usize>> = vec![None; n];
        for (l, nic) in pairs {
            if nic_of[l].replace(nic).is_some() {
                return Err(bad(&format!("local rank {l} is named twice")));
            }
        }
        let nic_of_local = nic_of
            .into_iter()
            .enumerate()
            .map(|(l, v)| v.ok_or_else(|| bad(&format!("local rank {l} has no NIC"))))
            .collect::<Result<Vec<_>>>()?;
        let nics = nic_of_local.iter().max().map_or(1, |m| m + 1);
        Ok(NicMap { nic_of_local, nics })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_spread_of_eight_ranks_over_four_nics_is_frontiers_map() {
        let m = NicMap::even(8, 4);
        assert_eq!(m.to_string(), "0:0-1;1:2-3;2:4-5;3:6-7");
        assert_eq!(m.max_sharing(), 2);
    }

    #[test]
    fn uneven_spread_gives_no_nic_more_than_one_extra_rank() {
        let m = NicMap::even(8, 3);
        assert_eq!(m.to_string(), "0:0-2;1:3-5;2:6-7");
        assert_eq!(NicMap::even(4, 0).to_string(), "0:0-3");
    }

    #[test]
    fn cray_syntax_round_trips() {
        for s in ["0:3;1:2;2:1;3:0", "0:0-1;1:2-3;2:4-5;3:6-7", "0:0,2;1:1,3"] {
            let m: NicMap = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
        let m: NicMap = "0:3;1:2;2:1;3:0".parse().unwrap();
        assert_eq!(m.nic_of(0), 3);
        assert_eq!(m.nics(), 4);
    }

    #[test]
    fn nics_in_use_count_only_those_a_rank_sends_through() {
        let m: NicMap = "0:0;2:1".parse().unwrap();
        assert_eq!((m.nics(), m.in_use()), (3, 2));
        assert_eq!(NicMap::even(2, 4).in_use(), 2);
        assert_eq!(NicMap::even(8, 4).in_use(), 4);
        assert_eq!(NicMap::from_nics(vec![], 2).in_use(), 1);
    }

    #[test]
    fn malformed_maps_are_errors_that_quote_the_map() {
        for s in ["", "0", "0:1", "0:0;1:0", "0:x", "0:3-1", "0:99999"] {
            let e = s.parse::<NicMap>().unwrap_err();
            assert!(e.message().contains("NIC map"), "{s}: {e}");
        }
    }
}
