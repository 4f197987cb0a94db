//! Vectored messages (`Transport::isendv` / `recvv_into`) on thread ranks, TCP ranks (over
//! sockets and over same-host rings) and MPI processes: the body in `tests/shared/vectored.rs`.

#[path = "shared/vectored.rs"]
mod vectored;

use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::transport::Transport;
use pccl::ThreadWorld;
use std::sync::Arc;
use std::time::Duration;

/// Runs the body on every rank of `ranks` (one thread each) and fails with every rank's error.
fn on_all(ranks: Vec<Arc<dyn Transport>>, label: &str) {
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|t| s.spawn(move || vectored::run(t.as_ref())))
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("rank thread").err())
            .collect()
    });
    assert!(errs.is_empty(), "{label}:\n{}", errs.join("\n"));
}

#[test]
fn vectored_messages_keep_the_packed_wire_contract_on_thread_ranks() {
    for p in [2, 3, 4] {
        let w = ThreadWorld::new(p);
        let ranks = (0..p).map(|r| w.transport(r).unwrap()).collect();
        on_all(ranks, &format!("threads, {p} ranks"));
    }
}

#[test]
fn vectored_messages_keep_the_packed_wire_contract_on_tcp_ranks() {
    for shm in [false, true] {
        let p = 2;
        let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
        let ranks: Vec<Arc<dyn Transport>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..p)
                .map(|r| {
                    let id = id.clone();
                    s.spawn(move || {
                        Arc::new(
                            TcpTransport::connect_with(
                                &id,
                                p,
                                r,
                                256 << 10,
                                Duration::from_secs(30),
                                shm,
                            )
                            .expect("connect"),
                        ) as Arc<dyn Transport>
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        on_all(ranks, &format!("tcp (shm rings {shm})"));
    }
}

#[cfg(feature = "mpi")]
#[test]
fn vectored_messages_keep_the_packed_wire_contract_on_mpi_processes() {
    let exe = std::env::current_exe().expect("test path");
    let prog = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .join("examples")
        .join("vectored_check");
    assert!(prog.exists(), "{} is built by cargo test", prog.display());
    for k in [2, 3] {
        let out = std::process::Command::new("mpiexec")
            .arg("-n")
            .arg(k.to_string())
            .arg(&prog)
            .env("PCCL_TIMEOUT", "60")
            .output()
            .expect("mpiexec runs (install mpich)");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "mpiexec -n {k} vectored_check:\n{text}"
        );
        for r in 0..k {
            assert!(
                text.contains(&format!("vectored_check: rank {r} ok")),
                "rank {r}:\n{text}"
            );
        }
    }
}
