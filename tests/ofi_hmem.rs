//! Device buffers handed to libfabric (`FI_HMEM`, feature `ofi`): the registration by iface,
//! the direct device send/receive and the agreement of every rank, on this host's providers.
//!
//! No GPU here, so the device path runs with the system iface (`FI_HMEM_SYSTEM`: host memory
//! registered and moved through libfabric's hmem path, which `shm` offers): every byte of it is
//! the code a CUDA buffer takes, except the iface named in the registration. The CUDA iface
//! itself is probed here only to check that a libfabric built without it turns the path off
//! (or fails init with `PCCL_OFI_HMEM=1`), never fails a collective. Each test runs in a child
//! process with `FI_PROVIDER` set (libfabric reads it once per process); ranks are threads.
#![cfg(feature = "ofi")]

mod common;

use common::exact_on;
use pccl::transport::ofi::{Hmem, HmemIface, HmemMode, OfiTransport};
use pccl::transport::tcp::UniqueId;
use pccl::transport::{faults, Transport};
use pccl::{Communicator, ErrorKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "PCCL_OFI_HMEM_TEST_CHILD";
const CHUNK: usize = 256 * 1024;

/// In the parent: runs test `name` in a child with `FI_PROVIDER=prov` (and `envs`), printing
/// its `@@` lines, and fails if it fails. In the child: true (run the body).
fn in_child(name: &str, prov: &str, envs: &[(&str, &str)]) -> bool {
    if std::env::var(CHILD).is_ok() {
        return true;
    }
    let mut all = vec![(CHILD, prov), ("FI_PROVIDER", prov)];
    all.extend_from_slice(envs);
    common::run_test_in_child(name, prov, &all);
    false
}

/// Whether the child's provider exists and offers `FI_HMEM`; prints why not.
fn hmem_provider() -> bool {
    let prov = std::env::var("FI_PROVIDER").unwrap_or_default();
    if pccl::transport::ofi::providers().is_empty() {
        println!("@@ SKIPPED: libfabric offers no RDM tagged provider for FI_PROVIDER={prov}");
        return false;
    }
    true
}

/// Connects `p` thread ranks, rank `r` asking for `hmem(r)`, and runs `f` on each; returns
/// what each rank's connect or body gave.
fn on_ranks<R: Send>(
    p: usize,
    hmem: impl Fn(usize) -> Hmem + Sync,
    f: impl Fn(usize, Arc<OfiTransport>) -> R + Sync,
) -> Vec<pccl::Result<R>> {
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let (id, f, hmem) = (id.clone(), &f, &hmem);
                s.spawn(move || {
                    let t = OfiTransport::connect_with_hmem(
                        &id,
                        p,
                        r,
                        CHUNK,
                        Duration::from_secs(20),
                        hmem(r),
                    )?;
                    Ok(f(r, Arc::new(t)))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn system(mode: HmemMode) -> Hmem {
    Hmem {
        mode,
        iface: HmemIface::System,
    }
}

/// The bytes rank `r` sends in exchange `k`.
fn pattern(r: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (r * 7 + k * 13)) as u8)
        .collect()
}

/// Rank `r` sends `len` bytes to `r + 1` and receives `len` from `r - 1`, both through the
/// device calls, and panics on the first byte that differs from what `r - 1` sent (or one
/// written past the receive's end).
fn device_ring(t: &OfiTransport, r: usize, p: usize, k: usize, len: usize) -> pccl::Result<()> {
    let (to, from) = ((r + 1) % p, (r + p - 1) % p);
    let mine = pattern(r, k, len);
    // A sentinel past the end shows a receive that writes beyond its length.
    let mut got = vec![0xA5u8; len + 64];
    let tag = faults::stamp(k as u32 + 1, faults::P2P | faults::KIND_P2P);
    let deadline = Instant::now() + Duration::from_secs(20);
    // SAFETY: `mine` outlives the op (waited for below); with the system iface the "device"
    // address is host memory that only libfabric touches until the calls return.
    let op = unsafe { t.isend_device(to, tag, mine.as_ptr() as u64, len)? };
    // SAFETY: as above: `got` has `len` writable bytes nothing else touches during the call.
    let r1 = unsafe { t.recv_device(from, tag, got.as_mut_ptr() as u64, len, deadline) };
    let r2 = op.wait(deadline);
    r1?;
    r2?;
    let want = pattern(from, k, len);
    if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
        panic!(
            "rank {r}: exchange {k} of {len} bytes from rank {from}: byte {i} is {} (want {})",
            got[i], want[i]
        );
    }
    assert!(
        got[len..].iter().all(|&b| b == 0xA5),
        "rank {r}: a {len}-byte device receive wrote past its end"
    );
    Ok(())
}

#[test]
fn device_buffers_over_fi_hmem_system_arrive_exact_at_every_size() {
    let name = "device_buffers_over_fi_hmem_system_arrive_exact_at_every_size";
    if !in_child(name, "shm", &[]) || !hmem_provider() {
        return;
    }
    let p = 3;
    let res = on_ranks(
        p,
        |_| system(HmemMode::On),
        |r, t| {
            assert!(t.moves_device_memory(), "rank {r}: FI_HMEM is on");
            assert_eq!(t.hmem_iface(), Some(HmemIface::System));
            let piece = t.piece_bytes();
            let sizes = [
                0,
                1,
                1000,
                piece - 1,
                piece,
                piece + 1,
                3 * piece + 17,
                (2 << 20) + 3,
            ];
            for (k, &len) in sizes.iter().enumerate() {
                device_ring(&t, r, p, k, len).unwrap_or_else(|e| panic!("rank {r}, {len}: {e}"));
            }
            // The same buffers again: registrations are cached, the bytes still exact.
            for (k, &len) in sizes.iter().enumerate() {
                device_ring(&t, r, p, k + sizes.len(), len)
                    .unwrap_or_else(|e| panic!("rank {r}, again {len}: {e}"));
            }
            // Host collectives on the same transport are unaffected.
            let comm = Communicator::new(t).expect("communicator");
            exact_on(&comm, &[1, 70_001]).unwrap_or_else(|e| panic!("rank {r}: {e}"));
            println!(
                "@@ rank {r}: {} sizes exact twice, up to 2 MiB",
                sizes.len()
            );
        },
    );
    for (r, x) in res.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r}: connect: {e}"));
    }
}

