//! The perf client: connects to a server ([`crate::net::dial`]),
//! negotiates a test, opens the data streams, runs its side, merges both
//! sides' samples into interval reports and a summary, and hands them to a
//! [`Reporter`]; also the third-party test, which it asks a server to run.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::databind::DataKey;
use longhaul_proto::msg::*;
use longhaul_proto::report::{PeerResults, Setup, SideSnapshot, Span, StreamSetup, Summary};
use longhaul_proto::session::{ClientEvent, SessionError};

use crate::net::dial::{
    host_key, lent_token, open_control, ClientOptions, Control, INTERRUPT_POLL,
};
use crate::net::sock::{self, Tuning};
use crate::perf::register;
use crate::perf::side::{interval_end, End, ReadyStream, SideRun, Ticker};
use crate::perf::workers::DataSocket;
use crate::report::Reporter;
use crate::EngineError;

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
pub(crate) fn window_warnings(
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

/// Runs a memory-to-memory test against `target` (`HOST[:PORT]`) and
/// returns its summary; intervals go to `sink` as they complete.
pub fn run_perf(
    target: &str,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Summary, EngineError> {
    check_params(params)?;
    let ctl = open_control(target, opts)?;
    run_perf_over(ctl, target, params, opts, sink)
}

/// [`run_perf`] on a control connection to `target` that has completed
/// its handshake (a third-party run tells a longhaul server from anything
/// else by it).
pub(crate) fn run_perf_over(
    mut ctl: Control,
    target: &str,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Summary, EngineError> {
    let back = udp_back(&ctl, params)?;
    let (sized, plan_warning) = if opts.auto_streams {
        let (streams, warning) = streams_for_path(&ctl, params);
        let sized = TestParams {
            streams,
            ..params.clone()
        };
        (Some(sized), warning)
    } else {
        (None, None)
    };
    let params = sized.as_ref().unwrap_or(params);
    // Sending first, the far end needs this side's ports before it starts.
    let back_sockets = match back {
        true => Some(bind_back(&ctl, params, opts)?),
        false => None,
    };
    let accept = request_test(&mut ctl, params, back_sockets.as_deref(), opts)?;
    let binding = DataBinding::of(&ctl, params, &accept, target)?;
    if back && binding.key.is_none() {
        return Err(EngineError::Failed(format!(
            "the far end {target} ({}) took a UDP test it sends first to but gave no data key to prove its datagrams with",
            ctl.welcome.software
        )));
    }
    let mut streams = open_streams(&ctl, params, &accept, &binding, opts, back_sockets)?;
    let ready = match back {
        false => client_registers(&mut ctl, &mut streams, &accept, &binding)?,
        true => far_end_registers(&mut ctl, &streams, &accept, &binding, opts)?,
    };
    let earlier = plan_warning.into_iter().collect();
    let warnings = tell_setup(
        &ctl, target, params, &streams, &ready, &binding, earlier, sink,
    );
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

/// Asks the server for the test (with this side's ports for a UDP test
/// it sends first to) and waits until it takes it, queued meanwhile.
fn request_test(
    ctl: &mut Control,
    params: &TestParams,
    back_sockets: Option<&[(UdpSocket, u16)]>,
    opts: &ClientOptions,
) -> Result<TestAccept, EngineError> {
    let request = TestParams {
        udp_back_ports: match back_sockets {
            Some(b) => b.iter().map(|(_, port)| *port).collect(),
            None => Vec::new(),
        },
        ..params.clone()
    };
    ctl.session
        .request_test(Instant::now(), request, Duration::from_secs(86_400));
    loop {
        if opts.interrupt.load(Ordering::Relaxed) {
            return Err(EngineError::Interrupted(
                "while waiting for the server to take the test".into(),
            ));
        }
        match ctl.next_event(INTERRUPT_POLL)? {
            Some(ClientEvent::Accepted(a)) => return Ok(a),
            Some(ClientEvent::Queued(q)) => ctl.queued(&q),
            _ => {}
        }
    }
}

/// Tells the reporter the test's setup (both ends' streams, the
/// encryption) and its warnings (windows too small for the path, and
/// `earlier` ones); returns the warnings.
#[allow(clippy::too_many_arguments)]
fn tell_setup(
    ctl: &Control,
    target: &str,
    params: &TestParams,
    streams: &[ReadyStream],
    ready: &Ready,
    binding: &DataBinding,
    earlier: Vec<String>,
    sink: &mut dyn Reporter,
) -> Vec<String> {
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
    warnings.extend(earlier);
    warnings.extend(binding.warning.clone());
    let data_encrypted = binding.tls && params.transport == Transport::Tcp;
    sink.setup(&Setup {
        server: target.to_string(),
        server_software: ctl.welcome.software.clone(),
        server_host: ctl.welcome.host.clone(),
        protocol_version: ctl.welcome.version,
        params: params.clone(),
        local_streams: local_setups,
        remote_streams: ready.streams.clone(),
        encryption: match data_encrypted {
            true => ctl.conn.encryption(),
            false => "none".into(),
        },
        control_encryption: ctl.conn.encryption(),
        data_encrypted: Some(data_encrypted),
    });
    for w in &warnings {
        sink.warning(w);
    }
    warnings
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

pub(crate) fn setup_of(s: &ReadyStream) -> StreamSetup {
    let (sndbuf, rcvbuf, mss, congestion) = match &s.socket {
        DataSocket::Tcp(t) => {
            let (a, b, m) = sock::granted(t.as_fd());
            (a, b, m, sock::congestion(t.as_fd()))
        }
        DataSocket::Udp(u) | DataSocket::Iperf3Udp(u, _) => {
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

/// How a test's data streams join it and whether they use TLS, as the
/// server's answer allows.
struct DataBinding {
    /// The test's data key: streams join with proofs of it. None from a
    /// server that predates it (or for a request without `data_tls`):
    /// they join with the token.
    key: Option<DataKey>,
    /// TCP data streams use TLS.
    tls: bool,
    /// The client asked for plaintext data and the server cannot do it.
    warning: Option<String>,
}

impl DataBinding {
    fn of(
        ctl: &Control,
        params: &TestParams,
        accept: &TestAccept,
        target: &str,
    ) -> Result<DataBinding, EngineError> {
        let control_tls = ctl.conn.is_tls();
        let Some(hex) = &accept.data_key else {
            let warning = (params.data_tls == Some(false) && control_tls).then(|| {
                format!(
                    "server {target} ({}) predates plaintext perf data streams: they use TLS, and the rate is TLS's; upgrade the server to measure the path alone",
                    ctl.welcome.software
                )
            });
            return Ok(DataBinding {
                key: None,
                tls: control_tls,
                warning,
            });
        };
        let key = DataKey::parse(hex).ok_or_else(|| {
            EngineError::Failed(format!(
                "server {target} sent a malformed data key in its test acceptance (expected 64 lowercase hex digits)"
            ))
        })?;
        Ok(DataBinding {
            key: Some(key),
            tls: control_tls && params.data_tls != Some(false),
            warning: None,
        })
    }
}

/// The test's data streams: TCP ones joined, UDP ones addressed to the
/// server's ports, or, where the far end sends first, the sockets
/// `back` bound for it (connected once its datagrams arrive).
fn open_streams(
    ctl: &Control,
    params: &TestParams,
    accept: &TestAccept,
    binding: &DataBinding,
    opts: &ClientOptions,
    back: Option<Vec<(UdpSocket, u16)>>,
) -> Result<Vec<ReadyStream>, EngineError> {
    let mut out = Vec::new();
    let mut back = back.map(Vec::into_iter);
    let keys = longhaul_proto::report::stream_keys(params);
    let tune = |s: &socket2::Socket, direction| {
        sock::apply_tcp(s, &tuning_for(params, End::Client.sends(direction)))
    };
    let mut tcp = match (params.transport, &binding.key) {
        (Transport::Tcp, Some(key)) => {
            ctl.open_proven_streams(&accept.token, key, binding.tls, &keys, opts, tune)?
        }
        (Transport::Tcp, None) => ctl.open_data_streams(&accept.token, &keys, opts, tune)?,
        (Transport::Udp, _) => Vec::new(),
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
            Transport::Udp if back.is_some() => {
                let (u, _) = back
                    .as_mut()
                    .and_then(Iterator::next)
                    .expect("one socket per key");
                DataSocket::Udp(Arc::new(u))
            }
            Transport::Udp => {
                let port = *accept.udp_ports.get(k).ok_or_else(|| {
                    EngineError::Failed(format!(
                        "server gave {} UDP ports for more streams",
                        accept.udp_ports.len()
                    ))
                })?;
                let u = UdpSocket::bind(opts.local_for(ctl.peer))
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

/// Whether the far end sends the first UDP datagram of each stream: a UDP
/// test to a far end over ssh that connected back, being behind a
/// firewall that takes no new connection from here (nor any datagram of
/// ours to its ports); an error if that far end cannot.
fn udp_back(ctl: &Control, params: &TestParams) -> Result<bool, EngineError> {
    if params.transport != Transport::Udp {
        return Ok(false);
    }
    let Some(o) = crate::net::back::Route::opened_at(ctl.peer).filter(|o| o.opened_by == "far_end")
    else {
        return Ok(false);
    };
    if !ctl.welcome.can(FEATURE_UDP_BACK) {
        return Err(EngineError::Usage(format!(
            "the far end on {} opened the connections itself ({}), so its UDP streams must start from its side too, and its longhaul ({}) is too old to do that: install this version there (or pass --remote-path to one), test with TCP (without -u), or open its UDP ports to this host",
            ctl.peer,
            o.reason.unwrap_or_default(),
            ctl.welcome.software
        )));
    }
    Ok(true)
}

/// A UDP socket per (direction, stream) for the far end to send its first
/// datagram to, on the control connection's local address (the far end
/// reached it), not yet connected; and its port.
fn bind_back(
    ctl: &Control,
    params: &TestParams,
    opts: &ClientOptions,
) -> Result<Vec<(UdpSocket, u16)>, EngineError> {
    let local = ctl
        .conn
        .tcp()
        .local_addr()
        .map(|a| SocketAddr::new(a.ip(), 0))
        .unwrap_or_else(|_| opts.local_for(ctl.peer));
    longhaul_proto::report::stream_keys(params)
        .into_iter()
        .map(|_| {
            let u = UdpSocket::bind(local).map_err(|e| {
                EngineError::io(format!("failed to bind a UDP socket on {local}"), e)
            })?;
            if let Some(w) = params.window {
                let r = socket2::SockRef::from(&u);
                let _ = r.set_send_buffer_size(w as usize);
                let _ = r.set_recv_buffer_size(w as usize);
            }
            u.set_nonblocking(true)
                .map_err(|e| EngineError::io("failed to set up a UDP socket".into(), e))?;
            let port = u
                .local_addr()
                .map_err(|e| EngineError::io("failed to read a UDP socket's port".into(), e))?
                .port();
            Ok((u, port))
        })
        .collect()
}

/// The client registers its UDP streams (`PROTOCOL.md` 8.2) until the
/// server is ready; its TCP streams joined already.
fn client_registers(
    ctl: &mut Control,
    streams: &mut [ReadyStream],
    accept: &TestAccept,
    binding: &DataBinding,
) -> Result<Ready, EngineError> {
    let mut last_register = Instant::now() - Duration::from_secs(1);
    loop {
        if last_register.elapsed() >= register::EVERY {
            register_udp(streams, &accept.token, binding.key.as_ref());
            last_register = Instant::now();
        }
        match ctl.next_event(register::EVERY) {
            Ok(Some(ClientEvent::Ready(r))) => return Ok(r),
            Ok(_) => {}
            // A server that refused a data stream said why on that stream.
            Err(e) => return Err(data_refusal(streams).unwrap_or(e)),
        }
    }
}

/// How long the far end's first datagrams may take to arrive, from its
/// acceptance of the test.
const BACK_WAIT: Duration = Duration::from_secs(10);

/// The far end registers its UDP streams with this side (`PROTOCOL.md`
/// 8.2.1): waits for its `Ready` and, on each socket, the first datagram
/// from the far end's host that proves the socket's slot, and connects the
/// socket to where it came from. What else arrives is dropped.
fn far_end_registers(
    ctl: &mut Control,
    streams: &[ReadyStream],
    accept: &TestAccept,
    binding: &DataBinding,
    opts: &ClientOptions,
) -> Result<Ready, EngineError> {
    let far = ctl.peer.ip();
    let mut pending: Vec<&ReadyStream> = streams.iter().collect();
    let mut strangers = register::Strangers::default();
    let mut ready = None;
    let until = Instant::now() + BACK_WAIT;
    let missing = |pending: &[&ReadyStream], strangers: &register::Strangers, why: String| {
        let ports: Vec<String> = pending
            .iter()
            .filter_map(|s| match &s.socket {
                DataSocket::Udp(u) => u.local_addr().ok().map(|a| a.to_string()),
                _ => None,
            })
            .collect();
        EngineError::Failed(format!(
            "no UDP datagram from the far end {far} reached {} ({why}; {} turned away from elsewhere, {} unproven): a firewall on this host or between drops UDP from there. Test with TCP (without -u), or let UDP from {far} in",
            ports.join(", "),
            strangers.elsewhere,
            strangers.unproven
        ))
    };
    while ready.is_none() || !pending.is_empty() {
        if opts.interrupt.load(Ordering::Relaxed) {
            return Err(EngineError::Interrupted(
                "while the far end's UDP streams registered".into(),
            ));
        }
        pending.retain(|s| {
            let DataSocket::Udp(u) = &s.socket else {
                return false;
            };
            let slot = register::Slot {
                token: &accept.token,
                key: binding.key.as_ref(),
                stream: s.stream,
                direction: s.direction,
            };
            register::take(u, far, &slot, &mut strangers).is_none()
        });
        if pending.is_empty() && ready.is_some() {
            break;
        }
        if Instant::now() >= until {
            return Err(missing(
                &pending,
                &strangers,
                format!("within {} s", BACK_WAIT.as_secs()),
            ));
        }
        match ctl.next_event(crate::CONTROL_TICK) {
            Ok(Some(ClientEvent::Ready(r))) => ready = Some(r),
            Ok(_) => {}
            Err(e) if !pending.is_empty() => {
                return Err(missing(&pending, &strangers, e.to_string()))
            }
            Err(e) => return Err(e),
        }
    }
    if strangers.elsewhere + strangers.unproven > 0 {
        tracing::info!(
            "the far end's UDP streams registered; {} datagrams from elsewhere and {} unproven were turned away",
            strangers.elsewhere,
            strangers.unproven
        );
    }
    Ok(ready.expect("loop ends when set"))
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

/// Sends each UDP stream's registration: the slot's proof of the data key
/// where the test has one, else (an older server) the token.
fn register_udp(streams: &[ReadyStream], token: &str, key: Option<&DataKey>) {
    for s in streams {
        let DataSocket::Udp(u) = &s.socket else {
            continue;
        };
        register::Slot {
            token,
            key,
            stream: s.stream,
            direction: s.direction,
        }
        .send(u);
    }
}

/// Interval samples of both sides, merged and reported in order as soon
/// as both sides' sample of an interval is in. An interval ends when the
/// later of its two samples was taken (each side's time from its own
/// start: a receiver may still take bytes after the sender's end), never
/// before the previous interval's end nor after the test's
/// ([`interval_end`]).
#[derive(Default)]
struct Intervals {
    local: BTreeMap<u32, (bool, SideSnapshot)>,
    remote: BTreeMap<u32, SideSnapshot>,
    /// The next sample to merge.
    next: u32,
    /// The index of the next interval reported: a pair of samples that
    /// adds no time (taken after both sides' streams ended) is not one.
    reported: u32,
    prev: Option<(SideSnapshot, SideSnapshot)>,
    /// Where the last interval reported ended.
    prev_end_us: u64,
    /// When the test ended, once both sides have.
    end_us: Option<u64>,
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
        let sampled_us = l.elapsed_us.max(r.elapsed_us);
        let Some(end_us) = interval_end(self.prev_end_us, sampled_us, self.end_us) else {
            return;
        };
        let span = Span {
            client_from: self.prev.as_ref().map(|p| &p.0),
            client_to: &l,
            server_from: self.prev.as_ref().map(|p| &p.1),
            server_to: &r,
            complete: false,
        };
        let mut report = span.interval_report(params, self.reported, omitted);
        report.start_s = self.prev_end_us as f64 / 1e6;
        report.end_s = end_us as f64 / 1e6;
        sink.interval(&report);
        self.prev = Some((l, r));
        self.prev_end_us = end_us;
        self.reported += 1;
    }

    fn flush(&mut self, params: &TestParams, sink: &mut dyn Reporter) {
        while self.local.contains_key(&self.next) && self.remote.contains_key(&self.next) {
            let (omitted, l) = self.local.remove(&self.next).expect("checked");
            let r = self.remote.remove(&self.next).expect("checked");
            self.next += 1;
            self.report(params, omitted, l, r, sink);
        }
    }

    /// Reports the time after the last whole interval to the test's end
    /// (both sides' ends), unless it is a sliver.
    fn tail(
        &mut self,
        params: &TestParams,
        l: &SideSnapshot,
        r: &SideSnapshot,
        sink: &mut dyn Reporter,
    ) {
        let end_us = l.elapsed_us.max(r.elapsed_us);
        let last = self.prev_end_us;
        if params.interval_ms > 0 && end_us.saturating_sub(last) > params.interval_ms * 100 {
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
                crate::perf::side::Tick::Baseline => local_baseline = Some(snap),
                crate::perf::side::Tick::Interval { index, omitted } => {
                    intervals.local.insert(index, (omitted, snap));
                }
            }
        }
        run.end_on_time(now);
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
                        EngineError::Failed(format!(
                            "server ended the test: {}",
                            longhaul_proto::units::escaped(&message)
                        ))
                    }
                    other => other,
                });
            }
        }
    }
    run.join();
    let results = results.expect("loop ends when set");
    let local_end = local_end.expect("loop ends when set");
    intervals.end_us = Some(local_end.elapsed_us.max(results.end.elapsed_us));
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
    let mut summary = span.summary(params, warnings, error);
    // Over ssh (`perf HOST:`): which side opened the connections.
    summary.connections = crate::net::back::Route::opened_at(ctl.peer);
    sink.summary(&summary);
    if let Some(e) = &summary.error {
        if !interrupted {
            // The server's part of it is its own words.
            let e = longhaul_proto::units::escaped(e).to_string();
            return Err(EngineError::Failed(e));
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
                        .and_then(|f| crate::net::tls::known_host(f, &host_key(b))),
                );
                fps
            },
            // b's own credential (or the default one), lent to a for b.
            token: lent_token(
                !opts.security.plaintext,
                &opts.security.token_for(b).map(str::to_string),
            ),
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
            Some(ClientEvent::Relay(Relay::Warning { message })) => {
                sink.warning(&longhaul_proto::units::escaped(&message).to_string());
            }
            Some(ClientEvent::Relay(Relay::Summary(s))) => {
                sink.summary(&s);
                return Ok(*s);
            }
            Some(ClientEvent::Relay(Relay::Failed(r))) => {
                return Err(match r.code {
                    RefuseCode::ServerError => EngineError::Failed(format!(
                        "{a} could not test to {b}: {}",
                        longhaul_proto::units::escaped(&r.message)
                    )),
                    _ => SessionError::from(r).into(),
                })
            }
            _ => {}
        }
    }
}
