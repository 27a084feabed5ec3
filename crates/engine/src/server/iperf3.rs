//! `serve --iperf3 [ADDR:]PORT`: answers stock iperf3 3.x clients, several
//! tests at once. A listener of its own; a thread per connection reads
//! the 37-byte cookie under one deadline and either hands the socket to
//! the test waiting for streams with that cookie, or runs a new test on
//! it (`proto::iperf3::Server`) while fewer than `max_tests` run, else
//! answers iperf3's `ACCESS_DENIED`, which iperf3 prints as "the server is
//! busy running a test". Each test runs this side with perf's
//! [`SideRun`] and is recorded through the server's observers (metrics,
//! archive) like any served perf test.
//!
//! iperf3 tests are unauthenticated and unencrypted: the listener exists
//! only when asked for, and every test is held to the caps in
//! [`Iperf3Config`] (docs/SECURITY.md).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::iperf3::{
    self, Accepted, Cookie, Iperf3Error, ServerEvent, ServerLimits, State,
};
use longhaul_proto::msg::{Mode, TestParams, Transport};
use longhaul_proto::report::{stream_keys, SideSnapshot};

use super::observe::{Observers, Outcome, Refused, RunKind, ServeObserver, Watch, ANONYMOUS};
use crate::net::lobby::{Entered, Lobby, Seat};
use crate::net::sock;
use crate::perf::client::tuning_for;
use crate::perf::iperf3::results_for;
use crate::perf::side::{End, ReadyStream, SideRun};
use crate::perf::workers::DataSocket;
use crate::EngineError;

/// What an iperf3 listener allows.
#[derive(Clone)]
pub struct Iperf3Config {
    /// Tests at once; the next client is told the server is busy.
    pub max_tests: usize,
    /// Streams per direction of one test.
    pub max_streams: u16,
    /// Omitted plus measured seconds of one test.
    pub max_seconds: u64,
    /// Total rate of one test, bits per second (None: no cap). With a
    /// cap a client must ask for a rate (`-b`) within it, and a test that
    /// moves data faster than 1.25 times it is ended.
    pub max_rate_bps: Option<u64>,
    /// Bytes per write.
    pub max_len: u64,
    /// Connections reading their cookie at once, in all.
    pub max_connections: usize,
    /// Of those, from one address; past either cap the idlest (the one
    /// quiet longest) is closed to make room ([`crate::net::lobby`]).
    pub max_per_address: usize,
    /// For the cookie, the parameters, the streams and the results, each.
    pub handshake_timeout: Duration,
    pub observers: Vec<Arc<dyn ServeObserver>>,
}

impl Default for Iperf3Config {
    fn default() -> Self {
        Iperf3Config {
            max_tests: 4,
            max_streams: 16,
            max_seconds: 60,
            max_rate_bps: None,
            max_len: 8 << 20,
            max_connections: 64,
            max_per_address: 32,
            handshake_timeout: Duration::from_secs(10),
            observers: Vec::new(),
        }
    }
}

struct Shared {
    cfg: Iperf3Config,
    observers: Observers,
    tests: Mutex<usize>,
    /// Connections that have not sent their cookie yet.
    lobby: Arc<Lobby>,
    /// Tests waiting for their streams: cookie -> (accept order, socket).
    pending: Mutex<HashMap<Cookie, mpsc::Sender<(u64, TcpStream)>>>,
    /// Held by the one UDP test whose streams are being set up: iperf3's
    /// UDP setup datagram names no test, so only one test at a time may
    /// take them (and only from its control connection's address).
    udp_setup: Mutex<()>,
    shutdown: AtomicBool,
}

