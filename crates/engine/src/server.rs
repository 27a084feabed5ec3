//! `longhaul serve`: one listening port for control and data connections,
//! a thread per connection, and limits on connections, tests, streams and
//! duration. A misbehaving client loses its own session, never anyone
//! else's.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::msg::*;
use longhaul_proto::report::{stream_keys, PeerResults, SideInterval, StreamSetup};
use longhaul_proto::session::{Limits, ServerConfig, ServerEvent, ServerSession};
use longhaul_proto::udp;
use longhaul_proto::units::escaped;

use crate::client::{run_perf, tuning_for, ClientOptions};
use crate::conn::{read_one_frame, FramedConn, Stream, HANDSHAKE_MAX_FRAME};
use crate::report::RelaySink;
use crate::run::{End, ReadyStream, SideRun, Tick, Ticker};
use crate::sock;
use crate::stream::DataSocket;
use crate::xfer::beneath::Anchor;
use crate::xfer::sink::{prepare_dest, run_sink, SinkConfig};
use crate::xfer::source::{run_source, SourceConfig};
use crate::xfer::storage::{Local, Storage};
use crate::xfer::{beneath, confine, kind_of, mtime_ns, Export};
use crate::EngineError;
use crate::{auth, tls};
use longhaul_proto::frame::MAGIC;
use longhaul_proto::xfer::{
    Kind, ListEntry, ListRequest, Listing, Op, TransferAccept, TransferRequest,
};

/// How a server runs.
#[derive(Clone)]
pub struct ServeConfig {
    pub limits: Limits,
    /// Directories offered for transfers.
    pub exports: Vec<Export>,
    /// Where file data is read and written (the local file system, or a
    /// fault-injecting one in tests).
    pub storage: Arc<dyn Storage>,
    /// fdatasync each received file before renaming it into place.
    pub sync_files: bool,
    /// Tests, transfers and probes running at once; more wait in a queue,
    /// shared out round robin between grants (anonymous clients together
    /// count as one, and may hold at most half the slots, rounded up).
    pub max_tests: usize,
    /// Requests waiting for a slot at once (`--max-queued`); more are
    /// refused as busy.
    pub max_queued: usize,
    /// Rate cap, bits/s per direction, of an anonymous (`--public-perf`)
    /// test (`--public-max-rate`).
    pub public_max_rate: u64,
    /// Longest anonymous test, its omitted start included
    /// (`--public-max-time`).
    pub public_max_time: Duration,
    /// Open connections of any kind at once (each holds a thread).
    pub max_connections: usize,
    /// Open connections from one client at once: one IPv4 address, or one
    /// IPv6 /64 (what one host or site is usually given).
    pub max_per_client: usize,
    /// Where the server keeps its identity and state.
    pub state_dir: PathBuf,
    /// TLS set-up; None loads (or makes) the identity in `state_dir`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Serve clients that ask for plaintext (`--allow-plaintext`).
    pub allow_plaintext: bool,
    /// Anonymous clients may run perf tests (`--public-perf`).
    pub public_perf: bool,
    /// Keep setuid, setgid and sticky bits and world-writable directories
    /// that clients send with `-p` (`--keep-special-modes`); stripped
    /// otherwise.
    pub keep_special_modes: bool,
    /// Every client may do everything, without credentials (the demo's
    /// in-process server). Never set by `longhaul serve`.
    pub open_access: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            exports: Vec::new(),
            storage: Arc::new(Local),
            sync_files: true,
            max_tests: 16,
            max_queued: 64,
            public_max_rate: 1_000_000_000,
            public_max_time: Duration::from_secs(30),
            max_connections: 512,
            max_per_client: 300,
            state_dir: default_state_dir(),
            tls: None,
            allow_plaintext: false,
            public_perf: false,
            keep_special_modes: false,
            open_access: false,
        }
    }
}

/// `$XDG_STATE_HOME/longhaul`, else `$HOME/.local/state/longhaul` (each
/// only if absolute). With neither, an error that says to set HOME or pass
/// `--state-dir`: there is no fallback to a shared directory such as /tmp,
/// where another user could make the directory first and then read or
/// plant the server's key and grants.
pub fn state_dir_from_env() -> Result<PathBuf, EngineError> {
    let var = |name| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(x) = var("XDG_STATE_HOME") {
        return Ok(x.join("longhaul"));
    }
    var("HOME")
        .map(|h| h.join(".local/state/longhaul"))
        .ok_or_else(|| EngineError::Usage(NO_STATE_DIR.into()))
}

/// Why there is no default state directory.
pub const NO_STATE_DIR: &str = "no state directory: neither HOME nor XDG_STATE_HOME is set (to an absolute path); set HOME or pass --state-dir DIR";

/// [`state_dir_from_env`] for [`ServeConfig::default`], which cannot fail:
/// an empty path when there is none, which the identity and the grants
/// refuse with [`NO_STATE_DIR`] before anything is made. Callers that can
/// report an error use [`state_dir_from_env`].
pub fn default_state_dir() -> PathBuf {
    state_dir_from_env().unwrap_or_default()
}

/// A data connection on its way to the test that owns its token.
struct Attach {
    stream: Box<dyn Stream>,
    index: u16,
    direction: Direction,
}

struct Shared {
    cfg: ServeConfig,
    tls: Arc<rustls::ServerConfig>,
    fingerprint: Option<String>,
    host: String,
    registry: Mutex<HashMap<String, Sender<Attach>>>,
    slots: Slots,
    connections: AtomicUsize,
    /// Open connections by [`client_key`].
    per_client: Mutex<HashMap<IpAddr, usize>>,
    next_test: AtomicU64,
    shutdown: AtomicBool,
}

/// A bound server.
pub struct Server {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

/// A server running on background threads (for the demo and tests).
pub struct ServerHandle {
    pub addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// The fingerprint of the identity made or loaded from the state
    /// directory (None when the caller gave its own TLS set-up).
    pub fn fingerprint(&self) -> Option<String> {
        self.shared.fingerprint.clone()
    }

