//! Notices and leftovers: the board's traffic on tag 0 (sent without blocking, taken by
//! every wait), and the janitor that drains the messages of failed collectives.

use super::*;

impl Core {
    // ---- notices --------------------------------------------------------------------------

    /// Sends `notice` to every peer without blocking (buffers kept until sent).
    pub fn notify(&self, notice: &Notice) {
        let mut bytes = Vec::new();
        match notice {
            Notice::Refused { seq, why } => {
                bytes.push(1u8);
                bytes.extend_from_slice(&seq.to_le_bytes());
                bytes.extend_from_slice(why.as_bytes());
                self.add_junk(*seq);
                self.note_failure(*seq, why);
            }
            Notice::Aborted { why } => {
                bytes.push(2u8);
                bytes.extend_from_slice(&0u32.to_le_bytes());
                self.finished.store(true, Ordering::SeqCst);
                bytes.extend_from_slice(why.as_bytes());
                self.note_failure(self.latest.load(Ordering::Relaxed), why);
            }
        }
        bytes.truncate(4096);
        self.reap_outbox();
        let mut out = lock(&self.outbox);
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            if out.len() >= OUTBOX_MAX {
                break;
            }
            let buf: Box<[u8]> = bytes.clone().into_boxed_slice();
            let mut req = Req(null_req());
            // SAFETY: `buf` is kept in the outbox until the request completes.
            let rc = call(|| unsafe {
                ffi::MPI_Isend(
                    buf.as_ptr() as *const _,
                    buf.len() as i32,
                    ffi::RSMPI_UINT8_T,
                    peer as i32,
                    NOTICE_TAG,
                    self.comm,
                    &mut req.0,
                )
            });
            if rc == 0 {
                out.push((req, buf));
            }
        }
    }

    pub(super) fn reap_outbox(&self) {
        let mut out = lock(&self.outbox);
        out.retain_mut(|(req, _)| !self.test(req));
    }

    /// Receives every notice that has arrived and records it on the board.
    pub(super) fn take_notices(&self) {
        for _ in 0..64 {
            let Some((src, _, bytes)) = self.take_any(NOTICE_TAG) else {
                return;
            };
            self.record(src, &bytes);
        }
    }

    /// Records the notice `bytes` from `src` on the board.
    pub(super) fn record(&self, src: usize, bytes: &[u8]) {
        if bytes.len() < 5 {
            return;
        }
        let seq = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let why = String::from_utf8_lossy(&bytes[5..]).into_owned();
        match bytes[0] {
            1 => {
                self.faults.refuse(seq, src, &why);
                self.add_junk(seq);
            }
            2 => {
                self.faults.revoked(src, &why);
                self.finished.store(true, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// Receives one message of `tag` from any source that no receive matched, if there is one.
    pub(super) fn take_any(&self, tag: i32) -> Option<(usize, i32, Vec<u8>)> {
        // SAFETY: reading an exported constant.
        let any = unsafe { ffi::RSMPI_ANY_SOURCE };
        self.take(any, tag)
    }

    /// Receives one unmatched message of `tag` from `src` (or any source), if there is one.
    pub(super) fn take(&self, src: i32, tag: i32) -> Option<(usize, i32, Vec<u8>)> {
        let (msg, status) = self.probe(src, tag)?;
        let (status, buf) = self.take_probed(msg, &status);
        Some((status.MPI_SOURCE.max(0) as usize, status.MPI_TAG, buf))
    }

    /// Matches (without receiving) one message of `tag` from `src` that no receive matched,
    /// if there is one: the message is then ours alone, its size known before it is received.
    pub(super) fn probe(&self, src: i32, tag: i32) -> Option<(Probed, ffi::MPI_Status)> {
        let mut flag = 0;
        let mut status = zero_status();
        // SAFETY: a message handle is written by MPI_Improbe before use.
        let mut msg: ffi::MPI_Message = unsafe { std::mem::zeroed() };
        // SAFETY: probing our own communicator; outputs are locals.
        let rc = call(|| unsafe {
            ffi::MPI_Improbe(src, tag, self.comm, &mut flag, &mut msg, &mut status)
        });
        (rc == 0 && flag != 0).then_some((Probed(msg), status))
    }

    /// Receives the probed message (of the size `status` gives) into a buffer of its own.
    pub(super) fn take_probed(
        &self,
        mut msg: Probed,
        status: &ffi::MPI_Status,
    ) -> (ffi::MPI_Status, Vec<u8>) {
        let n = count_of(status);
        let mut buf = vec![0u8; n];
        let mut st = zero_status();
        // SAFETY: `buf` holds the probed message's `n` bytes; `msg` is ours to receive.
        call(|| unsafe {
            ffi::MPI_Mrecv(
                buf.as_mut_ptr() as *mut _,
                n as i32,
                ffi::RSMPI_UINT8_T,
                &mut msg.0,
                &mut st,
            )
        });
        (st, buf)
    }

    /// Starts receiving the probed message into the `len` bytes at `ptr` (exactly its size).
    pub(super) fn imrecv(&self, mut msg: Probed, ptr: *mut u8, len: usize) -> Result<Req> {
        let mut req = Req(null_req());
        // SAFETY: the caller keeps `len` bytes at `ptr` valid until the request ends; `msg`
        // is a matched message of `len` bytes, ours to receive.
        let rc = call(|| unsafe {
            ffi::MPI_Imrecv(
                ptr as *mut _,
                len as i32,
                ffi::RSMPI_UINT8_T,
                &mut msg.0,
                &mut req.0,
            )
        });
        check(rc, "MPI_Imrecv")?;
        Ok(req)
    }

    // ---- leftovers ------------------------------------------------------------------------

    /// Collective `seq` failed: its leftover messages are drained from now on.
    pub(super) fn add_junk(&self, seq: u32) {
        let mut j = lock(&self.junk);
        if !j.contains(&seq) {
            if j.len() == JUNK_KEPT {
                j.pop_front();
            }
            j.push_back(seq);
        }
        self.any_junk.store(true, Ordering::SeqCst);
    }

    /// Drains every unmatched message of the failed collectives (too old ones are forgotten,
    /// before their tags come round again).
    pub(super) fn drain_junk(&self) {
        if self.finished.load(Ordering::Relaxed) {
            // SAFETY: reading an exported constant.
            let any = unsafe { ffi::RSMPI_ANY_TAG };
            for _ in 0..256 {
                match self.take_any(any) {
                    Some((src, NOTICE_TAG, bytes)) => self.record(src, &bytes),
                    Some(_) => {}
                    None => break,
                }
            }
        }
        if !self.any_junk.load(Ordering::Relaxed) {
            return;
        }
        let latest = self.latest.load(Ordering::Relaxed);
        let seqs: Vec<u32> = {
            let mut j = lock(&self.junk);
            // Sequence numbers wrap: keep those less than a quarter of the tag space behind.
            j.retain(|&s| (latest.wrapping_sub(s) as i32) < (self.window / 4) as i32);
            self.any_junk.store(!j.is_empty(), Ordering::SeqCst);
            j.iter().copied().collect()
        };
        for s in seqs {
            let h = self.header_tag(s);
            for t in [h, h + 1] {
                for _ in 0..256 {
                    if self.take_any(t).is_none() {
                        break;
                    }
                }
            }
        }
    }

    /// A wait's periodic work: notices, finished notice sends, leftovers.
    pub fn service(&self) {
        self.take_notices();
        self.reap_outbox();
        self.drain_junk();
    }
}
