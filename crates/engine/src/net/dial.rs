//! Dialing a server, for every client (perf, cp, ls, doctor, trust): the
//! control connection with its handshake (`open_control`), data streams
//! that join a test or transfer (`Dialer`, `present`), and what a
//! client presents (TLS, trust, credentials: [`Security`]).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::*;
use longhaul_proto::session::{ClientEvent, ClientSession};

use super::conn::{self, FramedConn};
use super::{sock, tls};
use crate::{EngineError, DEFAULT_PORT};

/// Client-side settings that are not part of the test itself.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub handshake_timeout: Duration,
    /// CPU to pin this side's stream threads to.
    pub local_cpu: Option<u32>,
    /// Set from outside (Ctrl-C) to end the test early; results are still reported.
    pub interrupt: Arc<AtomicBool>,
    /// TLS, trust and credentials.
    pub security: Security,
    /// perf `-P auto`: choose the stream count for the path (RTT of the
    /// control connection, both hosts' buffer caps) instead of the one in
    /// the parameters.
    pub auto_streams: bool,
    /// Several paths between the two hosts (several NICs): the data
    /// streams are spread over them; the control connection leaves from
    /// the first `bind` address.
    pub paths: Paths,
    /// Only this address family (`-4`/`-6`); None: any, or the family of
    /// the first `bind` address.
    pub family: Option<Family>,
    /// Every connection these options open goes this way: the far end
    /// connects back ([`super::back::Route::scoped`]). None: as usual.
    pub back: Option<Arc<super::back::Route>>,
}

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl ClientOptions {
    /// The family connections keep to: the one asked for, else the first
    /// bound address's.
    fn family(&self) -> Option<Family> {
        self.family.or_else(|| {
            self.paths.bind.first().map(|ip| match ip {
                std::net::IpAddr::V4(_) => Family::V4,
                std::net::IpAddr::V6(_) => Family::V6,
            })
        })
    }

    /// `target`'s addresses in the family connections keep to; an error
    /// naming the family if it has none.
    pub fn addresses(
        &self,
        target: &str,
        addrs: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, EngineError> {
        let Some(f) = self.family() else {
            return Ok(addrs);
        };
        let kept: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| a.is_ipv4() == (f == Family::V4))
            .collect();
        if kept.is_empty() {
            let (name, flag) = match f {
                Family::V4 => ("IPv4", "-4"),
                Family::V6 => ("IPv6", "-6"),
            };
            let why = match (self.family, self.paths.bind.first()) {
                (Some(_), _) | (None, None) => format!("{flag} asks for one"),
                (None, Some(ip)) => format!("the bind address {ip} is one"),
            };
            // Not worth a retry: the names say so, not the network.
            return Err(EngineError::Usage(format!(
                "{target} has no {name} address, and {why}"
            )));
        }
        Ok(kept)
    }

    /// The local address a socket to `peer` leaves from: the first bind
    /// address (port 0), else any address of `peer`'s family.
    pub fn local_for(&self, peer: SocketAddr) -> SocketAddr {
        match self.paths.bind.first() {
            Some(ip) => SocketAddr::new(*ip, 0),
            None if peer.is_ipv4() => SocketAddr::from(([0, 0, 0, 0], 0)),
            None => SocketAddr::from(([0u16; 8], 0)),
        }
    }

    /// Binds a socket about to connect to the first bind address, if any.
    pub fn bind_first(&self, s: &socket2::Socket) -> std::io::Result<()> {
        match self.paths.bind.first() {
            Some(ip) => s.bind(&SocketAddr::new(*ip, 0).into()).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot bind to {ip}: {e}; is it an address of this host (--bind)?"),
                )
            }),
            None => Ok(()),
        }
    }
}

/// The addresses a client's data streams use, beyond the control
/// connection's: stream `k` connects from `bind[k % B]` (any address if
/// none) to the `k % S`-th of the server's addresses, the control
/// connection's first, then `via` (nuttcp's multilink, SC12's several
/// links into one server). Any address of the server works: a data stream
/// proves it belongs to its transfer by its token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paths {
    pub bind: Vec<std::net::IpAddr>,
    /// More addresses of the same server (a port of 0 means the control
    /// connection's port).
    pub via: Vec<SocketAddr>,
}

