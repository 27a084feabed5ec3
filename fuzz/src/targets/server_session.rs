//! Arbitrary sequences of peer messages, engine decisions and clock jumps
//! against a `ServerSession` (after quinn's `fuzz_targets/streams.rs`).
//!
//! Must never panic. Invariants: a failed session is closed, a closed
//! session has no deadline and ignores everything, and everything the
//! session queues encodes and decodes back unchanged.

use std::time::{Duration, Instant};

use crate::roundtrip;

use arbitrary::Arbitrary;

use super::test_params::Params;
use longhaul_proto::frame::Frame;
use longhaul_proto::msg::*;
use longhaul_proto::report::{PeerResults, SideInterval, SideSnapshot, StreamSetup};
use longhaul_proto::session::{Limits, ServerConfig, ServerSession};

#[derive(Arbitrary, Debug)]
struct FuzzLimits {
    max_streams: u16,
    /// Seconds; bounded so that `now + limit` stays a valid `Instant`.
    max_duration_s: u32,
    max_bytes: u64,
    allow_third_party: bool,
    handshake_ms: u32,
    idle_ms: u32,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Raw frame from the peer: handled only if it decodes.
    Frame {
        kind: u8,
        body: Vec<u8>,
    },
    Hello {
        min: u16,
        max: u16,
        data: Option<(String, u16, bool)>,
    },
    /// A plaintext control hello naming the grant whose token it proves.
    ProvingHello {
        token_id: String,
        with_token: bool,
    },
    /// A client's answer to the challenge.
    Proof(String),
    /// The engine found the proof good.
    Authenticated,
    Request(Params),
    ThirdParty(String, Params),
    /// A third-party copy: a capability asked of the destination.
    GrantRequest {
        export: String,
        dest: String,
        dest_dir: bool,
        lifetime_s: u32,
    },
    /// A third-party copy ordered of the source.
    CopyOrder {
        sources: Vec<String>,
        target: String,
        capability: String,
        dest: String,
    },
    Start,
    Stop(String),
    Active(u16),
    PeerRefuse(u8, String),
    /// A message only a server sends, arriving at a server.
    Wrong(u8),
    Advance(u32),
    /// Jump to the session's own deadline, or a millisecond before it.
    ToDeadline {
        early: bool,
    },
    Accept {
        test_id: u64,
        token: String,
        ports: Vec<u16>,
    },
    Ready(u8),
    EngineRefuse(u8, String),
    Interval(u32),
    Relay(String),
    Results(Option<String>),
    Finish,
}

fn code(b: u8) -> RefuseCode {
    use RefuseCode::*;
    [
        Version,
        Busy,
        Limit,
        BadRequest,
        ThirdPartyDisabled,
        UnknownTest,
        Protocol,
        Timeout,
        ServerError,
    ][usize::from(b) % 9]
}

