//! A deterministic two-peer harness for the control protocol.
//!
//! A [`ClientSession`] and a [`ServerSession`] exchange encoded frames through
//! in-memory byte queues, and simulated time jumps straight to the next
//! `poll_timeout` (after quinn's `tests/util.rs` `Pair::drive`). The harness
//! plays both engines where a test does not take over: it accepts requests
//! and reports the streams ready at once, and starts as soon as the client
//! hears ready. Everything runs in microseconds and the same way every time.

// Test scenarios are held to no length: only shipped code is (clippy.toml).
#![allow(clippy::too_many_lines)]
use std::time::{Duration, Instant};

use longhaul_proto::frame::{self, Decoder, HEADER_LEN, MAGIC};
use longhaul_proto::msg::*;
use longhaul_proto::report::{PeerResults, SideInterval, SideSnapshot, StreamSample, StreamSetup};
use longhaul_proto::session::*;
use longhaul_proto::tokenproof;
use longhaul_proto::udp;
use longhaul_proto::ProtoError;

/// The control-frame limit the harness's server decoder enforces.
const CONTROL_MAX_BODY: u32 = 64 << 10;
const TOKEN: &str = "00112233445566778899aabbccddeeff";
/// The one grant the harness's server engine knows, by its token.
const GRANT_TOKEN: &str = "lh1_ab12cd34_0123456789abcdefghijklmnopqrstuvwxyzABCD";

/// One direction of the control connection: bytes written and not yet read.
#[derive(Debug)]
struct Link {
    wire: Vec<u8>,
    decoder: Decoder,
}

impl Link {
    fn new(decoder: Decoder, preamble: &[u8]) -> Self {
        Self {
            wire: preamble.to_vec(),
            decoder,
        }
    }

    /// Moves at most `max` bytes from the wire into the decoder and decodes
    /// what has arrived whole. Returns whether any byte moved.
    fn deliver(&mut self, max: usize) -> (bool, Result<Vec<Message>, ProtoError>) {
        let n = self.wire.len().min(max);
        self.decoder.push(&self.wire[..n]);
        self.wire.drain(..n);
        let mut msgs = Vec::new();
        loop {
            match self.decoder.next_frame() {
                Ok(Some(f)) => match Message::decode(&f) {
                    Ok(m) => msgs.push(m),
                    Err(e) => return (n > 0, Err(e)),
                },
                Ok(None) => return (n > 0, Ok(msgs)),
                Err(e) => return (n > 0, Err(e)),
            }
        }
    }
}

/// What the harness does in place of the engines.
#[derive(Debug, Clone, Copy)]
struct Engine {
    /// Accept every request the session passes up, then report ready.
    accept: bool,
    /// Send start once the client hears ready.
    start: bool,
}

struct Pair {
    base: Instant,
    offset: Duration,
    client: ClientSession,
    server: ServerSession,
    c2s: Link,
    s2c: Link,
    /// Bytes moved per link per step; `usize::MAX` delivers everything.
    chunk: usize,
    /// The connection was dropped (by either engine after an error).
    dropped: bool,
    engine: Engine,
    client_events: Vec<ClientEvent>,
    server_events: Vec<ServerEvent>,
    client_error: Option<SessionError>,
    server_error: Option<SessionError>,
    /// A framing or decoding failure on the server's side of the connection.
    server_wire_error: Option<ProtoError>,
    client_wire_error: Option<ProtoError>,
    next_test_id: u64,
    /// Every byte the client session wrote, after the preamble: what an
    /// eavesdropper on a plaintext path records.
    client_wrote: Vec<u8>,
}

fn server_config(limits: Limits) -> ServerConfig {
    ServerConfig {
        buffers: Default::default(),
        limits,
        software: "longhaul-server harness".into(),
        host: "server.test".into(),
    }
}

/// The client's handshake time-out, longer than the server's default so
/// that server-side time-outs fire first where a test wants them.
const CLIENT_HANDSHAKE: Duration = Duration::from_secs(30);

impl Pair {
    fn new(limits: Limits) -> Self {
        Self::with_preamble(limits, &MAGIC)
    }

    fn with_preamble(limits: Limits, preamble: &[u8]) -> Self {
        let base = Instant::now();
        Self {
            base,
            offset: Duration::ZERO,
            client: ClientSession::new(base, "longhaul-client harness", CLIENT_HANDSHAKE, None),
            server: ServerSession::new(base, server_config(limits)),
            c2s: Link::new(Decoder::expect_magic(CONTROL_MAX_BODY), preamble),
            s2c: Link::new(Decoder::new(CONTROL_MAX_BODY), &[]),
            chunk: usize::MAX,
            dropped: false,
            engine: Engine {
                accept: true,
                start: true,
            },
            client_events: Vec::new(),
            server_events: Vec::new(),
            client_error: None,
            server_error: None,
            server_wire_error: None,
            client_wire_error: None,
            next_test_id: 1,
            client_wrote: Vec::new(),
        }
    }

    /// A pair whose client proves [`GRANT_TOKEN`] in plaintext, to a server
    /// session that draws `challenge` for this connection.
    fn proving(challenge: [u8; tokenproof::CHALLENGE_LEN]) -> Self {
        let mut p = Self::new(Limits::default());
        p.client = ClientSession::proving(
            p.base,
            "longhaul-client harness",
            CLIENT_HANDSHAKE,
            GRANT_TOKEN,
        )
        .expect("a token of the form lh1_ID_SECRET");
        p.server =
            ServerSession::new(p.base, server_config(Limits::default())).with_challenge(challenge);
        p
    }

    /// A pair that has finished the handshake.
    fn welcomed(limits: Limits) -> Self {
        let mut p = Self::new(limits);
        p.drive();
        assert!(
            // This build's server sends the first UDP datagram where asked.
            matches!(p.client_events.as_slice(), [ClientEvent::Welcomed(w)] if w.version == PROTOCOL_VERSION && w.can(FEATURE_UDP_BACK) && w.can(FEATURE_COPY_BACK)),
            "handshake: {:?}",
            p.client_events
        );
        p.client_events.clear();
        p
    }