impl Paths {
    /// Whether the streams go over more than one path.
    pub fn several(&self) -> bool {
        self.bind.len() > 1 || !self.via.is_empty()
    }
}

/// How a client protects and identifies itself.
#[derive(Clone, Default)]
pub struct Security {
    /// Speak plaintext (`--insecure-plaintext`); the server must allow it
    /// too (`--allow-plaintext`), or it refuses.
    pub plaintext: bool,
    pub trust: tls::TrustOptions,
    /// The credential sent in the hello to a server that has none of its
    /// own in `tokens` (`--token-file FILE`, `LONGHAUL_TOKEN`).
    pub token: Option<String>,
    /// Credentials each for one server (`--token-file HOST[:PORT]=FILE`):
    /// each is presented to its own server only ([`Security::token_for`]).
    pub tokens: Vec<HostToken>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("plaintext", &self.plaintext)
            .field("trust", &self.trust)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl Security {
    /// The credential to present to `target` (`HOST[:PORT]` as dialled):
    /// its own, else the default one.
    pub fn token_for(&self, target: &str) -> Option<&str> {
        self.tokens
            .iter()
            .find(|t| t.is_for(target))
            .map(|t| t.token.as_str())
            .or(self.token.as_deref())
    }

    /// Whether `target` has a credential of its own (named for it).
    pub fn named_for(&self, target: &str) -> bool {
        self.tokens.iter().any(|t| t.is_for(target))
    }
}

/// One server's own credential: `host` is `HOST:PORT`, or `HOST` for the
/// server at the default port (as known_hosts' `host` means port 22),
/// as the user named the server.
#[derive(Clone)]
pub struct HostToken {
    pub host: String,
    pub token: String,
}

impl std::fmt::Debug for HostToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostToken")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl HostToken {
    /// Whether this is `target`'s credential: the same host (letters in
    /// any case) and the same port, the default port where either names
    /// none. Never another port's: a token for HOST:9000 sent to whatever
    /// listens on HOST:9001 would be a token given away.
    pub fn is_for(&self, target: &str) -> bool {
        host_key(&self.host).eq_ignore_ascii_case(&host_key(target))
    }
}

/// The session of a control connection, with its credential: the token
/// inside TLS; on plaintext never the token (a token seen on the wire is
/// a token stolen) but a proof of it for the server's challenge, good for
/// this one connection ([`longhaul_proto::tokenproof`]).
fn control_session(
    tls: bool,
    token: &Option<String>,
    handshake_timeout: Duration,
) -> ClientSession {
    let (now, software) = (Instant::now(), crate::software());
    match token.as_deref() {
        Some(t) if tls => ClientSession::new(now, &software, handshake_timeout, Some(t.into())),
        None => ClientSession::new(now, &software, handshake_timeout, None),
        Some(t) => ClientSession::proving(now, &software, handshake_timeout, t).unwrap_or_else(|| {
            tracing::warn!(
                "not sending the token over plaintext, and it is not of the form lh1_ID_SECRET that can be proven: this connection is anonymous"
            );
            ClientSession::new(now, &software, handshake_timeout, None)
        }),
    }
}

/// The token a third-party request lends the server it goes to, for the
/// server it tests against: only inside TLS. On plaintext nothing is lent
/// (a proof is good for one connection, and the lent token would cross in
/// clear): that server connects as anonymous.
pub fn lent_token(tls: bool, token: &Option<String>) -> Option<String> {
    token.clone().filter(|_| tls)
}

/// `HOST:PORT` of a target as the user named it, the key of the
/// known-hosts file.
pub fn host_key(target: &str) -> String {
    let bare_v6 = target.parse::<std::net::Ipv6Addr>().is_ok();
    if bare_v6 {
        return format!("[{target}]:{DEFAULT_PORT}");
    }
    if target.starts_with('[') && target.ends_with(']') {
        return format!("{target}:{DEFAULT_PORT}");
    }
    match target.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')) => {
            target.to_string()
        }
        _ => format!("{target}:{DEFAULT_PORT}"),
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            local_cpu: None,
            interrupt: Arc::new(AtomicBool::new(false)),
            security: Security::default(),
            auto_streams: false,
            paths: Paths::default(),
            family: None,
            back: None,
        }
    }
}