#[test]
fn one_rank_refusing_fi_hmem_turns_it_off_on_every_rank() {
    let name = "one_rank_refusing_fi_hmem_turns_it_off_on_every_rank";
    if !in_child(name, "shm", &[]) || !hmem_provider() {
        return;
    }
    let p = 3;
    let res = on_ranks(
        p,
        |r| {
            system(if r == 1 {
                HmemMode::Off
            } else {
                HmemMode::Auto
            })
        },
        |r, t| {
            assert!(!t.moves_device_memory(), "rank {r}: rank 1 refused FI_HMEM");
            assert_eq!(t.hmem_iface(), None, "rank {r}");
            let buf = [0u8; 16];
            // SAFETY: refused before anything is posted (the transport does not move device
            // memory); `buf` is valid regardless.
            let e = unsafe { t.isend_device((r + 1) % p, 1, buf.as_ptr() as u64, 16) }
                .err()
                .expect("device send refused");
            assert_eq!(e.kind(), ErrorKind::InvalidUsage, "rank {r}: {e}");
            assert!(e.message().contains("staging"), "rank {r}: {e}");
            // Host traffic is unaffected.
            let comm = Communicator::new(t).expect("communicator");
            exact_on(&comm, &[1, 70_001]).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        },
    );
    for (r, x) in res.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r}: connect: {e}"));
    }
}

