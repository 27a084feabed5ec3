//! The server's side of a perf test: the test a control connection owns,
//! its data streams joining (TCP by token or by a proof of the test's data
//! key, UDP by registration, the client's or, `udp_back_ports`, this
//! side's), and the caps an anonymous test is held to.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::databind::DataKey;
use longhaul_proto::msg::*;
use longhaul_proto::report::{stream_keys, PeerResults, SideInterval, StreamSetup};
use longhaul_proto::session::ServerSession;
use longhaul_proto::units::escaped;

use super::slots::{join_by_proof, register, TestGuard};
use super::{auth, peer_ip, refuse_on, Attach, ServeConfig, Shared};
use crate::net::conn::FramedConn;
use crate::net::sock;
use crate::perf::client::tuning_for;
use crate::perf::register::{self, Slot, Strangers};
use crate::perf::side::{End, ReadyStream, SideRun, Tick, Ticker};
use crate::perf::workers::DataSocket;

/// A test this control connection owns, from acceptance to results.
pub(super) struct Test {
    params: TestParams,
    token: String,
    /// The data key its streams prove (the request had `data_tls`); None:
    /// they join by token.
    data_key: Option<DataKey>,
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
    /// Datagrams turned away while the UDP streams registered.
    strangers: Strangers,
    /// This side sends the UDP registrations, to the client's ports
    /// (`udp_back_ports`), until the test starts.
    back: bool,
    /// When it last sent them.
    registered_at: Option<Instant>,
    _guard: TestGuard,
}

/// What a look at a test found.
pub(super) enum Step {
    /// Nothing for the control loop to do.
    Running,
    /// Every stream has joined; the client was told.
    Ready,
    /// The run is over and its results went to the client: the test is
    /// done, having moved `bytes` (this side, both directions).
    Finished { bytes: u64, error: Option<String> },
}

impl Test {
    /// Attaches streams that joined, tells the client once all are in, and
    /// while the run goes sends its intervals and, at its end, its results.
    pub(super) fn poll(&mut self, session: &mut ServerSession, peer: &str, now: Instant) -> Step {
        let t = self;
        attach_streams(t);
        if t.back && t.registered_at.is_none_or(|at| now >= at + register::EVERY) {
            t.registered_at = Some(now);
            for (direction, stream, u, _) in &t.udp {
                Slot {
                    token: &t.token,
                    key: t.data_key.as_ref(),
                    stream: *stream,
                    direction: *direction,
                }
                .send(u);
            }
        }
        let all_in =
            t.tcp.len() + t.udp.len() == stream_keys(&t.params).len() && t.udp.iter().all(|u| u.3);
        if !t.ready && all_in {
            t.ready = true;
            let caps = sock::buffer_caps();
            session.ready(Ready {
                streams: setups(t),
                rmem_max: caps.rmem_max,
                wmem_max: caps.wmem_max,
            });
            return Step::Ready;
        }
        let Some(run) = &mut t.run else {
            return Step::Running;
        };
        run.end_on_time(now);
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
        if !run.finished() {
            return Step::Running;
        }
        let end = run.snapshot();
        let baseline = match t.ticker.as_ref().is_some_and(Ticker::baseline_pending) {
            true => Some(end.clone()),
            false => t.baseline.take(),
        };
        let error = run.error();
        let bytes = end.streams.iter().map(|s| s.bytes).sum::<u64>();
        tracing::info!(
            "test of {} finished: {} bytes{}",
            peer,
            bytes,
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
                error: error.clone(),
            },
        );
        Step::Finished { bytes, error }
    }

    /// Starts this side's run when the client says `Start`; a run that
    /// cannot start is refused to the client.
    pub(super) fn start(&mut self, session: &mut ServerSession) {
        let t = self;
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

    /// The client's tuner: `n` of this side's sending streams send.
    pub(super) fn set_active(&self, n: u16) {
        if let Some(a) = &self.active {
            a.store(n.clamp(1, self.params.streams.max(1)), Ordering::Relaxed);
        }
    }

    /// Stops the run, if it started.
    pub(super) fn stop(&self) {
        if let Some(run) = &self.run {
            run.stop();
        }
    }
}