    /// Stops accepting; running sessions end on their own.
    pub fn shutdown(mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for a in &self.addrs {
            let _ = TcpStream::connect_timeout(&wake_addr(*a), Duration::from_millis(200));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn wake_addr(a: SocketAddr) -> SocketAddr {
    let mut a = a;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // One socket for both families where the host allows it.
        let _ = s.set_only_v6(false);
    }
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

impl Server {
    /// Binds every address; `[::]:PORT` serves IPv4 and IPv6 on one socket.
    pub fn bind(addrs: &[SocketAddr], cfg: ServeConfig) -> Result<Server, EngineError> {
        let mut listeners = Vec::new();
        for a in addrs {
            let l = bind_one(*a).map_err(|e| {
                let hint = match e.kind() {
                    io::ErrorKind::AddrInUse => {
                        " (another process listens there: pick another --listen port)"
                    }
                    io::ErrorKind::PermissionDenied => " (ports below 1024 need root)",
                    _ => "",
                };
                EngineError::Usage(format!("cannot listen on {a}: {e}{hint}"))
            })?;
            listeners.push(l);
        }
        let (tls, fingerprint) = match &cfg.tls {
            Some(t) => (t.clone(), None),
            None => {
                let (id, created) = tls::Identity::load_or_create(&cfg.state_dir)?;
                if created {
                    tracing::info!(
                        "made a new identity in {}: {}",
                        cfg.state_dir.display(),
                        id.fingerprint()
                    );
                }
                (tls::server_config(&id)?, Some(id.fingerprint()))
            }
        };
        let slots = Slots::new(cfg.max_tests, cfg.max_queued);
        Ok(Server {
            listeners,
            shared: Arc::new(Shared {
                cfg,
                tls,
                fingerprint,
                host: sock::hostname(),
                registry: Mutex::new(HashMap::new()),
                slots,
                connections: AtomicUsize::new(0),
                per_client: Mutex::new(HashMap::new()),
                next_test: AtomicU64::new(1),
                shutdown: AtomicBool::new(false),
            }),
        })
    }

    /// See [`ServerHandle::fingerprint`].
    pub fn fingerprint(&self) -> Option<String> {
        self.shared.fingerprint.clone()
    }

    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves on background threads.
    pub fn spawn(self) -> ServerHandle {
        let addrs = self.local_addrs();
        let shared = self.shared.clone();
        let threads = self
            .listeners
            .into_iter()
            .map(|l| {
                let sh = self.shared.clone();
                std::thread::Builder::new()
                    .name("lh-accept".into())
                    .spawn(move || accept_loop(&l, &sh))
                    .expect("spawn accept thread")
            })
            .collect();
        ServerHandle {
            addrs,
            shared,
            threads,
        }
    }

    /// Serves until the process ends.
    pub fn run(self) {
        self.spawn().threads.into_iter().for_each(|t| {
            let _ = t.join();
        });
    }
}

fn accept_loop(l: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let (stream, peer) = match l.accept() {
            Ok(x) => x,
            Err(e) => {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let open = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        if open > shared.cfg.max_connections {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                "refusing {peer}: {open} connections open, limit {}",
                shared.cfg.max_connections
            );
            // Plaintext: a TLS client sees the connection fail instead.
            let mut stream = stream;
            refuse_on(
                &mut stream,
                RefuseCode::Busy,
                "server has too many open connections; try again later",
            );
            continue;
        }
        let ip = client_key(peer.ip());
        let mine = {
            let mut m = shared.per_client.lock().expect("poisoned");
            let n = m.entry(ip).or_insert(0);
            *n += 1;
            *n
        };
        let release = move |sh: &Shared| {
            sh.connections.fetch_sub(1, Ordering::SeqCst);
            let mut m = sh.per_client.lock().expect("poisoned");
            if let Some(n) = m.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        };
        if mine > shared.cfg.max_per_client {
            release(shared);
            tracing::warn!(
                "refusing {peer}: {mine} connections from {ip} (IPv6: its /64), limit {}",
                shared.cfg.max_per_client
            );
            let mut stream = stream;
            refuse_on(
                &mut stream,
                RefuseCode::Busy,
                "too many connections from your address; try again later",
            );
            continue;
        }
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("lh-conn".into())
            .spawn(move || {
                handle_connection(&sh, stream, peer);
                release(&sh);
            });
        if let Err(e) = spawned {
            release(shared);
            tracing::error!("cannot start a thread for {peer}: {e}");
        }
    }
}

/// Writes a refusal on a stream (TLS or not) with a short time-out.
fn refuse_on(stream: &mut dyn Stream, code: RefuseCode, message: &str) {
    let mut out = Vec::new();
    if Message::Refuse(Refuse {
        code,
        message: message.into(),
    })
    .encode(&mut out)
    .is_ok()
    {
        let _ = stream
            .tcp()
            .set_write_timeout(Some(Duration::from_millis(200)));
        let _ = stream.write_all(&out).and_then(|()| stream.flush());
        let _ = stream.close_write();
    }
}

/// After a refusal: take (and drop) what the client is still sending, for
/// a moment, so that closing does not reset the connection and destroy
/// the refusal before the client reads it.
fn linger(stream: &mut dyn Stream) {
    let until = Instant::now() + Duration::from_millis(300);
    let mut buf = [0u8; 4096];
    let mut taken = 0usize;
    while taken < 256 << 10 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.tcp().set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => taken += n,
        }
    }
}

/// Reads from a stream with one deadline for the whole read, so a client
/// that trickles bytes (slowloris) cannot extend it. While `hold` says so
/// the deadline moves on by `grace`: a client with a request in the queue
/// keeps the data streams it opened early until its turn comes.
struct DeadlineReader<'a> {
    stream: &'a mut dyn Stream,
    deadline: Instant,
    hold: &'a dyn Fn() -> bool,
    grace: Duration,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if !(self.hold)() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                self.deadline = Instant::now() + self.grace;
                left = self.grace;
            }
            self.stream.tcp().set_read_timeout(Some(left))?;
            match self.stream.read(buf) {
                Err(e) if crate::stream::transient(&e) => continue,
                r => return r,
            }
        }
    }
}

/// Takes a new connection into TLS, or into plaintext if the client asks
/// for it and this server allows it; refuses anything else.
fn secure(
    shared: &Shared,
    tcp: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<Box<dyn Stream>> {
    let mut first = [0u8; 1];
    let _ = tcp.set_read_timeout(Some(shared.cfg.limits.handshake_timeout));
    match tcp.peek(&mut first) {
        Ok(1) if first[0] == tls::TLS_RECORD_HANDSHAKE => {
            match tls::accept(&shared.tls, tcp, deadline) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("closing {peer}: {}", escaped(&e.to_string()));
                    None
                }
            }
        }
        Ok(1) if first[0] == MAGIC[0] && shared.cfg.allow_plaintext => Some(Box::new(tcp)),
        Ok(1) if first[0] == MAGIC[0] => {
            tracing::warn!("refusing {peer}: plaintext, and this server requires TLS");
            let mut tcp = tcp;
            refuse_on(
                &mut tcp,
                RefuseCode::TlsRequired,
                "this server requires TLS: run the client without --insecure-plaintext (plaintext needs --allow-plaintext on the server too)",
            );
            linger(&mut tcp);
            None
        }
        Ok(_) => {
            tracing::warn!("closing {peer}: neither TLS nor longhaul");
            let mut tcp = tcp;
            refuse_on(
                &mut tcp,
                RefuseCode::Protocol,
                "not a longhaul client (expected TLS or the LONGHAUL preamble)",
            );
            None
        }
        Err(e) => {
            tracing::warn!("closing {peer}: nothing received: {e}");
            None
        }
    }
}

fn session_config(shared: &Shared) -> ServerConfig {
    ServerConfig {
        limits: shared.cfg.limits.clone(),
        software: crate::software(),
        host: shared.host.clone(),
        buffers: sock::buffer_caps(),
    }
}

