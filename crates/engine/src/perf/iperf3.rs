//! `perf --iperf3`: a test against a stock iperf3 server. The protocol is
//! `proto::iperf3::Client`; this drives it over the control connection,
//! opens the data streams, runs this side with the same [`SideRun`] as
//! any perf test (so its TCP_INFO counters, CPU and rates are perf's),
//! and merges the server's results into a [`Summary`] for the reporter.
//!
//! What each end counts: this end samples its own streams as perf does
//! (bytes, the sender's TCP_INFO, its test threads' CPU); the iperf3
//! server sends, at the end only, each stream's bytes (sent or received),
//! its retransmits when it sent, and its whole process's CPU. So the
//! intervals are this end's counts alone, and the summary takes the
//! receiver's bytes from whichever end received, as any perf summary
//! does; its notes say which figure came from which end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_proto::iperf3::{
    self, stream_id, stream_index, Client, ClientEvent, Cookie, Iperf3Error, Params, Results,
    StreamResult,
};
use longhaul_proto::msg::{Direction, Mode, RefuseCode, TestParams, Transport};
use longhaul_proto::report::{stream_keys, SideSnapshot, Span, StreamSample, Summary, UdpRecv};
use longhaul_proto::units::saturating_total;
use longhaul_proto::units::{format_bytes, format_rate};

use crate::net::dial::ClientOptions;
use crate::net::sock;
use crate::perf::client::{setup_of, tuning_for, window_warnings};
use crate::perf::side::{clip_sample, End, ReadyStream, SideRun, Tick, Ticker};
use crate::perf::workers::DataSocket;
use crate::report::Reporter;
use crate::EngineError;

/// How long the server may take for each step before the test starts.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long the results exchange may take after `TEST_END`.
const RESULTS: Duration = Duration::from_secs(10);

/// The parameters message for a perf test, or why iperf3 cannot run it.
pub fn params_for(p: &TestParams) -> Result<Params, EngineError> {
    let no = |what: &str| {
        Err(EngineError::Usage(format!(
            "--iperf3: {what} is not supported against an iperf3 server"
        )))
    };
    if p.bytes.is_some() {
        return no("a byte count (-n); give a time with -t");
    }
    if p.pacing_bps.is_some() {
        return no("--pacing");
    }
    if p.data_tls == Some(true) {
        return no("--tls (iperf3's data streams are plaintext)");
    }
    let secs = |ms: u64, what: &str| {
        if ms % 1000 != 0 {
            return Err(EngineError::Usage(format!(
                "--iperf3: iperf3 counts {what} in whole seconds; give -t/--omit in seconds"
            )));
        }
        Ok(ms / 1000)
    };
    let time = secs(p.duration_ms.unwrap_or(10_000), "the test's time")?;
    let omit = secs(p.omit_ms, "the omitted time")?;
    let udp = p.transport == Transport::Udp;
    if udp {
        let len = u64::from(p.length);
        if len < iperf3::UDP_HEADER_LEN_32 as u64 || len > iperf3::MAX_UDP_LEN {
            return Err(EngineError::Usage(format!(
                "--iperf3 -u: a datagram of {len} bytes (-l); iperf3 takes {} to {}",
                iperf3::UDP_HEADER_LEN_32,
                iperf3::MAX_UDP_LEN
            )));
        }
        if p.congestion.is_some() {
            return no("a congestion control (-C) with UDP (-u)");
        }
    }
    // iperf3's -b is per stream; ours is the total of a direction.
    let per_stream = p
        .udp_rate_bps
        .map(|r| r / u64::from(p.streams.max(1)))
        .unwrap_or(0);
    Ok(Params {
        tcp: !udp,
        udp,
        omit: Some(omit),
        time: Some(time),
        parallel: Some(u64::from(p.streams)),
        reverse: p.mode == Mode::Down,
        bidirectional: p.mode == Mode::Bidir,
        window: p.window.map(u64::from),
        len: Some(u64::from(p.length)),
        bandwidth: Some(per_stream),
        pacing_timer: Some(1000),
        mss: p.mss.map(u64::from),
        congestion: p.congestion.clone(),
        client_version: Some(format!("longhaul {}", env!("CARGO_PKG_VERSION"))),
        ..Params::default()
    })
}

