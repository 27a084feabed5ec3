//! `longhaul serve`: one listening port for control and data connections,
//! a thread per connection, and limits on connections, tests, streams and
//! duration. A misbehaving client loses its own session, never anyone
//! else's.
//!
//! This file accepts connections, secures them (TLS, or plaintext where
//! both ends allow it), authenticates ([`auth`]) and runs each control
//! session, handing each request to what serves it: a perf test
//! (`perf.rs`), a file transfer, listing or storage probe (`files.rs`), or
//! a third-party test (`third_party.rs`). Tests and transfers take a slot
//! first, waiting in a queue when all are in use (`slots.rs`).

pub mod auth;
pub mod copy;
mod durable;
mod files;
mod grant;
pub mod iperf3;
pub mod jobs;
pub mod observe;
pub mod oneshot;
mod perf;
mod slots;
mod third_party;

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::*;
use longhaul_proto::session::{Limits, ServerConfig, ServerEvent, ServerSession};
use longhaul_proto::tokenproof;
use longhaul_proto::units::escaped;

use crate::net::conn::{read_one_frame, FramedConn, Stream, HANDSHAKE_MAX_FRAME};
use crate::net::sock;
use crate::net::tls;
use crate::state;
use crate::xfer::storage::{Local, Storage};
use crate::xfer::Export;
use crate::EngineError;
use files::{serve_list, serve_probe, serve_transfer, Refusal};
use observe::{code_word, Failure, Observers, Outcome, Refused, RunKind, ServeObserver, Watch};
use perf::{new_test, Step, Test};
use slots::{take_slot, Slots};
use third_party::third_party;

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
    /// Refuse perf tests whose data would cross the network unencrypted
    /// (`--perf-tls-only`): plaintext TCP data streams, and UDP.
    pub perf_tls_only: bool,
    /// Keep setuid, setgid and sticky bits and world-writable directories
    /// that clients send with `-p` (`--keep-special-modes`); stripped
    /// otherwise.
    pub keep_special_modes: bool,
    /// Every client may do everything, without credentials (the demo's
    /// in-process server). Never set by `longhaul serve`.
    pub open_access: bool,
    /// Told of every session, test, transfer, refusal and failure
    /// (metrics, the archive): see [`observe`]. Never called per chunk.
    pub observers: Vec<Arc<dyn ServeObserver>>,
    /// A one-shot server's secret ([`oneshot`]): when set, it is the only
    /// credential a control connection may present (no grants, no token
    /// proofs, no anonymous session), and it admits one, once.
    pub one_time: Option<Arc<oneshot::OneTime>>,
    /// Take part in third-party copies (`--third-party-copies`): grant
    /// capabilities into this server's exports, and push to another server
    /// on an authenticated client's order (PROTOCOL.md 13.9).
    pub third_party_copies: bool,
    /// How the root of each named export is shown to clients, where not
    /// by its name: paths beneath an export read `NAME/path` in every
    /// refusal and failure, as a client names them; a one-shot server
    /// started over ssh shows its `/` as `/` and the home as `~`, as the
    /// user wrote them after `HOST:` ([`ServeConfig::show`]).
    pub shown_roots: Vec<(String, PathBuf)>,
    /// Takes jobs (`--jobs`): their messages go here ([`jobs::JobDesk`]).
    pub jobs: Option<Arc<dyn jobs::JobDesk>>,
}

impl ServeConfig {
    /// How the root of `ex` is named to clients.
    pub fn shown_root(&self, ex: &Export) -> PathBuf {
        self.shown_roots
            .iter()
            .find(|(name, _)| *name == ex.name)
            .map_or_else(|| PathBuf::from(&ex.name), |(_, shown)| shown.clone())
    }

    /// `rel` beneath export `ex`, as clients name it (`data/run7`, or
    /// over ssh `/tmp/run7`, `~/run7`).
    pub fn show(&self, ex: &Export, rel: &str) -> String {
        self.shown_root(ex)
            .join(rel.trim_start_matches('/'))
            .display()
            .to_string()
    }
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
            state_dir: state::default_state_dir(),
            tls: None,
            allow_plaintext: false,
            public_perf: false,
            perf_tls_only: false,
            keep_special_modes: false,
            open_access: false,
            observers: Vec::new(),
            one_time: None,
            third_party_copies: false,
            shown_roots: Vec::new(),
            jobs: None,
        }
    }
}

