//! The poster's own socket writes (`writer::post` → `direct`) on a real loopback connection
//! whose buffers are kept small, so a message the socket takes only part of is certain: the
//! frames on the wire are read back raw and checked byte for byte.

use super::link::{lock, Link};
use super::monitor::Bell;
use super::wire::{self, Header, Kind, HEADER, TRAILER, TRAILER_ABANDONED, TRAILER_OK};
use super::writer::{self, post, post_parts, Job};
use crate::transport::faults::{stamp, Faults};
use crate::transport::SendOp;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sets a socket buffer option (the kernel doubles it and keeps a floor).
fn set_buf(fd: i32, opt: libc::c_int, bytes: libc::c_int) {
    // SAFETY: `fd` is an open socket and the option value a live c_int of its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

/// A link from rank 0 to rank 1 over loopback with small buffers, the raw receiving end,
/// and the queue of its writer thread, not started yet ([`start_writer`]).
fn parked_link() -> (Arc<Link>, TcpStream, Receiver<Job>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_buf(l.as_raw_fd(), libc::SO_RCVBUF, 4096);
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    set_buf(a.as_raw_fd(), libc::SO_SNDBUF, 4096);
    let bell = Arc::new(Bell::new().unwrap());
    let link = Arc::new(Link::new(0, 1, Arc::new(Faults::default()), a, None, None, bell).unwrap());
    let (tx, rx) = channel();
    *lock(&link.writer) = Some(tx);
    (link, b, rx)
}

fn start_writer(link: &Arc<Link>, rx: Receiver<Job>) -> std::thread::JoinHandle<()> {
    let s = link.socket_clone().unwrap();
    let l2 = link.clone();
    std::thread::spawn(move || writer::socket_writer(s, l2, rx))
}

/// [`parked_link`] with its writer thread running.
fn small_link() -> (Arc<Link>, TcpStream, std::thread::JoinHandle<()>) {
    let (link, b, rx) = parked_link();
    let h = start_writer(&link, rx);
    (link, b, h)
}

/// Reads one data frame off the raw stream: (tag, body, trailer).
fn read_frame(b: &mut TcpStream) -> (u64, Vec<u8>, u64) {
    let mut head = [0u8; HEADER];
    b.read_exact(&mut head).unwrap();
    let h = Header::decode(&head).expect("a frame header");
    assert_eq!(h.kind, Kind::Data);
    let mut body = vec![0u8; h.len as usize];
    b.read_exact(&mut body).unwrap();
    let mut t = [0u8; TRAILER];
    b.read_exact(&mut t).unwrap();
    (h.tag, body, u64::from_le_bytes(t))
}

/// Reads the next frame and checks it is message `want` stamped `tag`, delivered whole.
fn expect_frame(b: &mut TcpStream, tag: u64, want: &[u8]) {
    let (got_tag, body, trailer) = read_frame(b);
    assert_eq!((got_tag, trailer), (tag, TRAILER_OK));
    assert_eq!(body, want);
}

fn pattern(n: usize, k: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(k))
        .collect()
}

fn send(link: &Arc<Link>, tag: u64, data: &[u8]) -> Box<dyn SendOp> {
    // SAFETY: every caller keeps `data` alive and unchanged until the op's wait returned.
    unsafe { post(link, tag, data.as_ptr(), data.len()) }.unwrap()
}

fn close(link: Arc<Link>, h: std::thread::JoinHandle<()>) {
    *lock(&link.writer) = None;
    h.join().unwrap();
}

#[test]
fn a_small_message_on_an_idle_socket_is_written_by_the_poster() {
    let (link, mut b, h) = small_link();
    let data = pattern(1000, 1);
    let op = send(&link, stamp(1, 0), &data);
    // Written in full during the post: nothing was handed to the writer thread.
    assert_eq!(link.queued.load(Ordering::Acquire), 0);
    assert!(lock(&link.wr).is_none());
    op.wait(Instant::now() + Duration::from_secs(5)).unwrap();
    expect_frame(&mut b, stamp(1, 0), &data);
    close(link, h);
}