fn refused(target: &str, e: Iperf3Error) -> EngineError {
    match e {
        Iperf3Error::Busy => EngineError::Refused {
            code: RefuseCode::Busy,
            message: format!(
                "iperf3 server {target} is busy running a test (ACCESS_DENIED); try again later"
            ),
        },
        Iperf3Error::ServerError { .. } => EngineError::Refused {
            code: RefuseCode::Limit,
            message: format!("iperf3 server {target}: {e}"),
        },
        e => EngineError::Failed(format!("iperf3 server {target}: {e}")),
    }
}

/// The control connection and its machine.
struct Control<'a> {
    target: &'a str,
    sock: TcpStream,
    machine: Client,
}

impl Control<'_> {
    fn flush(&mut self) -> Result<(), EngineError> {
        let out = self.machine.take_transmit();
        if !out.is_empty() {
            self.sock.write_all(&out).map_err(|e| {
                EngineError::io(
                    format!("failed to write to iperf3 server {}", self.target),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// Reads what the server sent within `wait` into the machine.
    fn pump(&mut self, wait: Duration) -> Result<(), EngineError> {
        self.flush()?;
        let _ = self
            .sock
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))));
        let mut buf = [0u8; 4096];
        match self.sock.read(&mut buf) {
            Ok(0) => Err(EngineError::Closed(format!(
                "iperf3 server {} (the control connection ended)",
                self.target
            ))),
            Ok(n) => {
                let r = self.machine.receive(&buf[..n]);
                self.flush()?;
                r.map_err(|e| refused(self.target, e))
            }
            Err(e) if crate::net::conn::transient(&e) => Ok(()),
            Err(e) => Err(EngineError::io(
                format!("failed to read from iperf3 server {}", self.target),
                e,
            )),
        }
    }

    /// Waits for the next event, up to `within`.
    fn next(&mut self, within: Duration, during: &str) -> Result<ClientEvent, EngineError> {
        match next_within(self, within, |c| c.machine.poll_event(), Self::pump)? {
            Some(e) => Ok(e),
            None => Err(EngineError::Timeout(format!(
                "{during} with iperf3 server {}",
                self.target
            ))),
        }
    }
}

/// The next event of one end of an iperf3 control connection (the
/// client's here, the server's in `server::iperf3`), waiting up to
/// `within`: `poll` asks its machine, `pump` reads its socket for at most
/// the time given. None: no event in time.
pub(crate) fn next_within<C, T, E>(
    end: &mut C,
    within: Duration,
    poll: impl Fn(&mut C) -> Option<T>,
    pump: impl Fn(&mut C, Duration) -> Result<(), E>,
) -> Result<Option<T>, E> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(e) = poll(end) {
            return Ok(Some(e));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        pump(end, left.min(Duration::from_millis(100)))?;
    }
}

fn connect(target: &str, opts: &ClientOptions) -> Result<(TcpStream, SocketAddr), EngineError> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| EngineError::Connect(format!("cannot resolve {target}: {e}")))?
        .collect();
    let addrs = opts.addresses(target, addrs)?;
    let mut last = None;
    for a in addrs {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(a),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(|e| EngineError::io("failed to make a socket".into(), e))?;
        opts.bind_first(&s)
            .map_err(|e| EngineError::Usage(e.to_string()))?;
        match s.connect_timeout(&a.into(), opts.connect_timeout) {
            Ok(()) => return Ok((s.into(), a)),
            Err(e) => last = Some(e),
        }
    }
    Err(EngineError::Connect(match last {
        Some(e) => format!("cannot connect to iperf3 server {target}: {e}"),
        None => format!("{target} resolves to no address"),
    }))
}