/// A bound iperf3 listener.
pub struct Iperf3Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// An iperf3 listener serving on a background thread.
pub struct Iperf3Handle {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Iperf3Handle {
    /// Stops accepting; running tests end on their own.
    pub fn shutdown(mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Iperf3Server {
    pub fn bind(addr: SocketAddr, cfg: Iperf3Config) -> Result<Iperf3Server, EngineError> {
        let listener = super::bind_one(addr).map_err(|e| {
            EngineError::Usage(format!(
                "cannot listen for iperf3 clients on {addr}: {e} (another iperf3 server there? pick another --iperf3 port)"
            ))
        })?;
        let observers: Observers = cfg.observers.clone().into();
        let lobby = Lobby::new(cfg.max_per_address, cfg.max_connections);
        Ok(Iperf3Server {
            listener,
            shared: Arc::new(Shared {
                cfg,
                observers,
                tests: Mutex::new(0),
                lobby,
                pending: Mutex::new(HashMap::new()),
                udp_setup: Mutex::new(()),
                shutdown: AtomicBool::new(false),
            }),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> Result<Iperf3Handle, EngineError> {
        let addr = super::wake_addr(
            self.local_addr()
                .map_err(|e| EngineError::io("iperf3 listener".into(), e))?,
        );
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("lh-iperf3".into())
            .spawn(move || accept_loop(&self.listener, &self.shared))
            .map_err(|e| EngineError::io("failed to start the iperf3 listener".into(), e))?;
        Ok(Iperf3Handle {
            addr,
            shared,
            thread: Some(thread),
        })
    }
}

fn accept_loop(l: &TcpListener, shared: &Arc<Shared>) {
    let order = AtomicU64::new(0);
    while let Some((stream, peer)) = super::accept_next(l, &shared.shutdown, "iperf3 listener") {
        let seat = match shared.lobby.enter(&stream, peer.ip()) {
            Ok((seat, Entered::Room)) => seat,
            Ok((seat, Entered::Dropped(ip))) => {
                tracing::info!(
                    "iperf3 listener: closed the idlest connection without a cookie from {ip} to take {peer}"
                );
                seat
            }
            Err(e) => {
                refuse_note(
                    shared,
                    &peer,
                    "busy",
                    format!("cannot keep its connection: {e}"),
                );
                continue;
            }
        };
        let seq = order.fetch_add(1, Ordering::Relaxed);
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("lh-iperf3-conn".into())
            .spawn(move || connection(stream, peer, seq, seat, &sh));
        if let Err(e) = spawned {
            tracing::warn!("iperf3 listener: cannot start a thread: {e}");
        }
    }
}

fn refuse_note(shared: &Shared, peer: &SocketAddr, reason: &'static str, message: String) {
    // A refusal is the server's answer to a person: in its log by default.
    tracing::warn!("iperf3 client {peer}: refused ({reason}): {message}");
    let r = Refused {
        what: "perf",
        export: None,
        grant: ANONYMOUS.into(),
        reason,
        message,
        client: peer.to_string(),
    };
    for o in shared.observers.iter() {
        o.refused(&r);
    }
}

/// Reads exactly `buf.len()` bytes by `deadline` (one deadline for all of
/// it: trickling bytes does not extend it), telling `seat` of each read.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant, seat: &Seat) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                seat.heard();
            }
            Err(e) if crate::net::conn::transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One accepted connection: its cookie says whether it is a data stream
/// of a test waiting for streams or a new test.
fn connection(mut s: TcpStream, peer: SocketAddr, seq: u64, seat: Seat, shared: &Arc<Shared>) {
    let mut raw = [0u8; iperf3::COOKIE_LEN];
    let deadline = Instant::now() + shared.cfg.handshake_timeout;
    if let Err(e) = read_by(&mut s, &mut raw, deadline, &seat) {
        let (reason, what) = match e.kind() {
            _ if seat.dropped() => (
                "busy",
                format!(
                    "closed while it sent no cookie, to make room ({} connections without one from an address, {} in all)",
                    shared.cfg.max_per_address, shared.cfg.max_connections
                ),
            ),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                ("timeout", format!("sent no cookie in time ({e})"))
            }
            _ => ("protocol", format!("closed before its cookie ({e})")),
        };
        refuse_note(shared, &peer, reason, what);
        return;
    }
    drop(seat);
    let cookie = match Cookie::parse(&raw) {
        Ok(c) => c,
        Err(e) => {
            let _ = s.write_all(&[State::AccessDenied.byte()]);
            refuse_note(shared, &peer, "protocol", e.to_string());
            return;
        }
    };
    let waiting = shared
        .pending
        .lock()
        .expect("poisoned")
        .get(&cookie)
        .cloned();
    if let Some(tx) = waiting {
        let _ = s.set_read_timeout(None);
        if tx.send((seq, s)).is_err() {
            tracing::debug!("iperf3 client {peer}: a data stream for a test that ended");
        }
        return;
    }
    let _ = s.set_nodelay(true);
    let slot = {
        let mut n = shared.tests.lock().expect("poisoned");
        (*n < shared.cfg.max_tests).then(|| {
            *n += 1;
        })
    };
    if slot.is_none() {
        // iperf3's own busy answer: its client prints "the server is busy
        // running a test. try again later".
        let _ = s.write_all(&[State::AccessDenied.byte()]);
        refuse_note(
            shared,
            &peer,
            "busy",
            format!(
                "{} iperf3 tests run already (--iperf3-max-tests)",
                shared.cfg.max_tests
            ),
        );
        return;
    }
    let _slot = Slot(shared);
    let mut t = Test {
        s,
        peer,
        shared,
        machine: iperf3::Server::new(),
        cookie,
    };
    if let Err(e) = t.run() {
        tracing::info!("iperf3 client {peer}: {e}");
        let _ = t.s.shutdown(std::net::Shutdown::Both);
    }
}

/// A test slot, given back however the test ends.
struct Slot<'a>(&'a Shared);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut n = self.0.tests.lock().expect("poisoned");
        *n = n.saturating_sub(1);
    }
}

/// Takes the cookie out of the streams registry however the test ends.
struct Pending<'a>(&'a Shared, Cookie);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.lock().expect("poisoned").remove(&self.1);
    }
}