/// A TCP connection to `addrs` for `opts`: by its own route when it has
/// one ([`ClientOptions::back`]), else [`conn::connect`].
fn dial_tcp(
    opts: &ClientOptions,
    addrs: &[SocketAddr],
    timeout: Duration,
    tune: impl Fn(&socket2::Socket) -> std::io::Result<()>,
) -> Result<std::net::TcpStream, EngineError> {
    match &opts.back {
        Some(r) => r.connect(timeout, &tune),
        None => super::back::connect(addrs, timeout, tune),
    }
}

/// A client's control connection to a server, after the handshake: the
/// session, the server's `Welcome`, and what its data streams need.
pub(crate) struct Control {
    pub(crate) conn: FramedConn,
    pub(crate) session: ClientSession,
    pub(crate) peer: SocketAddr,
    pub(crate) welcome: Welcome,
    /// The TLS set-up the control connection used, for the data streams;
    /// None in plaintext.
    tls: Option<Arc<tls::ClientTls>>,
    /// Ctrl-C: ends a wait for the server's answer.
    interrupt: Arc<AtomicBool>,
    /// The user was told the request waits in the server's queue.
    told_queued: bool,
}

/// How often a wait checks for Ctrl-C.
pub(crate) const INTERRUPT_POLL: Duration = Duration::from_millis(100);

impl Control {
    /// The server's answer to a request just sent: what `pick` takes (None
    /// for any other message), a `Refuse` as the server's refusal, anything
    /// else as unexpected; `what` names the wait on a time-out. While the
    /// server says the request is queued, the wait goes on (each reminder
    /// restarts the time-out); Ctrl-C ends it.
    pub(crate) fn answer<T>(
        &mut self,
        deadline: Instant,
        what: &str,
        pick: impl FnOnce(Message) -> Option<T>,
    ) -> Result<T, EngineError> {
        let span = deadline.saturating_duration_since(Instant::now());
        let mut deadline = deadline;
        loop {
            if self.interrupt.load(Ordering::Relaxed) {
                return Err(EngineError::Interrupted(format!(
                    "while waiting for {what}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(EngineError::Timeout(what.into()));
            }
            match self.conn.recv((deadline - now).min(INTERRUPT_POLL))? {
                None => {}
                Some(Message::Queued(q)) => {
                    self.queued(&q);
                    deadline = Instant::now() + span;
                }
                Some(Message::Refuse(r)) => {
                    return Err(EngineError::Refused {
                        code: r.code,
                        message: r.message,
                    })
                }
                Some(m) => {
                    let name = m.name();
                    return pick(m).ok_or_else(|| {
                        EngineError::Failed(format!("server sent an unexpected {name} message"))
                    });
                }
            }
        }
    }

    /// Tells the user, once, that the request waits in the server's queue.
    pub(crate) fn queued(&mut self, q: &Queued) {
        if std::mem::replace(&mut self.told_queued, true) {
            return;
        }
        let why = if q.reason.is_empty() {
            format!(
                "{} transfers and tests running, limit {}",
                q.running, q.limit
            )
        } else {
            q.reason.clone()
        };
        // To stderr, never into --json on stdout; a closed stderr is no error.
        // A warning's worth: not said where warnings are off (`-q`).
        if !tracing::enabled!(tracing::Level::WARN) {
            return;
        }
        let _ = writeln!(
            std::io::stderr().lock(),
            "server busy ({why}): waiting in queue, position {}",
            q.position
        );
    }

    /// What sizing for the path needs: the smallest RTT this connection has
    /// seen (microseconds, 0 if unknown), this host's buffer caps and the
    /// server's.
    pub(crate) fn path_facts(&self) -> (u32, sock::BufferCaps, sock::BufferCaps) {
        let info = sock::tcp_info(sock::fd_of(self.conn.tcp()));
        let rtt_us = info.map_or(0, |i| {
            if i.min_rtt_us > 0 {
                i.min_rtt_us
            } else {
                i.rtt_us
            }
        });
        (rtt_us, sock::buffer_caps(), self.welcome.buffers)
    }

    /// Connects data streams to the server, all at once (each costs a round
    /// trip or two, which on a long path add up when taken one by one), and
    /// presents the token on each. `tune` sets a socket before it connects.
    pub(crate) fn open_data_streams(
        &self,
        token: &str,
        which: &[(Direction, u16)],
        opts: &ClientOptions,
        tune: impl Fn(&socket2::Socket, Direction) -> std::io::Result<()> + Sync,
    ) -> Result<Vec<Box<dyn conn::Stream>>, EngineError> {
        let version = self.welcome.version;
        self.open_streams_with(&self.dialer(), which, opts, tune, |s, stream, direction| {
            present(s, version, token, stream, direction)
        })
    }

    /// Connects a perf test's data streams, each joining with its proof of
    /// the test's data key ([`Role::PerfData`]): in TLS if `tls` (and the
    /// control connection has TLS), else in plaintext, which is safe for
    /// the proof (it is good for its one stream only) but not for anything
    /// else: no credential crosses these streams.
    pub(crate) fn open_proven_streams(
        &self,
        test: &str,
        key: &longhaul_proto::databind::DataKey,
        tls: bool,
        which: &[(Direction, u16)],
        opts: &ClientOptions,
        tune: impl Fn(&socket2::Socket, Direction) -> std::io::Result<()> + Sync,
    ) -> Result<Vec<Box<dyn conn::Stream>>, EngineError> {
        let mut dialer = self.dialer();
        if !tls {
            dialer.tls = None;
        }
        let version = self.welcome.version;
        self.open_streams_with(&dialer, which, opts, tune, |s, stream, direction| {
            let proof = key.proof(test, Transport::Tcp, stream, direction);
            let role = Role::PerfData {
                test: test.to_string(),
                stream,
                direction,
                proof,
            };
            present_as(s, version, role, stream)
        })
    }

    /// Dials one data stream per `which`, all at once, and introduces each
    /// with `introduce`.
    fn open_streams_with(
        &self,
        dialer: &Dialer,
        which: &[(Direction, u16)],
        opts: &ClientOptions,
        tune: impl Fn(&socket2::Socket, Direction) -> std::io::Result<()> + Sync,
        introduce: impl Fn(&mut Box<dyn conn::Stream>, u16, Direction) -> Result<(), EngineError> + Sync,
    ) -> Result<Vec<Box<dyn conn::Stream>>, EngineError> {
        let (tune, introduce) = (&tune, &introduce);
        std::thread::scope(|scope| {
            let pending: Vec<_> = which
                .iter()
                .map(|&(direction, stream)| {
                    scope.spawn(move || {
                        let mut s =
                            dialer.dial_nth(usize::from(stream), opts, |s| tune(s, direction))?;
                        introduce(&mut s, stream, direction)?;
                        Ok(s)
                    })
                })
                .collect();
            pending
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::Failed("opening a data stream panicked".into()))
                    })
                })
                .collect()
        })
    }
}

