//! Jobs whose launcher starts one process per rank (`mpiexec`, `srun`, `torchrun`,
//! `scripts/cluster.sh run`) and joins them over TCP or libfabric without MPI: the rank and
//! world size come from the launcher's variables, the unique id from the environment or from
//! a file that rank 0 writes.
//!
//! Variables, first found wins: `PCCL_RANK` / `PCCL_WORLD_SIZE`, `PMI_RANK` / `PMI_SIZE`
//! (MPICH's hydra), `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`, `PALS_RANKID` /
//! `PALS_NRANKS` (Cray PALS), `SLURM_PROCID` / `SLURM_NTASKS`, `RANK` / `WORLD_SIZE`
//! (torchrun). The id: `PCCL_UNIQUE_ID` (the 128 bytes
//! of [`UniqueId::to_bytes`] as 256 hex digits), else `PCCL_UNIQUE_ID_FILE`: rank 0 opens the
//! rendezvous and writes its id there (mode 0600, renamed into place so nobody reads half of
//! it); the other ranks wait for the file up to `PCCL_TIMEOUT`. The file names a secret: give
//! each job a fresh path in a directory only the job's user can read.

use super::select::{self, Kind};
use super::tcp::{UniqueId, UNIQUE_ID_BYTES};
use super::Transport;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Launcher variables for (rank, world size), in the order they are looked at.
pub const RANK_VARS: [(&str, &str); 6] = [
    ("PCCL_RANK", "PCCL_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PALS_RANKID", "PALS_NRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("RANK", "WORLD_SIZE"),
];

/// This process's place in a launched job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
}

/// The rank and world size the launcher set, from `get` (the process environment in
/// [`from_env`]); `None` when no pair of [`RANK_VARS`] is set. A pair that is set but not a
/// rank below a positive size is an error naming the variables.
pub fn launch_from(get: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    for (r, s) in RANK_VARS {
        let (Some(rank), Some(size)) = (get(r), get(s)) else {
            continue;
        };
        let parse = |v: &str| v.trim().parse::<usize>().ok();
        return match (parse(&rank), parse(&size)) {
            (Some(rank), Some(size)) if rank < size => Ok(Some(Launch { rank, size })),
            _ => Err(Error::invalid(format!(
                "{r}={rank} {s}={size}: expected a rank below a positive world size"
            ))),
        };
    }
    Ok(None)
}

/// [`launch_from`] the process environment.
pub fn from_env() -> Result<Option<Launch>> {
    launch_from(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
}

/// The id as 256 hex digits (`PCCL_UNIQUE_ID`).
pub fn to_hex(id: &UniqueId) -> String {
    id.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`to_hex`].
pub fn from_hex(s: &str) -> Result<UniqueId> {
    let s = s.trim();
    if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
        return Err(Error::invalid(format!(
            "a PCCL unique id in hex has {} digits, this one {}",
            2 * UNIQUE_ID_BYTES,
            s.len()
        )));
    }
    let bytes: Option<Vec<u8>> = (0..UNIQUE_ID_BYTES)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect();
    let bytes =
        bytes.ok_or_else(|| Error::invalid("a PCCL unique id in hex has only hex digits"))?;
    UniqueId::from_bytes(&bytes)
}

/// The job's unique id for `rank`: `PCCL_UNIQUE_ID`, else through `PCCL_UNIQUE_ID_FILE`
/// (rank 0 creates it, the others wait for it until `timeout`).
pub fn unique_id(rank: usize, timeout: Duration) -> Result<UniqueId> {
    if let Some(hex) = std::env::var("PCCL_UNIQUE_ID")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return from_hex(&hex).map_err(|e| Error::invalid(format!("PCCL_UNIQUE_ID: {e}")));
    }
    let Some(file) = std::env::var_os("PCCL_UNIQUE_ID_FILE").filter(|s| !s.is_empty()) else {
        return Err(Error::usage(format!(
            "rank {rank}: a launched job needs its unique id: set PCCL_UNIQUE_ID (hex) or \
             PCCL_UNIQUE_ID_FILE (a fresh path all ranks can read; rank 0 writes it)"
        )));
    };
    let file = PathBuf::from(file);
    if rank == 0 {
        let id = UniqueId::new(timeout)?;
        write_private(&file, to_hex(&id).as_bytes())?;
        Ok(id)
    } else {
        wait_for(&file, rank, Instant::now() + timeout)
    }
}

