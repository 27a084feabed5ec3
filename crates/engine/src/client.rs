//! The perf client: connects to a server, negotiates a test, opens the
//! data streams, runs its side, merges both sides' samples into interval
//! reports and a summary, and hands them to a [`Reporter`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::frame::MAGIC;
use longhaul_proto::msg::*;
use longhaul_proto::report::{PeerResults, Setup, SideSnapshot, Span, StreamSetup, Summary};
use longhaul_proto::session::{ClientEvent, ClientSession, SessionError};
use longhaul_proto::udp;

use crate::conn::{self, FramedConn};
use crate::report::Reporter;
use crate::run::{End, ReadyStream, SideRun, Ticker};
use crate::sock::{self, Tuning};
use crate::stream::DataSocket;
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
}

/// How a client protects and identifies itself.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Speak plaintext (`--insecure-plaintext`); the server must allow it
    /// too (`--allow-plaintext`), or it refuses.
    pub plaintext: bool,
    pub trust: crate::tls::TrustOptions,
    /// The credential sent in the hello (`--token-file`, `LONGHAUL_TOKEN`).
    pub token: Option<String>,
}

/// `HOST:PORT` of a target as the user named it, the key of the
/// known-hosts file.
/// The credential a connection carries: the token inside TLS; on
/// plaintext never the token (a token seen on the wire is a token
/// stolen) but a one-time proof of it ([`crate::proof`]).
pub fn credential_for(tls: bool, token: &Option<String>) -> Option<String> {
    let token = token.as_deref()?;
    if tls {
        return Some(token.to_string());
    }
    let mut nonce = [0u8; 16];
    getrandom::getrandom(&mut nonce).ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let proof = crate::proof::prove(token, now, &nonce);
    if proof.is_none() {
        tracing::warn!(
            "not sending the token over plaintext, and it is not of the form lh1_ID_SECRET that can be proven: this connection is anonymous"
        );
    }
    proof
}

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
        }
    }
}

/// The largest socket buffer the kernel can represent (it doubles the value, into an int).
pub const MAX_WINDOW: u64 = 1 << 30;

/// Checks what can be checked before connecting.
pub fn check_params(p: &TestParams) -> Result<(), EngineError> {
    if let Some(w) = p.window {
        if u64::from(w) > MAX_WINDOW {
            return Err(EngineError::Usage(format!(
                "window {w} bytes is larger than the kernel allows for any socket (1 GiB); use -w 1G or less"
            )));
        }
    }
    if let Some(cc) = &p.congestion {
        if p.mode != Mode::Down {
            sock::check_congestion(cc).map_err(EngineError::Usage)?;
        }
    }
    if p.transport == Transport::Tcp && p.udp_rate_bps.is_some() {
        return Err(EngineError::Usage(
            "a rate (-b) applies to UDP tests only; for TCP use --pacing".into(),
        ));
    }
    Ok(())
}

/// Warnings when the kernel granted less buffer than was asked for.
fn window_warnings(
    p: &TestParams,
    side: &str,
    setups: &[StreamSetup],
    caps: (Option<u64>, Option<u64>),
) -> Vec<String> {
    let Some(w) = p.window else { return Vec::new() };
    let w = u64::from(w);
    let mut out = Vec::new();
    let granted_snd = setups.iter().map(|s| s.sndbuf / 2).min().unwrap_or(w);
    let granted_rcv = setups.iter().map(|s| s.rcvbuf / 2).min().unwrap_or(w);
    let (rmem_max, wmem_max) = caps;
    if granted_rcv < w {
        out.push(format!(
            "{side}: receive window capped at {} of the {} requested by net.core.rmem_max = {}; raise it there: sysctl -w net.core.rmem_max={w}",
            longhaul_proto::units::format_bytes(granted_rcv),
            longhaul_proto::units::format_bytes(w),
            rmem_max.map_or("?".into(), |v| v.to_string()),
        ));
    }
    if granted_snd < w {
        out.push(format!(
            "{side}: send buffer capped at {} of the {} requested by net.core.wmem_max = {}; raise it there: sysctl -w net.core.wmem_max={w}",
            longhaul_proto::units::format_bytes(granted_snd),
            longhaul_proto::units::format_bytes(w),
            wmem_max.map_or("?".into(), |v| v.to_string()),
        ));
    }
    out
}