/// What a data stream needs of the control connection: where and how.
#[derive(Clone)]
pub(crate) struct Dialer {
    peer: SocketAddr,
    tls: Option<Arc<tls::ClientTls>>,
    /// Early streams: wait for this before their TLS handshake.
    trusted: Option<Arc<Trusted>>,
}

/// Whether the control connection's TLS handshake found the server to be
/// the one trusted. Streams dialed early connect their TCP meanwhile and
/// wait for this before their own handshake, so a server this client does
/// not trust sees one failed handshake (and counts one), not one per
/// stream; the wait costs nothing, as the control connection's handshake
/// has its answer when the streams' TCP handshakes end.
#[derive(Default)]
pub(crate) struct Trusted {
    known: Mutex<Option<bool>>,
    told: Condvar,
}

impl Trusted {
    /// Says it once; later calls change nothing.
    fn tell(&self, trusted: bool) {
        let mut k = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if k.is_none() {
            *k = Some(trusted);
        }
        self.told.notify_all();
    }

    /// Waits up to `limit` to be told; true only for a trusted server.
    fn wait(&self, limit: Duration) -> bool {
        let k = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let (k, _) = self
            .told
            .wait_timeout_while(k, limit, |k| k.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *k == Some(true)
    }
}

/// Tells waiting streams "not trusted" unless they were told otherwise.
struct Untrusted(Arc<Trusted>);

impl Drop for Untrusted {
    fn drop(&mut self) {
        self.0.tell(false);
    }
}

impl Dialer {
    /// The path data stream `k` takes: from which local address (if one
    /// is set) to which of the server's.
    pub(crate) fn path(&self, k: usize, paths: &Paths) -> (Option<std::net::IpAddr>, SocketAddr) {
        let servers = 1 + paths.via.len();
        let peer = match k % servers {
            0 => self.peer,
            i => {
                let mut a = paths.via[i - 1];
                if a.port() == 0 {
                    a.set_port(self.peer.port());
                }
                a
            }
        };
        let bind = (!paths.bind.is_empty()).then(|| paths.bind[k % paths.bind.len()]);
        (bind, peer)
    }

