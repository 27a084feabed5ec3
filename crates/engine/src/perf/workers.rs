//! Data stream workers: one thread per stream that sends or receives as
//! fast as allowed, counting into atomics that the control loop samples.
//!
//! A memory-to-memory test is a transfer whose source is a memory buffer
//! and whose sink discards; these loops are that source and sink.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use longhaul_proto::iperf3;
use longhaul_proto::msg::{Direction, RecvMode, SendMode};
use longhaul_proto::report::UdpRecv;
use longhaul_proto::udp::{self, Header};

use crate::net::conn::transient;
use crate::net::sock::{self, ThreadClock};

/// The socket a stream runs over.
#[derive(Clone)]
pub enum DataSocket {
    Tcp(Arc<TcpStream>),
    Udp(Arc<UdpSocket>),
    /// A UDP stream of a test with iperf3: its datagram header
    /// (`proto::iperf3::UdpHeader`), 64-bit counters if true.
    Iperf3Udp(Arc<UdpSocket>, bool),
}

/// Which header a UDP stream's datagrams carry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UdpFormat {
    Longhaul,
    Iperf3 { wide: bool },
}

impl UdpFormat {
    fn header_len(self) -> usize {
        match self {
            UdpFormat::Longhaul => udp::HEADER_LEN,
            UdpFormat::Iperf3 { wide } => iperf3::udp_header_len(wide),
        }
    }
}

/// The wall clock (iperf3's datagrams carry it), nanoseconds since the epoch.
fn wall_since_epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Counters a worker publishes while it runs.
#[derive(Default)]
pub struct Counters {
    pub bytes: AtomicU64,
    pub packets_sent: AtomicU64,
    pub udp: Mutex<UdpRecv>,
    /// CPU time of the worker thread when it ended, microseconds.
    pub final_cpu_us: AtomicU64,
    /// When the worker moved its last byte, microseconds after the run
    /// started (0 until then; a receiver that got nothing leaves it 0):
    /// the end of the test for rate purposes, whenever the control thread
    /// notices, and however long the worker then waits for its peer.
    pub end_us: AtomicU64,
    pub done: AtomicBool,
    pub clock: OnceLock<ThreadClock>,
    pub error: Mutex<Option<String>>,
}

impl Counters {
    /// CPU time of the worker so far, microseconds.
    pub fn cpu_us(&self) -> u64 {
        if self.done.load(Ordering::Acquire) {
            return self.final_cpu_us.load(Ordering::Relaxed);
        }
        match self.clock.get().and_then(|c| c.read_us()) {
            Some(us) => us,
            None => self.final_cpu_us.load(Ordering::Relaxed),
        }
    }
}

/// How one worker runs.
#[derive(Clone)]
pub struct Plan {
    pub direction: Direction,
    pub stream: u16,
    pub send: bool,
    pub length: usize,
    /// When a sender stops (start + omit + duration), if time-bound.
    pub until: Option<Instant>,
    /// Bytes this stream sends, if byte-bound.
    pub bytes: Option<u64>,
    pub send_mode: SendMode,
    pub recv_mode: RecvMode,
    pub cpu: Option<u32>,
    /// UDP sender rate, bytes per second; None or 0 for unlimited.
    pub udp_rate: Option<u64>,
    pub udp_tag: u32,
    pub stop: Arc<AtomicBool>,
    /// Base of UDP send timestamps.
    pub epoch: Instant,
    /// Streams `0..active` send; the others wait (perf's online tuning).
    pub active: Option<Arc<std::sync::atomic::AtomicU16>>,
}

