//! Single-copy reads of a same-host peer's memory (Linux cross-memory attach,
//! `process_vm_readv`).
//!
//! A large message between two processes of one node goes through the shared-memory ring as
//! an *offer* (the sender's address and a sequence number) instead of its bytes: the receiver
//! reads the sender's memory straight into its own destination, one copy instead of two (into
//! the ring, out of it), and the sender's thread copies nothing. The kernel allows the read
//! where the receiver may ptrace the sender (same user and no Yama restriction, or
//! `CAP_SYS_PTRACE`) and both see the same process ids; containers often forbid the call.
//! So nothing is assumed: when the mesh is built each rank lets its same-host peers read a
//! random value from its memory ([`Probe`]), and a direction is single-copy only where that
//! read returned the value (see `tcp::build`).

use std::io;

/// Reads `dst.len()` bytes at address `remote` of process `pid` into `dst`.
///
/// The kernel checks the permission and the remote range: a dead process, an unmapped range
/// or a refusal is an error, never a fault in this process.
pub fn read(pid: libc::pid_t, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let from = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` describes memory this process owns and may write (`dst`, exclusively
        // borrowed for the call); `from` names the other process's memory, which the kernel
        // checks and never dereferences here.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &from, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer's memory ended early",
                ))
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether process `pid` has ended: it no longer exists, or it is a zombie (whose memory is
/// gone; nobody reads through it any more).
pub fn gone(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command's name, which is in parentheses and may hold any.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|c| c == 'Z' || c == 'X'),
    }
}

/// This process's id, as a peer names it in [`read`].
pub fn own_pid() -> u64 {
    u64::from(std::process::id())
}

/// A random value at a fixed address of this process, for a peer to read once: whether it
/// reads the value back tells whether single-copy reads work between the two.
pub struct Probe {
    value: Box<u64>,
}

impl Probe {
    /// A fresh probe.
    pub fn new() -> crate::error::Result<Self> {
        let b: [u8; 8] = super::secret::random_bytes()?;
        // Never 0, so an unwritten destination cannot pass.
        Ok(Probe {
            value: Box::new(u64::from_le_bytes(b) | 1),
        })
    }

    /// The value's address in this process.
    pub fn addr(&self) -> u64 {
        &*self.value as *const u64 as u64
    }

    /// The value.
    pub fn value(&self) -> u64 {
        *self.value
    }
}

/// Whether process `pid` holds `value` at `addr`, read with [`read`] (false on any error:
/// another process id space, no permission, a seccomp filter).
pub fn check(pid: u64, addr: u64, value: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    let mut got = [0u8; 8];
    read(pid, addr, &mut got).is_ok() && u64::from_le_bytes(got) == value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_of_this_process_reads_back_its_value() {
        let p = Probe::new().unwrap();
        assert!(check(own_pid(), p.addr(), p.value()));
        assert!(!check(own_pid(), p.addr(), p.value() ^ 2));
    }

    #[test]
    fn a_live_process_is_not_gone_and_an_exited_one_is_even_unreaped() {
        assert!(!gone(std::process::id() as libc::pid_t));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        // Not reaped yet: a zombie once it exited.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gone(pid) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            gone(pid),
            "an exited child counts as gone before it is reaped"
        );
        child.wait().unwrap();
        assert!(gone(pid));
    }

    #[test]
    fn a_read_of_an_unmapped_range_is_an_error_not_a_fault() {
        let mut dst = [0u8; 16];
        let e = read(std::process::id() as libc::pid_t, 8, &mut dst).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
    }

    #[test]
    fn a_read_of_a_large_buffer_copies_every_byte() {
        let src: Vec<u8> = (0..3 * 1024 * 1024 + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut dst = vec![0u8; src.len()];
        read(
            std::process::id() as libc::pid_t,
            src.as_ptr() as u64,
            &mut dst,
        )
        .unwrap();
        assert!(src == dst);
    }
}