/// Runs a test against the iperf3 server at `target` (`HOST:PORT`) and
/// returns its summary; intervals (this end's counts) go to `sink`.
pub fn run_iperf3(
    target: &str,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Summary, EngineError> {
    crate::perf::client::check_params(params)?;
    let wire = params_for(params)?;
    let (sock, peer) = connect(target, opts)?;
    let _ = sock.set_nodelay(true);
    let mut raw = [0u8; iperf3::COOKIE_LEN - 1];
    getrandom::fill(&mut raw)
        .map_err(|e| EngineError::Failed(format!("no randomness for the iperf3 cookie: {e}")))?;
    let cookie = Cookie::from_random(raw);
    let mut ctl = Control {
        target,
        sock,
        machine: Client::new(&cookie, &wire),
    };
    let ev = ctl.next(HANDSHAKE, "waiting for the parameter exchange")?;
    if ev != ClientEvent::CreateStreams {
        return Err(EngineError::Failed(format!(
            "iperf3 server {target}: unexpected {ev:?} before the streams"
        )));
    }
    let mut streams = Vec::new();
    for (direction, stream) in stream_keys(params) {
        let socket = if wire.udp {
            let timeout = opts.connect_timeout.max(HANDSHAKE);
            let u = udp_stream(target, peer, params, opts, timeout)?;
            DataSocket::Iperf3Udp(Arc::new(u), false)
        } else {
            let t = tcp_stream(target, peer, params, opts, &cookie, direction, stream)?;
            DataSocket::Tcp(Arc::new(t))
        };
        streams.push(ReadyStream {
            direction,
            stream,
            socket,
            io: None,
        });
    }
    let setups: Vec<_> = streams.iter().map(setup_of).collect();
    loop {
        match ctl.next(HANDSHAKE, "waiting for the test to start")? {
            ClientEvent::TestStart => continue,
            ClientEvent::Running => break,
            ev => {
                return Err(EngineError::Failed(format!(
                    "iperf3 server {target}: unexpected {ev:?} before the test ran"
                )))
            }
        }
    }
    let mut warnings = tell_setup(sink, target, peer, params, setups);
    let mut run = SideRun::start(End::Client, params, streams, opts.local_cpu, "", None)?;
    let baseline = measure(&mut ctl, &mut run, params, opts, sink)?;
    let local_end = run.snapshot();
    // After TEST_END the server closes its streams: a sender still in a
    // write then fails, which is the end, not an error of the test.
    let error = run.error();
    let theirs = exchange_results(&mut ctl, params, baseline.as_ref(), &local_end)?;
    run.stop();
    run.join();
    let remote = remote_snapshot(params, &theirs).map_err(|m| {
        EngineError::Failed(format!(
            "iperf3 server {target} sent results that do not fit the test: {m}"
        ))
    })?;
    warnings.extend(figures_notes(
        params,
        baseline.as_ref(),
        &local_end,
        &remote,
        &theirs,
    ));
    let span = Span {
        client_from: baseline.as_ref(),
        client_to: &local_end,
        server_from: None,
        server_to: &remote,
        complete: true,
    };
    let mut summary = span.summary(params, warnings, error);
    let server_sends = params
        .mode
        .directions()
        .iter()
        .any(|&d| End::Server.sends(d));
    if params.transport == Transport::Tcp && server_sends {
        match server_retransmits(params, &theirs) {
            Some(n) => {
                summary.retransmits += n;
                summary.retransmits_unknown = false;
            }
            None => summary.retransmits_unknown = true,
        }
    }
    sink.summary(&summary);
    Ok(summary)
}

/// One TCP data stream to the iperf3 server, with the test's socket
/// options, that names the test by its cookie.
fn tcp_stream(
    target: &str,
    peer: SocketAddr,
    params: &TestParams,
    opts: &ClientOptions,
    cookie: &Cookie,
    direction: Direction,
    stream: u16,
) -> Result<TcpStream, EngineError> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(peer),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| EngineError::io("failed to make a data socket".into(), e))?;
    sock::apply_tcp(&s, &tuning_for(params, End::Client.sends(direction)))
        .map_err(|e| EngineError::io("failed to set a data socket's options".into(), e))?;
    opts.bind_first(&s)
        .map_err(|e| EngineError::Usage(e.to_string()))?;
    s.connect_timeout(&peer.into(), opts.connect_timeout)
        .map_err(|e| {
            EngineError::Connect(format!(
                "cannot connect data stream {stream} to iperf3 server {target}: {e}"
            ))
        })?;
    let mut t: TcpStream = s.into();
    t.write_all(cookie.as_bytes())
        .map_err(|e| EngineError::io("failed to send a data stream's cookie".into(), e))?;
    Ok(t)
}

