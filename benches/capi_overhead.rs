//! Per-call overhead of the C ABI against the Rust API: an 8-byte all-reduce on 2 thread-ranks,
//! both APIs in the same run, interleaved in rounds so drift hits both alike. Prints the median
//! per-call time of each and their ratio (the target is C/Rust <= 1.05).
//!
//! cargo bench --bench capi_overhead

use pccl::capi::{
    pcclAllReduce, pcclCommDestroy, pcclCommInitThreads, pcclComm_t, pcclFloat32, pcclSuccess,
    pcclSum, pcclThreadWorldCreate, pcclThreadWorldDestroy, pcclThreadWorld_t,
};
use pccl::config::Config;
use pccl::{Communicator, ReduceOp};
use std::time::Instant;

const ROUNDS: usize = 15;
const CALLS: usize = 2000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut world: pcclThreadWorld_t = std::ptr::null_mut();
    // SAFETY: `world` is a valid place for the handle.
    assert_eq!(unsafe { pcclThreadWorldCreate(2, &mut world) }, pcclSuccess);
    let w = world as usize;
    let res = Communicator::run_threads(2, Config::default(), move |comm| {
        let mut c: pcclComm_t = std::ptr::null_mut();
        // SAFETY: `c` is a valid place for the handle; the world is alive.
        assert_eq!(
            unsafe { pcclCommInitThreads(&mut c, w as pcclThreadWorld_t, comm.rank() as i32) },
            pcclSuccess
        );
        let send = [1.0f32, 2.0];
        let mut recv = [0.0f32; 2];
        let (mut rust, mut capi) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS + 1 {
            comm.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..CALLS {
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            }
            let r = t.elapsed().as_secs_f64() / CALLS as f64;
            comm.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..CALLS {
                // SAFETY: 2-element buffers for a count of 2; `c` is a live communicator.
                let rc = unsafe {
                    pcclAllReduce(
                        send.as_ptr().cast(),
                        recv.as_mut_ptr().cast(),
                        2,
                        pcclFloat32,
                        pcclSum,
                        c,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, pcclSuccess);
            }
            let k = t.elapsed().as_secs_f64() / CALLS as f64;
            if round > 0 {
                rust.push(r);
                capi.push(k);
            }
        }
        assert_eq!(pcclCommDestroy(c), pcclSuccess);
        (median(&mut rust), median(&mut capi))
    })
    .unwrap();
    assert_eq!(pcclThreadWorldDestroy(world), pcclSuccess);
    let (r, c) = res[0];
    println!("8-byte f32 all-reduce, 2 thread-ranks, median of {ROUNDS} rounds x {CALLS} calls");
    println!("rust API   {:>8.2} us/call", r * 1e6);
    println!("C ABI      {:>8.2} us/call", c * 1e6);
    println!("C / Rust   {:>8.3}", c / r);
}