/// A data connection on its way to the test that owns its token.
struct Attach {
    stream: Box<dyn Stream>,
    index: u16,
    direction: Direction,
    /// Its proof of the test's data key (`Role::PerfData`); None when it
    /// joined by token.
    proof: Option<String>,
}

struct Shared {
    cfg: ServeConfig,
    tls: Arc<rustls::ServerConfig>,
    fingerprint: Option<String>,
    host: String,
    /// Tests and transfers by token, and whether data streams join them
    /// by proof of a data key (perf tests that have one) rather than by
    /// the token.
    registry: Mutex<HashMap<String, (Sender<Attach>, bool)>>,
    slots: Slots,
    connections: AtomicUsize,
    /// Open connections by [`client_key`].
    per_client: Mutex<HashMap<IpAddr, usize>>,
    next_test: AtomicU64,
    shutdown: AtomicBool,
    /// `cfg.observers`, shared with each run's [`Watch`].
    observers: Observers,
    /// Third-party copy capabilities issued and not yet revoked.
    capabilities: copy::Capabilities,
}

impl Shared {
    /// A configured export's name; None for a name that is no export (a
    /// client's made-up name never reaches an observer).
    fn export_label(&self, name: &str) -> Option<String> {
        self.cfg
            .exports
            .iter()
            .any(|e| e.name == name)
            .then(|| name.to_string())
    }

    /// Tells the observers of a refusal.
    fn refused(
        &self,
        what: &'static str,
        export: Option<&str>,
        grant: &str,
        code: RefuseCode,
        message: &str,
        client: &str,
    ) {
        if self.observers.is_empty() {
            return;
        }
        let r = Refused {
            what,
            export: export.and_then(|e| self.export_label(e)),
            grant: grant.to_string(),
            reason: code_word(code),
            message: message.to_string(),
            client: client.to_string(),
        };
        for o in self.observers.iter() {
            o.refused(&r);
        }
    }

    /// Tells the observers of a failure outside a test or transfer.
    fn failed(&self, stage: &'static str, grant: &str, message: &str, client: &str) {
        if self.observers.is_empty() {
            return;
        }
        let f = Failure {
            stage,
            export: None,
            grant: grant.to_string(),
            message: message.to_string(),
            client: client.to_string(),
        };
        for o in self.observers.iter() {
            o.error(&f);
        }
    }