fn handle_connection(shared: &Arc<Shared>, tcp: TcpStream, peer: SocketAddr) {
    let now = Instant::now();
    let deadline = now + shared.cfg.limits.handshake_timeout;
    let Some(mut stream) = secure(shared, tcp, peer, deadline) else {
        return;
    };
    let mut session = ServerSession::new(now, session_config(shared));
    let client = client_key(peer.ip());
    let hold = || shared.slots.waiting_from(client);
    let mut reader = DeadlineReader {
        stream: &mut *stream,
        deadline,
        hold: &hold,
        grace: shared.cfg.limits.handshake_timeout,
    };
    let hello = read_one_frame(&mut reader, true, HANDSHAKE_MAX_FRAME)
        .and_then(|f| Message::decode(&f).map_err(EngineError::from));
    let hello = match hello {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("closing {peer}: bad handshake: {}", escaped(&e.to_string()));
            if matches!(e, EngineError::Proto(_)) {
                refuse_on(&mut *stream, RefuseCode::Protocol, &e.to_string());
            }
            return;
        }
    };
    // Who this is, before anything else is looked at.
    let access = match &hello {
        Message::Hello(Hello {
            role: Role::Control,
            token,
            ..
        }) => {
            let raw_token_in_clear = !stream.is_tls()
                && token
                    .as_deref()
                    .is_some_and(|t| crate::proof::parse(t).is_none());
            let who = if raw_token_in_clear {
                // Already seen by anyone on the path: never accepted.
                Err("this client sent its token in the clear over plaintext: it is refused, and should be revoked (`longhaul token revoke ID`) and replaced; use TLS, or a client that sends a proof of it".to_string())
            } else if shared.cfg.open_access {
                Ok(auth::Access::everything("anyone (open server)"))
            } else {
                auth::authenticate(
                    &shared.cfg.state_dir,
                    token.as_deref(),
                    stream.peer_fingerprint().as_deref(),
                    shared.cfg.public_perf,
                )
            };
            match who {
                Ok(a) => Some(a),
                Err(message) => {
                    tracing::warn!("refusing {peer}: {}", escaped(&message));
                    refuse_on(&mut *stream, RefuseCode::Unauthorized, &message);
                    linger(&mut *stream);
                    return;
                }
            }
        }
        _ => None,
    };
    match session.handle(Instant::now(), hello) {
        Ok(Some(ServerEvent::DataStream {
            token,
            stream: index,
            direction,
        })) => {
            // The handshake's time-out would stay on the socket and make
            // every blocking read arm a timer.
            let _ = stream.tcp().set_read_timeout(None);
            let tx = shared
                .registry
                .lock()
                .expect("poisoned")
                .get(&token)
                .cloned();
            let attached = match tx {
                Some(tx) => tx
                    .send(Attach {
                        stream,
                        index,
                        direction,
                    })
                    .map_err(|e| e.0.stream),
                None => Err(stream),
            };
            if let Err(mut stream) = attached {
                tracing::warn!("closing {peer}: data stream for an unknown test");
                refuse_on(
                    &mut *stream,
                    RefuseCode::UnknownTest,
                    "no test with that token on this server",
                );
            }
        }
        Ok(_) => {
            let _ = stream.tcp().set_nodelay(true);
            let access = access.unwrap_or_else(|| auth::Access::anonymous(false));
            tracing::debug!("{peer} is {}", access.who);
            let mut conn = FramedConn::new(stream, peer.to_string());
            if let Err(e) = control_loop(shared, &mut conn, &mut session, &access) {
                match e {
                    EngineError::Closed(_) => {
                        tracing::debug!("{peer} closed its control connection")
                    }
                    e => tracing::warn!("closing session of {peer}: {}", escaped(&e.to_string())),
                }
            }
            flush(&mut conn, &mut session);
        }
        Err(e) => {
            tracing::warn!("closing {peer}: {}", escaped(&e.to_string()));
            let mut conn = FramedConn::new(stream, peer.to_string());
            flush(&mut conn, &mut session);
        }
    }
}

fn flush(conn: &mut FramedConn, session: &mut ServerSession) {
    while let Some(m) = session.poll_transmit() {
        if conn.send(&m).is_err() {
            break;
        }
    }
}

/// A test this control connection owns, from acceptance to results.
struct Test {
    params: TestParams,
    token: String,
    rx: Receiver<Attach>,
    tcp: Vec<ReadyStream>,
    udp: Vec<(Direction, u16, UdpSocket, bool)>,
    ready: bool,
    run: Option<SideRun>,
    ticker: Option<Ticker>,
    baseline: Option<longhaul_proto::report::SideSnapshot>,
    /// Of this side's sending TCP streams, how many send (the client's
    /// tuner says, `Active`); all until it does.
    active: Option<Arc<std::sync::atomic::AtomicU16>>,
    /// The control connection's address: UDP streams register from there
    /// or not at all.
    peer: Option<IpAddr>,
    /// Registrations ignored because they came from elsewhere.
    strangers: u64,
    _guard: TestGuard,
}

/// Frees the test's slot and token however the test ends.
struct TestGuard {
    shared: Arc<Shared>,
    token: String,
    _slot: SlotGuard,
}

impl Drop for TestGuard {
    fn drop(&mut self) {
        self.shared
            .registry
            .lock()
            .expect("poisoned")
            .remove(&self.token);
    }
}

fn new_token() -> String {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).expect("the OS random source");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn control_loop(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    session: &mut ServerSession,
    access: &auth::Access,
) -> Result<(), EngineError> {
    let mut test: Option<Test> = None;
    loop {
        while let Some(m) = session.poll_transmit() {
            conn.send(&m)?;
        }
        if session.is_closed() {
            return Ok(());
        }
        let now = Instant::now();
        session.handle_timeout(now)?;
        if let Some(t) = &mut test {
            attach_streams(t);
            let all_in = t.tcp.len() + t.udp.len() == stream_keys(&t.params).len()
                && t.udp.iter().all(|u| u.3);
            if !t.ready && all_in {
                t.ready = true;
                let caps = sock::buffer_caps();
                session.ready(Ready {
                    streams: setups(t),
                    rmem_max: caps.rmem_max,
                    wmem_max: caps.wmem_max,
                });
                continue;
            }
            if let Some(run) = &t.run {
                for tick in t.ticker.as_mut().expect("set with run").due(now) {
                    let snapshot = run.snapshot();
                    match tick {
                        Tick::Baseline => t.baseline = Some(snapshot),
                        Tick::Interval { index, omitted } => session.interval(SideInterval {
                            index,
                            omitted,
                            snapshot,
                        }),
                    }
                }
                if run.finished() {
                    let end = run.snapshot();
                    let baseline = match t.ticker.as_ref().is_some_and(Ticker::baseline_pending) {
                        true => Some(end.clone()),
                        false => t.baseline.take(),
                    };
                    let error = run.error();
                    tracing::info!(
                        "test of {} finished: {} bytes{}",
                        conn.peer(),
                        end.streams.iter().map(|s| s.bytes).sum::<u64>(),
                        error
                            .as_deref()
                            .map(|e| format!(", {}", escaped(e)))
                            .unwrap_or_default()
                    );
                    session.results(
                        Instant::now(),
                        PeerResults {
                            baseline,
                            end,
                            error,
                        },
                    );
                    test = None;
                    continue;
                }
            }
        }
        let wait = if test.is_some() {
            crate::CONTROL_TICK
        } else {
            session
                .poll_timeout()
                .map_or(Duration::from_millis(200), |d| {
                    d.saturating_duration_since(now)
                })
                .min(Duration::from_millis(200))
        };
        let msg = match conn.recv(wait) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e @ EngineError::Proto(_)) => {
                session.refuse(RefuseCode::Protocol, e.to_string());
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        match session.handle(Instant::now(), msg) {
            Ok(Some(ServerEvent::TestRequested(_) | ServerEvent::ThirdPartyRequested(_)))
                if !access.perf =>
            {
                tracing::warn!("refusing a test from {}: not authenticated", conn.peer());
                session.refuse(
                    RefuseCode::Unauthorized,
                    "this server runs perf tests for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN".to_string(),
                );
            }
            Ok(Some(ServerEvent::TestRequested(p))) => {
                match new_test(shared, conn, p.clone(), access) {
                    Ok((t, accept)) => {
                        tracing::info!(
                            "test {} from {}: {:?} {:?}, {} stream(s)",
                            accept.test_id,
                            conn.peer(),
                            p.transport,
                            p.mode,
                            p.streams
                        );
                        session.accept_test(Instant::now(), accept);
                        test = Some(t);
                    }
                    Err((code, message)) => {
                        tracing::warn!("refusing test from {}: {}", conn.peer(), escaped(&message));
                        session.refuse(code, message);
                    }
                }
            }
            Ok(Some(ServerEvent::Start)) => {
                if let Some(t) = &mut test {
                    let mut streams = std::mem::take(&mut t.tcp);
                    for (direction, stream, u, _) in t.udp.drain(..) {
                        streams.push(ReadyStream {
                            direction,
                            stream,
                            socket: DataSocket::Udp(Arc::new(u)),
                            io: None,
                        });
                    }
                    // A TCP test this side sends in may be tuned by the client.
                    t.active = (t.params.transport == Transport::Tcp && t.params.mode != Mode::Up)
                        .then(|| Arc::new(std::sync::atomic::AtomicU16::new(t.params.streams)));
                    match SideRun::start(
                        End::Server,
                        &t.params,
                        streams,
                        t.params.server_cpu,
                        &t.token,
                        t.active.clone(),
                    ) {
                        Ok(run) => {
                            t.ticker = Some(Ticker::new(run.start, &t.params));
                            t.run = Some(run);
                        }
                        Err(e) => {
                            session.refuse(
                                RefuseCode::ServerError,
                                format!("failed to start the test: {e}"),
                            );
                        }
                    }
                }
            }
            Ok(Some(ServerEvent::Active(n))) => {
                if let Some(a) = test.as_ref().and_then(|t| t.active.as_ref()) {
                    let most = test.as_ref().map_or(1, |t| t.params.streams);
                    a.store(n.clamp(1, most.max(1)), Ordering::Relaxed);
                }
            }
            Ok(Some(ServerEvent::Stop(reason))) => {
                tracing::info!("{} stops its test: {}", conn.peer(), escaped(&reason));
                if let Some(run) = test.as_ref().and_then(|t| t.run.as_ref()) {
                    run.stop();
                }
            }
            Ok(Some(ServerEvent::ThirdPartyRequested(mut req))) => {
                let capped = match access.is_anonymous() {
                    true => public_caps(&shared.cfg, &mut req.params),
                    false => Ok(()),
                };
                match capped {
                    Ok(()) => {
                        third_party(shared, conn, &req, access);
                        session.finish(Instant::now());
                    }
                    Err(message) => {
                        tracing::warn!("refusing a test from {}: {message}", conn.peer());
                        session.refuse(RefuseCode::Limit, message);
                    }
                }
            }
            Ok(Some(ServerEvent::TransferRequested(t))) => {
                match serve_transfer(shared, conn, &t, access) {
                    Ok(()) => session.finish(Instant::now()),
                    Err(Refusal::Refuse(code, message)) => {
                        tracing::warn!(
                            "refusing transfer from {}: {}",
                            conn.peer(),
                            escaped(&message)
                        );
                        session.refuse(code, message);
                    }
                    Err(Refusal::Failed(e)) => {
                        return Err(EngineError::Failed(format!("transfer failed: {e}")));
                    }
                }
            }
            Ok(Some(ServerEvent::ListRequested(l))) => match serve_list(shared, conn, &l, access) {
                Ok(()) => session.finish(Instant::now()),
                Err((code, message)) => {
                    session.refuse(code, message);
                }
            },
            Ok(Some(ServerEvent::ProbeRequested(_))) if access.is_anonymous() => {
                tracing::warn!("refusing a probe from {}: not authenticated", conn.peer());
                session.refuse(
                    RefuseCode::Unauthorized,
                    "this server answers probes (longhaul doctor) for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN".to_string(),
                );
            }
            Ok(Some(ServerEvent::ProbeRequested(p))) => {
                // A probe benchmarks storage and CPU: it takes a slot.
                let probed = take_slot(shared, conn, access)
                    .and_then(|_slot| serve_probe(shared, conn, &p, access));
                match probed {
                    Ok(()) => session.finish(Instant::now()),
                    Err((code, message)) => {
                        tracing::warn!(
                            "refusing probe from {}: {}",
                            conn.peer(),
                            escaped(&message)
                        );
                        session.refuse(code, message);
                    }
                }
            }
            Ok(Some(ServerEvent::DataStream { .. })) | Ok(None) => {}
            Err(e) => {
                if let Some(run) = test.as_ref().and_then(|t| t.run.as_ref()) {
                    run.stop();
                }
                return Err(EngineError::Failed(format!("session ended: {e}")));
            }
        }
    }
}