/// Tells the reporter the test's setup and this end's window warnings;
/// returns the warnings.
fn tell_setup(
    sink: &mut dyn Reporter,
    target: &str,
    peer: SocketAddr,
    params: &TestParams,
    setups: Vec<longhaul_proto::report::StreamSetup>,
) -> Vec<String> {
    let warnings = window_warnings(
        params,
        "local",
        &setups,
        (
            sock::sysctl_u64("/proc/sys/net/core/rmem_max"),
            sock::sysctl_u64("/proc/sys/net/core/wmem_max"),
        ),
    );
    sink.setup(&longhaul_proto::report::Setup {
        server: target.to_string(),
        server_software: "iperf3".into(),
        server_host: peer.to_string(),
        protocol_version: 3,
        params: params.clone(),
        local_streams: setups,
        remote_streams: Vec::new(),
        encryption: "none".into(),
        control_encryption: "none".into(),
        data_encrypted: Some(false),
    });
    for w in &warnings {
        sink.warning(w);
    }
    warnings
}

/// Runs the test to its end, reporting each interval from this end's
/// counts; returns the snapshot the omitted seconds end at. A failure of
/// the run, or an interrupt, stops the test at the server too.
fn measure(
    ctl: &mut Control,
    run: &mut SideRun,
    params: &TestParams,
    opts: &ClientOptions,
    sink: &mut dyn Reporter,
) -> Result<Option<SideSnapshot>, EngineError> {
    let target = ctl.target;
    let interrupted = || opts.interrupt.load(Ordering::Relaxed);
    let end_at =
        run.start + Duration::from_millis(params.omit_ms + params.duration_ms.unwrap_or(0));
    let mut ticker = Ticker::new(run.start, params);
    let mut baseline: Option<SideSnapshot> = None;
    let mut prev: Option<SideSnapshot> = None;
    let mut index = 0u32;
    let mut stopped_early = false;
    loop {
        let now = Instant::now();
        for t in ticker.due(now) {
            let snap = run.snapshot();
            match t {
                Tick::Baseline => baseline = Some(snap),
                Tick::Interval { index: _, omitted } => {
                    let Some(snap) = clip_sample(prev.as_ref(), &snap, None) else {
                        continue;
                    };
                    let remote = local_only(&snap);
                    let remote_prev = prev.as_ref().map(local_only);
                    let span = Span {
                        client_from: prev.as_ref(),
                        client_to: &snap,
                        server_from: remote_prev.as_ref(),
                        server_to: &remote,
                        complete: false,
                    };
                    sink.interval(&span.interval_report(params, index, omitted));
                    index += 1;
                    prev = Some(snap);
                }
            }
        }
        if now >= end_at {
            // A sender still blocked in a write ends now, as iperf3's
            // does: TEST_END goes at the end, whatever is queued.
            run.end_on_time(now);
            break;
        }
        if interrupted() {
            stopped_early = true;
            break;
        }
        if let Some(e) = run.error() {
            run.stop();
            ctl.machine.terminate();
            let _ = ctl.flush();
            return Err(EngineError::Failed(format!(
                "iperf3 test with {target}: {e}"
            )));
        }
        let wait = ticker
            .next_due()
            .unwrap_or(end_at)
            .min(end_at)
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        // The server says nothing while the test runs, unless it fails.
        ctl.pump(wait)?;
    }
    if stopped_early {
        run.stop();
        ctl.machine.terminate();
        let _ = ctl.flush();
        return Err(EngineError::Interrupted(format!(
            "the iperf3 test with {target} was stopped"
        )));
    }
    Ok(baseline)
}