    /// Connects data stream `k` to the server over its path ([`Paths`]):
    /// TCP, then TLS unless plaintext; it joins a transfer once
    /// [`present`]ed.
    pub(crate) fn dial_nth(
        &self,
        k: usize,
        opts: &ClientOptions,
        tune: impl Fn(&socket2::Socket) -> std::io::Result<()>,
    ) -> Result<Box<dyn conn::Stream>, EngineError> {
        let (bind, peer) = self.path(k, &opts.paths);
        let tcp = match bind {
            None => dial_tcp(opts, &[peer], opts.connect_timeout, tune)?,
            Some(ip) => dial_tcp(opts, &[peer], opts.connect_timeout, |s| {
                s.bind(&SocketAddr::new(ip, 0).into()).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot bind a data stream to {ip}: {e}; is it an address of this host (--bind)?"),
                    )
                })?;
                tune(s)
            })?,
        };
        Ok(match &self.tls {
            Some(t) => {
                if let Some(trusted) = &self.trusted {
                    if !trusted.wait(opts.handshake_timeout) {
                        return Err(EngineError::Closed(
                            "the control connection did not find the server trusted".into(),
                        ));
                    }
                }
                let _ = tcp.set_read_timeout(Some(opts.handshake_timeout));
                let s = t.connect(tcp)?;
                let _ = s.tcp().set_read_timeout(None);
                s
            }
            None => Box::new(tcp),
        })
    }
}

/// Presents a dialed data stream's token: it is stream `stream` of the
/// transfer or test the token names (the server does not answer).
pub(crate) fn present(
    s: &mut Box<dyn conn::Stream>,
    version: u16,
    token: &str,
    stream: u16,
    direction: Direction,
) -> Result<(), EngineError> {
    let role = Role::Data {
        token: token.to_string(),
        stream,
        direction,
    };
    present_as(s, version, role, stream)
}

/// The preamble and a data stream's `Hello` in `role`.
pub(crate) fn data_hello(version: u16, role: Role) -> Result<Vec<u8>, EngineError> {
    let mut hello = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: version,
        max_version: version,
        software: crate::software(),
        role,
        token: None,
        token_id: None,
    })
    .encode(&mut hello)?;
    Ok(hello)
}

fn present_as(
    s: &mut Box<dyn conn::Stream>,
    version: u16,
    role: Role,
    stream: u16,
) -> Result<(), EngineError> {
    let hello = data_hello(version, role)?;
    // Under Nagle the Hello would wait for the acknowledgement of the TLS
    // handshake's last flight, a round trip when the token came back as
    // the handshake ended (PROTOCOL.md 13.2 item 0). Nagle comes back on
    // for the data.
    let nagle = !s.tcp().nodelay().unwrap_or(true);
    if nagle {
        let _ = s.tcp().set_nodelay(true);
    }
    let sent = s.write_all(&hello).and_then(|()| s.flush());
    if nagle {
        let _ = s.tcp().set_nodelay(false);
    }
    sent.map_err(|e| {
        let peer = s
            .tcp()
            .peer_addr()
            .map_or_else(|_| "the server".into(), |a| a.to_string());
        EngineError::io(format!("failed to open data stream {stream} to {peer}"), e)
    })
}

impl Control {
    pub(crate) fn dialer(&self) -> Dialer {
        Dialer {
            peer: self.peer,
            tls: self.tls.clone(),
            trusted: None,
        }
    }

    pub(crate) fn flush(&mut self) -> Result<(), EngineError> {
        while let Some(m) = self.session.poll_transmit() {
            self.conn.send(&m)?;
        }
        Ok(())
    }