    /// Starts watching a run (see [`Watch`]).
    fn watch(
        &self,
        kind: RunKind,
        client: &str,
        access: &auth::Access,
        export: Option<&str>,
        params: serde_json::Value,
    ) -> Watch {
        Watch::start(
            &self.observers,
            kind,
            client,
            access.grant_label(),
            export.and_then(|e| self.export_label(e)).as_deref(),
            params,
        )
    }
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
        let observers: Observers = cfg.observers.clone().into();
        // A one-shot server's state directory is its client's: it keeps nothing there.
        let cfg_state = match &cfg.one_time {
            Some(_) => PathBuf::new(),
            None => cfg.state_dir.clone(),
        };
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
                observers,
                capabilities: copy::Capabilities::load(
                    (!cfg_state.as_os_str().is_empty()).then_some(cfg_state),
                ),
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

/// The next connection `l` takes, or None once `shutdown` is set; a
/// failed accept (out of descriptors, say) is logged with `what` and
/// tried again after a pause.
pub(super) fn accept_next(
    l: &TcpListener,
    shutdown: &std::sync::atomic::AtomicBool,
    what: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        match l.accept() {
            _ if shutdown.load(Ordering::SeqCst) => return None,
            Ok(x) => return Some(x),
            Err(e) => {
                tracing::warn!("{what}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn accept_loop(l: &TcpListener, shared: &Arc<Shared>) {
    while let Some((stream, peer)) = accept_next(l, &shared.shutdown, "listener") {
        admit(shared, stream, peer);
    }
}

/// Serves a connection the server did not accept itself: one a one-shot
/// server opened back to its client ([`crate::net::back`]), served exactly
/// as if accepted.
#[derive(Clone)]
pub struct Injector(Arc<Shared>);

impl Injector {
    pub fn serve(&self, stream: TcpStream, peer: SocketAddr) {
        admit(&self.0, stream, peer);
    }
}

impl ServerHandle {
    /// See [`Injector`].
    pub fn injector(&self) -> Injector {
        Injector(self.shared.clone())
    }
}

/// A connection over one of the connection limits: told "busy" (in
/// plaintext: a TLS client sees the connection fail instead) and recorded.
fn refuse_busy(shared: &Shared, mut stream: TcpStream, peer: SocketAddr, why: &str) {
    refuse_on(&mut stream, RefuseCode::Busy, why);
    shared.refused(
        "connection",
        None,
        observe::ANONYMOUS,
        RefuseCode::Busy,
        why,
        &peer.to_string(),
    );
}

/// Takes a connection in: the limits, then a thread that serves it.
fn admit(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let open = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
    if open > shared.cfg.max_connections {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!(
            "refusing {peer}: {open} connections open, limit {}",
            shared.cfg.max_connections
        );
        let why = "server has too many open connections; try again later";
        refuse_busy(shared, stream, peer, why);
        return;
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
        let why = "too many connections from your address; try again later";
        refuse_busy(shared, stream, peer, why);
        return;
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
                Err(e) if crate::net::conn::transient(&e) => continue,
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
                    let e = escaped(&e.to_string()).to_string();
                    tracing::warn!("closing {peer}: {e}");
                    shared.failed("handshake", observe::ANONYMOUS, &e, &peer.to_string());
                    None
                }
            }
        }
        // Without --allow-plaintext only a perf data stream may stay in
        // plaintext; `plaintext_allowed` checks once its hello is in.
        Ok(1) if first[0] == MAGIC[0] => Some(Box::new(tcp)),
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

/// Why a data stream may not join the test or transfer its token names,
/// when that one joins by proof (`proven`) and the stream does not, or
/// the other way round.
fn wrong_join(proven: bool, proof: &Option<String>) -> Option<(RefuseCode, &'static str)> {
    match (proven, proof.is_some()) {
        (true, false) => Some((
            RefuseCode::Unauthorized,
            "this test's data streams join with a proof of its data key (role perf_data), not with the token",
        )),
        (false, true) => Some((
            RefuseCode::Protocol,
            "this test or transfer takes data streams by its token (role data), not by proof",
        )),
        _ => None,
    }
}

/// Whether a connection may go on after its hello: TLS always; plaintext
/// with `--allow-plaintext`, or when it is a perf data stream, which
/// carries no credential (its proof is bound to one stream of one test,
/// PROTOCOL.md 4.1) and which the test itself checks.
fn plaintext_allowed(shared: &Shared, stream: &dyn Stream, hello: &Message) -> bool {
    stream.is_tls()
        || shared.cfg.allow_plaintext
        || matches!(
            hello,
            Message::Hello(Hello {
                role: Role::PerfData { .. },
                ..
            })
        )
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
    let mut session = ServerSession::new(now, session_config(shared)).with_challenge(challenge());
    let client = client_key(peer.ip());
    let hold = || shared.slots.waiting_from(client);
    let reader = DeadlineReader {
        stream: &mut *stream,
        deadline,
        hold: &hold,
        grace: shared.cfg.limits.handshake_timeout,
    };
    let Some(hello) = handshake_message(shared, reader, true, peer) else {
        return;
    };
    if !plaintext_allowed(shared, &*stream, &hello) {
        refuse_plaintext(shared, &mut *stream, peer);
        return;
    }
    let Some(admitted) = identify(shared, &mut *stream, &mut session, hello, deadline, peer) else {
        return;
    };
    match admitted.event {
        Ok(Some(ServerEvent::DataStream {
            token,
            stream: index,
            direction,
            proof,
        })) => {
            let attach = Attach {
                stream,
                index,
                direction,
                proof,
            };
            attach_data_stream(shared, &token, attach, peer);
        }
        Ok(_) => {
            let access = admitted
                .access
                .unwrap_or_else(|| auth::Access::anonymous(false));
            run_session(shared, stream, &mut session, &access, peer);
            drop(admitted.one_shot_client);
        }
        Err(e) => {
            tracing::warn!("closing {peer}: {}", escaped(&e.to_string()));
            let mut conn = FramedConn::new(stream, peer.to_string());
            flush(&mut conn, &mut session);
        }
    }
}

/// Refuses a plaintext connection to a server that requires TLS.
fn refuse_plaintext(shared: &Shared, stream: &mut dyn Stream, peer: SocketAddr) {
    tracing::warn!("refusing {peer}: plaintext, and this server requires TLS");
    let why = "this server requires TLS: run the client without --insecure-plaintext (plaintext needs --allow-plaintext on the server too)";
    refuse_on(stream, RefuseCode::TlsRequired, why);
    let peer = peer.to_string();
    shared.refused(
        "connection",
        None,
        observe::ANONYMOUS,
        RefuseCode::TlsRequired,
        why,
        &peer,
    );
    linger(stream);
}

/// Refuses a connection whose client is not (or not any more) let in.
fn refuse_unauthorized(shared: &Shared, stream: &mut dyn Stream, peer: SocketAddr, message: &str) {
    tracing::warn!("refusing {peer}: {}", escaped(message));
    refuse_on(stream, RefuseCode::Unauthorized, message);
    let code = RefuseCode::Unauthorized;
    let peer = peer.to_string();
    shared.refused("connection", None, observe::ANONYMOUS, code, message, &peer);
    linger(stream);
}

/// A connection let in: what its hello asked, who it is (None: a data
/// stream, or a session without credentials), and a one-shot server's
/// claim on its one client (released when dropped).
struct Admitted {
    event: Result<Option<ServerEvent>, longhaul_proto::session::SessionError>,
    access: Option<auth::Access>,
    one_shot_client: Option<oneshot::Admitted>,
}

/// Decides who sent `hello`, before anything else is looked at: by its
/// token or capability, or after a challenge by the proof of its token.
/// None: refused (and told so) or gone.
fn identify(
    shared: &Arc<Shared>,
    stream: &mut dyn Stream,
    session: &mut ServerSession,
    hello: Message,
    deadline: Instant,
    peer: SocketAddr,
) -> Option<Admitted> {
    let (mut access, by_capability) = match hello_access(shared, stream, &hello) {
        Ok(who) => who,
        Err(message) => {
            refuse_unauthorized(shared, stream, peer, &message);
            return None;
        }
    };
    // A one-shot server admits its one client and nobody else: no proof
    // of a token, no anonymous session.
    let one_shot_client = match &shared.cfg.one_time {
        Some(_)
            if access.is_none()
                && matches!(
                    &hello,
                    Message::Hello(Hello {
                        role: Role::Control,
                        ..
                    })
                ) =>
        {
            refuse_unauthorized(
                shared,
                stream,
                peer,
                "this is a one-shot server: it admits only the one-time secret its client received over ssh",
            );
            return None;
        }
        // Ended (`finished`) when the connection's handler returns, however it does.
        Some(one_time) => {
            (access.is_some() && !by_capability).then(|| oneshot::Admitted::new(one_time.clone()))
        }
        None => None,
    };
    let mut event = session.handle(Instant::now(), hello);
    if let Ok(Some(ServerEvent::Challenged { .. })) = &event {
        match challenge_round(shared, stream, session, deadline, peer) {
            Ok(a) => {
                access = Some(a);
                event = Ok(None);
            }
            Err(Some(message)) => {
                refuse_unauthorized(shared, stream, peer, &message);
                return None;
            }
            Err(None) => return None,
        }
    }
    Some(Admitted {
        event,
        access,
        one_shot_client,
    })
}

/// Who a control session's hello says it is by its token or capability,
/// and whether a capability let it in; None for any other hello (a data
/// stream's, or one that will prove its token after a challenge). `Err`:
/// refused, with the words.
fn hello_access(
    shared: &Shared,
    stream: &dyn Stream,
    hello: &Message,
) -> Result<(Option<auth::Access>, bool), String> {
    let Message::Hello(Hello {
        role: Role::Control,
        token,
        token_id: None,
        ..
    }) = hello
    else {
        return Ok((None, false));
    };
    let raw_token_in_clear = !stream.is_tls()
        && token
            .as_deref()
            .is_some_and(|t| !t.starts_with(tokenproof::OLD_PROOF_PREFIX));
    if raw_token_in_clear {
        // Already seen by anyone on the path: never accepted.
        return Err("this client sent its token in the clear over plaintext: it is refused, and should be revoked (`longhaul token revoke ID`) and replaced; use TLS, or a client that sends a proof of it".to_string());
    }
    if copy::is_capability(token.as_deref()) {
        let a = shared
            .capabilities
            .admit(token.as_deref().unwrap_or_default())?;
        return Ok((Some(a), true));
    }
    let who = if let Some(one_time) = &shared.cfg.one_time {
        one_time.claim(token.as_deref())
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
    Ok((Some(who?), false))
}

/// Hands a data stream to the test or transfer its token names, or closes
/// it with the reason.
fn attach_data_stream(shared: &Shared, token: &str, mut attach: Attach, peer: SocketAddr) {
    // The handshake's time-out would stay on the socket and make
    // every blocking read arm a timer.
    let _ = attach.stream.tcp().set_read_timeout(None);
    let tx = shared
        .registry
        .lock()
        .expect("poisoned")
        .get(token)
        .cloned();
    // A proof joins only a test with a data key, and such a test
    // takes nothing else: a transfer's streams never go plaintext.
    if let Some((code, message)) = tx.as_ref().and_then(|t| wrong_join(t.1, &attach.proof)) {
        tracing::warn!("closing {peer}: {message}");
        refuse_on(&mut *attach.stream, code, message);
        return;
    }
    let attached = match tx {
        Some((tx, _)) => tx.send(attach).map_err(|e| e.0.stream),
        None => Err(attach.stream),
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

/// Runs an admitted client's control session to its end, telling the
/// observers of its start and end and of a failure.
fn run_session(
    shared: &Arc<Shared>,
    stream: Box<dyn Stream>,
    session: &mut ServerSession,
    access: &auth::Access,
    peer: SocketAddr,
) {
    let _ = stream.tcp().set_nodelay(true);
    tracing::debug!("{peer} is {}", access.who);
    let mut conn = FramedConn::new(stream, peer.to_string());
    let s = observe::Session {
        client: peer.to_string(),
        grant: access.grant_label().to_string(),
    };
    shared.observers.iter().for_each(|o| o.session_opened(&s));
    if let Err(e) = control_loop(shared, &mut conn, session, access) {
        match e {
            EngineError::Closed(_) => {
                tracing::debug!("{peer} closed its control connection")
            }
            e => {
                let e = escaped(&e.to_string()).to_string();
                tracing::warn!("closing session of {peer}: {e}");
                shared.failed("session", &s.grant, &e, &s.client);
            }
        }
    }
    flush(&mut conn, session);
    shared.observers.iter().for_each(|o| o.session_closed(&s));
}

/// A fresh challenge for a token proof, from the OS's CSPRNG.
fn challenge() -> [u8; tokenproof::CHALLENGE_LEN] {
    let mut c = [0u8; tokenproof::CHALLENGE_LEN];
    getrandom::fill(&mut c).expect("the OS random source");
    c
}

/// One message of the handshake (the first after the preamble if `first`),
/// read within the reader's deadline. None: it did not come or did not
/// decode, which is logged and counted, and a protocol error is told to
/// the peer.
fn handshake_message(
    shared: &Shared,
    mut reader: DeadlineReader<'_>,
    first: bool,
    peer: SocketAddr,
) -> Option<Message> {
    let message = read_one_frame(&mut reader, first, HANDSHAKE_MAX_FRAME)
        .and_then(|f| Message::decode(&f).map_err(EngineError::from));
    match message {
        Ok(m) => Some(m),
        Err(e) => {
            let message = format!("bad handshake: {}", escaped(&e.to_string()));
            tracing::warn!("closing {peer}: {message}");
            shared.failed("handshake", observe::ANONYMOUS, &message, &peer.to_string());
            if matches!(e, EngineError::Proto(_)) {
                refuse_on(reader.stream, RefuseCode::Protocol, &e.to_string());
            }
            None
        }
    }
}

/// The challenge round of a client that proves its token instead of
/// sending it (PROTOCOL.md 1.2): sends the session's challenge, reads the
/// proof under the handshake's deadline and checks it against the grants.
/// `Err(Some(why))` is for the caller to refuse as `unauthorized`;
/// `Err(None)`: the connection failed or broke the protocol (logged, and
/// told where it should hear why).
fn challenge_round(
    shared: &Shared,
    stream: &mut dyn Stream,
    session: &mut ServerSession,
    deadline: Instant,
    peer: SocketAddr,
) -> Result<auth::Access, Option<String>> {
    let mut out = Vec::new();
    while let Some(m) = session.poll_transmit() {
        m.encode(&mut out).map_err(|e| Some(e.to_string()))?;
    }
    if let Err(e) = stream.write_all(&out).and_then(|()| stream.flush()) {
        tracing::warn!("closing {peer}: failed to send the challenge: {e}");
        return Err(None);
    }
    let never = || false;
    let reader = DeadlineReader {
        stream: &mut *stream,
        deadline,
        hold: &never,
        grace: Duration::ZERO,
    };
    let Some(proof) = handshake_message(shared, reader, false, peer) else {
        return Err(None);
    };
    match session.handle(Instant::now(), proof) {
        Ok(Some(ServerEvent::TokenProof {
            token_id,
            challenge,
            proof,
        })) => {
            let who = if shared.cfg.open_access {
                Ok(auth::Access::everything("anyone (open server)"))
            } else {
                auth::authenticate_proof(&shared.cfg.state_dir, &token_id, &challenge, &proof)
            };
            let a = who.map_err(Some)?;
            session.authenticated(Instant::now());
            Ok(a)
        }
        other => {
            if let Err(e) = other {
                tracing::warn!("closing {peer}: {}", escaped(&e.to_string()));
            }
            // The session's refusal (the proof was not what came next).
            let mut out = Vec::new();
            while let Some(m) = session.poll_transmit() {
                let _ = m.encode(&mut out);
            }
            let _ = stream.write_all(&out).and_then(|()| stream.flush());
            Err(None)
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

fn control_loop(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    session: &mut ServerSession,
    access: &auth::Access,
) -> Result<(), EngineError> {
    let mut perf = PerfRun::default();
    loop {
        while let Some(m) = session.poll_transmit() {
            conn.send(&m)?;
        }
        if session.is_closed() {
            return Ok(());
        }
        let now = Instant::now();
        session.handle_timeout(now)?;
        if perf.poll(session, conn.peer(), now) {
            continue;
        }
        let wait = if perf.test.is_some() {
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
            Ok(Some(ev)) => serve_event(shared, conn, session, access, &mut perf, ev)?,
            Ok(None) => {}
            Err(e) => {
                if let Some(t) = &perf.test {
                    t.stop();
                }
                return Err(EngineError::Failed(format!("session ended: {e}")));
            }
        }
    }
}

/// A control session's perf test while it runs, and its watch: dropped
/// unfinished (the session broke), it tells the observers the test was
/// aborted.
#[derive(Default)]
struct PerfRun {
    test: Option<Test>,
    watch: Option<Watch>,
}

impl PerfRun {
    /// Moves the running test on; true when the loop should go round at
    /// once (the test has more to send, or just finished).
    fn poll(&mut self, session: &mut ServerSession, peer: &str, now: Instant) -> bool {
        let Some(t) = &mut self.test else {
            return false;
        };
        match t.poll(session, peer, now) {
            Step::Running => false,
            Step::Ready => true,
            Step::Finished { bytes, error } => {
                self.test = None;
                if let Some(w) = self.watch.take() {
                    let result = match error {
                        Some(_) => Outcome::Failed,
                        None => Outcome::Ok,
                    };
                    w.finish(bytes, 0, result, error);
                }
                true
            }
        }
    }

    /// A test asked for: accepted and started, or refused.
    fn begin(
        &mut self,
        shared: &Arc<Shared>,
        conn: &mut FramedConn,
        session: &mut ServerSession,
        access: &auth::Access,
        p: TestParams,
    ) {
        match new_test(shared, conn, p.clone(), access) {
            Ok((t, accept)) => {
                let params = serde_json::to_value(&p).unwrap_or_default();
                let peer = conn.peer().to_string();
                self.watch = Some(shared.watch(RunKind::Perf, &peer, access, None, params));
                tracing::info!(
                    "test {} from {}: {:?} {:?}, {} stream(s)",
                    accept.test_id,
                    conn.peer(),
                    p.transport,
                    p.mode,
                    p.streams
                );
                session.accept_test(Instant::now(), accept);
                self.test = Some(t);
            }
            Err((code, message)) => {
                tracing::warn!("refusing test from {}: {}", conn.peer(), escaped(&message));
                refused_in(shared, conn, access, "perf", None, code, &message);
                session.refuse(code, message);
            }
        }
    }
}

/// Tells the observers a session's request was refused.
fn refused_in(
    shared: &Shared,
    conn: &FramedConn,
    access: &auth::Access,
    what: &'static str,
    export: Option<&str>,
    code: RefuseCode,
    message: &str,
) {
    let grant = access.grant_label();
    shared.refused(what, export, grant, code, message, conn.peer());
}

/// A request this session's access may not make: what it was (for the
/// observers), what was asked (for the log), and why not.
struct NotAllowed {
    what: &'static str,
    asked: &'static str,
    why: &'static str,
}

/// Whether `access` may not ask for `ev`, and why.
fn not_allowed(access: &auth::Access, ev: &ServerEvent) -> Option<NotAllowed> {
    let (what, asked, why) = match ev {
        // A capability pushes into its destination (or, a job's, reads
        // beneath its sources), and does nothing else.
        _ if access.scope.as_ref().is_some_and(|s| !copy::may_ask(s, ev)) => (
            "capability",
            "a request",
            "a capability only pushes into its destination (a job's: or reads beneath its sources)",
        ),
        ServerEvent::TestRequested(_) | ServerEvent::ThirdPartyRequested(_) if !access.perf => (
            "perf",
            "a test",
            "this server runs perf tests for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN",
        ),
        // Whatever the target: an anonymous client hears the same and
        // this server dials nothing (it would be a port scanner).
        ServerEvent::ThirdPartyRequested(_) if access.is_anonymous() => (
            "third-party",
            "a third-party test",
            "this server runs third-party tests for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN",
        ),
        ServerEvent::ProbeRequested(_) if access.is_anonymous() => (
            "probe",
            "a probe",
            "this server answers probes (longhaul doctor) for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN",
        ),
        _ => return None,
    };
    Some(NotAllowed { what, asked, why })
}

/// Serves one event of a control session: refused if its access may not
/// ask for it, else a perf test's step or a request served to its end.
fn serve_event(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    session: &mut ServerSession,
    access: &auth::Access,
    perf: &mut PerfRun,
    ev: ServerEvent,
) -> Result<(), EngineError> {
    if let Some(n) = not_allowed(access, &ev) {
        let reason = if n.what == "capability" {
            n.why
        } else {
            "not authenticated"
        };
        tracing::warn!("refusing {} from {}: {reason}", n.asked, conn.peer());
        refused_in(
            shared,
            conn,
            access,
            n.what,
            None,
            RefuseCode::Unauthorized,
            n.why,
        );
        session.refuse(RefuseCode::Unauthorized, n.why.to_string());
        return Ok(());
    }
    match ev {
        ServerEvent::TestRequested(p) => perf.begin(shared, conn, session, access, p),
        ServerEvent::Start => {
            if let Some(t) = &mut perf.test {
                t.start(session);
            }
        }
        ServerEvent::Active(n) => {
            if let Some(t) = &perf.test {
                t.set_active(n);
            }
        }
        ServerEvent::Stop(reason) => {
            tracing::info!("{} stops its test: {}", conn.peer(), escaped(&reason));
            if let Some(t) = &perf.test {
                t.stop();
            }
        }
        // Only at the hello, handled before the session's loop.
        ServerEvent::DataStream { .. }
        | ServerEvent::Challenged { .. }
        | ServerEvent::TokenProof { .. } => {}
        ev => serve_request(shared, conn, session, access, ev)?,
    }
    Ok(())
}

/// Serves a request that takes the session's turn to its end (a copy, a
/// listing, a probe, a job's word), then answers or refuses it.
fn serve_request(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    session: &mut ServerSession,
    access: &auth::Access,
    ev: ServerEvent,
) -> Result<(), EngineError> {
    let peer = conn.peer().to_string();
    let refused = |what, export: Option<&str>, code, message: &str| {
        shared.refused(what, export, access.grant_label(), code, message, &peer);
    };
    let warned = |asked: &str, message: &str| {
        tracing::warn!("refusing {asked} from {peer}: {}", escaped(message));
    };
    match ev {
        ServerEvent::RevokeRequested => {
            let served = durable::serve_revoke(shared, conn, access);
            answered(session, served, |code, message| {
                refused("revoke", None, code, message)
            });
        }
        ServerEvent::DiscardRequested(d) => {
            let served = durable::serve_discard(shared, conn, &d, access);
            answered(session, served, |code, message| {
                refused("discard", None, code, message)
            });
        }
        ServerEvent::JobSubmitted(j) => {
            let served = jobs::serve_submit(shared, conn, &j, access);
            if let Err((_, m)) = &served {
                tracing::warn!("refusing a job from {peer}: {}", escaped(m));
            }
            answered(session, served, |code, message| {
                refused("job", None, code, message)
            });
        }
        ServerEvent::JobCommanded(c) => {
            let served = jobs::serve_command(shared, conn, &c, access);
            answered(session, served, |code, message| {
                refused("job", None, code, message)
            });
        }
        ServerEvent::GrantRequested(g) => {
            let served = grant::serve_grant(shared, conn, &g, access);
            answered(session, served, |code, message| {
                tracing::warn!("refusing a capability to {peer}: {}", escaped(message));
                refused("grant", Some(&g.export), code, message)
            });
        }
        ServerEvent::CopyOrdered(o) => {
            let served = copy::serve_copy(shared, conn, &o, access);
            answered(session, served, |code, message| {
                warned("a third-party copy", message);
                refused("copy", Some(&o.export), code, message)
            });
        }
        ServerEvent::ThirdPartyRequested(req) => {
            third_party(shared, conn, &req, access);
            session.finish(Instant::now());
        }
        ServerEvent::TransferRequested(t) => {
            let served = match serve_transfer(shared, conn, &t, access) {
                Ok(()) => Ok(()),
                Err(Refusal::Refuse(code, message)) => Err((code, message)),
                Err(Refusal::Failed(e)) => {
                    return Err(EngineError::Failed(format!("transfer failed: {e}")));
                }
            };
            let what = match t.op {
                longhaul_proto::xfer::Op::Push => "push",
                longhaul_proto::xfer::Op::Pull => "pull",
            };
            answered(session, served, |code, message| {
                warned("transfer", message);
                refused(what, Some(&t.export), code, message)
            });
        }
        ServerEvent::ListRequested(l) => {
            let served = serve_list(shared, conn, &l, access);
            answered(session, served, |code, message| {
                refused("ls", Some(&l.export), code, message)
            });
        }
        ServerEvent::ProbeRequested(p) => {
            // A probe benchmarks storage and CPU: it takes a slot.
            let served = take_slot(shared, conn, access)
                .and_then(|_slot| serve_probe(shared, conn, &p, access));
            answered(session, served, |code, message| {
                warned("probe", message);
                refused("probe", Some(&p.export), code, message)
            });
        }
        _ => {}
    }
    Ok(())
}

/// Ends a short request's turn: the session waits for the next request,
/// or refuses (telling the observers through `refused`) and closes.
fn answered(
    session: &mut ServerSession,
    served: Result<(), (RefuseCode, String)>,
    refused: impl FnOnce(RefuseCode, &str),
) {
    match served {
        Ok(()) => session.finish(Instant::now()),
        Err((code, message)) => {
            refused(code, &message);
            session.refuse(code, message);
        }
    }
}

/// The client's address of a connection, if its peer name is one.
fn peer_ip(conn: &FramedConn) -> Option<std::net::IpAddr> {
    conn.peer()
        .parse::<std::net::SocketAddr>()
        .ok()
        .map(|a| a.ip())
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
}