/// Ends the test and exchanges results with the server: ours sent, its
/// own returned.
fn exchange_results(
    ctl: &mut Control,
    params: &TestParams,
    baseline: Option<&SideSnapshot>,
    local_end: &SideSnapshot,
) -> Result<Box<Results>, EngineError> {
    let target = ctl.target;
    ctl.machine.end_test();
    let ev = ctl.next(RESULTS, "waiting for the results exchange")?;
    if ev != ClientEvent::SendResults {
        return Err(EngineError::Failed(format!(
            "iperf3 server {target}: unexpected {ev:?} after TEST_END"
        )));
    }
    ctl.machine
        .send_results(&results_of(params, baseline, local_end));
    let theirs = match ctl.next(RESULTS, "waiting for the server's results")? {
        ClientEvent::ServerResults(r) => r,
        ev => {
            return Err(EngineError::Failed(format!(
                "iperf3 server {target}: unexpected {ev:?} instead of its results"
            )))
        }
    };
    // DISPLAY_RESULTS, then our IPERF_DONE; a server that closes first
    // has still given its results.
    let _ = ctl.next(RESULTS, "waiting for DISPLAY_RESULTS");
    let _ = ctl.flush();
    Ok(theirs)
}

/// The iperf3 server's own count of retransmits on the streams it sent
/// (the only sender figure its results carry: no RTT); None where it
/// says it counts none (`sender_has_retransmits` other than 1).
fn server_retransmits(params: &TestParams, theirs: &Results) -> Option<u64> {
    if theirs.sender_has_retransmits != 1 {
        return None;
    }
    let keys = stream_keys(params);
    Some(saturating_total(
        theirs
            .streams
            .iter()
            .filter(|s| {
                stream_index(s.id)
                    .and_then(|k| keys.get(k))
                    .is_some_and(|&(d, _)| End::Server.sends(d))
            })
            .map(|s| u64::try_from(s.retransmits).unwrap_or(0)),
    ))
}

/// One UDP stream to an iperf3 server: a socket connected to its port,
/// the 4-byte setup datagram, and the server's 4-byte answer, which comes
/// from the socket it then keeps for this stream. Sent once: iperf3 takes
/// any datagram on its listening socket as the next stream's.
fn udp_stream(
    target: &str,
    peer: SocketAddr,
    params: &TestParams,
    opts: &ClientOptions,
    within: Duration,
) -> Result<std::net::UdpSocket, EngineError> {
    let u = std::net::UdpSocket::bind(opts.local_for(peer))
        .map_err(|e| EngineError::io("failed to bind a UDP socket".into(), e))?;
    if let Some(w) = params.window {
        let r = socket2::SockRef::from(&u);
        let _ = r.set_send_buffer_size(w as usize);
        let _ = r.set_recv_buffer_size(w as usize);
    }
    u.connect(peer).map_err(|e| {
        EngineError::io(
            format!("failed to address UDP port {} of {target}", peer.port()),
            e,
        )
    })?;
    u.send(&iperf3::udp_connect_msg()).map_err(|e| {
        EngineError::io(
            format!("failed to send a UDP stream's setup to {target}"),
            e,
        )
    })?;
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 65_536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(EngineError::Timeout(format!(
                "iperf3 server {target} did not answer a UDP stream's setup datagram within {} s (a firewall dropping UDP to port {}?)",
                within.as_secs(),
                peer.port()
            )));
        }
        let _ = u.set_read_timeout(Some(left.min(Duration::from_millis(200))));
        match u.recv(&mut buf) {
            Ok(n) if iperf3::is_udp_connect_reply(&buf[..n]) => return Ok(u),
            // A data datagram ahead of the answer (iperf3 allows a few).
            Ok(_) => {}
            Err(e) if crate::net::conn::transient(&e) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                return Err(EngineError::Connect(format!(
                    "iperf3 server {target} refused UDP on port {} (ICMP port unreachable)",
                    peer.port()
                )))
            }
            Err(e) => {
                return Err(EngineError::io(
                    format!("failed to read a UDP stream's setup answer from {target}"),
                    e,
                ))
            }
        }
    }
}