    fn now(&self) -> Instant {
        self.base + self.offset
    }

    /// Encodes every queued message of both sessions onto the wires.
    fn flush(&mut self) -> bool {
        let mut any = false;
        while let Some(m) = self.client.poll_transmit() {
            let mut frame = Vec::new();
            m.encode(&mut frame).expect("client message encodes");
            self.c2s.wire.extend_from_slice(&frame);
            self.client_wrote.extend_from_slice(&frame);
            any = true;
        }
        while let Some(m) = self.server.poll_transmit() {
            m.encode(&mut self.s2c.wire)
                .expect("server message encodes");
            any = true;
        }
        any
    }

    /// Writes raw bytes onto the client-to-server wire, as a broken or
    /// hostile client would.
    fn client_sends_raw(&mut self, bytes: &[u8]) {
        self.c2s.wire.extend_from_slice(bytes);
    }

    fn client_sends(&mut self, m: &Message) {
        m.encode(&mut self.c2s.wire).expect("encodes");
    }

    fn server_sends(&mut self, m: &Message) {
        m.encode(&mut self.s2c.wire).expect("encodes");
    }

    /// Moves bytes and messages until neither side has anything left to do
    /// at the current instant.
    fn drive(&mut self) {
        for _ in 0..10_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the pair did not settle");
    }

    fn step(&mut self) -> bool {
        let mut progress = self.flush();
        if self.dropped {
            return false;
        }
        let now = self.now();

        let (moved, res) = self.c2s.deliver(self.chunk);
        progress |= moved;
        match res {
            Ok(msgs) => {
                for m in msgs {
                    match self.server.handle(now, m) {
                        Ok(Some(ev)) => self.on_server_event(ev),
                        Ok(None) => {}
                        Err(e) => self.server_error = Some(e),
                    }
                }
            }
            Err(e) => {
                self.server_wire_error = Some(e);
                self.dropped = true;
                return false;
            }
        }
        progress |= self.flush();

        let (moved, res) = self.s2c.deliver(self.chunk);
        progress |= moved;
        match res {
            Ok(msgs) => {
                for m in msgs {
                    if self.client_error.is_some() {
                        break;
                    }
                    match self.client.handle(now, m) {
                        Ok(Some(ev)) => self.on_client_event(ev),
                        Ok(None) => {}
                        Err(e) => self.client_error = Some(e),
                    }
                }
            }
            Err(e) => {
                self.client_wire_error = Some(e);
                self.dropped = true;
                return false;
            }
        }
        progress
    }

    fn on_server_event(&mut self, ev: ServerEvent) {
        let now = self.now();
        if let ServerEvent::TokenProof {
            token_id,
            challenge,
            proof,
        } = &ev
        {
            let key = tokenproof::key_of(GRANT_TOKEN);
            if token_id == "ab12cd34" && tokenproof::verify(&key, token_id, challenge, proof) {
                self.server.authenticated(now);
            } else {
                let e = self
                    .server
                    .refuse(RefuseCode::Unauthorized, "proof refused");
                self.server_error = Some(e);
            }
        }
        if let ServerEvent::TestRequested(p) = &ev {
            if self.engine.accept {
                let streams = ready_streams(p);
                let udp_ports = match p.transport {
                    Transport::Tcp => Vec::new(),
                    Transport::Udp => (0..streams.len() as u16).map(|i| 5300 + i).collect(),
                };
                self.server.accept_test(
                    now,
                    TestAccept {
                        test_id: self.next_test_id,
                        token: TOKEN.into(),
                        udp_ports,
                        data_key: None,
                    },
                );
                self.next_test_id += 1;
                self.server.ready(Ready {
                    streams,
                    rmem_max: Some(212_992),
                    wmem_max: Some(212_992),
                });
            }
        }
        self.server_events.push(ev);
    }

    fn on_client_event(&mut self, ev: ClientEvent) {
        if matches!(ev, ClientEvent::Ready(_)) && self.engine.start {
            self.client.start(self.now());
        }
        self.client_events.push(ev);
    }

