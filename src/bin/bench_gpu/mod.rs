//! `pccl-bench -d cuda|rocm|gpu`: device buffers of one rank, generic over the [`Device`]
//! back end, and the vendor library's own collective (NCCL's or RCCL's) timed on the same
//! buffers beside PCCL's.

use super::{count_wrong, finish_row, input_of, iters_for, lens, Args, Coll, Measured, Row};
use pccl::device::api::{DevSpan, Device};
use pccl::device::nccl_abi::{NcclComm, NcclUniqueId};
use pccl::{Communicator, Element, Error, RawCollective, ReduceOp, Result};
use std::time::Instant;

/// What `pccl-bench` needs of a device back end beyond [`Device`].
pub trait BenchDevice: Device {
    /// The `-d` name: "cuda" or "rocm".
    const FLAG: &'static str;
    /// Devices visible to this process.
    fn count() -> Result<usize>;
    /// Opens device `ordinal`.
    fn open(ordinal: usize) -> Result<Self>;
    /// The device's name, for the header.
    fn label(&self) -> String;
    /// PCCL's blocking device collective on this back end's front end.
    ///
    /// # Safety
    /// As [`Communicator::collective_on`].
    unsafe fn collective<T: Element>(
        comm: &Communicator,
        dev: &Self,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()>;
}

#[cfg(feature = "cuda")]
impl BenchDevice for pccl::device::cuda::CudaDevice {
    const FLAG: &'static str = "cuda";
    fn count() -> Result<usize> {
        pccl::device::cuda::CudaDevice::count()
    }
    fn open(ordinal: usize) -> Result<Self> {
        pccl::device::cuda::CudaDevice::open(ordinal)
    }
    fn label(&self) -> String {
        self.name().to_string()
    }
    unsafe fn collective<T: Element>(
        comm: &Communicator,
        dev: &Self,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        comm.raw_collective_device::<T>(dev, coll, send, recv, count)
    }
}

#[cfg(feature = "rocm")]
impl BenchDevice for pccl::device::hip::HipDevice {
    const FLAG: &'static str = "rocm";
    fn count() -> Result<usize> {
        pccl::device::hip::HipDevice::count()
    }
    fn open(ordinal: usize) -> Result<Self> {
        pccl::device::hip::HipDevice::open(ordinal)
    }
    fn label(&self) -> String {
        format!("{} {}", self.name(), self.arch())
    }
    unsafe fn collective<T: Element>(
        comm: &Communicator,
        dev: &Self,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        comm.collective_on::<T, Self>(dev, coll, send, recv, count)
    }
}

/// One rank's GPU, its two buffers (allocated once at the largest size), and the vendor
/// library's communicator of all ranks when every rank has a GPU of its own.
pub struct Gpu<D: BenchDevice> {
    pub dev: D,
    pub ordinal: usize,
    pub devices: usize,
    input: D::Memory,
    output: D::Memory,
    vendor: Option<NcclComm>,
    /// Why the vendor column is missing, if it is.
    pub vendor_note: Option<String>,
}

/// The rank's index among the ranks of its machine: every thread-rank is in this process;
/// MPI ranks from the launcher's environment (MPICH/Hydra, Open MPI, MVAPICH, Slurm), else
/// their place in the communicator's node.
fn local_rank(comm: &Communicator, mpi: bool) -> usize {
    if !mpi {
        return comm.rank();
    }
    [
        "MPI_LOCALRANKID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or_else(|| comm.topology().position(comm.rank()).1)
}

/// Fails on every rank when `mine` failed on one (so no rank waits for one that gave up).
fn agree<X>(comm: &Communicator, mine: Result<X>, what: &str) -> Result<X> {
    let mut failed = [0u32];
    comm.all_reduce(&[u32::from(mine.is_err())], &mut failed, ReduceOp::Max)?;
    match mine {
        Err(e) => Err(Error::new(
            e.kind(),
            format!("rank {}: {}", comm.rank(), e.message()),
        )),
        Ok(_) if failed[0] != 0 => Err(Error::system(format!("another rank could not {what}"))),
        Ok(x) => Ok(x),
    }
}

impl<D: BenchDevice> Gpu<D> {
    fn open(comm: &Communicator, mpi: bool, bytes: usize) -> Result<Gpu<D>> {
        let flag = D::FLAG;
        let devices =
            D::count().map_err(|e| Error::system(format!("no {flag} device: {}", e.message())))?;
        if devices == 0 {
            return Err(Error::system(format!(
                "no {flag} device: the runtime reports none"
            )));
        }
        let ordinal = local_rank(comm, mpi) % devices;
        let dev = D::open(ordinal)
            .map_err(|e| Error::new(e.kind(), format!("opening {flag} device {ordinal}: {e}")))?;
        let input = dev.alloc_zeroed(bytes)?;
        let output = dev.alloc_zeroed(bytes)?;
        Ok(Gpu {
            dev,
            ordinal,
            devices,
            input,
            output,
            vendor: None,
            vendor_note: None,
        })
    }

    /// Opens the rank's GPU and buffers of `bytes` each on every rank, and the vendor
    /// library's communicator of all ranks where it can run (`vendor`).
    pub fn open_all(comm: &Communicator, mpi: bool, bytes: usize, vendor: bool) -> Result<Gpu<D>> {
        let mut g = agree(comm, Gpu::<D>::open(comm, mpi, bytes), "open its device")?;
        if vendor {
            match g.open_vendor(comm)? {
                Ok(c) => g.vendor = Some(c),
                Err(why) => g.vendor_note = Some(why),
            }
        }
        Ok(g)
    }

    /// The vendor library's communicator of all ranks (rank order), or why there is none.
    /// Collective over `comm`.
    fn open_vendor(&self, comm: &Communicator) -> Result<std::result::Result<NcclComm, String>> {
        let p = comm.size();
        let api = D::collectives();
        let uuid = self.dev.uuid();
        let u = uuid.as_ref().map(|u| *u).unwrap_or([0; 16]);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mine = [
            word(&u[..8]),
            word(&u[8..]),
            u64::from(api.is_ok() && uuid.is_ok()),
        ];
        let mut all = vec![0u64; 3 * p];
        comm.all_gather(&mine, &mut all)?;
        let lib = api
            .as_ref()
            .map(|a| a.name())
            .unwrap_or("the vendor library");
        if let Some(r) = (0..p).find(|&r| all[3 * r + 2] == 0) {
            let why = match (&api, &uuid) {
                (Err(e), _) | (_, Err(e)) if r == comm.rank() => e.message().to_string(),
                _ => format!("rank {r} cannot load it or read its GPU's UUID"),
            };
            return Ok(Err(format!("no {lib} column: {why}")));
        }
        let key = |r: usize| &all[3 * r..3 * r + 2];
        if let Some((o, r)) =
            (0..p).find_map(|r| (0..r).find(|&o| key(o) == key(r)).map(|o| (o, r)))
        {
            return Ok(Err(format!(
                "no {lib} column: ranks {o} and {r} share one GPU ({lib} needs a GPU per rank)"
            )));
        }
        let api = api?;
        // Rank 0 makes the id; byte 128 says whether it could.
        let mut msg = [0u8; 129];
        if comm.rank() == 0 {
            if let Ok(id) = api.unique_id() {
                msg[..128].copy_from_slice(&id.to_bytes());
                msg[128] = 1;
            }
        }
        comm.broadcast(&mut msg, 0)?;
        if msg[128] != 1 {
            return Ok(Err(format!(
                "no {lib} column: rank 0 could not make a unique id"
            )));
        }
        let mut id = [0u8; 128];
        id.copy_from_slice(&msg[..128]);
        self.dev.bind()?;
        let c = NcclComm::init_with(api, &NcclUniqueId::from_bytes(&id), p, comm.rank());
        let c = agree(comm, c, &format!("join the {lib} communicator"))?;
        Ok(Ok(c))
    }

    /// The vendor library's name when its column is timed.
    pub fn vendor_name(&self) -> Option<&'static str> {
        self.vendor
            .as_ref()
            .and(D::collectives().ok().map(|a| a.name()))
    }
}

/// Host bytes into the front of `dst`.
fn upload<D: Device>(dev: &D, dst: DevSpan, bytes: &[u8]) -> Result<()> {
    let dst = dst.sub(0, bytes.len())?;
    // SAFETY: `bytes` holds `dst.len()` bytes and outlives the copy, which is waited for.
    unsafe { dev.copy_htod(dst, bytes.as_ptr())? };
    dev.synchronize()
}

/// The elements of `src`.
fn download<T: Element, D: Device>(dev: &D, src: DevSpan) -> Result<Vec<T>> {
    let mut out = vec![T::zeroed(); src.len() / std::mem::size_of::<T>()];
    // SAFETY: `out` holds `src.len()` writable bytes until the copy has been waited for.
    unsafe { dev.copy_dtoh(None, out.as_mut_ptr() as *mut u8, src)? };
    dev.synchronize()?;
    Ok(out)
}

/// One size of `coll` on device buffers: the pattern uploaded, warm-up runs, the timed runs
/// (each blocking until its device work is done, timed on the host), and with `--check` one
/// more run into a poisoned (0xFF) output, downloaded and compared with the host reference.
/// Then the same for the vendor library's collective when its column is on.
pub fn run_size<T: Element, D: BenchDevice>(
    comm: &Communicator,
    g: &mut Gpu<D>,
    coll: Coll,
    op: ReduceOp,
    bytes: usize,
    args: &Args,
) -> Result<Row> {
    let (r, p) = (comm.rank(), comm.size());
    let es = std::mem::size_of::<T>();
    let count = (bytes / es).max(1);
    let (in_len, out_len) = lens(coll, count, p);
    let dev = &g.dev;
    let input = dev.span_of(&g.input).sub(0, in_len * es)?;
    let output = dev.span_of(&g.output).sub(0, out_len * es)?;
    upload(dev, input, bytemuck::cast_slice(&input_of::<T>(r, in_len)))?;
    let raw = match coll {
        Coll::AllGather => RawCollective::AllGather,
        Coll::ReduceScatter => RawCollective::ReduceScatter(op),
        Coll::AllReduce => RawCollective::AllReduce(op),
    };
    // SAFETY: both spans hold the counts the collective implies and live as long as `g`.
    let pccl_once =
        || unsafe { D::collective::<T>(comm, dev, raw, input.addr(), output.addr(), count) };
    let total_bytes = out_len.max(in_len) * es;
    let iters = iters_for(args, total_bytes);
    let time = |once: &dyn Fn() -> Result<()>| -> Result<f64> {
        for _ in 0..args.warmup {
            once()?;
        }
        comm.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            once()?;
        }
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() / iters as f64)
    };
    let check = |once: &dyn Fn() -> Result<()>| -> Result<u64> {
        if !args.check {
            return Ok(0);
        }
        upload(dev, output, &vec![0xFF; output.len()])?;
        once()?;
        Ok(count_wrong(
            coll,
            op,
            p,
            r,
            count,
            &download::<T, D>(dev, output)?,
        ))
    };
    let mine = time(&pccl_once)?;
    let mut wrong = check(&pccl_once)?;
    let vendor_mine = match &g.vendor {
        Some(c) => {
            let stream = dev.raw_stream();
            // SAFETY: as above; the vendor call is queued on the device's stream and
            // waited for before the buffers are touched again.
            let vendor_once = || unsafe {
                match raw {
                    RawCollective::AllGather => {
                        c.all_gather(input.addr(), output.addr(), count, T::DTYPE, stream)
                    }
                    RawCollective::ReduceScatter(op) => {
                        c.reduce_scatter(input.addr(), output.addr(), count, T::DTYPE, op, stream)
                    }
                    RawCollective::AllReduce(op) => {
                        c.all_reduce(input.addr(), output.addr(), count, T::DTYPE, op, stream)
                    }
                    RawCollective::Broadcast(_) => Ok(()),
                }?;
                dev.synchronize()?;
                // A failure of a peer's call shows only here (the calls are queued).
                c.async_error()
            };
            let t = time(&vendor_once)?;
            wrong += check(&vendor_once)?;
            Some(t)
        }
        None => None,
    };
    let mut row = finish_row(
        comm,
        coll,
        op,
        Measured {
            count,
            es,
            total_bytes,
            iters,
            mine,
            mpi_mine: None,
            wrong,
        },
    )?;
    // What ran: the vendor level (and the inter-node algorithm) when it did, not the host
    // plan's algorithm.
    if let Some(name) = comm.device_level_name::<T, D>(raw, count) {
        row.algo = name;
    }
    if let Some(v) = vendor_mine {
        let mut sum = [0f64];
        comm.all_reduce(&[v / p as f64], &mut sum, ReduceOp::Sum)?;
        row.vendor_us = Some(sum[0] * 1e6);
    }
    Ok(row)
}