/// Starts a worker thread.
pub fn spawn(
    plan: Plan,
    socket: DataSocket,
    io: Option<Box<dyn crate::net::conn::Stream>>,
    counters: Arc<Counters>,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!(
            "lh-{}{}",
            if plan.send { "tx" } else { "rx" },
            plan.stream
        ))
        .spawn(move || {
            if let Some(c) = ThreadClock::current() {
                let _ = counters.clock.set(c);
            }
            let r = match plan.cpu.map(sock::pin_to_cpu) {
                Some(Err(e)) => Err(e),
                _ => match (&socket, plan.send) {
                    (DataSocket::Tcp(s), true) if io.is_some() => {
                        tls_send(io.expect("checked"), s, &plan, &counters)
                    }
                    (DataSocket::Tcp(s), false) if io.is_some() => {
                        tls_recv(io.expect("checked"), s, &plan, &counters)
                    }
                    (DataSocket::Tcp(s), true) => tcp_send(s, &plan, &counters),
                    (DataSocket::Tcp(s), false) => tcp_recv(s, &plan, &counters),
                    (DataSocket::Udp(s), true) => {
                        udp_send(s, &plan, &counters, UdpFormat::Longhaul)
                    }
                    (DataSocket::Udp(s), false) => {
                        udp_recv(s, &plan, &counters, UdpFormat::Longhaul)
                    }
                    (DataSocket::Iperf3Udp(s, wide), true) => {
                        udp_send(s, &plan, &counters, UdpFormat::Iperf3 { wide: *wide })
                    }
                    (DataSocket::Iperf3Udp(s, wide), false) => {
                        udp_recv(s, &plan, &counters, UdpFormat::Iperf3 { wide: *wide })
                    }
                },
            };
            if let Err(e) = r {
                if !plan.stop.load(Ordering::Relaxed) {
                    *counters.error.lock().expect("poisoned") = Some(format!(
                        "stream {} ({}): {e}",
                        plan.stream,
                        if plan.send { "sending" } else { "receiving" }
                    ));
                }
            }
            counters
                .final_cpu_us
                .store(sock::thread_cpu_us(), Ordering::Relaxed);
            counters.done.store(true, Ordering::Release);
        })
}

/// Fills a buffer with bytes that do not compress, so nothing on the path
/// can shrink them.
pub fn fill_incompressible(buf: &mut [u8], seed: u64) {
    longhaul_proto::data::Rng::new(seed).fill(buf);
}

fn micros_since(epoch: Instant) -> u64 {
    (epoch.elapsed().as_micros() as u64).max(1)
}

/// The test is over for this stream: stopped, or its planned end passed.
fn past_end(plan: &Plan) -> bool {
    plan.stop.load(Ordering::Relaxed) || plan.until.is_some_and(|u| Instant::now() >= u)
}