    /// Earliest wake-up either live session asked for.
    fn next_timeout(&self) -> Option<Instant> {
        [self.client.poll_timeout(), self.server.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Jumps the clock to `t` (never backwards), fires due time-outs and
    /// drives.
    fn advance_to(&mut self, t: Instant) {
        if t > self.now() {
            self.offset = t - self.base;
        }
        let now = self.now();
        if self.client_error.is_none() {
            if let Err(e) = self.client.handle_timeout(now) {
                self.client_error = Some(e);
            }
        }
        if self.server_error.is_none() {
            if let Err(e) = self.server.handle_timeout(now) {
                self.server_error = Some(e);
            }
        }
        self.drive();
    }

    fn advance_by(&mut self, d: Duration) {
        self.advance_to(self.now() + d);
    }

    /// Jumps to the next wake-up; returns the simulated time it landed on,
    /// or `None` when nothing is scheduled.
    fn advance_to_next_timeout(&mut self) -> Option<Duration> {
        let t = self.next_timeout()?;
        self.advance_to(t);
        Some(self.offset)
    }

    fn client_error_code(&self) -> Option<RefuseCode> {
        self.client_error.as_ref().map(|e| e.code)
    }

    fn server_error_code(&self) -> Option<RefuseCode> {
        self.server_error.as_ref().map(|e| e.code)
    }
}

fn ready_streams(p: &TestParams) -> Vec<StreamSetup> {
    p.mode
        .directions()
        .iter()
        .flat_map(|&direction| {
            (0..p.streams).map(move |stream| StreamSetup {
                direction,
                stream,
                sndbuf: 425_984,
                rcvbuf: 425_984,
                mss: 1448,
                congestion: "cubic".into(),
            })
        })
        .collect()
}

fn snapshot(elapsed: Duration, bytes: u64) -> SideSnapshot {
    SideSnapshot {
        elapsed_us: elapsed.as_micros() as u64,
        cpu_us: 1_000,
        streams: vec![StreamSample {
            direction: Direction::Up,
            stream: 0,
            bytes,
            packets_sent: None,
            tcp: None,
            udp: None,
            cpu_us: 500,
        }],
    }
}

fn params() -> TestParams {
    TestParams {
        duration_ms: Some(2_000),
        interval_ms: 1_000,
        ..TestParams::default()
    }
}

/// Client max duration for byte-count tests.
const CLIENT_MAX: Duration = Duration::from_secs(120);

/// Runs a request through a welcomed pair and expects it to be refused with
/// `code`, on both ends, with `fragment` in the message.
fn assert_refused(limits: Limits, p: TestParams, code: RefuseCode, fragment: &str) {
    let mut pair = Pair::welcomed(limits);
    let now = pair.now();
    pair.client.request_test(now, p.clone(), CLIENT_MAX);
    pair.drive();
    let server = pair
        .server_error
        .as_ref()
        .unwrap_or_else(|| panic!("server accepted {p:?}"));
    assert_eq!(server.code, code, "server code for {p:?}: {server}");
    assert!(
        server.message.contains(fragment),
        "server message for {p:?} is {:?}, expected it to mention {fragment:?}",
        server.message
    );
    assert!(pair.server.is_closed());
    assert_eq!(pair.server.poll_timeout(), None);
    let client = pair
        .client_error
        .as_ref()
        .expect("client heard the refusal");
    assert_eq!(client.code, code, "client code for {p:?}");
    assert_eq!(client.message, server.message);
    assert_eq!(
        pair.client.poll_timeout(),
        None,
        "a refused client stops waiting"
    );
    assert!(
        pair.server_events.is_empty(),
        "nothing reached the engine: {:?}",
        pair.server_events
    );
    assert!(pair.client_events.is_empty());
}

/// Runs a request through a welcomed pair and expects it accepted.
fn assert_accepted(limits: Limits, p: TestParams) {
    let mut pair = Pair::welcomed(limits);
    let now = pair.now();
    pair.client.request_test(now, p.clone(), CLIENT_MAX);
    pair.drive();
    assert_eq!(pair.server_error, None, "server refused {p:?}");
    assert_eq!(pair.client_error, None);
    assert!(
        matches!(pair.server_events.as_slice(), [ServerEvent::TestRequested(q), ServerEvent::Start] if *q == p)
    );
}

#[test]
fn full_test_ends_with_client_idle() {
    let mut pair = Pair::welcomed(Limits::default());
    assert_eq!(pair.server.version(), PROTOCOL_VERSION);
    assert_eq!(
        pair.client.poll_timeout(),
        None,
        "an idle client has no deadline"
    );
    assert_eq!(
        pair.server.poll_timeout(),
        Some(pair.now() + Limits::default().idle_timeout)
    );

    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    assert_eq!(
        pair.server_events,
        vec![ServerEvent::TestRequested(params()), ServerEvent::Start]
    );
    let [ClientEvent::Accepted(a), ClientEvent::Ready(r)] = pair.client_events.as_slice() else {
        panic!("events {:?}", pair.client_events);
    };
    assert_eq!(a.test_id, 1);
    assert_eq!(a.token, TOKEN);
    assert!(a.udp_ports.is_empty());
    assert_eq!(r.streams.len(), 1);
    // Both ends give up at the planned end plus the grace, measured from start.
    let end = pair.now() + Duration::from_millis(2_000) + END_GRACE;
    assert_eq!(pair.client.poll_timeout(), Some(end));
    assert_eq!(pair.server.poll_timeout(), Some(end));
    pair.client_events.clear();

    for index in 0..2u32 {
        pair.advance_by(Duration::from_secs(1));
        pair.server.interval(SideInterval {
            index,
            omitted: false,
            snapshot: snapshot(pair.offset, u64::from(index + 1) << 30),
        });
        pair.drive();
    }
    let results = PeerResults {
        baseline: None,
        end: snapshot(pair.offset, 2 << 30),
        error: None,
    };
    let now = pair.now();
    pair.server.results(now, results.clone());
    pair.drive();

    assert_eq!(pair.client_error, None);
    assert_eq!(pair.server_error, None);
    assert_eq!(pair.client_events.len(), 3, "{:?}", pair.client_events);
    for (i, ev) in pair.client_events[..2].iter().enumerate() {
        assert!(
            matches!(ev, ClientEvent::Interval(s) if s.index == i as u32),
            "{ev:?}"
        );
    }
    assert_eq!(pair.client_events[2], ClientEvent::Results(results));
    assert_eq!(pair.client.poll_timeout(), None, "client back in idle");
    assert_eq!(
        pair.server.poll_timeout(),
        Some(pair.now() + Limits::default().idle_timeout),
        "server waits for the next request"
    );

    // Idle means another test can run on the same connection.
    pair.client_events.clear();
    pair.server_events.clear();
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    assert!(
        matches!(pair.client_events.as_slice(), [ClientEvent::Accepted(a), ClientEvent::Ready(_)] if a.test_id == 2)
    );
}

#[test]
fn byte_at_a_time_delivery_gives_the_same_handshake() {
    let mut pair = Pair::new(Limits::default());
    pair.chunk = 1;
    pair.drive();
    assert!(
        matches!(pair.client_events.as_slice(), [ClientEvent::Welcomed(w)] if w.host == "server.test")
    );
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    assert_eq!(pair.server_events.len(), 2);
    assert_eq!(pair.client_events.len(), 3);
}

#[test]
fn the_clients_tuner_reaches_the_server_only_while_the_test_runs() {
    let mut pair = Pair::welcomed(Limits::default());
    // Before a test there is nothing to tune: nothing is sent.
    pair.client.active(3);
    pair.drive();
    assert_eq!(pair.server_error, None);
    assert!(pair.server_events.is_empty(), "{:?}", pair.server_events);
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    pair.client.active(3);
    pair.drive();
    assert_eq!(pair.server_events.last(), Some(&ServerEvent::Active(3)));
    assert_eq!(pair.server_error, None);
}

#[test]
fn client_stop_reaches_the_server_engine() {
    let mut pair = Pair::welcomed(Limits::default());
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    pair.client.stop("interrupted");
    pair.drive();
    assert_eq!(
        pair.server_events.last(),
        Some(&ServerEvent::Stop("interrupted".into()))
    );
    let now = pair.now();
    pair.server.results(
        now,
        PeerResults {
            baseline: None,
            end: SideSnapshot::default(),
            error: Some("stopped by the client".into()),
        },
    );
    pair.drive();
    assert!(
        matches!(pair.client_events.last(), Some(ClientEvent::Results(r)) if r.error.is_some())
    );
    assert_eq!(pair.client.poll_timeout(), None);
}

fn hand_made_hello(min_version: u16, max_version: u16) -> Message {
    Message::Hello(Hello {
        min_version,
        max_version,
        software: "longhaul from elsewhere".into(),
        role: Role::Control,
        token: None,
        token_id: None,
    })
}

#[test]
fn version_mismatch_is_refused() {
    for (lo, hi) in [
        (PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 5),
        (0, MIN_PROTOCOL_VERSION - 1),
        (u16::MAX, u16::MAX),
    ] {
        let mut pair = Pair::new(Limits::default());
        // Replace the session's own hello with one from a different build.
        assert!(matches!(
            pair.client.poll_transmit(),
            Some(Message::Hello(_))
        ));
        pair.client_sends(&hand_made_hello(lo, hi));
        pair.drive();
        assert_eq!(
            pair.server_error_code(),
            Some(RefuseCode::Version),
            "{lo}..={hi}"
        );
        assert!(pair.server.is_closed());
        assert_eq!(
            pair.client_error_code(),
            Some(RefuseCode::Version),
            "{lo}..={hi}"
        );
        assert!(pair.client_events.is_empty());
        assert!(pair.server_events.is_empty());
    }
}

#[test]
fn overlapping_version_range_is_welcomed_at_the_best_common_version() {
    let mut pair = Pair::new(Limits::default());
    pair.client.poll_transmit();
    pair.client_sends(&hand_made_hello(0, u16::MAX));
    pair.drive();
    assert_eq!(pair.server_error, None);
    assert_eq!(pair.server.version(), PROTOCOL_VERSION);
    assert!(
        matches!(pair.client_events.as_slice(), [ClientEvent::Welcomed(w)] if w.version == PROTOCOL_VERSION)
    );
}

#[test]
fn client_refuses_a_welcome_in_a_version_it_does_not_speak() {
    let mut pair = Pair::new(Limits::default());
    // The client's hello never reaches the server; a forged welcome answers it.
    pair.client.poll_transmit();
    pair.server_sends(&Message::Welcome(Welcome {
        version: PROTOCOL_VERSION + 1,
        software: "longhaul from the future".into(),
        host: "server.test".into(),
        buffers: Default::default(),
        max_streams: None,
        features: Vec::new(),
    }));
    pair.drive();
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Version));
    assert_eq!(pair.client.poll_timeout(), None);
}