/// Takes a slot for a test or transfer (waiting its turn in the queue) and
/// a token its data streams present; both are given back when the guard
/// drops.
fn register(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    access: &auth::Access,
) -> Result<(TestGuard, Receiver<Attach>), (RefuseCode, String)> {
    let slot = take_slot(shared, conn, access)?;
    let guard = TestGuard {
        shared: shared.clone(),
        token: new_token(),
        _slot: slot,
    };
    let (tx, rx) = mpsc::channel();
    shared
        .registry
        .lock()
        .expect("poisoned")
        .insert(guard.token.clone(), tx);
    Ok((guard, rx))
}

fn new_test(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    mut p: TestParams,
    access: &auth::Access,
) -> Result<(Test, TestAccept), (RefuseCode, String)> {
    if let Some(cc) = &p.congestion {
        sock::check_congestion(cc).map_err(|m| (RefuseCode::BadRequest, m))?;
    }
    if access.is_anonymous() {
        public_caps(&shared.cfg, &mut p).map_err(|m| (RefuseCode::Limit, m))?;
    }
    let p = &p;
    let (guard, rx) = register(shared, conn, access)?;
    let guard_token = guard.token.clone();
    let mut udp_sockets = Vec::new();
    let mut ports = Vec::new();
    if p.transport == Transport::Udp {
        let local_ip = conn
            .tcp()
            .local_addr()
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))?
            .ip();
        for (d, i) in stream_keys(p) {
            let u = UdpSocket::bind(SocketAddr::new(local_ip, 0)).map_err(|e| {
                (
                    RefuseCode::ServerError,
                    format!("failed to bind a UDP socket on {local_ip}: {e}"),
                )
            })?;
            if let Some(w) = p.window {
                let r = socket2::SockRef::from(&u);
                let _ = r.set_send_buffer_size(w as usize);
                let _ = r.set_recv_buffer_size(w as usize);
            }
            u.set_nonblocking(true)
                .map_err(|e| (RefuseCode::ServerError, e.to_string()))?;
            ports.push(
                u.local_addr()
                    .map_err(|e| (RefuseCode::ServerError, e.to_string()))?
                    .port(),
            );
            udp_sockets.push((d, i, u, false));
        }
    }
    let test_id = shared.next_test.fetch_add(1, Ordering::SeqCst);
    Ok((
        Test {
            params: p.clone(),
            token: guard_token.clone(),
            rx,
            tcp: Vec::new(),
            udp: udp_sockets,
            ready: false,
            run: None,
            active: None,
            ticker: None,
            baseline: None,
            peer: peer_ip(conn),
            strangers: 0,
            _guard: guard,
        },
        TestAccept {
            test_id,
            token: guard_token,
            udp_ports: ports,
        },
    ))
}

enum Refusal {
    /// Refused before anything moved: the client is told why.
    Refuse(RefuseCode, String),
    /// Failed after it started.
    Failed(EngineError),
}

fn export<'a>(
    shared: &'a Shared,
    name: &str,
    access: &auth::Access,
) -> Result<&'a Export, (RefuseCode, String)> {
    shared.cfg.exports.iter().find(|e| e.name == name).ok_or_else(|| {
        // Only the names this client may see.
        let names: Vec<&str> = shared
            .cfg
            .exports
            .iter()
            .filter(|e| access.check_read(e).is_ok())
            .map(|e| e.name.as_str())
            .collect();
        (
            RefuseCode::BadRequest,
            if names.is_empty() {
                format!("no export named '{name}': this server exports nothing (start it with --export NAME=PATH)")
            } else {
                format!("no export named '{name}': this server exports {}", names.join(", "))
            },
        )
    })
}