/// Writes `bytes` to `file` readable by this user only, atomically (a temporary file renamed).
fn write_private(file: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let what = |e: std::io::Error| {
        Error::system(format!(
            "rank 0: cannot write the unique id to PCCL_UNIQUE_ID_FILE={}: {e}",
            file.display()
        ))
    };
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(what)?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(what)?;
    std::fs::rename(&tmp, file).map_err(what)
}

/// Waits for rank 0's id file; a file that exists but does not parse is read again (rank 0
/// renames it into place whole, so only a stale or foreign file stays bad).
fn wait_for(file: &Path, rank: usize, deadline: Instant) -> Result<UniqueId> {
    let mut last = None;
    loop {
        match std::fs::read(file) {
            Ok(b) => match std::str::from_utf8(&b)
                .map_err(|_| Error::invalid("not text"))
                .and_then(from_hex)
            {
                Ok(id) => return Ok(id),
                Err(e) => last = Some(e.message().to_string()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => last = Some(e.to_string()),
        }
        if Instant::now() >= deadline {
            return Err(Error::timeout(format!(
                "rank {rank}: rank 0 never wrote the unique id to PCCL_UNIQUE_ID_FILE={} within \
                 PCCL_TIMEOUT{} (did rank 0 start, and do all ranks see the same path?)",
                file.display(),
                last.map(|l| format!(" (last read: {l})"))
                    .unwrap_or_default()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The transport of this launched process (`kind`: tcp or ofi; auto is tcp), joined through
/// [`unique_id`]; `None` when no launcher variables are set.
pub fn join_launched(
    kind: Kind,
    chunk_bytes: usize,
    timeout: Duration,
) -> Result<Option<(Launch, Arc<dyn Transport>)>> {
    let Some(l) = from_env()? else {
        return Ok(None);
    };
    let id = unique_id(l.rank, timeout)?;
    let t = select::join(kind, &id, l.size, l.rank, chunk_bytes, timeout)?;
    Ok(Some((l, t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launcher_variables_are_read_in_order_and_checked() {
        assert_eq!(launch_from(env(&[])).unwrap(), None);
        let l = launch_from(env(&[("PMI_RANK", "3"), ("PMI_SIZE", "8"), ("RANK", "1")]));
        assert_eq!(l.unwrap(), Some(Launch { rank: 3, size: 8 }));
        let l = launch_from(env(&[
            ("PCCL_RANK", "0"),
            ("PCCL_WORLD_SIZE", "2"),
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "6"),
        ]));
        assert_eq!(l.unwrap(), Some(Launch { rank: 0, size: 2 }));
        // Half a pair is no launcher; a bad pair is an error naming it.
        assert_eq!(launch_from(env(&[("RANK", "1")])).unwrap(), None);
        let e = launch_from(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.message().contains("RANK=4 WORLD_SIZE=4"), "{e}");
        let e = launch_from(env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")])).unwrap_err();
        assert!(e.message().contains("SLURM_PROCID=x"), "{e}");
    }

    #[test]
    fn ids_round_trip_through_hex_and_mangled_ones_are_refused() {
        let id = UniqueId::new(Duration::from_millis(100)).unwrap();
        let hex = to_hex(&id);
        assert_eq!(hex.len(), 2 * UNIQUE_ID_BYTES);
        assert_eq!(from_hex(&hex).unwrap(), id);
        assert!(from_hex(&hex[1..]).is_err());
        let mut bad = hex.clone().into_bytes();
        bad[40] = if bad[40] == b'0' { b'1' } else { b'0' };
        assert!(from_hex(std::str::from_utf8(&bad).unwrap()).is_err());
        assert!(from_hex(&"zz".repeat(UNIQUE_ID_BYTES)).is_err());
    }

    #[test]
    fn the_id_file_is_written_whole_and_private_and_waited_for() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pccl-launch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("id");
        let id = UniqueId::new(Duration::from_millis(100)).unwrap();
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || wait_for(&file, 1, Instant::now() + Duration::from_secs(5)))
        };
        std::thread::sleep(Duration::from_millis(50));
        write_private(&file, to_hex(&id).as_bytes()).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), id);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Nobody writes: the wait ends with an error naming the file.
        let e = wait_for(
            &dir.join("never"),
            2,
            Instant::now() + Duration::from_millis(60),
        )
        .unwrap_err();
        assert!(
            e.message().contains("rank 2") && e.message().contains("never"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