    /// Waits for the next session event, up to `wait`.
    pub(crate) fn next_event(
        &mut self,
        wait: Duration,
    ) -> Result<Option<ClientEvent>, EngineError> {
        self.flush()?;
        let now = Instant::now();
        self.session.handle_timeout(now)?;
        let wait = match self.session.poll_timeout() {
            Some(d) => wait.min(d.saturating_duration_since(now)),
            None => wait,
        };
        match self.conn.recv(wait)? {
            Some(m) => Ok(self.session.handle(Instant::now(), m)?),
            None => Ok(None),
        }
    }

    /// Waits until `f` accepts an event (time-outs come from the session).
    fn expect(&mut self, mut f: impl FnMut(ClientEvent) -> bool) -> Result<(), EngineError> {
        loop {
            if let Some(e) = self.next_event(Duration::from_millis(50))? {
                if f(e) {
                    return Ok(());
                }
            }
        }
    }
}

pub(crate) fn open_control(target: &str, opts: &ClientOptions) -> Result<Control, EngineError> {
    open_control_early(target, opts, |_, _| (), |_| None).map(|(c, ())| c)
}

/// [`open_control`], calling `early` with a dialer and the RTT of the TCP
/// handshake as soon as the control connection is up, so that data streams
/// can connect while the control handshake goes on. The message `first`
/// returns (given the smallest RTT seen once TLS is up) is sent right
/// after the `Hello`, without waiting for the `Welcome` (PROTOCOL.md 13.2):
/// the server answers both in order, so the request's answer comes a round
/// trip sooner. The caller reads that answer; a server that refuses the
/// `Hello` closes and never reads it.
pub(crate) fn open_control_early<T>(
    target: &str,
    opts: &ClientOptions,
    early: impl FnOnce(&Dialer, u32) -> T,
    first: impl FnOnce(u32) -> Option<Message>,
) -> Result<(Control, T), EngineError> {
    let addrs = opts.addresses(target, conn::resolve(target, DEFAULT_PORT)?)?;
    let tcp = dial_tcp(opts, &addrs, opts.connect_timeout, |s| {
        opts.bind_first(s)?;
        s.set_tcp_nodelay(true)
    })?;
    let peer = tcp
        .peer_addr()
        .map_err(|e| EngineError::io("failed to read the peer address".into(), e))?;
    let tls = if opts.security.plaintext {
        None
    } else {
        Some(Arc::new(tls::ClientTls::new(
            &opts.security.trust,
            &host_key(target),
        )?))
    };
    let rtt_us = sock::tcp_info(sock::fd_of(&tcp)).map_or(0, |i| i.min_rtt_us);
    let trusted = Untrusted(Arc::default());
    let early = early(
        &Dialer {
            peer,
            tls: tls.clone(),
            trusted: Some(trusted.0.clone()),
        },
        rtt_us,
    );
    let mut stream: Box<dyn conn::Stream> = match &tls {
        None => Box::new(tcp),
        Some(t) => {
            let _ = tcp.set_read_timeout(Some(opts.handshake_timeout));
            let s = t.connect(tcp)?;
            trusted.0.tell(true);
            s
        }
    };
    stream
        .write_all(&MAGIC)
        .map_err(|e| EngineError::io(format!("failed to greet {peer}"), e))?;
    let token = opts.security.token_for(target).map(str::to_string);
    let session = control_session(tls.is_some(), &token, opts.handshake_timeout);
    let mut c = Control {
        conn: FramedConn::new(stream, target.to_string()),
        session,
        tls,
        interrupt: opts.interrupt.clone(),
        told_queued: false,
        peer,
        welcome: Welcome {
            version: 0,
            software: String::new(),
            host: String::new(),
            buffers: Default::default(),
            max_streams: None,
            features: Vec::new(),
        },
    };
    // The TLS handshake added samples to the SYN's: one alone can be off
    // by what a busy host or path added to it.
    let rtt_us = sock::tcp_info(sock::fd_of(c.conn.tcp())).map_or(rtt_us, |i| i.min_rtt_us);
    let in_handshake = |e| match e {
        EngineError::Closed(_) | EngineError::Proto(_) => EngineError::Connect(format!(
            "{target} closed the connection during the handshake: is it a longhaul server?"
        )),
        EngineError::Timeout(m) => EngineError::Connect(format!("{target}: {m}")),
        other => other,
    };
    // A proof answers the server's challenge, and the server reads it
    // before anything else: nothing goes ahead of it.
    while c.session.awaits_challenge() {
        c.next_event(Duration::from_millis(50))
            .map_err(in_handshake)?;
    }
    if let Some(m) = first(rtt_us) {
        c.flush()?;
        c.conn.send(&m)?;
    }
    let mut welcome = None;
    c.expect(|e| match e {
        ClientEvent::Welcomed(w) => {
            welcome = Some(w);
            true
        }
        _ => false,
    })
    .map_err(in_handshake)?;
    c.welcome = welcome.expect("set by expect");
    Ok((c, early))
}