#[test]
fn a_frame_the_socket_took_in_part_is_finished_first_and_later_messages_keep_their_order() {
    let (link, mut b, h) = small_link();
    let first = pattern(60 * 1024, 2);
    let second = pattern(300, 3);
    let third = pattern(200 * 1024, 4); // above the direct limit: always queued
    let op1 = send(&link, stamp(1, 0), &first);
    // Nobody reads yet, so the small buffers took only part of the frame: the rest is the
    // writer thread's, and the next messages queue behind it.
    assert_eq!(
        link.queued.load(Ordering::Acquire),
        1,
        "a partial frame is pending"
    );
    let op2 = send(&link, stamp(1, 0), &second);
    let op3 = send(&link, stamp(2, 0), &third);
    assert!(link.queued.load(Ordering::Acquire) >= 2);
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        (0..3).map(|_| read_frame(&mut b)).collect::<Vec<_>>()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    op1.wait(deadline).unwrap();
    op2.wait(deadline).unwrap();
    op3.wait(deadline).unwrap();
    let got = reader.join().unwrap();
    let want = [
        (stamp(1, 0), &first),
        (stamp(1, 0), &second),
        (stamp(2, 0), &third),
    ];
    for (i, ((tag, body, trailer), (wtag, wbody))) in got.iter().zip(want).enumerate() {
        assert_eq!((*tag, *trailer), (wtag, TRAILER_OK), "frame {i}");
        assert!(body == wbody, "frame {i}: {} bytes differ", {
            body.iter()
                .zip(wbody.iter())
                .filter(|(a, b)| a != b)
                .count()
        });
    }
    // The writer counts a message off once its frame's last byte is written (the ops
    // returned at the body's end).
    let t0 = Instant::now();
    while link.queued.load(Ordering::Acquire) != 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(link.queued.load(Ordering::Acquire), 0);
    close(link, h);
}

#[test]
fn a_partial_frame_given_up_is_padded_and_the_stream_stays_framed() {
    let (link, mut b, h) = small_link();
    let first = pattern(60 * 1024, 5);
    let op1 = send(&link, stamp(1, 0), &first);
    assert_eq!(
        link.queued.load(Ordering::Acquire),
        1,
        "a partial frame is pending"
    );
    // The waiter's deadline has passed and nobody reads: the wait gives the message up and
    // returns once the writer no longer touches the caller's memory.
    let t0 = Instant::now();
    let e = op1.wait(Instant::now()).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("rank 1"), "names the peer: {e}");
    drop(first); // the caller's memory is gone; the writer must pad from zeros
    let next = pattern(500, 6);
    let op2 = send(&link, stamp(2, 0), &next);
    let (tag, body, trailer) = read_frame(&mut b);
    assert_eq!((tag, trailer), (stamp(1, 0), TRAILER_ABANDONED));
    assert_eq!(body.len(), 60 * 1024);
    // What the socket took before the give-up is the message; the rest is zeros.
    let want = pattern(60 * 1024, 5);
    let sent = body.iter().zip(&want).take_while(|(a, b)| a == b).count();
    assert!(
        body[sent..].iter().all(|&x| x == 0),
        "padding after byte {sent}"
    );
    op2.wait(Instant::now() + Duration::from_secs(5)).unwrap();
    expect_frame(&mut b, stamp(2, 0), &next);
    close(link, h);
}

#[test]
fn a_partial_frame_of_a_closing_transport_fails_its_wait_instead_of_hanging() {
    let (link, _b, h) = small_link();
    let first = pattern(60 * 1024, 7);
    let op = send(&link, stamp(1, 0), &first);
    assert_eq!(
        link.queued.load(Ordering::Acquire),
        1,
        "a partial frame is pending"
    );
    // The transport closes (its writer stops) while the receiver reads nothing.
    link.set_broken();
    close(link, h);
    let t0 = Instant::now();
    assert!(op.wait(Instant::now() + Duration::from_secs(30)).is_err());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn a_small_message_posted_after_a_queued_notice_is_not_written_before_it() {
    // A rank that refused a collective tells its peers, then goes on (a shrink's first
    // messages): a peer still in that collective must read the refusal first, or it takes
    // the next message for a mismatched call.
    let (link, mut b, rx) = parked_link();
    let notice = wire::control(Kind::Refused, 7, "rank 3 died");
    link.send_control(notice.clone());
    let data = pattern(100, 8);
    let op = send(&link, stamp(1, 0), &data);
    // Nothing is on the wire before the writer thread runs: the message queued behind the
    // notice instead of going ahead of it.
    assert_eq!(link.queued.load(Ordering::Acquire), 2);
    let h = start_writer(&link, rx);
    op.wait(Instant::now() + Duration::from_secs(5)).unwrap();
    let mut got = vec![0u8; notice.len()];
    b.read_exact(&mut got).unwrap();
    assert_eq!(got, notice, "the notice comes first");
    expect_frame(&mut b, stamp(1, 0), &data);
    let t0 = Instant::now();
    while link.queued.load(Ordering::Acquire) != 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(link.queued.load(Ordering::Acquire), 0, "both counted off");
    close(link, h);
}

/// Segments of the given lengths, each its own allocation, and their bytes laid end to end.
fn segments(lens: &[usize]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let segs: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(k, &n)| pattern(n, k as u8 * 17 + 3))
        .collect();
    let whole = segs.concat();
    (segs, whole)
}