#[test]
fn limit_refusals_reach_the_client() {
    use RefuseCode::{BadRequest, Limit};
    let limits = Limits {
        max_streams: 8,
        max_duration: Duration::from_secs(60),
        max_bytes: 1 << 30,
        ..Limits::default()
    };
    let tcp = params();
    let udp = TestParams {
        transport: Transport::Udp,
        length: 1400,
        udp_rate_bps: Some(1_000_000),
        ..params()
    };
    let cases: Vec<(&str, TestParams, RefuseCode, &str)> = vec![
        (
            "0 streams",
            TestParams {
                streams: 0,
                ..tcp.clone()
            },
            BadRequest,
            "stream count 0",
        ),
        (
            "too many streams",
            TestParams {
                streams: 9,
                ..tcp.clone()
            },
            Limit,
            "9 streams requested",
        ),
        (
            "duration 0",
            TestParams {
                duration_ms: Some(0),
                ..tcp.clone()
            },
            BadRequest,
            "duration 0",
        ),
        (
            "bytes 0",
            TestParams {
                duration_ms: None,
                bytes: Some(0),
                ..tcp.clone()
            },
            BadRequest,
            "byte count 0",
        ),
        (
            "both duration and bytes",
            TestParams {
                bytes: Some(1 << 20),
                ..tcp.clone()
            },
            BadRequest,
            "exactly one",
        ),
        (
            "neither duration nor bytes",
            TestParams {
                duration_ms: None,
                ..tcp.clone()
            },
            BadRequest,
            "exactly one",
        ),
        (
            "over max duration",
            TestParams {
                duration_ms: Some(61_000),
                ..tcp.clone()
            },
            Limit,
            "at most 60 s",
        ),
        (
            "omit pushes past max duration",
            TestParams {
                duration_ms: Some(60_000),
                omit_ms: 1_000,
                ..tcp.clone()
            },
            Limit,
            "at most 60 s",
        ),
        (
            "over max bytes",
            TestParams {
                duration_ms: None,
                bytes: Some((1 << 30) + 1),
                ..tcp.clone()
            },
            Limit,
            "bytes requested",
        ),
        (
            "tcp length 0",
            TestParams {
                length: 0,
                ..tcp.clone()
            },
            BadRequest,
            "buffer length 0",
        ),
        (
            "tcp length too long",
            TestParams {
                length: MAX_TCP_LENGTH + 1,
                ..tcp.clone()
            },
            BadRequest,
            "buffer length",
        ),
        (
            "udp length shorter than the header",
            TestParams {
                length: udp::HEADER_LEN as u32 - 1,
                ..udp.clone()
            },
            BadRequest,
            "buffer length 23",
        ),
        (
            "udp length over the IPv4 payload",
            TestParams {
                length: MAX_UDP_LENGTH + 1,
                ..udp.clone()
            },
            BadRequest,
            "buffer length 65508",
        ),
        (
            "empty congestion name",
            TestParams {
                congestion: Some(String::new()),
                ..tcp.clone()
            },
            BadRequest,
            "congestion",
        ),
        (
            "congestion name with punctuation",
            TestParams {
                congestion: Some("bbr;reboot".into()),
                ..tcp.clone()
            },
            BadRequest,
            "congestion",
        ),
        (
            "congestion name longer than the kernel's",
            TestParams {
                congestion: Some("a".repeat(16)),
                ..tcp.clone()
            },
            BadRequest,
            "congestion",
        ),
        (
            "udp_back_ports for fewer streams than asked",
            TestParams {
                streams: 2,
                udp_back_ports: vec![40000],
                ..udp.clone()
            },
            BadRequest,
            "udp_back_ports for 2 UDP streams",
        ),
        (
            "udp_back_ports for a TCP test",
            TestParams {
                udp_back_ports: vec![40000],
                ..tcp.clone()
            },
            BadRequest,
            "UDP tests only",
        ),
    ];
    for (what, p, code, fragment) in cases {
        eprintln!("case: {what}");
        assert_refused(limits.clone(), p, code, fragment);
    }

    // The edges of every range are allowed.
    let accepted = [
        TestParams {
            streams: 8,
            ..tcp.clone()
        },
        TestParams {
            duration_ms: Some(60_000),
            ..tcp.clone()
        },
        TestParams {
            duration_ms: Some(59_000),
            omit_ms: 1_000,
            ..tcp.clone()
        },
        TestParams {
            duration_ms: None,
            bytes: Some(1 << 30),
            ..tcp.clone()
        },
        TestParams {
            length: 1,
            ..tcp.clone()
        },
        TestParams {
            length: MAX_TCP_LENGTH,
            ..tcp.clone()
        },
        TestParams {
            length: udp::HEADER_LEN as u32,
            ..udp.clone()
        },
        TestParams {
            length: MAX_UDP_LENGTH,
            ..udp.clone()
        },
        TestParams {
            congestion: Some("bbr".into()),
            ..tcp.clone()
        },
        TestParams {
            congestion: Some("a".repeat(15)),
            ..tcp.clone()
        },
        TestParams {
            mode: Mode::Bidir,
            streams: 2,
            udp_back_ports: vec![40000, 40001, 40002, 40003],
            ..udp.clone()
        },
    ];
    for p in accepted {
        assert_accepted(limits.clone(), p);
    }
}