struct Test<'a> {
    s: TcpStream,
    peer: SocketAddr,
    shared: &'a Shared,
    machine: iperf3::Server,
    cookie: Cookie,
}

/// Why a test ended early.
enum Halt {
    /// Refused before it ran (recorded as a refusal).
    Refused(&'static str, String),
    /// Failed or ended by a cap while it ran (recorded on the run).
    Failed(String),
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Refused(r, m) => write!(f, "refused ({r}): {m}"),
            Halt::Failed(m) => write!(f, "{m}"),
        }
    }
}

impl Test<'_> {
    fn flush(&mut self) -> Result<(), Halt> {
        let out = self.machine.take_transmit();
        if !out.is_empty() {
            self.s
                .write_all(&out)
                .map_err(|e| Halt::Failed(format!("failed to write to the client: {e}")))?;
        }
        Ok(())
    }

    /// Reads what the client sent within `wait`; an early close or a
    /// malformed message is an error.
    fn pump(&mut self, wait: Duration) -> Result<(), Halt> {
        self.flush()?;
        let _ = self
            .s
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))));
        let mut buf = [0u8; 4096];
        match self.s.read(&mut buf) {
            Ok(0) => Err(Halt::Failed(
                "the client closed the control connection".into(),
            )),
            Ok(n) => {
                let r = self.machine.receive(&buf[..n]);
                let f = self.flush();
                r.map_err(|e| self.protocol_error(e))?;
                f
            }
            Err(e) if crate::net::conn::transient(&e) => Ok(()),
            Err(e) => Err(Halt::Failed(format!("control connection: {e}"))),
        }
    }

    fn protocol_error(&mut self, e: Iperf3Error) -> Halt {
        match e {
            Iperf3Error::ClientTerminated => Halt::Failed(e.to_string()),
            e => {
                // Tell an iperf3 client what went wrong, as iperf3 would.
                self.machine.refuse(iperf3::errno::MESSAGE);
                let _ = self.flush();
                Halt::Failed(format!("malformed control message: {e}"))
            }
        }
    }

    fn next(&mut self, within: Duration, during: &str) -> Result<ServerEvent, Halt> {
        let next =
            crate::perf::iperf3::next_within(self, within, |t| t.machine.poll_event(), Self::pump)?;
        next.ok_or_else(|| {
            self.machine.terminate();
            let _ = self.flush();
            Halt::Failed(format!("timed out {during}"))
        })
    }

    fn run(&mut self) -> Result<(), Halt> {
        let cfg = &self.shared.cfg;
        let hs = cfg.handshake_timeout;
        let r = self.negotiate(hs);
        let (accepted, params, streams) = match r {
            Ok(x) => x,
            Err(Halt::Refused(reason, message)) => {
                refuse_note(self.shared, &self.peer, reason, message.clone());
                return Err(Halt::Refused(reason, message));
            }
            Err(e) => {
                refuse_note(self.shared, &self.peer, "protocol", e.to_string());
                return Err(e);
            }
        };
        let watch = Watch::start(
            &self.shared.observers,
            RunKind::Perf,
            &self.peer.to_string(),
            ANONYMOUS,
            None,
            serde_json::json!({
                "iperf3": true,
                "transport": if accepted.udp { "udp" } else { "tcp" },
                "mode": params.mode,
                "streams": params.streams,
                "seconds": accepted.seconds,
                "omit": accepted.omit,
                "length": params.length,
                "window": params.window,
                "congestion": params.congestion,
                "rate_bps": accepted.rate_bps,
            }),
        );
        self.machine.start();
        self.flush()?;
        let mut run = SideRun::start(End::Server, &params, streams, None, "", None)
            .map_err(|e| Halt::Failed(e.to_string()))?;
        match self.running(&mut run, &accepted, &params) {
            Ok((bytes, note)) => {
                tracing::info!("iperf3 client {}: {note}", self.peer);
                watch.finish(bytes, 0, Outcome::Ok, None);
                Ok(())
            }
            Err(e) => {
                run.stop();
                let bytes = total(&run.snapshot());
                watch.finish(bytes, 0, Outcome::Failed, Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// The parameters, the check against the caps, the streams.
    fn negotiate(
        &mut self,
        hs: Duration,
    ) -> Result<(Accepted, TestParams, Vec<ReadyStream>), Halt> {
        self.flush()?;
        let p = match self.next(hs, "waiting for the parameters")? {
            ServerEvent::Params(p) => p,
            ev => return Err(Halt::Failed(format!("unexpected {ev:?}"))),
        };
        let cfg = &self.shared.cfg;
        let limits = ServerLimits {
            max_streams: cfg.max_streams,
            max_seconds: cfg.max_seconds,
            max_rate_bps: cfg.max_rate_bps,
            max_len: cfg.max_len,
            congestion: sock::available_congestion(),
        };
        let a = match p.check(&limits) {
            Ok(a) => a,
            Err(r) => {
                self.machine.refuse(r.code);
                let _ = self.flush();
                let reason = match r.reason {
                    "unsupported" => "bad_request",
                    _ => "limit",
                };
                return Err(Halt::Refused(reason, r.message));
            }
        };
        let params = params_of(&a);
        if a.udp {
            let streams = self.udp_streams(&a, &params, hs)?;
            return Ok((a, params, streams));
        }
        let streams = self.tcp_streams(&a, &params, hs)?;
        Ok((a, params, streams))
    }

    /// A TCP test's streams as they connect (each names this test by its
    /// cookie), within the handshake's time-out, in the client's order, each
    /// with the test's socket options.
    fn tcp_streams(
        &mut self,
        a: &Accepted,
        params: &TestParams,
        hs: Duration,
    ) -> Result<Vec<ReadyStream>, Halt> {
        let (tx, rx) = mpsc::channel();
        self.shared
            .pending
            .lock()
            .expect("poisoned")
            .insert(self.cookie.clone(), tx);
        let _pending = Pending(self.shared, self.cookie.clone());
        self.machine.accept();
        self.flush()?;
        let deadline = Instant::now() + hs;
        let mut got = Vec::with_capacity(a.total_streams);
        while got.len() < a.total_streams {
            if Instant::now() >= deadline {
                self.machine.terminate();
                let _ = self.flush();
                return Err(Halt::Failed(format!(
                    "{} of {} data streams connected in {} s",
                    got.len(),
                    a.total_streams,
                    hs.as_secs()
                )));
            }
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(x) => got.push(x),
                Err(mpsc::RecvTimeoutError::Timeout) => self.pump(Duration::from_millis(1))?,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Halt::Failed("the stream registry closed".into()))
                }
            }
        }
        // In the order the client connected them: iperf3's bidirectional
        // tests send on the first half and receive on the second.
        got.sort_by_key(|(seq, _)| *seq);
        let mut streams = Vec::with_capacity(got.len());
        for ((direction, stream), (_, t)) in stream_keys(params).into_iter().zip(got) {
            let tune = tuning_for(params, End::Server.sends(direction));
            if let Err(e) = sock::apply_tcp_ref(&socket2::SockRef::from(&t), &tune) {
                self.machine.refuse(iperf3::errno::SET_CONGESTION);
                let _ = self.flush();
                return Err(Halt::Failed(format!(
                    "cannot set a data stream's options: {e}"
                )));
            }
            if a.rate_bps > 0 && End::Server.sends(direction) {
                // Paced by the kernel: keep what waits unsent small, so that
                // the bytes this end counts as sent are the bytes on the
                // wire, as iperf3's own (application-paced) sender counts.
                let _ = sock::setsockopt_u32(
                    std::os::fd::AsFd::as_fd(&t),
                    libc::IPPROTO_TCP,
                    libc::TCP_NOTSENT_LOWAT,
                    128 << 10,
                );
            }
            streams.push(ReadyStream {
                direction,
                stream,
                socket: DataSocket::Tcp(Arc::new(t)),
                io: None,
            });
        }
        Ok(streams)
    }

    /// A UDP test's streams, iperf3's way: a socket bound to the address
    /// the client reached us at; each stream's first datagram (the 4-byte
    /// `UDP_CONNECT_MSG`, from the control connection's address) connects
    /// it to the datagram's sender, a fresh socket takes the next stream,
    /// and the 4-byte answer goes out. Datagrams from other addresses and
    /// anything else are dropped unanswered; nothing is bound outside this.
    fn udp_streams(
        &mut self,
        a: &Accepted,
        params: &TestParams,
        hs: Duration,
    ) -> Result<Vec<ReadyStream>, Halt> {
        let deadline = Instant::now() + hs;
        let shared = self.shared;
        let _setup = loop {
            match shared.udp_setup.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if Instant::now() >= deadline {
                self.machine.refuse(iperf3::errno::ACCESS_DENIED);
                let _ = self.flush();
                return Err(Halt::Refused(
                    "busy",
                    "another iperf3 UDP test was setting up its streams".into(),
                ));
            }
            // Notices an early close meanwhile.
            self.pump(Duration::from_millis(20))?;
        };
        let local = self
            .s
            .local_addr()
            .map_err(|e| Halt::Failed(format!("control connection: {e}")))?;
        let bind = |what: &str| {
            udp_listener(local)
                .map_err(|e| Halt::Failed(format!("cannot bind UDP {local} for {what}: {e}")))
        };
        let mut listener = bind("the streams")?;
        self.machine.accept();
        self.flush()?;
        let keys = stream_keys(params);
        let mut streams = Vec::with_capacity(a.total_streams);
        let mut buf = [0u8; 64];
        let mut ignored = 0u64;
        while streams.len() < a.total_streams {
            if Instant::now() >= deadline {
                self.machine.terminate();
                let _ = self.flush();
                return Err(Halt::Failed(format!(
                    "{} of {} UDP streams set up in {} s ({ignored} stray datagrams ignored)",
                    streams.len(),
                    a.total_streams,
                    hs.as_secs()
                )));
            }
            let _ = listener.set_read_timeout(Some(Duration::from_millis(20)));
            let (n, from) = match listener.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if crate::net::conn::transient(&e) => {
                    self.pump(Duration::from_millis(1))?;
                    continue;
                }
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
                Err(e) => return Err(Halt::Failed(format!("UDP {local}: {e}"))),
            };
            let order = match iperf3::udp_connect_order(&buf[..n.min(buf.len())]) {
                Some(o) if n == 4 && same_host(from, self.peer) => o,
                _ => {
                    ignored += 1;
                    tracing::debug!(
                        "iperf3 UDP {local}: ignored a {n}-byte datagram from {from} (not a stream setup from {})",
                        self.peer.ip()
                    );
                    continue;
                }
            };
            let (direction, stream) = keys[streams.len()];
            listener
                .connect(from)
                .map_err(|e| Halt::Failed(format!("UDP {local}: connect to {from}: {e}")))?;
            let u = std::mem::replace(&mut listener, bind("the next stream")?);
            if let Some(w) = params.window {
                let r = socket2::SockRef::from(&u);
                let _ = r.set_send_buffer_size(w as usize);
                let _ = r.set_recv_buffer_size(w as usize);
            }
            let _ = u.set_read_timeout(None);
            u.send(&iperf3::udp_connect_reply(order))
                .map_err(|e| Halt::Failed(format!("UDP {local}: answer to {from}: {e}")))?;
            streams.push(ReadyStream {
                direction,
                stream,
                socket: DataSocket::Iperf3Udp(Arc::new(u), a.wide_counters),
                io: None,
            });
        }
        Ok(streams)
    }

    /// Runs to the client's `TEST_END` (or a cap), then exchanges results.
    /// Returns this end's bytes and a line for the log.
    fn running(
        &mut self,
        run: &mut SideRun,
        a: &Accepted,
        params: &TestParams,
    ) -> Result<(u64, String), Halt> {
        let cfg = &self.shared.cfg;
        let grace = Duration::from_secs(10);
        let asked = Duration::from_secs(a.seconds + a.omit);
        let cap = Duration::from_secs(cfg.max_seconds);
        let deadline = run.start + asked.min(cap) + grace;
        let omit_at = run.start + Duration::from_secs(a.omit);
        let mut baseline: Option<SideSnapshot> = None;
        loop {
            if let Some(ev) = self.machine.poll_event() {
                match ev {
                    ServerEvent::TestEnd => break,
                    ev => return Err(Halt::Failed(format!("unexpected {ev:?} while running"))),
                }
            }
            let now = Instant::now();
            if a.omit > 0 && baseline.is_none() && now >= omit_at {
                baseline = Some(run.snapshot());
            }
            if now >= deadline {
                self.machine.terminate();
                let _ = self.flush();
                return Err(Halt::Failed(format!(
                    "no TEST_END {} s after the {} s the test may take: ended",
                    grace.as_secs(),
                    asked.min(cap).as_secs()
                )));
            }
            if let Some(max) = cfg.max_rate_bps {
                let s = run.snapshot();
                let secs = s.elapsed_us as f64 / 1e6;
                let bps = total(&s) as f64 * 8.0 / secs.max(1e-3);
                if secs >= 1.0 && bps > max as f64 * 1.25 {
                    self.machine.terminate();
                    let _ = self.flush();
                    return Err(Halt::Failed(format!(
                        "moved {bps:.0} bit/s, over the cap of {max} (--iperf3-max-rate): ended"
                    )));
                }
            }
            // Wake for the end of the omitted time too, so that the
            // baseline is taken within a millisecond of it.
            let wait = match baseline.is_none() && a.omit > 0 {
                true => omit_at.saturating_duration_since(now),
                false => Duration::from_millis(50),
            };
            self.pump(wait.min(Duration::from_millis(50)))?;
        }
        let end = run.snapshot();
        let error = run.error();
        run.stop();
        let theirs = match self.next(cfg.handshake_timeout, "waiting for the client's results")? {
            ServerEvent::ClientResults(r) => r,
            ev => {
                return Err(Halt::Failed(format!(
                    "unexpected {ev:?} instead of results"
                )))
            }
        };
        let mine = results_for(params, End::Server, baseline.as_ref(), &end);
        self.machine.send_results(&mine);
        self.flush()?;
        // IPERF_DONE, or the client closing, ends it.
        let _ = self.next(Duration::from_secs(2), "waiting for IPERF_DONE");
        run.join();
        let ours: u64 = mine.streams.iter().map(|s| s.bytes).sum();
        let theirs_b: u64 = theirs.streams.iter().map(|s| s.bytes).sum();
        let secs = mine.streams.first().and_then(|s| s.end_time).unwrap_or(0.0);
        let note = format!(
            "iperf3 test done: {} streams, this end counted {ours} bytes in {secs:.2} s, the client {theirs_b}{}",
            mine.streams.len(),
            error.map(|e| format!(" ({e})")).unwrap_or_default()
        );
        Ok((total(&end), note))
    }
}

