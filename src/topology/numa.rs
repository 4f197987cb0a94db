//! The NUMA node a rank runs on: the node whose CPUs hold every CPU the calling thread may run
//! on (its affinity, as a launcher's binding sets it). A rank bound inside one NUMA node has
//! one; an unbound rank (allowed on the CPUs of several nodes) has none. Read from Linux's
//! `/proc/thread-self/status` (`Cpus_allowed_list`) and `/sys/devices/system/node/node*/cpulist`,
//! no library needed; on other systems, or where those files are missing, there is none.
//!
//! The topology agreement ([`super::agree`]) turns the ranks' NUMA nodes into groups inside a
//! node (a level of the hierarchy: socket → node → network) on nodes without GPUs.

use std::path::Path;

/// The CPUs of a Linux cpulist (`0-3,8,10-11`), ascending; None when it does not parse.
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (
                    a.trim().parse::<usize>().ok()?,
                    b.trim().parse::<usize>().ok()?,
                );
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The NUMA node holding every CPU of `allowed`, from the node directories under `sys_node`
/// (`node<N>/cpulist` each); None when the CPUs span several nodes or nothing is known.
pub fn node_of(allowed: &[usize], sys_node: &Path) -> Option<usize> {
    if allowed.is_empty() {
        return None;
    }
    let entries = std::fs::read_dir(sys_node).ok()?;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let Some(cpus) = std::fs::read_to_string(e.path().join("cpulist"))
            .ok()
            .and_then(|s| parse_cpulist(&s))
        else {
            continue;
        };
        if allowed.iter().all(|c| cpus.binary_search(c).is_ok()) {
            return Some(id);
        }
    }
    None
}

/// The NUMA node of the calling thread, or None (unbound, several nodes, not Linux).
pub fn this_thread() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    node_of(&parse_cpulist(list)?, Path::new("/sys/devices/system/node"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a-b"), None);
    }

    #[test]
    fn a_binding_inside_one_node_names_it_and_a_wider_one_none() {
        let dir = std::env::temp_dir().join(format!("pccl-numa-{}", std::process::id()));
        for (n, list) in [(0, "0-3,8-11"), (1, "4-7,12-15")] {
            let d = dir.join(format!("node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), list).unwrap();
        }
        std::fs::create_dir_all(dir.join("power")).unwrap();
        assert_eq!(node_of(&[4, 5, 12], &dir), Some(1));
        assert_eq!(node_of(&[0, 9], &dir), Some(0));
        assert_eq!(node_of(&[3, 4], &dir), None);
        assert_eq!(node_of(&[], &dir), None);
        assert_eq!(node_of(&[0], &dir.join("missing")), None);
        let _ = std::fs::remove_dir_all(&dir);
        // On this machine: whatever it is, it runs.
        let _ = this_thread();
    }
}