fn third_party(params: TestParams) -> ThirdParty {
    ThirdParty {
        target: "far.example:5201".into(),
        params,
        trust: Vec::new(),
        token: None,
        plaintext: false,
    }
}

#[test]
fn third_party_disabled_is_refused() {
    let limits = Limits {
        allow_third_party: false,
        ..Limits::default()
    };
    let mut pair = Pair::welcomed(limits);
    let now = pair.now();
    pair.client
        .request_third_party(now, third_party(params()), CLIENT_MAX);
    pair.drive();
    assert_eq!(
        pair.server_error_code(),
        Some(RefuseCode::ThirdPartyDisabled)
    );
    assert_eq!(
        pair.client_error_code(),
        Some(RefuseCode::ThirdPartyDisabled)
    );
    assert!(pair.server_events.is_empty());
}

#[test]
fn third_party_allowed_relays_until_the_summary_or_failure() {
    let mut pair = Pair::welcomed(Limits::default());
    let now = pair.now();
    pair.client
        .request_third_party(now, third_party(params()), CLIENT_MAX);
    pair.drive();
    assert_eq!(
        pair.server_events,
        vec![ServerEvent::ThirdPartyRequested(third_party(params()))]
    );
    pair.server.relay(Relay::Warning {
        message: "far side capped the window".into(),
    });
    pair.drive();
    assert!(
        pair.client.poll_timeout().is_some(),
        "still waiting for the summary"
    );
    let failed = Refuse {
        code: RefuseCode::Busy,
        message: "far side busy".into(),
    };
    pair.server.relay(Relay::Failed(failed.clone()));
    let now = pair.now();
    pair.server.finish(now);
    pair.drive();
    assert_eq!(pair.client_error, None);
    assert_eq!(
        pair.client_events.last(),
        Some(&ClientEvent::Relay(Relay::Failed(failed)))
    );
    assert_eq!(pair.client.poll_timeout(), None, "client back in idle");
}

#[test]
fn third_party_params_are_checked_against_limits() {
    let mut pair = Pair::welcomed(Limits::default());
    let now = pair.now();
    let bad = TestParams {
        streams: 0,
        ..params()
    };
    pair.client
        .request_third_party(now, third_party(bad), CLIENT_MAX);
    pair.drive();
    assert_eq!(pair.client_error_code(), Some(RefuseCode::BadRequest));
}

