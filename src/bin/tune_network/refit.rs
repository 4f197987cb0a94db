//! The timings a network profile's `source` lists, read back (profiles `pccl-tune
//! --transport` wrote before they kept a `[measured_network]` table), for `pccl-tune --refit`.
//!
//! The text is `describe`'s: "… on N nodes x M ranks (K NICs per node; H nodes per host of C
//! cores) …. Measured: pair between nodes: S B T us, …; pair in a node: …; the world's
//! all-gathers: ALGO S B T us, …[; the world's all-reduces: ALGO S B T us, …]; every
//! node's S B all-gather inside it at once: T ms …".

use pccl::model::network_fit::NetworkTimings;
use pccl::{Algorithm, Error, Result};

fn bad(what: &str) -> Error {
    Error::invalid(format!(
        "pccl-tune --refit: the profile holds no network timings (no [measured_network] \
         table, and its source does not list {what}): refit only profiles written by \
         pccl-tune --transport tcp|ofi"
    ))
}

/// The text after `key` up to the next `;` (or the end).
fn field<'a>(s: &'a str, key: &str) -> Result<&'a str> {
    let at = s.find(key).ok_or_else(|| bad(key.trim_end_matches(": ")))?;
    let rest = &s[at + key.len()..];
    Ok(rest.split(';').next().unwrap_or(rest).trim())
}

/// The number just before `unit` in `s` (`"4 nodes"` with unit `" nodes"`).
fn before(s: &str, unit: &str) -> Result<usize> {
    let at = s.find(unit).ok_or_else(|| bad(unit.trim()))?;
    s[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| bad(unit.trim()))
}

/// `"S B T us"` items, comma separated, each after `skip` leading words.
fn items(list: &str, skip: usize, what: &str) -> Result<Vec<(Vec<String>, usize, f64)>> {
    list.split(", ")
        .map(|it| {
            let w: Vec<&str> = it.split_whitespace().collect();
            match w[..] {
                [ref head @ .., b, "B", t, "us"] if head.len() == skip => Ok((
                    head.iter().map(|x| x.to_string()).collect(),
                    b.parse().map_err(|_| bad(what))?,
                    t.parse::<f64>().map_err(|_| bad(what))? * 1e-6,
                )),
                _ => Err(bad(what)),
            }
        })
        .collect()
}

/// The timings `source` lists.
pub fn timings_of_source(source: &str) -> Result<NetworkTimings> {
    let pairs = |key: &str| -> Result<Vec<(usize, f64)>> {
        Ok(items(field(source, key)?, 0, key)?
            .into_iter()
            .map(|(_, b, t)| (b, t))
            .collect())
    };
    let algos = |key: &str| -> Result<Vec<(Algorithm, usize, f64)>> {
        items(field(source, key)?, 1, key)?
            .into_iter()
            .map(|(h, b, t)| Ok((h[0].parse::<Algorithm>()?, b, t)))
            .collect()
    };
    let world = algos("the world's all-gathers: ")?;
    let reduces = "the world's all-reduces: ";
    let world_reduce = match source.contains(reduces) {
        true => algos(reduces)?,
        false => Vec::new(),
    };
    let all = field(source, "every node's ")?;
    let num = |s: &str| {
        s.trim()
            .parse::<f64>()
            .map_err(|_| bad("every node's all-gather"))
    };
    let intra_all = match (all.split_once(" B "), all.split_once("at once: ")) {
        (Some((b, _)), Some((_, rest))) => {
            let ms = rest.split(" ms").next().unwrap_or(rest);
            Some((num(b)? as usize, num(ms)? * 1e-3))
        }
        _ => None,
    };
    Ok(NetworkTimings {
        nodes: before(source, " nodes x ")?,
        ranks_per_node: before(source, " ranks (")?,
        nics: before(source, " NICs per node")?,
        cores: before(source, " cores)")?,
        nodes_per_host: before(source, " nodes per host")?,
        inter_pair: pairs("pair between nodes: ")?,
        intra_pair: pairs("pair in a node: ")?,
        world,
        world_reduce,
        intra_all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "pccl-tune --transport tcp on 4 nodes x 4 ranks (1 NICs per node; 4 \
        nodes per host of 2 cores); host terms from PCCL's defaults. Measured: pair between \
        nodes: 1024 B 40.8 us, 16384 B 690.2 us, 262144 B 10980.0 us; pair in a node: 1024 B \
        2.9 us, 16384 B 5.2 us, 262144 B 81.2 us; the world's all-gathers: ring 1024 B 758.2 \
        us, hier-ring 64 B 332.7 us, rd 1024 B 2084.5 us; the world's all-reduces: ring 1024 \
        B 1225.0 us; every node's 4194304 B all-gather \
        inside it at once: 30.4 ms (a node's messages share 1.69 GB/s; 0: no limit); fitted \
        within 1.08x";

    #[test]
    fn the_timings_a_source_lists_are_read_back() {
        let t = timings_of_source(SOURCE).unwrap();
        assert_eq!(
            (t.nodes, t.ranks_per_node, t.nics, t.nodes_per_host, t.cores),
            (4, 4, 1, 4, 2)
        );
        assert_eq!(t.inter_pair.len(), 3);
        assert_eq!(t.inter_pair[1].0, 16384);
        assert!((t.inter_pair[1].1 - 690.2e-6).abs() < 1e-12);
        assert!((t.intra_pair[0].1 - 2.9e-6).abs() < 1e-12);
        let names: Vec<String> = t.world.iter().map(|w| w.0.to_string()).collect();
        assert_eq!(names, ["ring", "hier-ring", "rd"]);
        assert_eq!(t.world[1].1, 64);
        assert_eq!(t.world_reduce.len(), 1);
        assert!((t.world_reduce[0].2 - 1225e-6).abs() < 1e-12);
        let older = SOURCE.replace("; the world's all-reduces: ring 1024 B 1225.0 us", "");
        assert!(timings_of_source(&older).unwrap().world_reduce.is_empty());
        let (b, s) = t.intra_all.unwrap();
        assert_eq!(b, 4 << 20);
        assert!((s - 30.4e-3).abs() < 1e-12);
    }

    #[test]
    fn a_source_without_timings_is_refused_with_what_is_missing() {
        let e = timings_of_source("pccl-tune on threads: measured here").unwrap_err();
        assert!(e.to_string().contains("no network timings"), "{e}");
    }
}
