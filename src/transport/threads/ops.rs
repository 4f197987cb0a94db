//! The thread transport's operations: a posted send and its wait, the receives that copy or
//! reduce straight out of the sender's memory, and [`Transport`] for [`ThreadTransport`].

use super::*;

struct ThreadSend {
    state: Arc<SendState>,
    ch: Arc<Channel>,
    rank: usize,
    peer: usize,
    tag: Tag,
    faults: Arc<Faults>,
}

impl SendOp for ThreadSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        for _ in 0..SPINS {
            if *lock(&self.state.state) == DONE {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let mut s = lock(&self.state.state);
        loop {
            match *s {
                DONE => return Ok(()),
                REVOKED => return Err(Error::internal("send revoked twice")),
                DROPPED => {
                    // The board usually says why (the collective failed there).
                    self.faults.check(self.tag, self.peer)?;
                    return Err(Error::remote(format!(
                        "rank {} dropped this rank's message of collective #{}: that \
                         collective had failed there",
                        self.peer,
                        faults::seq_of(self.tag)
                    )));
                }
                _ => {}
            }
            // A posted send is revoked when its collective failed or its deadline passed; a
            // claimed one (the receiver is copying right now) finishes by itself.
            if *s == POSTED {
                let fault = self.faults.check(self.tag, self.peer).err().or_else(|| {
                    self.ch.dst_left.load(Ordering::Acquire).then(|| {
                        left_error(self.rank, self.peer, self.tag, "had a message for it of")
                    })
                });
                if fault.is_some() || Instant::now() >= deadline {
                    *s = REVOKED;
                    return Err(fault.unwrap_or_else(|| {
                        faults::timed_out(
                            self.rank,
                            self.peer,
                            "sent a message never taken by",
                            true,
                        )
                    }));
                }
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), faults::POLL);
            s = self
                .state
                .cv
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl ThreadTransport {
    /// Posts a descriptor of `len` bytes at address `ptr` (host or device memory) to `peer`.
    fn post(
        &self,
        peer: usize,
        tag: Tag,
        ptr: usize,
        len: usize,
        segs: Vec<(usize, usize)>,
        device: bool,
    ) -> Result<Box<dyn SendOp>> {
        let dst = *self
            .world
            .get(peer)
            .ok_or_else(|| Error::invalid(format!("no rank {peer}")))?;
        self.faults.check(tag, peer)?;
        if !self.hub.reachable(self.world[self.rank], dst) {
            return Ok(Box::new(Lost));
        }
        let ch = self.hub.channel(self.ctx, self.world[self.rank], dst);
        if ch.dst_left.load(Ordering::Acquire) {
            return Err(left_error(self.rank, peer, tag, "had a message for it of"));
        }
        let state = Arc::new(SendState::default());
        lock(&ch.queue).push_back(Envelope {
            tag,
            ptr,
            len,
            segs,
            device,
            state: state.clone(),
        });
        ch.cv.notify_all();
        Ok(Box::new(ThreadSend {
            state,
            ch,
            rank: self.rank,
            peer,
            tag,
            faults: self.faults.clone(),
        }))
    }

    /// Takes the next message of collective `tag` from `peer` and claims it (the sender may
    /// no longer revoke it); the caller must `set(DONE)` on it when done with the sender's
    /// memory. Messages of earlier collectives (that failed somewhere) are dropped; one of a
    /// later collective is left in place for the call it belongs to.
    fn take(&self, peer: usize, tag: Tag, deadline: Instant) -> Result<Envelope> {
        let src = *self
            .world
            .get(peer)
            .ok_or_else(|| Error::invalid(format!("no rank {peer}")))?;
        let ch = self.hub.channel(self.ctx, src, self.world[self.rank]);
        // A short polite spin first: a wake-up through the condition variable costs tens of
        // microseconds, while the peer's message is often only a few away.
        for _ in 0..SPINS {
            if !lock(&ch.queue).is_empty() {
                break;
            }
            std::thread::yield_now();
        }
        let mut q = lock(&ch.queue);
        loop {
            if !self.hub.reachable(src, self.world[self.rank]) {
                // A partition (fault injection): what the other side queued here before it
                // is lost as well, as if still in flight, so the injected partition takes the
                // whole collective whatever the ranks' timing (a rank isolated late could
                // otherwise finish on messages delivered before it was cut off). Their senders
                // see them delivered, as those of the messages lost on the way ([`Lost`]).
                while let Some(old) = q.pop_front() {
                    let mut st = lock(&old.state.state);
                    if *st == POSTED {
                        *st = DONE;
                        old.state.cv.notify_all();
                    }
                }
            }
            if faults::is_control(tag) {
                // The transport's own traffic (the survivors' agreement) passes whatever a
                // failed collective or a point-to-point send left queued; earlier control
                // messages of this pair are stale.
                while let Some(i) = q
                    .iter()
                    .position(|e| faults::is_control(e.tag) && faults::is_stale(e.tag, tag))
                {
                    if let Some(old) = q.remove(i) {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                }
                if let Some(i) = q.iter().position(|e| e.tag == tag) {
                    if let Some(env) = q.remove(i) {
                        let mut st = lock(&env.state.state);
                        if *st != REVOKED {
                            *st = CLAIMED;
                            drop(st);
                            return Ok(env);
                        }
                    }
                    continue;
                }
            } else if let Some(head) = q.front() {
                if faults::is_stale(head.tag, tag) {
                    if let Some(old) = q.pop_front() {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                    continue;
                }
                if head.tag != tag && *lock(&head.state.state) == REVOKED {
                    // A send its sender gave up (nobody received it in time, or its collective
                    // failed there): it holds no later message back.
                    q.pop_front();
                    continue;
                }
                let failed_here = self.faults.any();
                if head.tag != tag
                    && failed_here
                    && !faults::is_p2p(head.tag)
                    && self
                        .faults
                        .refused_seqs()
                        .contains(&faults::seq_of(head.tag))
                {
                    // A message of a collective some rank refused: nobody will take it.
                    if let Some(old) = q.pop_front() {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                    continue;
                }
                let settling = head.tag != tag
                    && failed_here
                    && faults::is_p2p(tag)
                    && !faults::is_p2p(head.tag);
                // `settling`: a point-to-point receive behind a message of a collective that
                // is failing; its sender revokes it (or a refusal names it) in a moment, so
                // wait for that below instead of calling it a mismatch.
                if !settling {
                    if head.tag != tag {
                        // The board usually explains it (the peer gave up this collective).
                        self.faults.check(tag, peer)?;
                        if faults::moved_on(head.tag, tag) {
                            // A later collective's message stays for the call it belongs to;
                            // the refusal that explains it may still be on its way.
                            let got = head.tag;
                            drop(q);
                            self.faults.explain(tag, got, peer, deadline)?;
                            return Err(faults::mismatch(self.rank, peer, tag, got));
                        }
                    }
                    let Some(env) = q.pop_front() else { continue };
                    let mut st = lock(&env.state.state);
                    if *st == REVOKED {
                        drop(st);
                        self.faults.check(tag, peer)?;
                        return Err(Error::remote(format!(
                            "rank {peer} gave up its send of collective #{} to rank {}",
                            faults::seq_of(tag),
                            self.rank
                        )));
                    }
                    *st = CLAIMED;
                    drop(st);
                    return Ok(env);
                }
            }
            self.faults.check(tag, peer)?;
            if ch.src_left.load(Ordering::Acquire) {
                return Err(left_error(
                    self.rank,
                    peer,
                    tag,
                    "expected a message from it of",
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(faults::timed_out(
                    self.rank,
                    peer,
                    "waited in vain for a message from",
                    true,
                ));
            }
            q = ch
                .cv
                .wait_timeout(q, (deadline - now).min(faults::POLL))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Why `env` is not the message a receive of `len` bytes (device memory or not) of
    /// collective `tag` expects, if it is not.
    fn mismatch(
        &self,
        env: &Envelope,
        peer: usize,
        tag: Tag,
        len: usize,
        device: bool,
    ) -> Option<Error> {
        let kind = |d: bool| if d { "device" } else { "host" };
        if env.tag != tag {
            Some(faults::mismatch(self.rank, peer, tag, env.tag))
        } else if env.len != len {
            Some(Error::remote(format!(
                "rank {} expected {len} bytes from rank {peer} but it sent {}: do all ranks pass the \
                 same count and dtype?",
                self.rank, env.len
            )))
        } else if env.device != device {
            Some(Error::remote(format!(
                "rank {} expected {} memory from rank {peer} but it sent {} memory: do all ranks \
                 use the same thread world (device mode) and PCCL_DEVICE_DIRECT setting?",
                self.rank,
                kind(device),
                kind(env.device)
            )))
        } else {
            None
        }
    }

    fn device_mode(&self) -> Result<()> {
        if self.device {
            Ok(())
        } else {
            Err(Error::usage(
                "this thread world does not move device memory: build it with \
                 ThreadWorld::with_device_direct(true) (feature `cuda`)",
            ))
        }
    }
}

/// Copies `len` bytes from device address `src` to device address `dst` and returns when the
/// copy has finished.
///
/// # Safety
/// Both must address `len` valid device bytes (unified addressing; a context current on this
/// thread) that nothing else touches during the call.
#[cfg(feature = "cuda")]
unsafe fn copy_device(dst: u64, src: u64, len: usize) -> Result<()> {
    use cudarc::driver::result;
    // cudarc panics when libcuda is missing: say so as an error first.
    crate::device::cuda::ensure_available()?;
    let err = |what: &str, e: result::DriverError| {
        Error::system(format!(
            "CUDA {what} failed in a device-to-device receive: {e} (is the device's context \
             current on this thread?)"
        ))
    };
    // SAFETY: as the caller guarantees.
    unsafe { result::memcpy_dtod_sync(dst, src, len) }.map_err(|e| err("copy", e))?;
    // cuMemcpyDtoD does not wait on the host for device-to-device copies: wait for the legacy
    // default stream it ran on before the sender may reuse its buffer (PCCL's own streams are
    // non-blocking, so this waits for nothing else).
    // SAFETY: synchronising the legacy default stream (the null handle) of the current context.
    unsafe { result::stream::synchronize(std::ptr::null_mut()) }
        .map_err(|e| err("stream synchronize", e))
}

/// Without feature `cuda` no thread world is in device mode, so this is never reached.
///
/// # Safety
/// None needed: it touches no memory.
#[cfg(not(feature = "cuda"))]
unsafe fn copy_device(_dst: u64, _src: u64, _len: usize) -> Result<()> {
    Err(Error::usage(
        "device-to-device receives need PCCL built with feature `cuda`",
    ))
}

impl Drop for ThreadTransport {
    /// A rank that destroys its communicator tells its peers at once: their waits on it fail
    /// naming it, as a TCP peer's goodbye does, instead of running into their deadlines.
    fn drop(&mut self) {
        if let Some(&w) = self.world.get(self.rank) {
            self.hub.set_left(self.ctx, &self.world, w, true);
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.world.len()
    }
    fn name(&self) -> &'static str {
        "threads"
    }
    fn node_key(&self) -> u64 {
        self.node
    }

    fn faults(&self) -> &Faults {
        &self.faults
    }

    fn notify(&self, notice: &Notice) {
        let boards: Vec<Arc<Faults>> = lock(&self.hub.groups)
            .get(&self.ctx)
            .map(|g| g.boards.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for b in boards.iter().filter(|b| !Arc::ptr_eq(b, &self.faults)) {
            match notice {
                Notice::Refused { seq, why } => {
                    b.refuse(*seq, self.rank, why);
                }
                Notice::Aborted { why } => b.revoked(self.rank, why),
            }
        }
        self.hub.wake(self.ctx);
    }

    fn kill_self(&self) {
        let w = self.world[self.rank];
        self.faults
            .abort("this thread-rank was killed by fault injection (PCCL_FAULT kill)");
        self.hub
            .bury(w, "its thread-rank was killed by fault injection");
    }

    fn drop_links(&self) -> Result<()> {
        let w = self.world[self.rank];
        for r in (0..self.world.len()).filter(|&r| r != self.rank) {
            self.faults.cut_off(
                r,
                "this rank's links were cut by fault injection (PCCL_FAULT drop)",
            );
        }
        self.hub
            .bury(w, "its links were cut by fault injection (PCCL_FAULT drop)");
        Ok(())
    }

    fn isolate(&self, side: u32, _members: &[usize]) -> Result<()> {
        lock(&self.hub.sides).insert(self.world[self.rank], side);
        self.hub.partitioned.store(true, Ordering::Release);
        Ok(())
    }

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.post(peer, tag, ptr as usize, len, Vec::new(), false)
    }

    /// Posts a descriptor of the segments: the receiver copies straight out of them (one copy
    /// per byte, no packing).
    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        _piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        let len = segs.iter().map(|s| s.1).sum();
        let v = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
        self.post(peer, tag, 0, len, v, false)
    }

    /// Copies straight from the sender's memory (contiguous or segments) into `segs`.
    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        _piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let (starts, len) = crate::transport::seg_starts(segs);
        self.recv(peer, tag, len, deadline, &mut |off, bytes| {
            crate::transport::scatter(segs, &starts, off, bytes)
        })
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let env = self.take(peer, tag, deadline)?;
        let mismatch = self.mismatch(&env, peer, tag, len, false);
        if mismatch.is_none() && len > 0 {
            // SAFETY: the sender keeps its `len` bytes of host memory (`device` is false,
            // checked above) valid and unmodified until its send op completes, which happens
            // only at the `set(DONE)` below (it cannot revoke once the state is CLAIMED).
            for (off, bytes) in unsafe { env.parts() } {
                sink(off, bytes);
            }
        }
        // A rejected message fails its sender too (not a silent success for it).
        env.state
            .set(if mismatch.is_some() { DROPPED } else { DONE });
        match mismatch {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn moves_device_memory(&self) -> bool {
        self.device
    }

    unsafe fn isend_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.device_mode()?;
        let addr = usize::try_from(ptr)
            .map_err(|_| Error::invalid(format!("device address {ptr:#x} does not fit")))?;
        self.post(peer, tag, addr, len, Vec::new(), true)
    }

    unsafe fn recv_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        self.device_mode()?;
        let env = self.take(peer, tag, deadline)?;
        let mut r = match self.mismatch(&env, peer, tag, len, true) {
            Some(e) => {
                env.state.set(DROPPED);
                return Err(e);
            }
            None => Ok(()),
        };
        if r.is_ok() && len > 0 {
            // SAFETY: the sender's `len` device bytes (`device` checked above) stay valid and
            // unmodified until the `set(DONE)` below, which comes after the copy finished;
            // the caller guarantees `ptr` addresses `len` writable device bytes.
            r = unsafe { copy_device(ptr, env.ptr as u64, len) };
        }
        env.state.set(DONE);
        r
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        let me = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::internal("subset does not contain this rank"))?;
        let world: Vec<usize> = members.iter().map(|&m| self.world[m]).collect();
        let ctx = fnv1a(&[self.ctx.to_le_bytes(), ctx.to_le_bytes()].concat());
        let world = Arc::new(world);
        Ok(Arc::new(ThreadTransport {
            faults: self.hub.board(ctx, &world, me),
            hub: self.hub.clone(),
            ctx,
            rank: me,
            world,
            node: self.node,
            device: self.device,
        }))
    }
}