/// Our test's parameters for what the iperf3 client asked and the caps
/// accepted.
fn params_of(a: &Accepted) -> TestParams {
    TestParams {
        transport: if a.udp {
            Transport::Udp
        } else {
            Transport::Tcp
        },
        mode: match (a.bidirectional, a.reverse) {
            (true, _) => Mode::Bidir,
            (false, true) => Mode::Down,
            (false, false) => Mode::Up,
        },
        streams: a.streams,
        duration_ms: None,
        bytes: None,
        length: a.len,
        window: a.window,
        congestion: a.congestion.clone(),
        // iperf3's -b for TCP: its client paces itself; this end
        // paces its sends with SO_MAX_PACING_RATE.
        pacing_bps: (a.rate_bps > 0 && !a.udp)
            .then(|| a.rate_bps.saturating_mul(u64::from(a.streams))),
        // iperf3's -b for UDP: each stream's rate; ours is the total.
        udp_rate_bps: a
            .udp
            .then(|| a.rate_bps.saturating_mul(u64::from(a.streams))),
        mss: None,
        interval_ms: 0,
        omit_ms: 0,
        data_tls: Some(false),
        ..TestParams::default()
    }
}

/// Bytes sent and received by every stream of a snapshot.
fn total(s: &SideSnapshot) -> u64 {
    s.streams.iter().map(|x| x.bytes).sum()
}

/// An unconnected UDP socket on `addr` that shares it with the test's
/// connected ones (iperf3's own way: SO_REUSEADDR; the kernel gives a
/// connected socket its peer's datagrams first).
fn udp_listener(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Whether two addresses are the same host (an IPv4 address and its
/// IPv6-mapped form alike).
fn same_host(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    canon(a.ip()) == canon(b.ip())
}