/// Runs a transfer on this control connection: the server is the sink of
/// a push and the source of a pull.
fn serve_transfer(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    t: &TransferRequest,
    access: &auth::Access,
) -> Result<(), Refusal> {
    let refuse = |(c, m): (RefuseCode, String)| Refusal::Refuse(c, m);
    let ex = export(shared, &t.export, access).map_err(refuse)?;
    let allowed = match t.op {
        Op::Push => access.check_write(ex),
        Op::Pull => access.check_read(ex),
    };
    allowed.map_err(|m| Refusal::Refuse(RefuseCode::Unauthorized, m))?;
    let bad = |e: EngineError| Refusal::Refuse(RefuseCode::BadRequest, e.to_string());
    if t.op == Op::Push && ex.read_only {
        return Err(Refusal::Refuse(
            RefuseCode::BadRequest,
            format!("export '{}' is read-only", ex.name),
        ));
    }
    let roots = match t.op {
        Op::Push => Vec::new(),
        Op::Pull => {
            let mut roots = Vec::new();
            for p in &t.sources {
                let r = beneath(&ex.root, p).map_err(bad)?;
                confine(&ex.root, &r).map_err(bad)?;
                if std::fs::symlink_metadata(&r).is_err() {
                    return Err(Refusal::Refuse(
                        RefuseCode::BadRequest,
                        format!("{}:{} does not exist", ex.name, p),
                    ));
                }
                roots.push(r);
            }
            roots
        }
    };
    let dest = beneath(&ex.root, &t.dest).map_err(bad)?;
    confine(&ex.root, &dest).map_err(bad)?;
    // Everything this transfer touches resolves beneath the export root.
    let anchor = Anchor::open(&ex.root).map_err(bad)?;
    let landing = match t.op {
        Op::Push => {
            let slash = if t.dest_dir && !t.dest.is_empty() {
                "/"
            } else {
                ""
            };
            let shown = format!("{}/{}{slash}", ex.name, t.dest);
            prepare_dest(&anchor, &dest, &shown, t).map_err(bad)?
        }
        Op::Pull => longhaul_proto::xfer::Landing::Into,
    };
    let (guard, rx) = register(shared, conn, access).map_err(refuse)?;
    let max_files = crate::xfer::files_in_flight_cap();
    conn.send(&Message::TransferAccept(TransferAccept {
        token: guard.token.clone(),
        max_files_in_flight: Some(max_files),
    }))
    .map_err(Refusal::Failed)?;
    let deadline = Instant::now() + shared.cfg.limits.handshake_timeout;
    let mut streams = Vec::new();
    while streams.len() < usize::from(t.streams) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(a) => streams.push(a.stream),
            Err(_) => {
                return Err(Refusal::Failed(EngineError::Timeout(format!(
                    "{} of {} data streams connected",
                    streams.len(),
                    t.streams
                ))))
            }
        }
    }
    // The client sized the streams for the path; this side sends on a pull.
    let sending = t.op == Op::Pull;
    let mut cc = String::new();
    for s in &streams {
        match sock::tune_data_stream(sock::fd_of(s.tcp()), &t.tuning, sending) {
            Ok(c) => cc = c,
            Err(e) => tracing::warn!("failed to tune a data stream of {}: {e}", conn.peer()),
        }
    }
    tracing::info!(
        "{:?} of {} on export {} with {} stream(s), {cc}",
        t.op,
        conn.peer(),
        ex.name,
        t.streams
    );
    let storage: Arc<dyn Storage> = if t.direct {
        Arc::new(crate::xfer::storage::Direct)
    } else {
        shared.cfg.storage.clone()
    };
    let result = match t.op {
        Op::Push => run_sink(
            conn,
            streams,
            SinkConfig {
                digest_out: None,
                progress: Default::default(),
                landing,
                dest_shown: format!("{}/{}", ex.name, t.dest),
                dest,
                preserve: t.preserve,
                keep_special_modes: shared.cfg.keep_special_modes,
                force: t.force,
                sync_files: shared.cfg.sync_files,
                verify: t.verify,
                storage,
                umask: crate::xfer::umask(),
                delete: t.sync.as_ref().is_some_and(|s| s.delete),
                dry_run: t.dry_run,
                anchor,
                max_files,
            },
        )
        .map(|r| {
            tracing::info!(
                "received {} files, {} bytes, {} failed",
                r.files,
                r.bytes,
                r.failed.len()
            )
        }),
        Op::Pull => run_source(
            conn,
            streams,
            SourceConfig {
                dir_ends: t.sync.as_ref().is_some_and(|s| s.delete),
                digests: t.sync.as_ref().is_some_and(|s| s.checksum),
                digest_out: None,
                progress: Default::default(),
                roots,
                recursive: t.recursive,
                chunk_size: t.chunk_size,
                streams: t.streams,
                storage,
                anchor: Some(Arc::new(anchor)),
                online: t.tuning.online,
                send_intervals: t.tuning.intervals,
                rtt: Duration::from_micros(u64::from(
                    crate::sock::tcp_info(crate::sock::fd_of(conn.tcp()))
                        .map_or(0, |i| i.min_rtt_us),
                )),
                // As the client (the sink) sized them: an older client
                // says nothing and gets what every sink allowed.
                files_in_flight: t
                    .tuning
                    .files_in_flight
                    .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT),
                max_files_in_flight: t
                    .tuning
                    .max_files_in_flight
                    .unwrap_or(longhaul_proto::tune::DEFAULT_FILES_IN_FLIGHT)
                    .min(longhaul_proto::tune::MAX_FILES_IN_FLIGHT),
            },
        )
        .map(|r| {
            tracing::info!(
                "sent {} files, {} bytes, {} failed",
                r.files,
                r.bytes,
                r.failed.len()
            )
        }),
    };
    drop(guard);
    result.map_err(Refusal::Failed)
}

/// Answers `doctor`'s probe: this host's settings and, on the export, the
/// storage benchmark in a scratch directory (writes need write access).
fn serve_probe(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    p: &longhaul_proto::disk::ProbeRequest,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let t = p.tests;
    let touches = t.write || t.read || t.create || p.remove.is_some();
    let result = if touches {
        let ex = export(shared, &p.export, access)?;
        if t.write || t.create || p.remove.is_some() {
            if ex.read_only {
                return Err((
                    RefuseCode::Unauthorized,
                    format!(
                        "export '{}' is read-only: its storage can only be read",
                        ex.name
                    ),
                ));
            }
            access
                .check_write(ex)
                .map_err(|m| (RefuseCode::Unauthorized, m))?;
        } else {
            access
                .check_read(ex)
                .map_err(|m| (RefuseCode::Unauthorized, m))?;
        }
        let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
        // Through a descriptor opened beneath the export root, so a symlink
        // swapped in cannot take the benchmark outside it.
        let anchor = Anchor::open(&ex.root).map_err(bad)?;
        // A path that does not exist yet (where a transfer will create
        // it) is measured in the nearest directory above it that does.
        let mut used = p.path.trim_matches('/').to_string();
        let dir = loop {
            let path = beneath(&ex.root, &used).map_err(bad)?;
            confine(&ex.root, &path).map_err(bad)?;
            match anchor.dir(&path, false) {
                Ok(d) => break d,
                Err(e) if used.is_empty() => return Err(bad(e)),
                Err(_) => used = used.rsplit_once('/').map_or("", |(up, _)| up).to_string(),
            }
        };
        tracing::info!("{} probes {}:{}", conn.peer(), ex.name, escaped(&used));
        let mut r = crate::doctor::serve_probe(&dir.path(), p, peer_ip(conn)).map_err(|e| {
            (
                RefuseCode::ServerError,
                format!("probing {}:{used}: {e}", ex.name),
            )
        })?;
        if used != p.path.trim_matches('/') {
            r.report.warnings.push(format!(
                "{} does not exist yet: measured in {}:/{used}, the nearest directory above it",
                p.path, ex.name
            ));
        }
        // Named as the client knows it, not by the descriptor used.
        r.report.path = format!("{}:{used}", ex.name);
        r.dir = Some(used);
        r
    } else {
        crate::doctor::serve_probe(std::path::Path::new("/"), p, peer_ip(conn))
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))?
    };
    conn.send(&Message::ProbeResult(Box::new(result)))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}