/// A snapshot with this end's counts standing for the far end's, its CPU
/// unknown (the intervals of a test against iperf3, which reports only at
/// the end).
fn local_only(s: &SideSnapshot) -> SideSnapshot {
    let mut r = s.clone();
    r.cpu_us = 0;
    for st in &mut r.streams {
        st.cpu_us = 0;
    }
    r
}

fn sample(s: &SideSnapshot, d: Direction, i: u16) -> Option<&StreamSample> {
    s.streams.iter().find(|x| x.direction == d && x.stream == i)
}

fn since(
    from: Option<&SideSnapshot>,
    to: &SideSnapshot,
    d: Direction,
    i: u16,
) -> (u64, Option<u64>) {
    let find = |s: &SideSnapshot| {
        s.streams
            .iter()
            .find(|x| x.direction == d && x.stream == i)
            .map(|x| (x.bytes, x.tcp.map(|t| t.retransmits)))
    };
    let (b1, r1) = find(to).unwrap_or((0, None));
    let (b0, r0) = from.and_then(find).unwrap_or((0, None));
    (
        b1.saturating_sub(b0),
        r1.map(|r| r.saturating_sub(r0.unwrap_or(0))),
    )
}

/// This end's results as iperf3 sends them: per stream, bytes sent (its
/// sending streams) or received, since the omitted start.
pub fn results_of(
    params: &TestParams,
    baseline: Option<&SideSnapshot>,
    end: &SideSnapshot,
) -> Results {
    results_for(params, End::Client, baseline, end)
}

/// [`results_of`] for either end.
pub(crate) fn results_for(
    params: &TestParams,
    me: End,
    baseline: Option<&SideSnapshot>,
    end: &SideSnapshot,
) -> Results {
    let wall_us = end
        .elapsed_us
        .saturating_sub(baseline.map_or(0, |b| b.elapsed_us));
    let cpu_us = end.cpu_us.saturating_sub(baseline.map_or(0, |b| b.cpu_us));
    let cpu = if wall_us == 0 {
        0.0
    } else {
        cpu_us as f64 * 100.0 / wall_us as f64
    };
    let sends_any = params.mode.directions().iter().any(|&d| me.sends(d));
    let udp = params.transport == Transport::Udp;
    let mut congestion = None;
    let streams = stream_keys(params)
        .into_iter()
        .enumerate()
        .map(|(k, (d, i))| {
            let (bytes, retrans) = since(baseline, end, d, i);
            if me.sends(d) && congestion.is_none() && !udp {
                congestion = Some(params.congestion.clone().unwrap_or_default());
            }
            // UDP: a sender's datagrams sent; a receiver's highest
            // datagram number, its losses, its jitter (iperf3's fields).
            let (jitter, errors, packets) = match (udp, me.sends(d)) {
                (false, _) => (0.0, 0, 0),
                (true, true) => {
                    let sent = |s: &SideSnapshot| sample(s, d, i).and_then(|x| x.packets_sent);
                    let n = sent(end)
                        .unwrap_or(0)
                        .saturating_sub(baseline.and_then(sent).unwrap_or(0));
                    (0.0, 0, n as i64)
                }
                (true, false) => {
                    let u = sample(end, d, i).and_then(|x| x.udp).unwrap_or_default();
                    let f = baseline
                        .and_then(|b| sample(b, d, i))
                        .and_then(|x| x.udp)
                        .unwrap_or_default();
                    let expected = u.expected.saturating_sub(f.expected);
                    let got = u.packets.saturating_sub(f.packets);
                    (
                        u.jitter_us as f64 / 1e6,
                        expected.saturating_sub(got) as i64,
                        expected as i64,
                    )
                }
            };
            StreamResult {
                id: stream_id(k),
                bytes,
                retransmits: match (me.sends(d), retrans) {
                    (true, Some(r)) if !udp => r as i64,
                    _ => -1,
                },
                jitter,
                errors,
                packets,
                start_time: Some(0.0),
                end_time: Some(wall_us as f64 / 1e6),
            }
        })
        .collect();
    Results {
        cpu_util_total: cpu,
        cpu_util_user: cpu,
        cpu_util_system: 0.0,
        sender_has_retransmits: match (sends_any, udp) {
            (false, _) => -1,
            (true, true) => 0,
            (true, false) => 1,
        },
        congestion_used: congestion.filter(|c| !c.is_empty()),
        streams,
    }
}