fn send_parts(link: &Arc<Link>, tag: u64, segs: &[Vec<u8>]) -> Box<dyn SendOp> {
    let parts: Vec<(*const u8, usize)> = segs.iter().map(|s| (s.as_ptr(), s.len())).collect();
    // SAFETY: every caller keeps `segs` alive and unchanged until the op's wait returned.
    unsafe { post_parts(link, tag, &parts) }.unwrap()
}

#[test]
fn a_vectored_message_is_written_from_its_segments_as_one_frame() {
    let (link, mut b, h) = small_link();
    // Runs longer than the writer's 1 MiB step, a one-byte run, an empty one.
    let (segs, whole) = segments(&[700_000, 1, 1_500_000, 0, 300_000]);
    let op = send_parts(&link, stamp(1, 0), &segs);
    let reader = std::thread::spawn(move || {
        let f = read_frame(&mut b);
        (f, b)
    });
    op.wait(Instant::now() + Duration::from_secs(10)).unwrap();
    let ((tag, body, trailer), mut b) = reader.join().unwrap();
    assert_eq!((tag, trailer), (stamp(1, 0), TRAILER_OK));
    assert_eq!(body.len(), whole.len());
    if let Some(i) = body.iter().zip(&whole).position(|(a, b)| a != b) {
        panic!("byte {i}: {} (want {})", body[i], whole[i]);
    }
    let next = pattern(500, 9);
    let op2 = send(&link, stamp(2, 0), &next);
    op2.wait(Instant::now() + Duration::from_secs(5)).unwrap();
    expect_frame(&mut b, stamp(2, 0), &next);
    close(link, h);
}

#[test]
fn a_vectored_message_given_up_midway_is_padded_and_the_stream_stays_framed() {
    let (link, mut b, h) = small_link();
    let (segs, whole) = segments(&[300_000, 5, 400_000]);
    let op = send_parts(&link, stamp(1, 0), &segs);
    // The writer has begun the frame (its header arrived; a job still queued would simply
    // be dropped), then nobody reads and the deadline has passed: the wait gives it up and
    // returns once the writer no longer touches the segments.
    let mut head = [0u8; HEADER];
    b.read_exact(&mut head).unwrap();
    let hd = Header::decode(&head).expect("a frame header");
    assert_eq!((hd.tag, hd.len as usize), (stamp(1, 0), whole.len()));
    let t0 = Instant::now();
    let e = op.wait(Instant::now()).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("rank 1"), "names the peer: {e}");
    drop(segs); // the writer must pad from zeros now
    let next = pattern(500, 6);
    let op2 = send(&link, stamp(2, 0), &next);
    let mut body = vec![0u8; whole.len()];
    b.read_exact(&mut body).unwrap();
    let mut t = [0u8; TRAILER];
    b.read_exact(&mut t).unwrap();
    let sent = body.iter().zip(&whole).take_while(|(a, b)| a == b).count();
    assert!(
        body[sent..].iter().all(|&x| x == 0),
        "padding after byte {sent}"
    );
    // Given up before the socket took it all (small buffers): marked abandoned.
    assert_eq!(
        u64::from_le_bytes(t),
        TRAILER_ABANDONED,
        "{sent} of {} bytes sent",
        whole.len()
    );
    op2.wait(Instant::now() + Duration::from_secs(5)).unwrap();
    expect_frame(&mut b, stamp(2, 0), &next);
    close(link, h);
}
