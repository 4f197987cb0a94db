//! The vectored message contract (`Transport::isendv` / `recvv_into`), one body for every
//! transport: included by `tests/vectored.rs` (thread and TCP ranks),
//! `tests/ofi_transport.rs` (libfabric) and `examples/vectored_check.rs` (MPI processes
//! under `mpiexec`).
//!
//! Ranks pair up (0–1, 2–3, …; an odd last rank sits out). For each piece size and layout the
//! even rank sends and the odd rank receives, then the roles swap, in three forms: vectored to
//! vectored with the receiver's segments cut differently, vectored to contiguous, contiguous
//! to vectored (the wire contract: a vectored message is byte for byte the packed one).
//! Layouts hold zero-length segments, one-byte ones, segments straddling piece
//! boundaries, and runs larger than a TCP writer's step and a ring slot (which the TCP
//! transport sends from the segments, unpacked). Then a vectored message 5 bytes longer than its receive is an error on the
//! receiver (never success, never a hang), and the pair's next message is still exact.

use pccl::transport::{faults, Transport};
use std::time::{Duration, Instant};

/// Segment lengths of the layouts exchanged (their sums are the message lengths).
const LAYOUTS: [&[usize]; 7] = [
    &[0],
    &[0, 0, 0],
    &[1],
    &[70_000, 0, 3, 1, 200_000, 0, 65_536],
    &[131_072, 131_072],
    &[5, 262_139, 17, 0, 300_000],
    // Larger than a TCP writer's 1 MiB step and a ring's slot: sent from the segments.
    &[1_048_576, 3, 1_048_583, 0, 600_000],
];

/// The byte at offset `i` of message `k` from rank `r`.
fn byte(r: usize, k: u32, i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (r * 29 + k as usize * 7) ^ (i >> 9)) as u8
}

/// Cuts `len` bytes into segments differently from the sender: thirds, with empty ones
/// between.
fn recut(len: usize) -> Vec<usize> {
    let a = len / 3;
    vec![0, a, 0, a, len - 2 * a, 0]
}

/// Separate buffers for segments of `lens`, each with 8 guard bytes after it.
fn buffers(lens: &[usize], fill: impl Fn(usize) -> u8) -> (Vec<Vec<u8>>, usize) {
    let mut at = 0;
    let bufs = lens
        .iter()
        .map(|&n| {
            let mut b: Vec<u8> = (at..at + n).map(&fill).collect();
            b.extend_from_slice(&[0xEE; 8]);
            at += n;
            b
        })
        .collect();
    (bufs, at)
}

/// Checks buffers received for segments of `lens` against `want(offset)`, guards included.
fn check(
    bufs: &[Vec<u8>],
    lens: &[usize],
    want: impl Fn(usize) -> u8,
    what: &str,
) -> Result<(), String> {
    let mut at = 0;
    for (s, (b, &n)) in bufs.iter().zip(lens).enumerate() {
        if let Some((i, &got)) = b[..n].iter().enumerate().find(|&(i, &x)| x != want(at + i)) {
            return Err(format!(
                "{what}: segment {s} byte {i} (message byte {}) is {got} (want {})",
                at + i,
                want(at + i)
            ));
        }
        if b[n..].iter().any(|&g| g != 0xEE) {
            return Err(format!(
                "{what}: segment {s} of {n} bytes was written past its end"
            ));
        }
        at += n;
    }
    Ok(())
}

fn segs_of(bufs: &[Vec<u8>], lens: &[usize]) -> Vec<(*const u8, usize)> {
    bufs.iter()
        .zip(lens)
        .map(|(b, &n)| (b.as_ptr(), n))
        .collect()
}

fn segs_mut(bufs: &mut [Vec<u8>], lens: &[usize]) -> Vec<(*mut u8, usize)> {
    bufs.iter_mut()
        .zip(lens)
        .map(|(b, &n)| (b.as_mut_ptr(), n))
        .collect()
}

/// Runs the contract on this rank of `t`; `Err` names what differed.
pub fn run(t: &dyn Transport) -> Result<(), String> {
    run_with(t, true)
}