fn should_stop(plan: &Plan) -> bool {
    let done = || past_end(plan);
    // A parked stream waits here, still connected, until the tuner wants
    // it again or the test ends.
    if let Some(active) = &plan.active {
        while plan.stream >= active.load(Ordering::Relaxed) {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    done()
}

/// A TCP sender's way of handing bytes to the kernel.
enum Writer {
    Copy,
    Sendfile(std::fs::File),
    Splice(Pipe),
}

impl Writer {
    fn new(mode: SendMode, buf: &[u8]) -> io::Result<Writer> {
        Ok(match mode {
            SendMode::Copy => Writer::Copy,
            SendMode::Sendfile => Writer::Sendfile(memfd_with(buf)?),
            // A kernel without vmsplice/splice for sockets falls back to write.
            SendMode::Splice => Pipe::new(buf.len()).map_or(Writer::Copy, Writer::Splice),
        })
    }

    /// Sends up to `buf.len()` bytes; returns how many went.
    fn send(&mut self, s: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        match self {
            Writer::Copy => {
                let mut w = s;
                w.write(buf)
            }
            Writer::Sendfile(f) => sendfile(s, f, buf.len()),
            Writer::Splice(p) => p.send(s, buf),
        }
    }
}

/// A pipe that carries page references from our buffer to a socket.
struct Pipe {
    r: std::os::fd::OwnedFd,
    w: std::os::fd::OwnedFd,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // As large as the buffer where allowed (pipe-max-size, 1 MiB by default).
        let want =
            size.min(sock::sysctl_u64("/proc/sys/fs/pipe-max-size").unwrap_or(1 << 20) as usize);
        let _ = rustix::pipe::fcntl_setpipe_size(&w, want);
        Ok(Pipe { r, w })
    }

    /// vmsplice as much of `buf` as the pipe takes, then splice all of it
    /// to the socket. The buffer is never written while the test runs, so
    /// the referenced pages keep their contents.
    fn send(&mut self, s: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: iov points to a live buffer of iov_len bytes.
        let n = unsafe { libc::vmsplice(self.w.as_raw_fd(), &iov, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut left = n as usize;
        while left > 0 {
            // No offsets: both ends are read and written at their position.
            let m = match rustix::pipe::splice(
                &self.r,
                None,
                s,
                None,
                left,
                rustix::pipe::SpliceFlags::MOVE | rustix::pipe::SpliceFlags::MORE,
            ) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => m,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            left -= m;
        }
        Ok(n as usize)
    }
}

fn tcp_send(s: &TcpStream, plan: &Plan, c: &Counters) -> io::Result<()> {
    let mut buf = vec![0u8; plan.length];
    fill_incompressible(&mut buf, u64::from(plan.stream) + 1);
    let mut remaining = plan.bytes.unwrap_or(u64::MAX);
    // No SO_SNDTIMEO: a timed wait arms a kernel timer at every block.
    // A write still blocked at the test's end (the path or the receiver
    // slower than this sender, the socket buffer full) is ended by the
    // control thread, which shuts the socket's write side then
    // (`SideRun::end_on_time`); SideRun::stop shuts it down as well.
    let mut writer = Writer::new(plan.send_mode, &buf)?;
    while remaining > 0 && !should_stop(plan) {
        let want = (buf.len() as u64).min(remaining) as usize;
        match writer.send(s, &buf[..want]) {
            Ok(n) => {
                remaining -= n as u64;
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if transient(&e) => {}
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
                    && !matches!(writer, Writer::Copy) =>
            {
                // This kernel cannot splice or sendfile to this socket.
                writer = Writer::Copy;
            }
            // The write side was shut at the end, under a blocked write.
            Err(_) if past_end(plan) => break,
            Err(e) => return Err(e),
        }
    }
    c.end_us.store(micros_since(plan.epoch), Ordering::Relaxed);
    if let Err(e) = s.shutdown(Shutdown::Write) {
        if !past_end(plan) {
            return Err(e);
        }
    }
    wait_for_close(s, plan);
    Ok(())
}

/// Sends through TLS: every byte is encrypted in this thread, so the
/// zero-copy modes do not apply.
fn tls_send(
    mut io: Box<dyn crate::net::conn::Stream>,
    s: &TcpStream,
    plan: &Plan,
    c: &Counters,
) -> io::Result<()> {
    let mut buf = vec![0u8; plan.length];
    fill_incompressible(&mut buf, u64::from(plan.stream) + 1);
    let mut remaining = plan.bytes.unwrap_or(u64::MAX);
    while remaining > 0 && !should_stop(plan) {
        let want = (buf.len() as u64).min(remaining) as usize;
        match io.write(&buf[..want]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                remaining -= n as u64;
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
    io.flush()?;
    c.end_us.store(micros_since(plan.epoch), Ordering::Relaxed);
    io.close_write()?;
    wait_for_close(s, plan);
    Ok(())
}

/// Receives through TLS until the sender's close_notify (or the stop).
fn tls_recv(
    mut io: Box<dyn crate::net::conn::Stream>,
    s: &TcpStream,
    plan: &Plan,
    c: &Counters,
) -> io::Result<()> {
    let mut buf = vec![0u8; plan.length.clamp(64 << 10, 4 << 20)];
    loop {
        match io.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                if plan.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) if plan.stop.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        }
    }
    received_all(plan, c);
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}

/// A receiver's stream ended (the sender's close right after its last
/// byte, or the stop): when the test ended for it, as a sender records
/// its last write. Without it the side's end would be when its control
/// thread noticed, which on a busy host is a second later and stretches
/// the test's time and its last interval.
fn received_all(plan: &Plan, c: &Counters) {
    c.end_us.store(micros_since(plan.epoch), Ordering::Relaxed);
}

/// After our FIN: wait (briefly) for the receiver to close, so that the
/// final TCP_INFO sample covers every byte acknowledged.
fn wait_for_close(s: &TcpStream, plan: &Plan) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let grace = Instant::now() + Duration::from_secs(5);
    let mut sink = [0u8; 4096];
    let mut r = s;
    while Instant::now() < grace {
        match r.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if transient(&e) => {
                if plan.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
}

fn memfd_with(buf: &[u8]) -> io::Result<std::fs::File> {
    let fd = rustix::fs::memfd_create(c"longhaul-perf", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(buf)?;
    Ok(f)
}

fn sendfile(s: &TcpStream, f: &std::fs::File, len: usize) -> io::Result<usize> {
    // From the file's start every time: the memfd holds one buffer's worth.
    let mut off = 0;
    Ok(rustix::fs::sendfile(s, f, Some(&mut off), len)?)
}

fn tcp_recv(s: &TcpStream, plan: &Plan, c: &Counters) -> io::Result<()> {
    let len = plan.length.clamp(64 << 10, 4 << 20);
    // With MSG_TRUNC, TCP drops the bytes without copying them: the buffer
    // is only a placeholder.
    let discard = plan.recv_mode == RecvMode::Discard;
    let mut buf = vec![0u8; if discard { 64 } else { len }];
    let mut lowat = WakeBatch::new(len, s);
    // No SO_RCVTIMEO, as for the sender: a shutdown ends a blocked read.
    loop {
        lowat.update(s);
        let flags = if discard { libc::MSG_TRUNC } else { 0 };
        // SAFETY: with MSG_TRUNC TCP writes nothing to the buffer; without
        // it, at most `buf.len()` bytes, which is what we pass.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                if discard { len } else { buf.len() },
                flags,
            )
        };
        match n {
            0 => break,
            n if n > 0 => {
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                // Stopped while bytes still arrive (a sender's queue
                // draining past the test's end): the end all the same.
                if plan.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if plan.stop.load(Ordering::Relaxed) {
                    break;
                }
                return Err(e);
            }
        }
    }
    received_all(plan, c);
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}

/// Most bytes a receiver lets arrive before the kernel wakes it
/// (SO_RCVLOWAT): a quarter of a megabyte is 20 ms at 100 Mbit/s, well
/// inside an interval report, and four 64 KB loopback segments.
const WAKE_BATCH_MAX: u32 = 256 << 10;

/// Wakes the receiver once per batch of bytes instead of once per segment.
///
/// Without it a receiver that takes its bytes faster than they arrive
/// (`recv` with MSG_TRUNC costs nothing per byte) sleeps between segments,
/// and every segment that TCP queues costs a wake-up and a read, each read
/// an acknowledgement (window update) back to the sender. On one stream
/// under a pacing congestion control (BBR) segments arrive one by one,
/// never in bursts, so that is one wake-up, one read and one more ACK to
/// process per segment, all charged to the CPU that runs the sender (on
/// loopback and veth the receiving softirq runs in the sender's thread):
/// measured 2026-11-23 on loopback, one stream, bbr, the sender's thread
/// at 96% CPU, 14-15 Gbit/s without, 49-66 with (BENCHMARKS.md, issue 15).
/// The kernel still wakes the receiver early when the window it offers
/// closes, under memory pressure and at the peer's FIN, so no byte waits
/// behind the threshold for long.
///
/// Not on a long path ([`sock::LONG_PATH_US`] and more, by the stream's
/// RTT at its start, read once: the handshake measured it): there the kernel's receive buffer autotuning (6.x's
/// `tcp_rcv_space_adjust`, which takes the bytes still queued off the
/// bytes read in the last RTT) never saw a window's worth read while a
/// batch's threshold stayed queued, and one stream under BBR stayed at its
/// first 128 KiB buffer: 1 Mbit/s at 540 ms where CUBIC and iperf3 reached
/// hundreds (2026-11-29). A long path's segments arrive at most a window
/// per RTT, so the wake-ups it saves there are few.
///
/// The threshold never exceeds a quarter of the receive buffer, so that
/// setting it never makes the kernel grow the buffer or touch the window
/// clamp (tcp_set_rcvlowat); it follows the buffer up as autotuning grows
/// it, to [`WAKE_BATCH_MAX`] or the read size, whichever is smaller.
struct WakeBatch {
    /// Threshold in force (0: the kernel's default of 1 byte).
    set: u32,
    /// What we want once the buffer allows it.
    goal: u32,
    /// Reads until the buffer is looked at again.
    countdown: u32,
}

impl WakeBatch {
    /// Reads between looks at the receive buffer while it grows.
    const EVERY: u32 = 64;

    fn new(read_size: usize, s: &TcpStream) -> WakeBatch {
        WakeBatch {
            set: 0,
            goal: match sock::long_path(s.as_fd()) {
                true => 0,
                false => u32::try_from(read_size).map_or(WAKE_BATCH_MAX, |r| r.min(WAKE_BATCH_MAX)),
            },
            countdown: 0,
        }
    }

    fn update(&mut self, s: &TcpStream) {
        if self.set >= self.goal {
            return;
        }
        if self.countdown > 0 {
            self.countdown -= 1;
            return;
        }
        self.countdown = Self::EVERY;
        let fd = s.as_fd();
        let Ok(rcvbuf) = sock::getsockopt_u32(fd, libc::SOL_SOCKET, libc::SO_RCVBUF) else {
            self.goal = 0;
            return;
        };
        let want = (rcvbuf / 4).min(self.goal);
        if want > self.set {
            if sock::setsockopt_u32(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, want).is_ok() {
                self.set = want;
            } else {
                // Not settable here: leave the kernel's default.
                self.goal = 0;
            }
        }
    }
}

fn now_ns(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Largest number of segments we hand the kernel in one GSO send.
const GSO_MAX_SEGMENTS: usize = 64;

fn udp_send(s: &UdpSocket, plan: &Plan, c: &Counters, format: UdpFormat) -> io::Result<()> {
    let seg = plan.length.max(format.header_len());
    let mut batch =
        if sock::setsockopt_u32(s.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, seg as u32).is_ok() {
            (65_000 / seg).clamp(1, GSO_MAX_SEGMENTS)
        } else {
            1
        };
    let mut buf = vec![0u8; seg * batch];
    fill_incompressible(&mut buf, 7);
    let rate = plan.udp_rate.filter(|&r| r > 0);
    let started = Instant::now();
    let mut seq: u64 = 0;
    let limit_pkts = plan.bytes.map(|b| b.div_ceil(seg as u64));
    s.set_write_timeout(Some(Duration::from_millis(100)))?;
    while !should_stop(plan) && limit_pkts.is_none_or(|l| seq < l) {
        let mut due = batch as u64;
        if let Some(r) = rate {
            let allowed = (started.elapsed().as_secs_f64() * r as f64 / seg as f64) as u64 + 1;
            if allowed <= seq {
                let next = Duration::from_secs_f64((seq + 1) as f64 * seg as f64 / r as f64);
                let wait = next
                    .saturating_sub(started.elapsed())
                    .min(Duration::from_millis(10));
                std::thread::sleep(wait.max(Duration::from_micros(50)));
                continue;
            }
            due = due.min(allowed - seq);
        }
        if let Some(l) = limit_pkts {
            due = due.min(l - seq);
        }
        let n = due as usize;
        match format {
            UdpFormat::Longhaul => {
                let t = now_ns(plan.epoch);
                for i in 0..n {
                    Header {
                        tag: plan.udp_tag,
                        stream: plan.stream,
                        flags: 0,
                        seq: seq + i as u64,
                        send_ns: t,
                    }
                    .write(&mut buf[i * seg..]);
                }
            }
            UdpFormat::Iperf3 { wide } => {
                // iperf3 numbers datagrams from 1.
                let t = wall_since_epoch();
                for i in 0..n {
                    iperf3::UdpHeader::at(t, seq + i as u64 + 1).write(&mut buf[i * seg..], wide);
                }
            }
        }
        match s.send(&buf[..n * seg]) {
            Ok(_) => {
                seq += due;
                c.packets_sent.fetch_add(due, Ordering::Relaxed);
                c.bytes.fetch_add((n * seg) as u64, Ordering::Relaxed);
            }
            Err(e)
                if batch > 1
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EMSGSIZE | libc::EIO)
                    ) =>
            {
                // The path or device refuses GSO: send one datagram at a time.
                let _ = sock::setsockopt_u32(s.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 0);
                batch = 1;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOBUFS | libc::EAGAIN | libc::ECONNREFUSED)
                ) || e.kind() == io::ErrorKind::TimedOut =>
            {
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(e),
        }
    }
    c.end_us.store(micros_since(plan.epoch), Ordering::Relaxed);
    let _ = sock::setsockopt_u32(s.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 0);
    // iperf3's streams have no end marker: its receiver stops at TEST_END.
    let fins = match format {
        UdpFormat::Longhaul => 3,
        UdpFormat::Iperf3 { .. } => 0,
    };
    for _ in 0..fins {
        Header {
            tag: plan.udp_tag,
            stream: plan.stream,
            flags: udp::FLAG_FIN,
            seq,
            send_ns: now_ns(plan.epoch),
        }
        .write(&mut buf[..seg]);
        let _ = s.send(&buf[..udp::HEADER_LEN]);
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn udp_recv(s: &UdpSocket, plan: &Plan, c: &Counters, format: UdpFormat) -> io::Result<()> {
    let fd = s.as_fd();
    sock::setsockopt_u32(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
    let gro = sock::setsockopt_u32(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = vec![0u8; if gro { 1 << 17 } else { 65_536 }];
    let mut rx = udp::Receiver::new();
    // In a byte-bound test, silence for this long (from the start, or
    // after the last datagram) ends the receiver.
    let silence = Duration::from_secs(2);
    let mut last_data = Instant::now() + Duration::from_secs(8);
    // A receiver ends on the sender's FIN; failing that, a second after the
    // planned end, or after two seconds of silence in a byte-bound test.
    let hard_end = plan.until.map(|u| u + Duration::from_secs(1));
    // When the last datagram came: the stream's end, stored as it ends
    // (a stored end says the stream moves no more bytes).
    let mut last_us = 0;
    loop {
        if plan.stop.load(Ordering::Relaxed) || hard_end.is_some_and(|e| Instant::now() >= e) {
            break;
        }
        let (n, segsize, drops) = match recv_with_cmsg(s, &mut buf) {
            Ok(v) => v,
            Err(e) if transient(&e) => {
                if plan.until.is_none()
                    && format == UdpFormat::Longhaul
                    && last_data.elapsed() > silence
                {
                    break;
                }
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
            Err(e) => return Err(e),
        };
        let now = now_ns(plan.epoch);
        let seg = segsize.unwrap_or(n).max(1);
        let mut fin = false;
        let mut bytes = 0u64;
        for d in buf[..n].chunks(seg) {
            if let UdpFormat::Iperf3 { wide } = format {
                // The sender's wall clock against ours, as iperf3 does
                // (jitter needs no agreement between the clocks).
                match iperf3::UdpHeader::read(d, wide) {
                    Some(h) if h.count > 0 => {
                        let now = wall_since_epoch().as_nanos() as u64;
                        rx.on_datagram(h.count - 1, h.sent_ns(), now);
                        bytes += d.len() as u64;
                    }
                    _ => {}
                }
                continue;
            }
            let Some(h) = Header::read(d) else { continue };
            if h.tag != plan.udp_tag || h.flags & udp::FLAG_REGISTER != 0 {
                continue;
            }
            if h.flags & udp::FLAG_FIN != 0 {
                fin = true;
                continue;
            }
            rx.on_datagram(h.seq, h.send_ns, now);
            bytes += d.len() as u64;
        }
        if let Some(d) = drops {
            rx.set_rcvbuf_drops(u64::from(d));
        }
        if bytes > 0 {
            last_data = Instant::now();
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
            last_us = micros_since(plan.epoch);
        }
        *c.udp.lock().expect("poisoned") = rx.counts();
        if fin {
            break;
        }
    }
    *c.udp.lock().expect("poisoned") = rx.counts();
    c.end_us.store(last_us, Ordering::Relaxed);
    Ok(())
}

/// recvmsg with room for the UDP_GRO segment size and the SO_RXQ_OVFL
/// drop counter.
fn recv_with_cmsg(
    s: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, Option<usize>, Option<u32>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain data; every pointer we set outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: fd is a valid socket and msg points to live buffers.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut seg = None;
    let mut drops = None;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled,
    // bounded by msg_controllen.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(&msg);
        while !cm.is_null() {
            let data = libc::CMSG_DATA(cm);
            match ((*cm).cmsg_level, (*cm).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    seg = Some(std::ptr::read_unaligned(data.cast::<libc::c_int>()) as usize)
                }
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                    drops = Some(std::ptr::read_unaligned(data.cast::<u32>()))
                }
                _ => {}
            }
            cm = libc::CMSG_NXTHDR(&msg, cm);
        }
    }
    Ok((n as usize, seg, drops))
}