/// Answers `ls`: the entries of a directory (or the one file), in batches.
fn serve_list(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    l: &ListRequest,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let ex = export(shared, &l.export, access)?;
    access
        .check_read(ex)
        .map_err(|m| (RefuseCode::Unauthorized, m))?;
    let path = beneath(&ex.root, &l.path).map_err(|e| (RefuseCode::BadRequest, e.to_string()))?;
    confine(&ex.root, &path).map_err(|e| (RefuseCode::BadRequest, e.to_string()))?;
    // Looked at through descriptors opened beneath the export root.
    let bad = |e: EngineError| (RefuseCode::BadRequest, e.to_string());
    let anchor = Anchor::open(&ex.root).map_err(bad)?;
    let at = anchor.anchored(&path).map_err(bad)?;
    let meta = std::fs::symlink_metadata(&at).map_err(|e| {
        (
            RefuseCode::BadRequest,
            format!("cannot list {}:{}: {e}", ex.name, l.path),
        )
    })?;
    let entry = |name: String, m: &std::fs::Metadata| ListEntry {
        name,
        kind: kind_of(m).unwrap_or(Kind::File),
        size: m.len(),
        mode: std::os::unix::fs::MetadataExt::mode(m) & 0o7777,
        mtime_ns: mtime_ns(m),
    };
    let send = |conn: &mut FramedConn, entries: Vec<ListEntry>, done: bool| {
        conn.send(&Message::Listing(Listing { entries, done }))
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))
    };
    if !meta.is_dir() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return send(conn, vec![entry(name, &meta)], true);
    }
    let dir = anchor.dir(&path, false).map_err(bad)?;
    let rd = std::fs::read_dir(dir.path()).map_err(|e| {
        (
            RefuseCode::BadRequest,
            format!("cannot list {}:{}: {e}", ex.name, l.path),
        )
    })?;
    let mut batch = Vec::new();
    for de in rd.flatten() {
        if let Ok(m) = dir.join(de.file_name()).symlink_metadata() {
            batch.push(entry(de.file_name().to_string_lossy().into_owned(), &m));
        }
        if batch.len() == 1000 {
            send(conn, std::mem::take(&mut batch), false)?;
        }
    }
    send(conn, batch, true)
}

/// Takes data connections and UDP registrations that have arrived.
fn attach_streams(t: &mut Test) {
    while let Ok(a) = t.rx.try_recv() {
        let known = stream_keys(&t.params).contains(&(a.direction, a.index));
        let dup = t
            .tcp
            .iter()
            .any(|s| s.direction == a.direction && s.stream == a.index);
        let mut a = a;
        if t.ready || !known || dup || t.params.transport != Transport::Tcp {
            refuse_on(
                &mut *a.stream,
                RefuseCode::Protocol,
                "data stream index not part of this test",
            );
            continue;
        }
        let tuning = tuning_for(&t.params, End::Server.sends(a.direction));
        let s = socket2::SockRef::from(a.stream.tcp());
        if let Err(e) = sock::apply_tcp_ref(&s, &tuning) {
            tracing::warn!("failed to tune data stream: {e}");
        }
        let (socket, io) = match a.stream.into_plain() {
            Ok(tcp) => (tcp, None),
            Err(tls) => match tls.tcp().try_clone() {
                Ok(tcp) => (tcp, Some(tls)),
                Err(e) => {
                    tracing::warn!("failed to clone a data stream: {e}");
                    continue;
                }
            },
        };
        t.tcp.push(ReadyStream {
            direction: a.direction,
            stream: a.index,
            socket: DataSocket::Tcp(Arc::new(socket)),
            io,
        });
    }
    let tag = udp::tag_of(&t.token);
    let mut buf = [0u8; 128];
    let peer = t.peer.map(|ip| ip.to_canonical());
    for (_, _, u, registered) in t.udp.iter_mut().filter(|u| !u.3) {
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            // Only the control connection's host may register: data sent
            // anywhere else would make this server a reflector.
            if Some(from.ip().to_canonical()) != peer {
                t.strangers += 1;
                if t.strangers == 1 {
                    tracing::warn!(
                        "ignoring a UDP registration from {from}: the test's control connection is from {}",
                        t.peer.map_or_else(|| "an unknown address".into(), |p| p.to_string())
                    );
                }
                continue;
            }
            let ok = udp::Header::read(&buf[..n])
                .is_some_and(|h| h.tag == tag && h.flags & udp::FLAG_REGISTER != 0)
                && &buf[udp::HEADER_LEN.min(n)..n] == t.token.as_bytes();
            if ok && u.connect(from).is_ok() {
                let _ = u.set_nonblocking(false);
                *registered = true;
                break;
            }
        }
    }
}

fn setups(t: &Test) -> Vec<StreamSetup> {
    let mut out: Vec<StreamSetup> = t
        .tcp
        .iter()
        .filter_map(|s| match &s.socket {
            DataSocket::Tcp(tcp) => {
                let (sndbuf, rcvbuf, mss) = sock::granted(tcp.as_fd());
                Some(StreamSetup {
                    direction: s.direction,
                    stream: s.stream,
                    sndbuf,
                    rcvbuf,
                    mss,
                    congestion: sock::congestion(tcp.as_fd()),
                })
            }
            DataSocket::Udp(_) => None,
        })
        .collect();
    for (d, i, u, _) in &t.udp {
        let r = socket2::SockRef::from(u);
        out.push(StreamSetup {
            direction: *d,
            stream: *i,
            sndbuf: r.send_buffer_size().unwrap_or(0) as u64,
            rcvbuf: r.recv_buffer_size().unwrap_or(0) as u64,
            mss: 0,
            congestion: String::new(),
        });
    }
    out
}