pub(crate) struct Control {
    pub(crate) conn: FramedConn,
    session: ClientSession,
    pub(crate) peer: SocketAddr,
    pub(crate) welcome: Welcome,
    /// The TLS set-up the control connection used, for the data streams;
    /// None in plaintext.
    tls: Option<Arc<crate::tls::ClientTls>>,
    /// Ctrl-C: ends a wait for the server's answer.
    interrupt: Arc<AtomicBool>,
    /// The user was told the request waits in the server's queue.
    told_queued: bool,
}

/// How often a wait checks for Ctrl-C.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);

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
    fn queued(&mut self, q: &Queued) {
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
        let dialer = self.dialer();
        let version = self.welcome.version;
        let (dialer, tune) = (&dialer, &tune);
        std::thread::scope(|scope| {
            let pending: Vec<_> = which
                .iter()
                .map(|&(direction, stream)| {
                    scope.spawn(move || {
                        let mut s = dialer.dial(opts, |s| tune(s, direction))?;
                        present(&mut s, version, token, stream, direction)?;
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
    tls: Option<Arc<crate::tls::ClientTls>>,
}

impl Dialer {
    /// Connects a data stream to the server (TCP, then TLS unless
    /// plaintext); it joins a transfer once [`present`]ed.
    pub(crate) fn dial(
        &self,
        opts: &ClientOptions,
        tune: impl Fn(&socket2::Socket) -> std::io::Result<()>,
    ) -> Result<Box<dyn conn::Stream>, EngineError> {
        let tcp = conn::connect(&[self.peer], opts.connect_timeout, tune)?;
        Ok(match &self.tls {
            Some(t) => {
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
    let mut hello = MAGIC.to_vec();
    Message::Hello(Hello {
        min_version: version,
        max_version: version,
        software: crate::software(),
        role: Role::Data {
            token: token.to_string(),
            stream,
            direction,
        },
        token: None,
    })
    .encode(&mut hello)?;
    s.write_all(&hello).and_then(|()| s.flush()).map_err(|e| {
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
        }
    }

    fn flush(&mut self) -> Result<(), EngineError> {
        while let Some(m) = self.session.poll_transmit() {
            self.conn.send(&m)?;
        }
        Ok(())
    }

    /// Waits for the next session event, up to `wait`.
    fn next_event(&mut self, wait: Duration) -> Result<Option<ClientEvent>, EngineError> {
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
    open_control_early(target, opts, |_, _| ()).map(|(c, ())| c)
}

/// [`open_control`], calling `early` with a dialer and the RTT of the TCP
/// handshake as soon as the control connection is up, so that data streams
/// can connect while the control handshake goes on.
pub(crate) fn open_control_early<T>(
    target: &str,
    opts: &ClientOptions,
    early: impl FnOnce(&Dialer, u32) -> T,
) -> Result<(Control, T), EngineError> {
    let addrs = conn::resolve(target, DEFAULT_PORT)?;
    let tcp = conn::connect(&addrs, opts.connect_timeout, |s| s.set_nodelay(true))?;
    let peer = tcp
        .peer_addr()
        .map_err(|e| EngineError::io("failed to read the peer address".into(), e))?;
    let tls = if opts.security.plaintext {
        None
    } else {
        Some(Arc::new(crate::tls::ClientTls::new(
            &opts.security.trust,
            &host_key(target),
        )?))
    };
    let rtt_us = sock::tcp_info(sock::fd_of(&tcp)).map_or(0, |i| i.min_rtt_us);
    let early = early(
        &Dialer {
            peer,
            tls: tls.clone(),
        },
        rtt_us,
    );
    let mut stream: Box<dyn conn::Stream> = match &tls {
        None => Box::new(tcp),
        Some(t) => {
            let _ = tcp.set_read_timeout(Some(opts.handshake_timeout));
            t.connect(tcp)?
        }
    };
    stream
        .write_all(&MAGIC)
        .map_err(|e| EngineError::io(format!("failed to greet {peer}"), e))?;
    let session = ClientSession::new(
        Instant::now(),
        &crate::software(),
        opts.handshake_timeout,
        credential_for(tls.is_some(), &opts.security.token),
    );
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
        },
    };
    let mut welcome = None;
    c.expect(|e| match e {
        ClientEvent::Welcomed(w) => {
            welcome = Some(w);
            true
        }
        _ => false,
    })
    .map_err(|e| match e {
        EngineError::Closed(_) | EngineError::Proto(_) => EngineError::Connect(format!(
            "{target} closed the connection during the handshake: is it a longhaul server?"
        )),
        EngineError::Timeout(m) => EngineError::Connect(format!("{target}: {m}")),
        other => other,
    })?;
    c.welcome = welcome.expect("set by expect");
    Ok((c, early))
}

/// Connects to `target` only to read the fingerprint of the certificate it
/// presents (for `longhaul trust`); sends nothing else.
pub fn probe_fingerprint(target: &str, timeout: Duration) -> Result<String, EngineError> {
    let addrs = conn::resolve(target, DEFAULT_PORT)?;
    let tcp = conn::connect(&addrs, timeout, |_| Ok(()))?;
    let _ = tcp.set_read_timeout(Some(timeout));
    let t = crate::tls::ClientTls::new(
        &crate::tls::TrustOptions {
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

/// Runs a memory-to-memory test against `target` (`HOST[:PORT]`) and
/// returns its summary; intervals go to `sink` as they complete.
pub fn run_perf(
    target: &str,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Summary, EngineError> {
    check_params(params)?;
    let mut ctl = open_control(target, opts)?;
    let mut plan_warning = None;
    let sized;
    let params = if opts.auto_streams {
        let (streams, warning) = streams_for_path(&ctl, params);
        plan_warning = warning;
        sized = TestParams {
            streams,
            ..params.clone()
        };
        &sized
    } else {
        params
    };
    ctl.session
        .request_test(Instant::now(), params.clone(), Duration::from_secs(86_400));
    let accept = loop {
        if opts.interrupt.load(Ordering::Relaxed) {
            return Err(EngineError::Interrupted(
                "while waiting for the server to take the test".into(),
            ));
        }
        match ctl.next_event(INTERRUPT_POLL)? {
            Some(ClientEvent::Accepted(a)) => break a,
            Some(ClientEvent::Queued(q)) => ctl.queued(&q),
            _ => {}
        }
    };

    let mut streams = open_streams(&ctl, params, &accept, opts)?;
    let mut ready = None;
    let mut last_register = Instant::now() - Duration::from_secs(1);
    while ready.is_none() {
        if last_register.elapsed() >= Duration::from_millis(50) {
            register_udp(&streams, &accept.token);
            last_register = Instant::now();
        }
        match ctl.next_event(Duration::from_millis(50)) {
            Ok(Some(ClientEvent::Ready(r))) => ready = Some(r),
            Ok(_) => {}
            // A server that refused a data stream said why on that stream.
            Err(e) => return Err(data_refusal(&mut streams).unwrap_or(e)),
        }
    }
    let ready = ready.expect("loop ends when set");

    let local_setups: Vec<StreamSetup> = streams.iter().map(setup_of).collect();
    let caps = sock::buffer_caps();
    let mut warnings = window_warnings(
        params,
        "client",
        &local_setups,
        (caps.rmem_max, caps.wmem_max),
    );
    warnings.extend(window_warnings(
        params,
        "server",
        &ready.streams,
        (ready.rmem_max, ready.wmem_max),
    ));
    warnings.extend(plan_warning);
    sink.setup(&Setup {
        server: target.to_string(),
        server_software: ctl.welcome.software.clone(),
        server_host: ctl.welcome.host.clone(),
        protocol_version: ctl.welcome.version,
        params: params.clone(),
        local_streams: local_setups,
        remote_streams: ready.streams.clone(),
        // UDP datagrams travel outside TLS: say so.
        encryption: match params.transport {
            Transport::Tcp => ctl.conn.encryption(),
            Transport::Udp => format!("none for the UDP data (control: {})", ctl.conn.encryption()),
        },
    });
    for w in &warnings {
        sink.warning(w);
    }

    ctl.session.start(Instant::now());
    ctl.flush()?;
    // -P auto, a time-bound TCP test with intervals: the sending streams
    // of each direction tuned online, as cp's source is
    // (`proto::tune::Climb`); the server's through `Active` messages.
    let online = opts.auto_streams
        && params.transport == Transport::Tcp
        && params.duration_ms.is_some()
        && params.interval_ms > 0
        && params.streams > 2;
    let sends_up = params.mode != Mode::Down;
    let local =
        (online && sends_up).then(|| Arc::new(std::sync::atomic::AtomicU16::new(params.streams)));
    let remote = (online && params.mode != Mode::Up)
        .then(|| Arc::new(std::sync::atomic::AtomicU16::new(params.streams)));
    let run = SideRun::start(
        End::Client,
        params,
        streams,
        opts.local_cpu,
        &accept.token,
        local.clone(),
    )?;
    if !online {
        return drive(&mut ctl, run, params, opts, sink, warnings, None);
    }
    let rtt_us = ctl.path_facts().0;
    let tuners = [(Direction::Up, local), (Direction::Down, remote.clone())]
        .into_iter()
        .filter_map(|(d, a)| Some(DirectionTuner::new(d, a?, params.streams)))
        .collect();
    let mut tuner = TuningSink::new(sink, tuners, params, rtt_us);
    let mut s = drive(&mut ctl, run, params, opts, &mut tuner, warnings, remote)?;
    (s.tuning, s.tuning_reverse) = tuner.reports();
    Ok(s)
}

/// One direction's climb: whose streams it parks (this side's, or the
/// server's through `Active`), and its epoch so far.
struct DirectionTuner {
    direction: Direction,
    active: Arc<std::sync::atomic::AtomicU16>,
    climb: longhaul_proto::tune::Climb,
    streams: u16,
    in_epoch: u32,
    epochs: u32,
    skip: u32,
    bits: f64,
    seconds: f64,
    resent: f64,
}

impl DirectionTuner {
    fn new(direction: Direction, active: Arc<std::sync::atomic::AtomicU16>, n: u16) -> Self {
        DirectionTuner {
            direction,
            active,
            // Down to a quarter of the streams (at least 2), never above all.
            climb: longhaul_proto::tune::Climb::new(n, (n / 4).max(2), n),
            streams: n,
            in_epoch: 0,
            epochs: 0,
            skip: 0,
            bits: 0.0,
            seconds: 0.0,
            resent: 0.0,
        }
    }

    /// Takes one interval of this direction; ends an epoch every
    /// `per_epoch` of them (the first, slow start, not observed) and sets
    /// the streams for the next.
    fn observe(&mut self, r: &longhaul_proto::report::IntervalReport, per_epoch: u32) {
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        let Some(d) = r.directions.iter().find(|d| d.direction == self.direction) else {
            return;
        };
        let span = (r.end_s - r.start_s).max(1e-6);
        self.bits += d.bits_per_second * span;
        self.seconds += span;
        // Retransmitted segments against bytes: a share of the bytes.
        let segments = (d.bytes as f64 / 1448.0).max(1.0);
        self.resent += d.tcp.map_or(0.0, |t| t.retransmits as f64) / segments * span;
        self.in_epoch += 1;
        if self.in_epoch < per_epoch {
            return;
        }
        let (rate, loss) = (self.bits / self.seconds, self.resent / self.seconds);
        (self.in_epoch, self.bits, self.seconds, self.resent) = (0, 0.0, 0.0, 0.0);
        self.epochs += 1;
        if self.epochs == 1 {
            return;
        }
        let before = self.active.load(std::sync::atomic::Ordering::Relaxed);
        let next = self
            .climb
            .observe(r.end_s, longhaul_proto::tune::utility(rate, loss));
        if next != before {
            self.active
                .store(next, std::sync::atomic::Ordering::Relaxed);
            // The streams that stay take up the parked ones' share.
            self.skip = 1;
        }
    }

    fn report(&self) -> longhaul_proto::tune::TuningReport {
        longhaul_proto::tune::TuningReport {
            online: true,
            direction: Some(self.direction),
            initial_streams: self.streams,
            final_streams: self.climb.best(),
            chunk_size: 0,
            files_in_flight: 0,
            initial_files_in_flight: 0,
            send_buffer: 0,
            send_buffer_raises: 0,
            steps: self.climb.steps.clone(),
        }
    }
}

/// Passes a perf test's reports on, and tunes the streams that send from
/// its intervals: epochs of two intervals (or 25 RTTs), the first skipped
/// (slow start), an interval after each change left out (settling).
struct TuningSink<'a> {
    inner: &'a mut dyn Reporter,
    tuners: Vec<DirectionTuner>,
    per_epoch: u32,
}

impl<'a> TuningSink<'a> {
    fn new(
        inner: &'a mut dyn Reporter,
        tuners: Vec<DirectionTuner>,
        p: &TestParams,
        rtt_us: u32,
    ) -> Self {
        let interval_us = (p.interval_ms * 1000).max(1);
        let epoch_us = (u64::from(rtt_us) * 25).max(2_000_000);
        TuningSink {
            inner,
            tuners,
            per_epoch: epoch_us.div_ceil(interval_us).max(1) as u32,
        }
    }

    /// The first direction's tuning, and the second's (`--bidir`).
    fn reports(
        &self,
    ) -> (
        Option<longhaul_proto::tune::TuningReport>,
        Option<longhaul_proto::tune::TuningReport>,
    ) {
        let mut r = self.tuners.iter().map(DirectionTuner::report);
        (r.next(), r.next())
    }
}

impl Reporter for TuningSink<'_> {
    fn setup(&mut self, s: &Setup) {
        self.inner.setup(s);
    }
    fn interval(&mut self, r: &longhaul_proto::report::IntervalReport) {
        self.inner.interval(r);
        for t in &mut self.tuners {
            t.observe(r, self.per_epoch);
        }
    }
    fn summary(&mut self, s: &Summary) {
        let mut s = s.clone();
        (s.tuning, s.tuning_reverse) = self.reports();
        self.inner.summary(&s);
    }
    fn warning(&mut self, m: &str) {
        self.inner.warning(m);
    }
}

fn setup_of(s: &ReadyStream) -> StreamSetup {
    let (sndbuf, rcvbuf, mss, congestion) = match &s.socket {
        DataSocket::Tcp(t) => {
            let (a, b, m) = sock::granted(t.as_fd());
            (a, b, m, sock::congestion(t.as_fd()))
        }
        DataSocket::Udp(u) => {
            let r = socket2::SockRef::from(&**u);
            (
                r.send_buffer_size().unwrap_or(0) as u64,
                r.recv_buffer_size().unwrap_or(0) as u64,
                0,
                String::new(),
            )
        }
    };
    StreamSetup {
        direction: s.direction,
        stream: s.stream,
        sndbuf,
        rcvbuf,
        mss,
        congestion,
    }
}

/// `perf -P auto`: streams enough for the window each can have at the
/// control connection's RTT, sized for the pacing rate if given (else
/// 10 Gbit/s); and the shortfall, if the caps keep them from it.
fn streams_for_path(ctl: &Control, p: &TestParams) -> (u16, Option<String>) {
    use longhaul_proto::window::{plan, BufferCaps, PathInput};
    let (rtt_us, local, remote) = ctl.path_facts();
    let (sender, receiver) = match p.mode {
        Mode::Down => (remote, local),
        Mode::Up | Mode::Bidir => (local, remote),
    };
    // perf leaves buffers to autotuning unless -w sets both.
    let as_used = |c: BufferCaps| match p.window {
        Some(w) => BufferCaps {
            tcp_rmem_max: Some(0),
            tcp_wmem_max: Some(0),
            rmem_max: Some(u64::from(w).min(c.rmem_max.unwrap_or(u64::MAX))),
            wmem_max: Some(u64::from(w).min(c.wmem_max.unwrap_or(u64::MAX))),
        },
        None => BufferCaps {
            rmem_max: None,
            wmem_max: None,
            ..c
        },
    };
    let (sender, receiver) = (as_used(sender), as_used(receiver));
    let w = plan(&PathInput {
        rtt_us,
        target_bps: p.pacing_bps,
        sender,
        receiver,
        streams: None,
    });
    let streams = w
        .streams
        .min(ctl.welcome.max_streams.unwrap_or(u16::MAX).max(1));
    (streams, w.shortfall(&sender, &receiver))
}

/// Data-stream socket options for one end.
pub fn tuning_for(params: &TestParams, sends: bool) -> Tuning {
    Tuning {
        window: params.window,
        congestion: params.congestion.clone(),
        pacing_bytes_per_sec: params
            .pacing_bps
            .filter(|_| sends)
            .map(|r| (r / 8 / u64::from(params.streams.max(1))).max(1)),
        mss: params.mss,
    }
}

fn open_streams(
    ctl: &Control,
    params: &TestParams,
    accept: &TestAccept,
    opts: &ClientOptions,
) -> Result<Vec<ReadyStream>, EngineError> {
    let mut out = Vec::new();
    let keys = longhaul_proto::report::stream_keys(params);
    let mut tcp = match params.transport {
        Transport::Tcp => ctl.open_data_streams(&accept.token, &keys, opts, |s, direction| {
            sock::apply_tcp(s, &tuning_for(params, End::Client.sends(direction)))
        })?,
        Transport::Udp => Vec::new(),
    }
    .into_iter();
    for (k, (direction, stream)) in keys.into_iter().enumerate() {
        let mut io = None;
        let socket = match params.transport {
            Transport::Tcp => {
                let s = tcp.next().expect("one stream per key");
                match s.into_plain() {
                    Ok(tcp) => DataSocket::Tcp(Arc::new(tcp)),
                    Err(tls) => {
                        let tcp = tls
                            .tcp()
                            .try_clone()
                            .map_err(|e| EngineError::io("failed to clone a socket".into(), e))?;
                        io = Some(tls);
                        DataSocket::Tcp(Arc::new(tcp))
                    }
                }
            }
            Transport::Udp => {
                let port = *accept.udp_ports.get(k).ok_or_else(|| {
                    EngineError::Failed(format!(
                        "server gave {} UDP ports for more streams",
                        accept.udp_ports.len()
                    ))
                })?;
                let bind: SocketAddr = if ctl.peer.is_ipv4() {
                    "0.0.0.0:0".parse().expect("literal")
                } else {
                    "[::]:0".parse().expect("literal")
                };
                let u = UdpSocket::bind(bind)
                    .map_err(|e| EngineError::io("failed to bind a UDP socket".into(), e))?;
                if let Some(w) = params.window {
                    let r = socket2::SockRef::from(&u);
                    let _ = r.set_send_buffer_size(w as usize);
                    let _ = r.set_recv_buffer_size(w as usize);
                }
                u.connect(SocketAddr::new(ctl.peer.ip(), port))
                    .map_err(|e| {
                        EngineError::io(
                            format!("failed to address UDP port {port} of {}", ctl.peer),
                            e,
                        )
                    })?;
                DataSocket::Udp(Arc::new(u))
            }
        };
        out.push(ReadyStream {
            direction,
            stream,
            socket,
            io,
        });
    }
    Ok(out)
}

/// A refusal the server wrote on a data stream instead of taking it.
fn data_refusal(streams: &mut [ReadyStream]) -> Option<EngineError> {
    streams.iter_mut().find_map(|s| {
        let DataSocket::Tcp(t) = &s.socket else {
            return None;
        };
        let mut buf = [0u8; 4096];
        t.set_nonblocking(true).ok()?;
        let n = match &mut s.io {
            Some(io) => io.read(&mut buf).ok()?,
            None => (&**t).read(&mut buf).ok()?,
        };
        let mut d = longhaul_proto::frame::Decoder::new(4096);
        d.push(&buf[..n]);
        match Message::decode(&d.next_frame().ok()??).ok()? {
            Message::Refuse(r) => Some(SessionError::from(r).into()),
            _ => None,
        }
    })
}

fn register_udp(streams: &[ReadyStream], token: &str) {
    for s in streams {
        let DataSocket::Udp(u) = &s.socket else {
            continue;
        };
        let mut d = vec![0u8; udp::HEADER_LEN + token.len()];
        udp::Header {
            tag: udp::tag_of(token),
            stream: s.stream,
            flags: udp::FLAG_REGISTER,
            seq: 0,
            send_ns: 0,
        }
        .write(&mut d);
        d[udp::HEADER_LEN..].copy_from_slice(token.as_bytes());
        let _ = u.send(&d);
    }
}

/// Interval samples of both sides, merged and reported in order as soon
/// as both sides' sample of an interval is in.
#[derive(Default)]
struct Intervals {
    local: BTreeMap<u32, (bool, SideSnapshot)>,
    remote: BTreeMap<u32, SideSnapshot>,
    next: u32,
    prev: Option<(SideSnapshot, SideSnapshot)>,
}

impl Intervals {
    fn report(
        &mut self,
        params: &TestParams,
        omitted: bool,
        l: SideSnapshot,
        r: SideSnapshot,
        sink: &mut dyn Reporter,
    ) {
        let span = Span {
            client_from: self.prev.as_ref().map(|p| &p.0),
            client_to: &l,
            server_from: self.prev.as_ref().map(|p| &p.1),
            server_to: &r,
            complete: false,
        };
        sink.interval(&span.interval_report(params, self.next, omitted));
        self.prev = Some((l, r));
        self.next += 1;
    }

    fn flush(&mut self, params: &TestParams, sink: &mut dyn Reporter) {
        while self.local.contains_key(&self.next) && self.remote.contains_key(&self.next) {
            let (omitted, l) = self.local.remove(&self.next).expect("checked");
            let r = self.remote.remove(&self.next).expect("checked");
            self.report(params, omitted, l, r, sink);
        }
    }

    /// Reports the time after the last whole interval, unless it is a sliver.
    fn tail(
        &mut self,
        params: &TestParams,
        l: &SideSnapshot,
        r: &SideSnapshot,
        sink: &mut dyn Reporter,
    ) {
        let last = self.prev.as_ref().map_or(0, |p| p.0.elapsed_us);
        if params.interval_ms > 0 && l.elapsed_us.saturating_sub(last) > params.interval_ms * 100 {
            let omitted = last < params.omit_ms * 1000;
            self.report(params, omitted, l.clone(), r.clone(), sink);
        }
    }
}

/// Runs the client's side to the end and merges both sides' samples.
fn drive(
    ctl: &mut Control,
    mut run: SideRun,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
    warnings: Vec<String>,
    remote_active: Option<Arc<std::sync::atomic::AtomicU16>>,
) -> Result<Summary, EngineError> {
    let mut ticker = Ticker::new(run.start, params);
    // What the server was last told of its sending streams.
    let mut told = params.streams;
    let mut intervals = Intervals::default();
    let mut local_baseline = None;
    let mut local_end = None;
    let mut results: Option<PeerResults> = None;
    let mut interrupted = false;

    while local_end.is_none() || results.is_none() {
        if opts.interrupt.load(Ordering::Relaxed) && !interrupted {
            interrupted = true;
            run.stop();
            ctl.session.stop("interrupted by the user");
        }
        let now = Instant::now();
        for t in ticker.due(now) {
            let snap = run.snapshot();
            match t {
                crate::run::Tick::Baseline => local_baseline = Some(snap),
                crate::run::Tick::Interval { index, omitted } => {
                    intervals.local.insert(index, (omitted, snap));
                }
            }
        }
        if local_end.is_none() && run.finished() {
            if ticker.baseline_pending() {
                local_baseline = Some(run.snapshot());
            }
            local_end = Some(run.snapshot());
        }
        intervals.flush(params, sink);
        if let Some(n) = remote_active
            .as_ref()
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|&n| n != told)
        {
            told = n;
            ctl.session.active(n);
            ctl.flush()?;
        }
        let wait = ticker
            .next_due()
            .map_or(crate::CONTROL_TICK, |d| {
                d.saturating_duration_since(Instant::now())
            })
            .min(crate::CONTROL_TICK);
        match ctl.next_event(wait) {
            Ok(Some(ClientEvent::Interval(i))) => {
                intervals.remote.insert(i.index, i.snapshot);
            }
            Ok(Some(ClientEvent::Results(r))) => results = Some(r),
            Ok(_) => {}
            Err(e) => {
                run.stop();
                return Err(match e {
                    EngineError::Closed(_) => EngineError::Failed(format!(
                        "server {} closed the control connection mid-test",
                        ctl.conn.peer()
                    )),
                    EngineError::Refused { code, message } if code != RefuseCode::Busy => {
                        EngineError::Failed(format!("server ended the test: {message}"))
                    }
                    other => other,
                });
            }
        }
    }
    run.join();
    let results = results.expect("loop ends when set");
    let local_end = local_end.expect("loop ends when set");
    intervals.flush(params, sink);
    intervals.tail(params, &local_end, &results.end, sink);
    let error = run
        .error()
        .map(|e| format!("client {e}"))
        .or_else(|| results.error.clone().map(|e| format!("server {e}")))
        .or_else(|| interrupted.then(|| "interrupted by the user".to_string()));
    let span = Span {
        client_from: local_baseline.as_ref(),
        client_to: &local_end,
        server_from: results.baseline.as_ref(),
        server_to: &results.end,
        complete: true,
    };
    let summary = span.summary(params, warnings, error);
    sink.summary(&summary);
    if let Some(e) = &summary.error {
        if !interrupted {
            return Err(EngineError::Failed(e.clone()));
        }
    }
    Ok(summary)
}

/// Asks the server at `a` to run a test to the server at `b` and relays
/// its reports (nuttcp's third-party mode).
pub fn run_third_party(
    a: &str,
    b: &str,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Summary, EngineError> {
    let mut ctl = open_control(a, opts)?;
    ctl.session.request_third_party(
        Instant::now(),
        ThirdParty {
            target: b.to_string(),
            params: params.clone(),
            trust: {
                // What this client trusts for b, for a to pin.
                let t = &opts.security.trust;
                let mut fps = t.pins.clone();
                fps.extend(
                    t.known_hosts
                        .as_deref()
                        .and_then(|f| crate::tls::known_host(f, &host_key(b))),
                );
                fps
            },
            token: credential_for(!opts.security.plaintext, &opts.security.token),
            plaintext: opts.security.plaintext,
        },
        Duration::from_secs(86_400),
    );
    loop {
        if opts.interrupt.load(Ordering::Relaxed) {
            return Err(EngineError::Failed("interrupted by the user".into()));
        }
        match ctl.next_event(Duration::from_millis(100))? {
            Some(ClientEvent::Relay(Relay::Start(s))) => sink.setup(&s),
            Some(ClientEvent::Relay(Relay::Interval(i))) => sink.interval(&i),
            Some(ClientEvent::Relay(Relay::Warning { message })) => sink.warning(&message),
            Some(ClientEvent::Relay(Relay::Summary(s))) => {
                sink.summary(&s);
                return Ok(*s);
            }
            Some(ClientEvent::Relay(Relay::Failed(r))) => {
                return Err(match r.code {
                    RefuseCode::ServerError => {
                        EngineError::Failed(format!("{a} could not test to {b}: {}", r.message))
                    }
                    _ => SessionError::from(r).into(),
                })
            }
            _ => {}
        }
    }
}