/// The iperf3 end's results as a snapshot of its side, for the merge:
/// each stream's bytes, its wall time (the longest stream's), its whole
/// process's CPU. Its TCP counters are not in iperf3's protocol.
pub(crate) fn remote_snapshot(params: &TestParams, r: &Results) -> Result<SideSnapshot, String> {
    let keys = stream_keys(params);
    let mut streams: Vec<StreamSample> = keys
        .iter()
        .map(|&(direction, stream)| StreamSample {
            direction,
            stream,
            bytes: 0,
            packets_sent: None,
            tcp: None,
            udp: None,
            cpu_us: 0,
        })
        .collect();
    let mut seen = vec![false; keys.len()];
    let mut secs: f64 = 0.0;
    for s in &r.streams {
        let k = stream_index(s.id)
            .filter(|&k| k < keys.len())
            .ok_or_else(|| format!("stream id {} is not one of the test's {}", s.id, keys.len()))?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(format!("stream id {} is listed twice", s.id));
        }
        streams[k].bytes = s.bytes;
        if params.transport == Transport::Udp {
            let st = &mut streams[k];
            let packets = s.packets.max(0) as u64;
            if End::Server.sends(st.direction) {
                st.packets_sent = Some(packets);
            } else {
                let lost = (s.errors.max(0) as u64).min(packets);
                st.udp = Some(UdpRecv {
                    packets: packets - lost,
                    expected: packets,
                    jitter_us: if s.jitter.is_finite() {
                        (s.jitter.clamp(0.0, 1e6) * 1e6) as u64
                    } else {
                        0
                    },
                    ..UdpRecv::default()
                });
            }
        }
        if let (Some(a), Some(b)) = (s.start_time, s.end_time) {
            if b.is_finite() && a.is_finite() && b > a && b - a < 1e7 {
                secs = secs.max(b - a);
            }
        }
    }
    let elapsed_us = (secs * 1e6) as u64;
    let cpu = if r.cpu_util_total.is_finite() {
        r.cpu_util_total.clamp(0.0, 1e6)
    } else {
        0.0
    };
    Ok(SideSnapshot {
        elapsed_us,
        cpu_us: (cpu / 100.0 * elapsed_us as f64) as u64,
        streams,
    })
}