pub(super) fn new_test(
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
    if shared.cfg.perf_tls_only {
        tls_only(&p, conn.is_tls()).map_err(|m| (RefuseCode::TlsRequired, m))?;
    }
    // The client takes this side's UDP registrations by the data key's proofs.
    let back = p.transport == Transport::Udp && !p.udp_back_ports.is_empty();
    let data_key = match p.data_tls.is_some() || back {
        true => Some(new_data_key().map_err(|m| (RefuseCode::ServerError, m))?),
        false => None,
    };
    let peer = peer_ip(conn);
    let back_to = match (back, peer) {
        (true, None) => {
            return Err((
                RefuseCode::ServerError,
                "cannot tell the control connection's peer address to send UDP to".into(),
            ))
        }
        (_, peer) => peer.filter(|_| back),
    };
    let p = &p;
    let (guard, rx) = register(shared, conn, access)?;
    let guard_token = guard.token.clone();
    if data_key.is_some() {
        join_by_proof(shared, &guard_token);
    }
    let mut udp_sockets = Vec::new();
    let mut ports = Vec::new();
    if p.transport == Transport::Udp {
        let local_ip = conn
            .tcp()
            .local_addr()
            .map_err(|e| (RefuseCode::ServerError, e.to_string()))?
            .ip();
        for (k, (d, i)) in stream_keys(p).into_iter().enumerate() {
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
            // Sending first, to the client's port: registered as it is.
            if let (Some(ip), Some(&port)) = (back_to, p.udp_back_ports.get(k)) {
                u.connect(SocketAddr::new(ip, port)).map_err(|e| {
                    (
                        RefuseCode::ServerError,
                        format!("failed to address UDP port {port} of {ip}: {e}"),
                    )
                })?;
                u.set_nonblocking(false)
                    .map_err(|e| (RefuseCode::ServerError, e.to_string()))?;
            }
            udp_sockets.push((d, i, u, back_to.is_some()));
        }
    }
    let test_id = shared.next_test.fetch_add(1, Ordering::SeqCst);
    Ok((
        Test {
            params: p.clone(),
            token: guard_token.clone(),
            data_key: data_key.clone(),
            rx,
            tcp: Vec::new(),
            udp: udp_sockets,
            ready: false,
            run: None,
            active: None,
            ticker: None,
            baseline: None,
            peer,
            strangers: Strangers::default(),
            back,
            registered_at: None,
            _guard: guard,
        },
        TestAccept {
            test_id,
            token: guard_token,
            udp_ports: ports,
            data_key: data_key.map(|k| k.to_hex()),
        },
    ))
}

/// A fresh data key from the OS's CSPRNG.
fn new_data_key() -> Result<DataKey, String> {
    let mut k = [0u8; longhaul_proto::databind::KEY_LEN];
    getrandom::fill(&mut k)
        .map_err(|e| format!("failed to draw a data key from the OS random source: {e}"))?;
    Ok(DataKey::from_bytes(k))
}

/// `serve --perf-tls-only`: refuses a test whose data would cross the
/// network unencrypted.
fn tls_only(p: &TestParams, control_tls: bool) -> Result<(), String> {
    const WHY: &str =
        "this server (serve --perf-tls-only) runs perf tests with encrypted data only";
    if !control_tls {
        return Err(format!(
            "{WHY}: run perf with --tls and without --insecure-plaintext"
        ));
    }
    if p.transport == Transport::Udp {
        return Err(format!(
            "{WHY}, and UDP datagrams cannot be encrypted: run a TCP test with --tls"
        ));
    }
    if p.data_tls == Some(false) {
        return Err(format!("{WHY}: run perf with --tls"));
    }
    Ok(())
}

/// Why a data connection may not join its test, if it may not: where the
/// test has a data key, a proof of it for this slot (in TLS where the
/// client asked for TLS). Which of token and proof a test takes the
/// server checked before it handed the stream over (`wrong_join`).
fn join_refusal(t: &Test, a: &Attach) -> Option<(RefuseCode, &'static str)> {
    let (k, proof) = match (&t.data_key, &a.proof) {
        (Some(k), Some(proof)) => (k, proof),
        (None, None) => return None,
        _ => {
            return Some((
                RefuseCode::Protocol,
                "token or proof, not as this test takes them",
            ))
        }
    };
    if !k.verify(&t.token, Transport::Tcp, a.index, a.direction, proof) {
        return Some((
            RefuseCode::Unauthorized,
            "the data stream's proof does not match this test, stream and direction",
        ));
    }
    if t.params.data_tls == Some(true) && !a.stream.is_tls() {
        return Some((
            RefuseCode::TlsRequired,
            "this test's data streams use TLS (perf --tls): a plaintext one is refused",
        ));
    }
    None
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
        // A replayed proof finds its slot taken (`dup`, or `ready`).
        if t.ready || !known || dup || t.params.transport != Transport::Tcp {
            tracing::warn!(
                "refusing a data stream ({:?} {}) of a test: not part of it, taken, or too late",
                a.direction,
                a.index
            );
            refuse_on(
                &mut *a.stream,
                RefuseCode::Protocol,
                "data stream index not part of this test, already joined, or too late",
            );
            continue;
        }
        if let Some((code, message)) = join_refusal(t, &a) {
            tracing::warn!(
                "refusing a data stream ({:?} {}): {message}",
                a.direction,
                a.index
            );
            refuse_on(&mut *a.stream, code, message);
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
    let Some(peer) = t.peer else { return };
    if t.back {
        return;
    }
    for (direction, stream, u, registered) in t.udp.iter_mut().filter(|u| !u.3) {
        let slot = Slot {
            token: &t.token,
            key: t.data_key.as_ref(),
            stream: *stream,
            direction: *direction,
        };
        // Only the control connection's host may register: data sent
        // anywhere else would make this server a reflector.
        *registered = register::take(u, peer, &slot, &mut t.strangers).is_some();
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
            DataSocket::Udp(_) | DataSocket::Iperf3Udp(..) => None,
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

/// Holds an anonymous test to the public caps: refuses what asks for more
/// time or rate than they allow, and caps this side's sending to the rate
/// where the request left it open.
pub(super) fn public_caps(cfg: &ServeConfig, p: &mut TestParams) -> Result<(), String> {
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
