//! Two ranks as threads exchange one message over the libfabric transport (feature `ofi`).
use pccl::transport::ofi::OfiTransport;
use pccl::transport::tcp::UniqueId;
use pccl::transport::Transport;
use std::time::{Duration, Instant};

fn main() {
    let id = UniqueId::new(Duration::from_secs(10)).unwrap();
    let len: usize = std::env::args().nth(1).map_or(1000, |s| s.parse().unwrap());
    std::thread::scope(|s| {
        for r in 0..2 {
            let id = id.clone();
            s.spawn(move || {
                let t = OfiTransport::connect(&id, 2, r, 1 << 20, Duration::from_secs(10)).unwrap();
                let buf = vec![r as u8 + 1; len];
                let mut got = vec![0u8; len];
                let dl = Instant::now() + Duration::from_secs(5);
                // SAFETY: buf outlives the wait.
                let op = unsafe { t.isend(1 - r, 7 << 32, buf.as_ptr(), len) }.unwrap();
                let rr = t.recv_into(1 - r, 7 << 32, &mut got, dl);
                let ws = op.wait(dl);
                println!(
                    "rank {r}: recv {rr:?} send {ws:?} ok={}",
                    got.iter().all(|&x| x == 2 - r as u8)
                );
            });
        }
    });
}