/// [`run`]; with `mismatch` false the pair stops before the longer message (libfabric's
/// `shm`, where a message its receiver refused retires the endpoint, by decision
/// (docs/OFI.md), and a peer that then closes its endpoint first crashes the provider; the
/// receive's length check is the one every `ofi` receive makes, tested on `tcp;ofi_rxm`).
pub fn run_with(t: &dyn Transport, mismatch: bool) -> Result<(), String> {
    let (r, p) = (t.rank(), t.size());
    let peer = r ^ 1;
    if peer >= p {
        return Ok(());
    }
    let deadline = || Instant::now() + Duration::from_secs(30);
    let mut k: u32 = 0;
    let mut next = || {
        k += 1;
        (k, faults::stamp(k, faults::P2P | faults::KIND_P2P))
    };
    for piece in [None, Some(64 << 10)] {
        for lens in LAYOUTS {
            for sender in [0usize, 1] {
                let sending = r % 2 == sender;
                let from = if sending { r } else { peer };
                // Vectored to vectored (the receiver cuts differently), vectored to
                // contiguous, contiguous to vectored.
                for form in 0..3 {
                    let (k, tag) = next();
                    let what = format!(
                        "rank {r} {} rank {peer}, form {form}, layout {lens:?}, piece {piece:?}",
                        if sending { "to" } else { "from" }
                    );
                    let total: usize = lens.iter().sum();
                    if sending {
                        let (bufs, _) = buffers(lens, |i| byte(from, k, i));
                        let flat: Vec<u8> = (0..total).map(|i| byte(from, k, i)).collect();
                        // SAFETY: the buffers outlive the op, waited for below.
                        let op = unsafe {
                            if form == 2 {
                                t.isend_pieces(peer, tag, flat.as_ptr(), total, piece)
                            } else {
                                t.isendv(peer, tag, &segs_of(&bufs, lens), piece)
                            }
                        }
                        .map_err(|e| format!("{what}: post: {e}"))?;
                        op.wait(deadline())
                            .map_err(|e| format!("{what}: wait: {e}"))?;
                    } else if form == 1 {
                        let mut dst = vec![0u8; total];
                        t.recv_into_pieces(peer, tag, &mut dst, piece, deadline())
                            .map_err(|e| format!("{what}: {e}"))?;
                        if let Some(i) = (0..total).find(|&i| dst[i] != byte(from, k, i)) {
                            return Err(format!("{what}: byte {i} differs"));
                        }
                    } else {
                        let cut = if form == 0 {
                            recut(total)
                        } else {
                            lens.to_vec()
                        };
                        let (mut bufs, _) = buffers(&cut, |_| 0);
                        let segs = segs_mut(&mut bufs, &cut);
                        // SAFETY: distinct live buffers, untouched during the call.
                        unsafe { t.recvv_into(peer, tag, &segs, piece, deadline()) }
                            .map_err(|e| format!("{what}: {e}"))?;
                        check(&bufs, &cut, |i| byte(from, k, i), &what)?;
                    }
                }
            }
        }
    }
    if !mismatch {
        return Ok(());
    }
    // A vectored message 5 bytes longer than the receive: the receiver fails, naming the
    // sender; the sender never hangs; the pair's next message is exact.
    let lens = [100_000usize, 0, 150_000];
    let (k, tag) = next();
    if r % 2 == 0 {
        let long = [100_000usize, 0, 150_005];
        let (bufs, _) = buffers(&long, |i| byte(r, k, i));
        // SAFETY: as above.
        let op = unsafe { t.isendv(peer, tag, &segs_of(&bufs, &long), None) }
            .map_err(|e| format!("rank {r}: post the longer message: {e}"))?;
        let w = op.wait(Instant::now() + Duration::from_secs(5));
        println!("@@ rank {r}: the longer vectored send ended: {w:?}");
    } else {
        let (mut bufs, _) = buffers(&lens, |_| 0);
        let segs = segs_mut(&mut bufs, &lens);
        // SAFETY: as above.
        match unsafe { t.recvv_into(peer, tag, &segs, None, deadline()) } {
            Ok(()) => {
                return Err(format!(
                    "rank {r}: a longer message was received as success"
                ))
            }
            Err(e) if e.message().contains(&format!("rank {peer}")) => {
                println!("@@ rank {r}: {e}")
            }
            Err(e) => {
                return Err(format!(
                    "rank {r}: the error does not name rank {peer}: {e}"
                ))
            }
        }
    }
    let (k, tag) = next();
    if r % 2 == 0 {
        let (bufs, _) = buffers(&lens, |i| byte(r, k, i));
        // SAFETY: as above.
        let op = unsafe { t.isendv(peer, tag, &segs_of(&bufs, &lens), None) }
            .map_err(|e| format!("rank {r}: post after the mismatch: {e}"))?;
        op.wait(deadline())
            .map_err(|e| format!("rank {r}: send after the mismatch: {e}"))?;
    } else {
        let (mut bufs, _) = buffers(&lens, |_| 0);
        let segs = segs_mut(&mut bufs, &lens);
        // SAFETY: as above.
        unsafe { t.recvv_into(peer, tag, &segs, None, deadline()) }
            .map_err(|e| format!("rank {r}: receive after the mismatch: {e}"))?;
        check(&bufs, &lens, |i| byte(peer, k, i), "after the mismatch")?;
    }
    Ok(())
}