/// Connects to `target` only to read the fingerprint of the certificate it
/// presents (for `longhaul trust`); sends nothing else.
pub fn probe_fingerprint(target: &str, timeout: Duration) -> Result<String, EngineError> {
    let addrs = conn::resolve(target, DEFAULT_PORT)?;
    let tcp = super::back::connect(&addrs, timeout, |_| Ok(()))?;
    let _ = tcp.set_read_timeout(Some(timeout));
    let t = tls::ClientTls::new(
        &tls::TrustOptions {
            accept_any: true,
            ..Default::default()
        },
        target,
    )?;
    let mut s = t.connect(tcp)?;
    let _ = s.close_write();
    t.seen()
        .ok_or_else(|| EngineError::Trust(format!("{target} presented no certificate")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::databind::DataKey;

    /// `--token-file HOST=FILE` is the server at HOST's default port, as
    /// known_hosts' `host` is port 22: never another service of that host
    /// (its token sent to whatever listens on HOST:9001).
    #[test]
    fn attacker_a_token_named_for_a_host_is_never_sent_to_its_other_ports() {
        let tok = |host: &str| HostToken {
            host: host.into(),
            token: "t".into(),
        };
        let d = DEFAULT_PORT;
        let bare = tok("dtn.example.org");
        assert!(bare.is_for("dtn.example.org"));
        assert!(bare.is_for("DTN.example.org"));
        assert!(bare.is_for(&format!("dtn.example.org:{d}")));
        assert!(!bare.is_for("dtn.example.org:9001"));
        assert!(!bare.is_for("other.example.org"));
        let port = tok("dtn.example.org:9000");
        assert!(port.is_for("dtn.example.org:9000"));
        assert!(!port.is_for("dtn.example.org:9001"));
        assert!(!port.is_for("dtn.example.org"));
        let v6 = tok("[2001:db8::1]");
        assert!(v6.is_for(&format!("[2001:db8::1]:{d}")));
        assert!(v6.is_for("2001:db8::1"));
        assert!(!v6.is_for("[2001:db8::1]:9001"));
        let s = Security {
            token: Some("default".into()),
            tokens: vec![bare],
            ..Security::default()
        };
        assert_eq!(s.token_for("dtn.example.org:9001"), Some("default"));
        assert!(!s.named_for("dtn.example.org:9001"));
    }

    /// What a plaintext perf data stream puts on the wire before its data:
    /// the preamble and a hello naming the test with a proof, and nothing
    /// that works alone: no bearer token, no data key.
    #[test]
    fn a_perf_data_hello_carries_no_credential() {
        let key = DataKey::from_bytes([9; 32]);
        let test = "00112233445566778899aabbccddeeff";
        let proof = key.proof(test, Transport::Tcp, 2, Direction::Down);
        let role = Role::PerfData {
            test: test.into(),
            stream: 2,
            direction: Direction::Down,
            proof: proof.clone(),
        };
        let wire = data_hello(2, role).unwrap();
        assert!(wire.starts_with(&MAGIC));
        let text = String::from_utf8_lossy(&wire[MAGIC.len() + 5..]).into_owned();
        assert_eq!(
            text,
            format!(
                r#"{{"min_version":2,"max_version":2,"software":"{}","role":{{"kind":"perf_data","test":"{test}","stream":2,"direction":"down","proof":"{proof}"}}}}"#,
                crate::software()
            )
        );
        assert!(!text.contains(&key.to_hex()));
        assert!(!text.contains("\"token\""));
    }
}