/// Runs a test from this server to another and relays it to the
/// requester, while still listening to the requester: a stop or a closed
/// connection ends the run.
fn third_party(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    req: &ThirdParty,
    access: &auth::Access,
) {
    tracing::info!(
        "third-party test from {} to {}",
        conn.peer(),
        escaped(&req.target)
    );
    // Not queued: the requester waits for relays, not for a queue.
    let Some(_slot) = shared.slots.try_take(shared, &Claimant::of(access)) else {
        let (running, limit) = shared.slots.load();
        let _ = conn.send(&Message::Relay(Relay::Failed(Refuse {
            code: RefuseCode::Busy,
            message: format!(
                "server is running {running} tests and transfers, its limit (--max-tests {limit}); try again later"
            ),
        })));
        return;
    };
    // Connect to the target as the requester would: pin what it trusts
    // there, present its token, plaintext only if it uses plaintext.
    let opts = ClientOptions {
        security: crate::client::Security {
            plaintext: req.plaintext,
            trust: tls::TrustOptions {
                pins: req.trust.clone(),
                ..Default::default()
            },
            token: req.token.clone(),
        },
        ..ClientOptions::default()
    };
    let interrupt = opts.interrupt.clone();
    let (tx, rx) = mpsc::channel::<Relay>();
    let (target, params) = (req.target.clone(), req.params.clone());
    let worker = std::thread::Builder::new()
        .name("lh-3rd".into())
        .spawn(move || {
            let mut sink = RelaySink(|r: Relay| {
                let _ = tx.send(r);
            });
            if let Err(e) = run_perf(&target, &params, &opts, &mut sink) {
                let code = match &e {
                    EngineError::Refused { code, .. } => *code,
                    _ => RefuseCode::ServerError,
                };
                let _ = tx.send(Relay::Failed(Refuse {
                    code,
                    message: e.to_string(),
                }));
            }
        });
    let Ok(worker) = worker else {
        let _ = conn.send(&Message::Relay(Relay::Failed(Refuse {
            code: RefuseCode::ServerError,
            message: "cannot start a thread for the test".into(),
        })));
        return;
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(r) => {
                if conn.send(&Message::Relay(r)).is_err() {
                    interrupt.store(true, Ordering::SeqCst);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        match conn.recv(Duration::from_millis(1)) {
            Ok(Some(Message::Stop(s))) => {
                tracing::info!(
                    "{} stops its third-party test: {}",
                    conn.peer(),
                    escaped(&s.reason)
                );
                interrupt.store(true, Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(_) => interrupt.store(true, Ordering::SeqCst),
        }
    }
    let _ = worker.join();
}

/// The client's address of a connection, if its peer name is one.
fn peer_ip(conn: &FramedConn) -> Option<std::net::IpAddr> {
    conn.peer()
        .parse::<std::net::SocketAddr>()
        .ok()
        .map(|a| a.ip())
}

/// Who a slot is shared out to: one grant, or every anonymous client
/// together.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claimant {
    key: String,
    anonymous: bool,
}

impl Claimant {
    fn of(access: &auth::Access) -> Claimant {
        Claimant {
            key: access.who.clone(),
            anonymous: access.is_anonymous(),
        }
    }
}

/// A claimant's waiting requests, in arrival order: (ticket, client).
struct Waiting {
    claimant: Claimant,
    tickets: VecDeque<(u64, IpAddr)>,
}

#[derive(Default)]
struct SlotState {
    running: usize,
    anonymous_running: usize,
    next_ticket: u64,
    /// Claimants with requests waiting, the next to be served first.
    queue: VecDeque<Waiting>,
    waiting: usize,
    /// Tickets given a slot whose waiter has not yet taken it, and
    /// whether the claimant is anonymous.
    granted: HashMap<u64, bool>,
}

/// The server's test slots (`--max-tests`) and the queue for them. A slot
/// that frees goes to the claimant at the head of a round robin (each
/// grant, and the anonymous clients together, served in turn; one
/// claimant's requests in arrival order); anonymous clients together hold
/// at most half the slots, rounded up, so that they cannot lock out every
/// token holder.
struct Slots {
    max: usize,
    anonymous_max: usize,
    max_queued: usize,
    state: Mutex<SlotState>,
    changed: Condvar,
}

/// Where a waiting request stands.
enum Turn {
    Granted,
    Waiting(Queued),
}

impl Slots {
    fn new(max: usize, max_queued: usize) -> Slots {
        Slots {
            max,
            anonymous_max: max.div_ceil(2),
            max_queued,
            state: Mutex::new(SlotState::default()),
            changed: Condvar::new(),
        }
    }

    /// (running, limit)
    fn load(&self) -> (usize, usize) {
        (self.state.lock().expect("poisoned").running, self.max)
    }

    /// Hands free slots to the waiting requests, round robin.
    fn dispatch(&self, st: &mut SlotState) {
        while st.running < self.max {
            let anonymous_full = st.anonymous_running >= self.anonymous_max;
            let Some(i) = st
                .queue
                .iter()
                .position(|w| !(w.claimant.anonymous && anonymous_full))
            else {
                break;
            };
            let mut w = st.queue.remove(i).expect("found");
            let (ticket, _) = w.tickets.pop_front().expect("never empty");
            st.waiting -= 1;
            st.running += 1;
            if w.claimant.anonymous {
                st.anonymous_running += 1;
            }
            st.granted.insert(ticket, w.claimant.anonymous);
            if !w.tickets.is_empty() {
                st.queue.push_back(w);
            }
            self.changed.notify_all();
        }
    }

    /// Queues a request; its slot may be granted at once. Refuses (with
    /// why) when the queue is full.
    fn enqueue(&self, c: &Claimant, client: IpAddr) -> Result<u64, String> {
        if self.max == 0 {
            return Err(
                "this server runs no tests or transfers: its limit is 0 (--max-tests 0)".into(),
            );
        }
        let mut st = self.state.lock().expect("poisoned");
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        match st.queue.iter_mut().find(|w| &w.claimant == c) {
            Some(w) => w.tickets.push_back((ticket, client)),
            None => st.queue.push_back(Waiting {
                claimant: c.clone(),
                tickets: VecDeque::from([(ticket, client)]),
            }),
        }
        st.waiting += 1;
        self.dispatch(&mut st);
        if !st.granted.contains_key(&ticket) && st.waiting > self.max_queued {
            let (running, waiting) = (st.running, st.waiting - 1);
            drop(st);
            self.withdraw(ticket);
            return Err(format!(
                "server is running {running} tests and transfers, its limit (--max-tests {}), and {waiting} more wait, its queue limit (--max-queued {}); try again later",
                self.max, self.max_queued
            ));
        }
        Ok(ticket)
    }

    /// A slot now, or None without queueing.
    fn try_take(&self, shared: &Arc<Shared>, c: &Claimant) -> Option<SlotGuard> {
        let ticket = self.enqueue(c, IpAddr::from([0, 0, 0, 0])).ok()?;
        match self.turn(ticket, Duration::ZERO) {
            Turn::Granted => Some(SlotGuard {
                shared: shared.clone(),
                anonymous: c.anonymous,
            }),
            Turn::Waiting(_) => {
                self.withdraw(ticket);
                None
            }
        }
    }

    /// Waits up to `wait` for the ticket's slot; takes it if granted.
    fn turn(&self, ticket: u64, wait: Duration) -> Turn {
        let mut st = self.state.lock().expect("poisoned");
        if !wait.is_zero() && !st.granted.contains_key(&ticket) {
            st = self.changed.wait_timeout(st, wait).expect("poisoned").0;
        }
        if st.granted.remove(&ticket).is_some() {
            return Turn::Granted;
        }
        let mut q = Queued {
            position: 1,
            running: st.running as u32,
            limit: self.max as u32,
            reason: String::new(),
        };
        let mine = st.queue.iter().enumerate().find_map(|(i, w)| {
            let k = w.tickets.iter().position(|t| t.0 == ticket)?;
            Some((i, k, w.claimant.anonymous))
        });
        if let Some((i, k, anonymous)) = mine {
            // Round robin: each claimant ahead in the rotation serves one
            // more than those behind it before this one's turn.
            let ahead: usize = st
                .queue
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(j, w)| w.tickets.len().min(k + usize::from(j < i)))
                .sum();
            q.position = (ahead + k + 1) as u32;
            if anonymous && st.anonymous_running >= self.anonymous_max {
                q.reason = format!(
                    "anonymous clients may hold {} of the {} slots, and do",
                    self.anonymous_max, self.max
                );
            }
        }
        Turn::Waiting(q)
    }

    /// Leaves the queue (or gives back a slot granted meanwhile).
    fn withdraw(&self, ticket: u64) {
        let mut st = self.state.lock().expect("poisoned");
        if let Some(anonymous) = st.granted.remove(&ticket) {
            drop(st);
            self.release(anonymous);
            return;
        }
        for w in st.queue.iter_mut() {
            if let Some(k) = w.tickets.iter().position(|t| t.0 == ticket) {
                w.tickets.remove(k);
                st.waiting -= 1;
                break;
            }
        }
        st.queue.retain(|w| !w.tickets.is_empty());
        self.dispatch(&mut st);
    }

    fn release(&self, anonymous: bool) {
        let mut st = self.state.lock().expect("poisoned");
        st.running = st.running.saturating_sub(1);
        if anonymous {
            st.anonymous_running = st.anonymous_running.saturating_sub(1);
        }
        self.dispatch(&mut st);
        self.changed.notify_all();
    }

    /// Has a client (by [`client_key`]) a request waiting?
    fn waiting_from(&self, client: IpAddr) -> bool {
        let st = self.state.lock().expect("poisoned");
        st.queue
            .iter()
            .any(|w| w.tickets.iter().any(|t| t.1 == client))
    }
}

/// A test slot, given back when dropped.
struct SlotGuard {
    shared: Arc<Shared>,
    anonymous: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.slots.release(self.anonymous);
    }
}

/// How often a queued client hears that it still waits.
const QUEUE_KEEPALIVE: Duration = Duration::from_secs(2);

/// Takes a slot for this connection's request, waiting in the queue while
/// none is free: the client is told it waits (and reminded every few
/// seconds); a client that closes its connection leaves the queue.
fn take_slot(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    access: &auth::Access,
) -> Result<SlotGuard, (RefuseCode, String)> {
    let claimant = Claimant::of(access);
    let client = peer_ip(conn).map_or(IpAddr::from([0, 0, 0, 0]), client_key);
    let ticket = shared
        .slots
        .enqueue(&claimant, client)
        .map_err(|m| (RefuseCode::Busy, m))?;
    let granted = || SlotGuard {
        shared: shared.clone(),
        anonymous: claimant.anonymous,
    };
    let mut told: Option<Instant> = None;
    let mut wait = Duration::ZERO;
    loop {
        match shared.slots.turn(ticket, wait) {
            Turn::Granted => {
                if told.is_some() {
                    tracing::info!("{} got its slot", conn.peer());
                }
                return Ok(granted());
            }
            Turn::Waiting(q) if told.is_none_or(|t| t.elapsed() >= QUEUE_KEEPALIVE) => {
                if told.is_none() {
                    tracing::info!(
                        "{} ({}) waits for a slot: position {}, {} running, limit {}",
                        conn.peer(),
                        access.who,
                        q.position,
                        q.running,
                        q.limit
                    );
                }
                told = Some(Instant::now());
                if let Err(e) = conn.send(&Message::Queued(q)) {
                    shared.slots.withdraw(ticket);
                    return Err((RefuseCode::ServerError, format!("left the queue: {e}")));
                }
            }
            Turn::Waiting(_) => {}
        }
        wait = Duration::from_millis(100);
        // The client says nothing while it waits: anything else is the
        // connection closing (or a broken client), and ends the wait.
        let gone = match conn.recv(Duration::from_millis(1)) {
            Ok(None) => None,
            Ok(Some(m)) => Some((
                RefuseCode::Protocol,
                format!("unexpected {} message while queued", m.name()),
            )),
            Err(e) => Some((RefuseCode::ServerError, format!("left the queue: {e}"))),
        };
        if let Some(e) = gone {
            shared.slots.withdraw(ticket);
            return Err(e);
        }
    }
}

/// Holds an anonymous test to the public caps: refuses what asks for more
/// time or rate than they allow, and caps this side's sending to the rate
/// where the request left it open.
fn public_caps(cfg: &ServeConfig, p: &mut TestParams) -> Result<(), String> {
    use longhaul_proto::units::format_rate;
    let pass = "pass --token-file FILE or set LONGHAUL_TOKEN for more";
    let (rate, time) = (cfg.public_max_rate, cfg.public_max_time);
    let asked = Duration::from_millis(p.duration_ms.unwrap_or(0).saturating_add(p.omit_ms));
    if asked > time {
        return Err(format!(
            "anonymous tests on this server run at most {} s (--public-max-time), {} s asked; {pass}",
            time.as_secs(),
            asked.as_secs()
        ));
    }
    let most_bytes = (rate / 8).saturating_mul(time.as_secs().max(1));
    if p.bytes.is_some_and(|b| b > most_bytes) {
        return Err(format!(
            "anonymous tests on this server move at most {most_bytes} bytes per direction ({} for {} s), {} asked; {pass}",
            format_rate(rate as f64),
            time.as_secs(),
            p.bytes.unwrap_or(0)
        ));
    }
    for asked in [p.pacing_bps, p.udp_rate_bps].into_iter().flatten() {
        // 0 is no limit at all.
        if asked > rate || asked == 0 {
            let asked = match asked {
                0 => "no limit".to_string(),
                a => format_rate(a as f64),
            };
            return Err(format!(
                "anonymous tests on this server send at most {} per direction (--public-max-rate), {asked} asked; {pass}",
                format_rate(rate as f64),
            ));
        }
    }
    match p.transport {
        Transport::Tcp => p.pacing_bps = Some(p.pacing_bps.unwrap_or(rate)),
        Transport::Udp => p.udp_rate_bps = Some(p.udp_rate_bps.unwrap_or(rate)),
    }
    Ok(())
}

/// What the per-client connection cap counts by: an IPv4 address (also
/// when mapped into IPv6), or an IPv6 address's /64, which one host or
/// site usually has to itself.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6) & !((1u128 << 64) - 1),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_key_groups_ipv6_by_64_and_ipv4_by_address() {
        let k = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2:aaaa::1"), k("2001:db8:1:2:ffff:1:2:3"));
        assert_eq!(
            k("2001:db8:1:2::5"),
            "2001:db8:1:2::".parse::<IpAddr>().unwrap()
        );
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("192.0.2.7"), "192.0.2.7".parse::<IpAddr>().unwrap());
        assert_ne!(k("192.0.2.7"), k("192.0.2.8"));
        assert_eq!(k("::ffff:192.0.2.7"), k("192.0.2.7"));
    }

    fn who(key: &str, anonymous: bool) -> Claimant {
        Claimant {
            key: key.into(),
            anonymous,
        }
    }

    fn granted(s: &Slots, t: u64) -> bool {
        matches!(s.turn(t, Duration::ZERO), Turn::Granted)
    }

    #[test]
    fn slots_go_round_robin_between_grants_and_in_order_within_one() {
        let s = Slots::new(1, 64);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let first = s.enqueue(&who("a", false), ip).unwrap();
        assert!(granted(&s, first));
        let a: Vec<u64> = (0..3)
            .map(|_| s.enqueue(&who("a", false), ip).unwrap())
            .collect();
        let b = s.enqueue(&who("b", false), ip).unwrap();
        // b arrived after three of a's, but a grant is served in turn.
        let Turn::Waiting(q) = s.turn(b, Duration::ZERO) else {
            panic!("b has no slot yet")
        };
        assert_eq!(q.position, 2);
        let mut order = Vec::new();
        for _ in 0..4 {
            s.release(false);
            let next = a.iter().chain([&b]).copied().find(|&t| granted(&s, t));
            order.push(next.expect("one granted per release"));
        }
        assert_eq!(order, vec![a[0], b, a[1], a[2]]);
    }

    #[test]
    fn anonymous_clients_hold_at_most_half_the_slots() {
        let s = Slots::new(2, 64);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let anon: Vec<u64> = (0..3)
            .map(|_| s.enqueue(&who("anonymous", true), ip).unwrap())
            .collect();
        assert!(granted(&s, anon[0]));
        let Turn::Waiting(q) = s.turn(anon[1], Duration::ZERO) else {
            panic!("a second anonymous request got the other slot")
        };
        assert!(q.reason.contains("anonymous"), "{}", q.reason);
        let token = s.enqueue(&who("token 1", false), ip).unwrap();
        assert!(
            granted(&s, token),
            "the token holder waits behind anonymous ones"
        );
        // A withdrawn waiter leaves; the queue cap counts only waiters.
        s.withdraw(anon[2]);
        assert!(s.waiting_from(ip));
        s.withdraw(anon[1]);
        assert!(!s.waiting_from(ip));
        let full = Slots::new(1, 1);
        let t = full.enqueue(&who("a", false), ip).unwrap();
        assert!(granted(&full, t));
        full.enqueue(&who("a", false), ip).unwrap();
        let e = full.enqueue(&who("b", false), ip).unwrap_err();
        assert!(e.contains("--max-queued 1"), "{e}");
    }
}