#[test]
fn unexpected_message_is_a_protocol_refusal() {
    let start = Message::Start(Start {});
    let request = Message::TestRequest(params());
    // (messages the client session sends itself first, the intruder, state)
    let cases: Vec<(bool, Message, &str)> = vec![
        (false, request.clone(), "AwaitHello"),
        (true, start.clone(), "AwaitRequest"),
        (true, hand_made_hello(1, 1), "AwaitRequest"),
        (
            true,
            Message::Welcome(Welcome {
                version: 1,
                software: "x".into(),
                host: "y".into(),
                buffers: Default::default(),
                max_streams: None,
                features: Vec::new(),
            }),
            "AwaitRequest",
        ),
        (
            true,
            Message::Results(PeerResults {
                baseline: None,
                end: SideSnapshot::default(),
                error: None,
            }),
            "AwaitRequest",
        ),
    ];
    for (after_hello, intruder, state) in cases {
        let mut pair = Pair::new(Limits::default());
        if after_hello {
            pair.drive();
            pair.client_events.clear();
        } else {
            pair.client.poll_transmit();
        }
        pair.client_sends(&intruder);
        pair.drive();
        let e = pair.server_error.as_ref().expect("server refused");
        assert_eq!(e.code, RefuseCode::Protocol, "{}", intruder.name());
        assert!(
            e.message.contains(intruder.name()) && e.message.contains(state),
            "{}",
            e.message
        );
        assert!(pair.server.is_closed());
        assert_eq!(pair.client_error_code(), Some(RefuseCode::Protocol));
    }

    // A second request while the server is deciding on the first.
    let mut pair = Pair::welcomed(Limits::default());
    pair.engine.accept = false;
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.client_sends(&request);
    pair.drive();
    assert_eq!(
        pair.server_events,
        vec![ServerEvent::TestRequested(params())]
    );
    assert_eq!(pair.server_error_code(), Some(RefuseCode::Protocol));
    assert!(pair
        .server_error
        .as_ref()
        .unwrap()
        .message
        .contains("Deciding"));
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Protocol));
}

#[test]
fn client_refuses_results_it_did_not_ask_for() {
    let mut pair = Pair::welcomed(Limits::default());
    pair.server_sends(&Message::Results(PeerResults {
        baseline: None,
        end: SideSnapshot::default(),
        error: None,
    }));
    pair.drive();
    let e = pair.client_error.as_ref().expect("client refused");
    assert_eq!(e.code, RefuseCode::Protocol);
    assert!(
        e.message.contains("results") && e.message.contains("Idle"),
        "{}",
        e.message
    );
}

#[test]
fn server_handshake_timeout() {
    let limits = Limits::default();
    let mut pair = Pair::new(limits.clone());
    // The client connected and sent its preamble, then fell silent.
    pair.client.poll_transmit();
    pair.drive();
    assert_eq!(pair.server.version(), 0);
    assert_eq!(
        pair.advance_to_next_timeout(),
        Some(limits.handshake_timeout)
    );
    let e = pair.server_error.as_ref().expect("server timed out");
    assert_eq!(e.code, RefuseCode::Timeout);
    assert!(e.message.contains("hello"), "{}", e.message);
    assert!(pair.server.is_closed());
    // The client hears why before its own, longer, time-out.
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Timeout));
    assert_eq!(pair.client_error.as_ref().unwrap().message, e.message);
    assert_eq!(
        pair.advance_to_next_timeout(),
        None,
        "nothing left to wait for"
    );
}

#[test]
fn server_idle_timeout() {
    let limits = Limits {
        idle_timeout: Duration::from_secs(45),
        ..Limits::default()
    };
    let mut pair = Pair::welcomed(limits);
    assert_eq!(pair.client.poll_timeout(), None);
    assert_eq!(
        pair.advance_to_next_timeout(),
        Some(Duration::from_secs(45))
    );
    let e = pair.server_error.as_ref().expect("server timed out");
    assert_eq!(e.code, RefuseCode::Timeout);
    assert!(e.message.contains("idle"), "{}", e.message);
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Timeout));
}

#[test]
fn server_gives_up_when_streams_never_join() {
    let mut pair = Pair::welcomed(Limits::default());
    pair.engine.accept = false;
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    let accept_at = pair.now() + Duration::from_secs(1);
    pair.advance_to(accept_at);
    pair.server.accept_test(
        accept_at,
        TestAccept {
            test_id: 9,
            token: TOKEN.into(),
            udp_ports: vec![],
            data_key: None,
        },
    );
    pair.drive();
    // Client and server both wait a handshake time from the accept; the
    // server's shorter one fires first.
    assert_eq!(
        pair.advance_to_next_timeout(),
        Some(Duration::from_secs(1) + Limits::default().handshake_timeout)
    );
    let e = pair.server_error.as_ref().expect("server timed out");
    assert_eq!(e.code, RefuseCode::Timeout);
    assert!(e.message.contains("data streams"), "{}", e.message);
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Timeout));
}

#[test]
fn client_results_timeout() {
    let mut pair = Pair::welcomed(Limits::default());
    // A byte-count test: the client waits its own maximum, shorter than the
    // server's, so the client gives up first.
    let p = TestParams {
        duration_ms: None,
        bytes: Some(1 << 30),
        ..params()
    };
    let now = pair.now();
    pair.client.request_test(now, p, CLIENT_MAX);
    pair.drive();
    assert!(matches!(
        pair.server_events.last(),
        Some(ServerEvent::Start)
    ));
    let started = pair.offset;
    assert_eq!(pair.advance_to_next_timeout(), Some(started + CLIENT_MAX));
    let e = pair.client_error.as_ref().expect("client timed out");
    assert_eq!(e.code, RefuseCode::Timeout);
    assert!(e.message.contains("no results"), "{}", e.message);
    assert_eq!(pair.client.poll_timeout(), None);
    assert_eq!(pair.server_error, None, "the server's run limit is longer");
}

#[test]
fn client_handshake_timeout_when_the_server_is_silent() {
    let mut pair = Pair::new(Limits::default());
    pair.dropped = true;
    assert_eq!(
        pair.advance_to_next_timeout(),
        Some(Limits::default().handshake_timeout)
    );
    // The server's own time-out comes first but its refusal never arrives.
    assert_eq!(pair.client_error, None);
    assert_eq!(pair.advance_to_next_timeout(), Some(CLIENT_HANDSHAKE));
    let e = pair.client_error.as_ref().expect("client timed out");
    assert_eq!(e.code, RefuseCode::Timeout);
    assert!(e.message.contains("hello"), "{}", e.message);
}