/// Notes for the summary: for each direction, what each end counted, so
/// that a reader sees which figure came from which end.
pub(crate) fn figures_notes(
    params: &TestParams,
    baseline: Option<&SideSnapshot>,
    local: &SideSnapshot,
    remote: &SideSnapshot,
    theirs: &Results,
) -> Vec<String> {
    let local_us = local
        .elapsed_us
        .saturating_sub(baseline.map_or(0, |b| b.elapsed_us));
    let rate = |b: u64, us: u64| {
        if us == 0 {
            0.0
        } else {
            b as f64 * 8e6 / us as f64
        }
    };
    let mut out = Vec::new();
    for &d in params.mode.directions() {
        let ours = saturating_total((0..params.streams).map(|i| since(baseline, local, d, i).0));
        let theirs_b = saturating_total(
            remote
                .streams
                .iter()
                .filter(|s| s.direction == d)
                .map(|s| s.bytes),
        );
        let (we, they) = match d {
            Direction::Up => ("sent", "received"),
            Direction::Down => ("received", "sent"),
        };
        out.push(format!(
            "iperf3 {}: this end {we} {} in {:.2} s ({}); the iperf3 server {they} {} in {:.2} s ({}), by its own count. The rate above is the receiver's ({}){}",
            match d {
                Direction::Up => "up",
                Direction::Down => "down",
            },
            format_bytes(ours),
            local_us as f64 / 1e6,
            format_rate(rate(ours, local_us)),
            format_bytes(theirs_b),
            remote.elapsed_us as f64 / 1e6,
            format_rate(rate(theirs_b, remote.elapsed_us)),
            match d {
                Direction::Up => "iperf3's count",
                Direction::Down => "this end's count",
            },
            match params.transport {
                Transport::Tcp => match d {
                    Direction::Up => "; TCP counters are this end's sockets'",
                    Direction::Down => "; the iperf3 server sent: its retransmits are its own count (its results carry no RTT or window)",
                },
                Transport::Udp => "",
            },
        ));
        if params.transport == Transport::Udp {
            out.push(udp_note(params, d, baseline, local, remote));
        }
    }
    out.push(format!(
        "iperf3 CPU: the server's whole iperf3 process at {:.1}% of one core (its own figure); this end's test threads as measured here",
        theirs.cpu_util_total
    ));
    out
}

/// Which end counted a UDP direction's datagrams: the sender's count of
/// sent ones, the receiver's losses and jitter.
fn udp_note(
    params: &TestParams,
    d: Direction,
    baseline: Option<&SideSnapshot>,
    local: &SideSnapshot,
    remote: &SideSnapshot,
) -> String {
    let (tx, tx_from, rx, rx_from, sender, receiver) = match d {
        Direction::Up => (
            local,
            baseline,
            remote,
            None,
            "this end",
            "the iperf3 server",
        ),
        Direction::Down => (
            remote,
            None,
            local,
            baseline,
            "the iperf3 server",
            "this end",
        ),
    };
    let mut sent = 0u64;
    let mut expected = 0u64;
    let mut got = 0u64;
    let mut jitter_us = 0u64;
    for i in 0..params.streams {
        let pk = |s: Option<&SideSnapshot>| {
            s.and_then(|s| sample(s, d, i))
                .and_then(|x| x.packets_sent)
                .unwrap_or(0)
        };
        sent += pk(Some(tx)).saturating_sub(pk(tx_from));
        let u = |s: Option<&SideSnapshot>| {
            s.and_then(|s| sample(s, d, i))
                .and_then(|x| x.udp)
                .unwrap_or_default()
        };
        let (a, b) = (u(Some(rx)), u(rx_from));
        expected += a.expected.saturating_sub(b.expected);
        got += a.packets.saturating_sub(b.packets);
        jitter_us = jitter_us.max(a.jitter_us);
    }
    let lost = expected.saturating_sub(got);
    format!(
        "iperf3 {} UDP: {sender} sent {sent} datagrams, by its own count; {receiver} received {got} and lost {lost} of {expected} ({:.3}%), jitter {:.3} ms, by its own count (jitter as RFC 1889 and iperf3 compute it)",
        match d {
            Direction::Up => "up",
            Direction::Down => "down",
        },
        if expected == 0 {
            0.0
        } else {
            lost as f64 * 100.0 / expected as f64
        },
        jitter_us as f64 / 1000.0,
    )
}