fn wrong(b: u8) -> Message {
    match b % 6 {
        5 => Message::Queued(Queued {
            position: 1,
            running: 1,
            limit: 1,
            reason: String::new(),
        }),
        0 => Message::Welcome(Welcome {
            version: 1,
            software: "s".into(),
            host: "h".into(),
            buffers: Default::default(),
            max_streams: None,
            features: Vec::new(),
        }),
        1 => Message::TestAccept(TestAccept {
            test_id: 1,
            token: "t".into(),
            udp_ports: vec![],
            data_key: None,
        }),
        2 => Message::Ready(Ready {
            streams: vec![],
            rmem_max: None,
            wmem_max: None,
        }),
        3 => Message::Results(PeerResults {
            baseline: None,
            end: SideSnapshot::default(),
            error: None,
        }),
        _ => Message::Relay(Relay::Warning {
            message: "w".into(),
        }),
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    limits: FuzzLimits,
    /// This connection's challenge for a token proof.
    challenge: [u8; 32],
    ops: Vec<Op>,
}

fn check_output(s: &mut ServerSession) {
    while let Some(m) = s.poll_transmit() {
        // A relay may carry any JSON the server was handed; it only has
        // to encode.
        if matches!(m, Message::Relay(_)) {
            let mut wire = Vec::new();
            m.encode(&mut wire).expect("server message encodes");
            continue;
        }
        roundtrip::assert_roundtrip(&m);
    }
}

fuzz_target!(|input: Input| {
    let l = input.limits;
    let limits = Limits {
        max_streams: l.max_streams,
        max_duration: Duration::from_secs(u64::from(l.max_duration_s)),
        max_bytes: l.max_bytes,
        max_buffer_bytes: l.max_bytes,
        allow_third_party: l.allow_third_party,
        handshake_timeout: Duration::from_millis(u64::from(l.handshake_ms)),
        idle_timeout: Duration::from_millis(u64::from(l.idle_ms)),
    };
    let base = Instant::now();
    let mut now = base;
    let cfg = ServerConfig {
        buffers: Default::default(),
        limits,
        software: "fuzz".into(),
        host: "fuzz".into(),
    };
    let mut s = ServerSession::new(now, cfg).with_challenge(input.challenge);

    for op in input.ops {
        let was_closed = s.is_closed();
        let msg = match op {
            Op::Frame { kind, body } => Message::decode(&Frame { kind, body }).ok(),
            Op::Hello { min, max, data } => Some(Message::Hello(Hello {
                min_version: min,
                max_version: max,
                software: "fuzz".into(),
                role: match data {
                    None => Role::Control,
                    // Odd streams join by proof (perf data streams), even ones by token.
                    Some((token, stream, up)) if stream % 2 == 1 => Role::PerfData {
                        proof: token.chars().rev().collect(),
                        test: token,
                        stream,
                        direction: if up { Direction::Up } else { Direction::Down },
                    },
                    Some((token, stream, up)) => Role::Data {
                        token,
                        stream,
                        direction: if up { Direction::Up } else { Direction::Down },
                    },
                },
                token: None,
                token_id: None,
            })),
            Op::ProvingHello {
                token_id,
                with_token,
            } => Some(Message::Hello(Hello {
                min_version: PROTOCOL_VERSION,
                max_version: PROTOCOL_VERSION,
                software: "fuzz".into(),
                role: Role::Control,
                token: with_token.then(|| "lh1_ab_x".into()),
                token_id: Some(token_id),
            })),
            Op::Proof(proof) => Some(Message::Proof(Proof { proof })),
            Op::Request(p) => Some(Message::TestRequest(p.build())),
            Op::ThirdParty(target, p) => Some(Message::ThirdParty(ThirdParty {
                target,
                params: p.build(),
                trust: Vec::new(),
                token: None,
                plaintext: false,
            })),
            Op::GrantRequest {
                export,
                dest,
                dest_dir,
                lifetime_s,
            } => Some(Message::GrantRequest(
                longhaul_proto::xfer::copy::GrantRequest {
                    export,
                    dest,
                    dest_dir,
                    lifetime_s,
                    ..Default::default()
                },
            )),
            Op::CopyOrder {
                sources,
                target,
                capability,
                dest,
            } => Some(Message::CopyOrder(Box::new(
                longhaul_proto::xfer::copy::CopyOrder {
                    export: "data".into(),
                    sources,
                    target,
                    fingerprint: String::new(),
                    capability,
                    dest_export: "data".into(),
                    dest,
                    dest_dir: false,
                    options: Default::default(),
                    connect_back: None,
                    share: None,
                },
            ))),
            Op::Start => Some(Message::Start(Start {})),
            Op::Stop(reason) => Some(Message::Stop(Stop { reason })),
            Op::Active(streams) => Some(Message::Active(Active { streams })),
            Op::PeerRefuse(c, message) => Some(Message::Refuse(Refuse {
                code: code(c),
                message,
            })),
            Op::Wrong(b) => Some(wrong(b)),
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                if s.handle_timeout(now).is_err() {
                    assert!(s.is_closed());
                }
                None
            }
            Op::ToDeadline { early } => {
                if let Some(d) = s.poll_timeout() {
                    let t = if early {
                        d.checked_sub(Duration::from_millis(1)).unwrap_or(d)
                    } else {
                        d
                    };
                    now = now.max(t);
                    let res = s.handle_timeout(now);
                    if now >= d {
                        assert!(
                            res.is_err() && s.is_closed(),
                            "deadline passed without a time-out"
                        );
                    } else {
                        assert!(res.is_ok());
                    }
                }
                None
            }
            // The engine drops a closed session; it makes no more calls on it.
            _ if was_closed => None,
            Op::Authenticated => {
                s.authenticated(now);
                None
            }
            Op::Accept {
                test_id,
                token,
                ports,
            } => {
                s.accept_test(
                    now,
                    TestAccept {
                        test_id,
                        token,
                        udp_ports: ports,
                        data_key: None,
                    },
                );
                None
            }
            Op::Ready(n) => {
                let streams = (0..u16::from(n % 8))
                    .map(|stream| StreamSetup {
                        direction: Direction::Up,
                        stream,
                        sndbuf: 1,
                        rcvbuf: 1,
                        mss: 1,
                        congestion: "cubic".into(),
                    })
                    .collect();
                s.ready(Ready {
                    streams,
                    rmem_max: None,
                    wmem_max: Some(1),
                });
                None
            }
            Op::EngineRefuse(c, message) => {
                let e = s.refuse(code(c), message);
                assert_eq!(e.code, code(c));
                assert!(s.is_closed());
                None
            }
            Op::Interval(index) => {
                s.interval(SideInterval {
                    index,
                    omitted: false,
                    snapshot: SideSnapshot::default(),
                });
                None
            }
            Op::Relay(message) => {
                s.relay(Relay::Warning { message });
                None
            }
            Op::Results(error) => {
                s.results(
                    now,
                    PeerResults {
                        baseline: None,
                        end: SideSnapshot::default(),
                        error,
                    },
                );
                None
            }
            Op::Finish => {
                s.finish(now);
                None
            }
        };
        if let Some(m) = msg {
            let res = s.handle(now, m);
            if was_closed {
                assert_eq!(res, Ok(None), "a closed session ignores the peer");
            }
            if res.is_err() {
                assert!(s.is_closed(), "failed but not closed");
            }
        }
        if s.is_closed() {
            assert_eq!(s.poll_timeout(), None, "closed with a deadline");
        }
        if was_closed {
            assert!(s.is_closed(), "a closed session came back");
        }
        check_output(&mut s);
    }
});