#[test]
fn truncated_frame_decodes_nothing_and_waits() {
    let mut pair = Pair::new(Limits::default());
    pair.flush();
    let wire_len = pair.c2s.wire.len();
    assert!(wire_len > MAGIC.len() + HEADER_LEN);
    let (_, res) = pair.c2s.deliver(wire_len - 1);
    assert_eq!(res, Ok(vec![]), "no message from a partial frame");
    assert_eq!(pair.c2s.decoder.buffered(), wire_len - 1 - MAGIC.len());
    assert_eq!(pair.server.version(), 0);
    assert!(pair.server_events.is_empty());
    // The last byte completes the hello.
    pair.drive();
    assert_eq!(pair.server_wire_error, None);
    assert_eq!(pair.server.version(), PROTOCOL_VERSION);
    assert!(matches!(
        pair.client_events.as_slice(),
        [ClientEvent::Welcomed(_)]
    ));
}

#[test]
fn oversized_frame_is_refused_before_its_body_arrives() {
    let mut pair = Pair::welcomed(Limits::default());
    let mut header = (CONTROL_MAX_BODY + 1).to_be_bytes().to_vec();
    header.push(kind::TEST_REQUEST);
    pair.client_sends_raw(&header);
    pair.drive();
    assert_eq!(
        pair.server_wire_error,
        Some(ProtoError::FrameTooLarge {
            len: u64::from(CONTROL_MAX_BODY) + 1,
            max: CONTROL_MAX_BODY
        })
    );
    assert_eq!(
        pair.c2s.decoder.buffered(),
        HEADER_LEN,
        "only the header was read"
    );
    assert!(pair.server_events.is_empty());

    // The largest allowed frame still decodes (as a malformed body here).
    let mut pair = Pair::welcomed(Limits::default());
    let mut wire = Vec::new();
    frame::encode_frame(
        kind::TEST_REQUEST,
        &vec![b' '; CONTROL_MAX_BODY as usize],
        &mut wire,
    )
    .unwrap();
    pair.client_sends_raw(&wire);
    pair.drive();
    assert!(
        matches!(
            pair.server_wire_error,
            Some(ProtoError::BadBody {
                kind: kind::TEST_REQUEST,
                ..
            })
        ),
        "{:?}",
        pair.server_wire_error
    );
}

#[test]
fn garbage_preamble_is_bad_magic() {
    let mut pair = Pair::with_preamble(Limits::default(), b"GET / HTTP/1.1\r\n");
    pair.drive();
    assert_eq!(pair.server_wire_error, Some(ProtoError::BadMagic));
    assert_eq!(pair.server.version(), 0);
    assert!(pair.server_events.is_empty());
    assert!(pair.client_events.is_empty());

    // A preamble that starts right but goes wrong is caught at the first wrong byte.
    let mut pair = Pair::with_preamble(Limits::default(), b"LONGHAUX");
    pair.chunk = 1;
    pair.drive();
    assert_eq!(pair.server_wire_error, Some(ProtoError::BadMagic));
    assert_eq!(pair.c2s.decoder.buffered(), MAGIC.len());
}

#[test]
fn unknown_frame_type_is_a_decode_error() {
    let mut pair = Pair::welcomed(Limits::default());
    let mut wire = Vec::new();
    frame::encode_frame(0x7e, b"{}", &mut wire).unwrap();
    pair.client_sends_raw(&wire);
    pair.drive();
    assert_eq!(pair.server_wire_error, Some(ProtoError::UnknownFrame(0x7e)));
}

#[test]
fn server_saturates_duration_plus_omit() {
    let mut pair = Pair::welcomed(Limits::default());
    // Sent raw: `ClientSession::request_test` itself overflows on these (see
    // `client_request_with_huge_duration_does_not_panic`).
    pair.client_sends(&Message::TestRequest(TestParams {
        duration_ms: Some(u64::MAX),
        omit_ms: u64::MAX,
        ..params()
    }));
    pair.drive();
    assert_eq!(pair.server_error_code(), Some(RefuseCode::Limit));
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Limit));
}

#[test]

fn client_request_with_huge_duration_does_not_panic() {
    let mut pair = Pair::welcomed(Limits::default());
    let now = pair.now();
    let p = TestParams {
        duration_ms: Some(u64::MAX),
        omit_ms: 1,
        ..params()
    };
    pair.client.request_test(now, p, CLIENT_MAX);
    pair.drive();
    assert_eq!(pair.client_error_code(), Some(RefuseCode::Limit));
}

/// A data connection's hello hands the connection to the engine with what
/// it presented: a token (role data), or a test name and proof (role
/// perf_data), which the engine checks against the test's data key.
#[test]
fn a_data_hello_hands_over_its_token_or_its_proof() {
    let now = Instant::now();
    let hello = |role| {
        Message::Hello(Hello {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            software: "data".into(),
            role,
            token: None,
            token_id: None,
        })
    };
    let cases = [
        (
            Role::Data {
                token: TOKEN.into(),
                stream: 1,
                direction: Direction::Down,
            },
            None,
        ),
        (
            Role::PerfData {
                test: TOKEN.into(),
                stream: 1,
                direction: Direction::Down,
                proof: "ab".repeat(32),
            },
            Some("ab".repeat(32)),
        ),
    ];
    for (role, proof) in cases {
        let mut s = ServerSession::new(now, server_config(Limits::default()));
        let event = s.handle(now, hello(role)).unwrap();
        assert_eq!(
            event,
            Some(ServerEvent::DataStream {
                token: TOKEN.into(),
                stream: 1,
                direction: Direction::Down,
                proof,
            })
        );
        assert!(s.is_closed());
        assert_eq!(s.poll_transmit(), None);
    }
}