/// Debian's libfabric has no CUDA iface: `auto` stages (no error), `1` fails init on every
/// rank with a message naming the variable, and a rank that fails init alone does not leave
/// the others waiting out their timeout.
#[test]
fn an_iface_libfabric_lacks_stages_on_auto_and_fails_init_on_1() {
    let name = "an_iface_libfabric_lacks_stages_on_auto_and_fails_init_on_1";
    if !in_child(name, "shm", &[]) || !hmem_provider() {
        return;
    }
    let cuda = |mode| Hmem {
        mode,
        iface: HmemIface::Cuda,
    };
    let p = 2;
    // Probe once: if this libfabric does register CUDA memory (a GPU build), say so and stop.
    let auto = on_ranks(p, |_| cuda(HmemMode::Auto), |_, t| t.hmem_iface());
    let auto: Vec<_> = auto
        .into_iter()
        .map(|x| x.expect("auto connects"))
        .collect();
    if auto.iter().all(|x| x.is_some()) {
        println!("@@ SKIPPED: this libfabric registers FI_HMEM_CUDA memory (a GPU build)");
        return;
    }
    assert!(auto.iter().all(|x| x.is_none()), "ranks disagree: {auto:?}");

    let res = on_ranks(p, |_| cuda(HmemMode::On), |_, _| ());
    for (r, x) in res.into_iter().enumerate() {
        let e = x
            .err()
            .unwrap_or_else(|| panic!("rank {r}: init succeeded"));
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(
            e.message().contains("PCCL_OFI_HMEM=1") && e.message().contains("FI_HMEM_CUDA"),
            "rank {r}: {e}"
        );
    }

    // Only rank 0 insists: it fails at once, rank 1 ends in an error, well before its 20 s.
    let t0 = Instant::now();
    let res = on_ranks(
        p,
        |r| cuda(if r == 0 { HmemMode::On } else { HmemMode::Auto }),
        |_, _| (),
    );
    let took = t0.elapsed();
    for (r, x) in res.into_iter().enumerate() {
        let e = x
            .err()
            .unwrap_or_else(|| panic!("rank {r}: init succeeded"));
        println!("@@ rank {r}: {e}");
    }
    println!(
        "@@ one rank failing init: both ended after {} ms",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_device_message_longer_than_its_receive_is_an_error_not_a_hang() {
    let name = "a_device_message_longer_than_its_receive_is_an_error_not_a_hang";
    if !in_child(name, "shm", &[]) || !hmem_provider() {
        return;
    }
    let p = 2;
    // Both ranks keep their endpoints until the send has ended: libfabric 1.17's shm crashes
    // a process whose send is in flight to an endpoint of the same process that closes
    // (ranks as threads only; docs/OFI.md).
    let both = std::sync::Barrier::new(p);
    let res = on_ranks(
        p,
        |_| system(HmemMode::On),
        |r, t| {
            let piece = t.piece_bytes();
            let (sent, want) = (3 * piece + 100, 3 * piece + 50);
            let tag = faults::stamp(1, faults::P2P | faults::KIND_P2P);
            let t0 = Instant::now();
            if r == 0 {
                let buf = pattern(0, 0, sent);
                // SAFETY: `buf` outlives the op (waited for, or dropped, before it goes).
                let op = unsafe { t.isend_device(1, tag, buf.as_ptr() as u64, sent) }?;
                // Nobody takes the rest of it: the send ends at its deadline (in a collective
                // the receiver's refusal ends it sooner), never in success.
                let w = op.wait(Instant::now() + Duration::from_secs(3));
                println!(
                    "@@ rank 0: the longer send ended in {:?}: {w:?}",
                    t0.elapsed()
                );
                both.wait();
                assert!(w.is_err(), "a send its receiver refused succeeded");
                Ok(())
            } else {
                let mut got = vec![0u8; want];
                let deadline = Instant::now() + Duration::from_secs(20);
                // SAFETY: `got` has `want` writable bytes nothing else touches.
                let e = unsafe { t.recv_device(0, tag, got.as_mut_ptr() as u64, want, deadline) };
                let e = e.expect_err("a truncated device receive fails");
                println!("@@ rank 1: {e} after {:?}", t0.elapsed());
                assert!(
                    e.message().contains("rank 0") && e.message().contains("rank 1"),
                    "the error names both ranks: {e}"
                );
                assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
                both.wait();
                Ok(())
            }
        },
    );
    for (r, x) in res.into_iter().enumerate() {
        let body: pccl::Result<()> = x.unwrap_or_else(|e| panic!("rank {r}: connect: {e}"));
        body.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

#[test]
fn a_bad_pccl_ofi_hmem_is_an_error_naming_it() {
    let name = "a_bad_pccl_ofi_hmem_is_an_error_naming_it";
    if !in_child(name, "shm", &[("PCCL_OFI_HMEM", "yes")]) {
        return;
    }
    let e = Hmem::from_env().expect_err("PCCL_OFI_HMEM=yes is refused");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("PCCL_OFI_HMEM=yes"), "{e}");
    std::env::set_var("PCCL_OFI_HMEM", "auto");
    std::env::set_var("PCCL_OFI_HMEM_IFACE", "gpu");
    let e = Hmem::from_env().expect_err("PCCL_OFI_HMEM_IFACE=gpu is refused");
    assert!(e.message().contains("PCCL_OFI_HMEM_IFACE=gpu"), "{e}");
}