// ---- a plaintext client's proof of its token (issue 26, A6)

/// A plaintext client names its grant, the server challenges, the client
/// answers with a proof for that challenge, and only then is it welcomed;
/// the secret never crosses.
#[test]
fn a_plaintext_client_proves_its_token_for_the_servers_challenge() {
    let mut pair = Pair::proving([1; 32]);
    pair.drive();
    assert_eq!(pair.server_error, None);
    assert!(
        matches!(pair.client_events.as_slice(), [ClientEvent::Welcomed(_)]),
        "{:?}",
        pair.client_events
    );
    assert!(matches!(
        pair.server_events.as_slice(),
        [ServerEvent::Challenged { token_id }, ServerEvent::TokenProof { .. }] if token_id == "ab12cd34"
    ));
    let secret = GRANT_TOKEN.rsplit_once('_').unwrap().1.as_bytes();
    assert!(!pair.client_wrote.windows(secret.len()).any(|w| w == secret));
    assert!(!pair.client_wrote.windows(4).any(|w| w == b"lh1_"));
    // The session goes on as any other.
    let now = pair.now();
    pair.client.request_test(now, params(), CLIENT_MAX);
    pair.drive();
    assert!(pair
        .server_events
        .iter()
        .any(|e| matches!(e, ServerEvent::TestRequested(_))));
}

/// What an eavesdropper recorded of one connection (the hello and the
/// proof, byte for byte) is refused on any other: another connection to
/// the same server, a second server that shares the grant, the same
/// server after a restart. Each draws its own challenge; nothing needs
/// remembering.
#[test]
fn a_recorded_proof_is_refused_on_every_other_connection() {
    let mut first = Pair::proving([1; 32]);
    first.drive();
    assert!(matches!(
        first.client_events.as_slice(),
        [ClientEvent::Welcomed(_)]
    ));
    let recorded = first.client_wrote.clone();
    for challenge in [[2u8; 32], [0xfe; 32]] {
        let mut replay = Pair::proving(challenge);
        // The attacker's bytes in place of a client that knows the token.
        replay.client = ClientSession::new(replay.base, "replayer", CLIENT_HANDSHAKE, None);
        replay.client.poll_transmit();
        replay.client_sends_raw(&recorded);
        replay.drive();
        assert_eq!(replay.server_error_code(), Some(RefuseCode::Unauthorized));
        assert!(replay.server.is_closed());
        assert!(!replay
            .client_events
            .iter()
            .any(|e| matches!(e, ClientEvent::Welcomed(_))));
    }
    // The same challenge again (which a server never draws twice) is what
    // the proof answers: the binding, not luck, refused the replays.
    let mut same = Pair::proving([1; 32]);
    same.client = ClientSession::new(same.base, "replayer", CLIENT_HANDSHAKE, None);
    same.client.poll_transmit();
    same.client_sends_raw(&recorded);
    same.drive();
    assert_eq!(same.server_error, None);
}

/// A proving client never falls back to anonymous: a server that welcomes
/// it without a challenge (one that predates challenges) is an error, and
/// a hello that carries both a token and a token id, or a server session
/// with no challenge to give, is refused.
#[test]
fn a_proof_is_never_skipped_or_mixed() {
    let mut old_server = Pair::proving([1; 32]);
    old_server.client.poll_transmit();
    old_server.server_sends(&Message::Welcome(Welcome {
        version: PROTOCOL_VERSION,
        software: "longhaul before challenges".into(),
        host: "server.test".into(),
        buffers: Default::default(),
        max_streams: None,
        features: Vec::new(),
    }));
    old_server.drive();
    assert_eq!(old_server.client_error_code(), Some(RefuseCode::Version));
    assert!(old_server.client_error.unwrap().message.contains("use TLS"));

    let mut both = Pair::proving([1; 32]);
    both.client.poll_transmit();
    both.client_sends(&Message::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        software: "mixed".into(),
        role: Role::Control,
        token: Some(GRANT_TOKEN.into()),
        token_id: Some("ab12cd34".into()),
    }));
    both.drive();
    assert_eq!(both.server_error_code(), Some(RefuseCode::Protocol));

    let mut unarmed = Pair::proving([1; 32]);
    unarmed.server = ServerSession::new(unarmed.base, server_config(Limits::default()));
    unarmed.drive();
    assert_eq!(unarmed.server_error_code(), Some(RefuseCode::Unauthorized));
    assert_eq!(unarmed.client_error_code(), Some(RefuseCode::Unauthorized));

    // A proof must come next: a request in its place breaks the protocol.
    let mut early = Pair::proving([1; 32]);
    early.client.poll_transmit();
    let mut hello = Vec::new();
    Message::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        software: "early".into(),
        role: Role::Control,
        token: None,
        token_id: Some("ab12cd34".into()),
    })
    .encode(&mut hello)
    .unwrap();
    early.client_sends_raw(&hello);
    early.client_sends(&Message::TestRequest(params()));
    early.drive();
    assert_eq!(early.server_error_code(), Some(RefuseCode::Protocol));
}

/// A server that waits for the proof gives up at the handshake time-out.
#[test]
fn a_missing_proof_times_out() {
    let mut pair = Pair::proving([1; 32]);
    pair.client = ClientSession::new(pair.base, "silent", CLIENT_HANDSHAKE, None);
    pair.client.poll_transmit();
    let mut hello = Vec::new();
    Message::Hello(Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        software: "silent".into(),
        role: Role::Control,
        token: None,
        token_id: Some("ab12cd34".into()),
    })
    .encode(&mut hello)
    .unwrap();
    pair.client_sends_raw(&hello);
    pair.drive();
    assert!(pair.server_error.is_none());
    pair.advance_by(Limits::default().handshake_timeout);
    assert_eq!(pair.server_error_code(), Some(RefuseCode::Timeout));
}
