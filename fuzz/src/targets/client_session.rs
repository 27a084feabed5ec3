//! Arbitrary sequences of server messages, local decisions and clock jumps
//! against a `ClientSession` (the client's twin of `server_session`).
//!
//! Must never panic. The harness keeps the phase the session is in, as far
//! as it can be seen from outside (what it was told, what it answered), and
//! checks what the code promises:
//! - the hello is queued at once and carries the given software and token;
//! - every message the session queues is one a client sends, and encodes
//!   and decodes back unchanged; a local call queues exactly its message
//!   (`start` only once the server said ready, `stop` only while a test
//!   runs), a server message or a clock jump at most a refusal;
//! - an event carries the server's message unchanged and is one the
//!   protocol allows in that phase; a message it expects there is taken;
//!   a refusal comes back as the error unchanged; an unknown version is
//!   never welcomed;
//! - a session waiting on the server has a deadline, an idle one none, and
//!   it times out exactly when its deadline is reached;
//! - a failed session (any `Err`; there is no `is_closed`) is closed: no
//!   deadline, no events, nothing queued from then on.

use std::time::{Duration, Instant};

use crate::roundtrip;

use arbitrary::Arbitrary;

use super::test_params::Params;
use longhaul_proto::frame::Frame;
use longhaul_proto::msg::*;
use longhaul_proto::report::{
    LimitHint, PeerResults, SideInterval, SideSnapshot, StreamSetup, Summary,
};
use longhaul_proto::session::{ClientEvent, ClientSession, SessionError};

#[derive(Arbitrary, Debug)]
enum Op {
    /// The next step of a well-behaved exchange (see `Harness::next`), so
    /// that deep states are reached; the others may come at any time.
    Next {
        b: u8,
        text: String,
        n: u32,
        params: Params,
    },
    /// Raw frame from the server: handled only if it decodes.
    Frame {
        kind: u8,
        body: Vec<u8>,
    },
    Welcome {
        version: u16,
        software: String,
        host: String,
    },
    Accept {
        test_id: u64,
        token: String,
        ports: Vec<u16>,
    },
    Ready(u8),
    Interval(u32),
    Results(Option<String>),
    Relay(u8, String),
    PeerRefuse(u8, String),
    /// A message only a client sends, arriving at a client.
    Wrong(u8),
    Advance(u32),
    /// Jump to the session's own deadline, or a millisecond before it.
    ToDeadline {
        early: bool,
    },
    /// `max_duration` in seconds, unbounded: deadlines must saturate.
    RequestTest(Params, u64),
    RequestThirdParty {
        target: String,
        params: Params,
        trust: Vec<String>,
        token: Option<String>,
        plaintext: bool,
        max_duration_s: u64,
    },
    Start,
    Stop(String),
    Active(u16),
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
        Unauthorized,
        TlsRequired,
    ][usize::from(b) % 11]
}

fn summary(message: String) -> Summary {
    Summary {
        transport: Transport::Tcp,
        seconds: 1.0,
        bytes: 1,
        bits_per_second: 8.0,
        retransmits: 0,
        rtt_us: 0,
        min_rtt_us: 0,
        cpu_local_percent: 0.0,
        cpu_remote_percent: 0.0,
        lost_percent: None,
        jitter_us: None,
        directions: Vec::new(),
        streams: Vec::new(),
        limit: LimitHint::default(),
        warnings: vec![message],
        error: None,
        tuning: None,
        tuning_reverse: None,
        connections: None,
        retransmits_unknown: false,
        rtt_unknown: false,
    }
}

fn relay(b: u8, message: String) -> Relay {
    match b % 3 {
        0 => Relay::Warning { message },
        1 => Relay::Summary(Box::new(summary(message))),
        _ => Relay::Failed(Refuse {
            code: code(b / 3),
            message,
        }),
    }
}

fn wrong(b: u8) -> Message {
    match b % 5 {
        0 => Message::Hello(Hello {
            min_version: 1,
            max_version: 1,
            software: "s".into(),
            role: Role::Control,
            token: None,
            token_id: None,
        }),
        1 => Message::TestRequest(TestParams::default()),
        2 => Message::Start(Start {}),
        3 => Message::Stop(Stop { reason: "r".into() }),
        _ => Message::ThirdParty(ThirdParty {
            target: "t".into(),
            params: TestParams::default(),
            trust: Vec::new(),
            token: None,
            plaintext: false,
        }),
    }
}

/// Everything queued since the last call; each encodes and decodes back.
fn drain(s: &mut ClientSession) -> Vec<Message> {
    let mut out = Vec::new();
    while let Some(m) = s.poll_transmit() {
        assert!(
            matches!(
                m,
                Message::Hello(_)
                    | Message::Refuse(_)
                    | Message::TestRequest(_)
                    | Message::ThirdParty(_)
                    | Message::Start(_)
                    | Message::Stop(_)
                    | Message::Active(_)
            ),
            "client queued a server-only message: {m:?}"
        );
        roundtrip::assert_roundtrip(&m);
        out.push(m);
    }
    out
}

/// Where the session is, as seen from outside: what it was told and what
/// it answered. `ClientSession` has no `is_closed`; `Closed` is any `Err`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitWelcome,
    Idle,
    AwaitAccept,
    AwaitReady,
    Ready,
    Running,
    ThirdParty,
    Closed,
}

impl Phase {
    /// Waiting on the server, so it must have a deadline.
    fn waiting(self) -> bool {
        !matches!(self, Phase::Idle | Phase::Closed)
    }

    /// The phase after `handle` reported `ev` in this one, or `None` if
    /// the protocol has no such message here.
    fn after(self, ev: &ClientEvent) -> Option<Phase> {
        use ClientEvent as E;
        use Phase as P;
        Some(match (self, ev) {
            (P::AwaitWelcome, E::Welcomed(_)) => P::Idle,
            (P::AwaitAccept, E::Queued(_)) => P::AwaitAccept,
            (P::AwaitAccept, E::Accepted(_)) => P::AwaitReady,
            (P::AwaitReady, E::Ready(_)) => P::Ready,
            (P::Running, E::Interval(_)) => P::Running,
            (P::Running, E::Results(_)) => P::Idle,
            (P::ThirdParty, E::Relay(Relay::Summary(_) | Relay::Failed(_))) => P::Idle,
            (P::ThirdParty, E::Relay(_)) => P::ThirdParty,
            _ => return None,
        })
    }
}

/// The event `handle` must report for `m`, if it takes `m`.
fn event_for(m: &Message) -> Option<ClientEvent> {
    Some(match m {
        Message::Welcome(w) => ClientEvent::Welcomed(w.clone()),
        Message::Queued(q) => ClientEvent::Queued(q.clone()),
        Message::TestAccept(a) => ClientEvent::Accepted(a.clone()),
        Message::Ready(r) => ClientEvent::Ready(r.clone()),
        Message::Interval(i) => ClientEvent::Interval(i.clone()),
        Message::Results(r) => ClientEvent::Results(r.clone()),
        Message::Relay(r) => ClientEvent::Relay(r.clone()),
        _ => return None,
    })
}

fn ready(n: u8) -> Ready {
    let streams = (0..u16::from(n % 8))
        .map(|stream| StreamSetup {
            direction: Direction::Down,
            stream,
            sndbuf: 1,
            rcvbuf: 1,
            mss: 1,
            congestion: "cubic".into(),
        })
        .collect();
    Ready {
        streams,
        rmem_max: Some(1),
        wmem_max: None,
    }
}

fn interval(index: u32) -> SideInterval {
    SideInterval {
        index,
        omitted: false,
        snapshot: SideSnapshot::default(),
    }
}

fn results(error: Option<String>) -> PeerResults {
    PeerResults {
        baseline: None,
        end: SideSnapshot::default(),
        error,
    }
}

/// One thing that happens to the session.
enum Act {
    /// From the server; `valid`: one the protocol expects in this phase.
    Server {
        msg: Message,
        valid: bool,
    },
    RequestTest(TestParams, Duration),
    RequestThirdParty(ThirdParty, Duration),
    Start,
    Stop(String),
    Active(u16),
    Advance(u32),
    ToDeadline {
        early: bool,
    },
}

struct Harness {
    s: ClientSession,
    phase: Phase,
    now: Instant,
}

impl Harness {
    /// The next step of a well-behaved exchange from this phase: what the
    /// server or the engine does next when nothing goes wrong.
    fn next(&self, b: u8, text: String, n: u32, p: Params) -> Option<Act> {
        let server = |msg| Some(Act::Server { msg, valid: true });
        match self.phase {
            Phase::AwaitWelcome => server(Message::Welcome(Welcome {
                version: PROTOCOL_VERSION,
                software: text.clone(),
                host: text,
                buffers: Default::default(),
                max_streams: None,
                features: Vec::new(),
            })),
            Phase::Idle if b % 2 == 0 => Some(Act::RequestTest(
                p.build(),
                Duration::from_millis(u64::from(n)),
            )),
            Phase::Idle => Some(Act::RequestThirdParty(
                ThirdParty {
                    target: text,
                    params: p.build(),
                    trust: Vec::new(),
                    token: None,
                    plaintext: b & 2 != 0,
                },
                Duration::from_millis(u64::from(n)),
            )),
            // A busy server queues the request before it accepts it.
            Phase::AwaitAccept if b % 3 == 0 => server(Message::Queued(Queued {
                position: n,
                running: u32::from(b),
                limit: u32::from(b / 2),
                reason: text,
            })),
            Phase::AwaitAccept => server(Message::TestAccept(TestAccept {
                test_id: u64::from(n),
                token: text,
                udp_ports: vec![5201; usize::from(b % 4)],
                data_key: None,
            })),
            Phase::AwaitReady => server(Message::Ready(ready(b))),
            Phase::Ready => Some(Act::Start),
            Phase::Running if b % 4 == 0 => server(Message::Results(results(Some(text)))),
            Phase::Running => server(Message::Interval(interval(n))),
            Phase::ThirdParty => server(Message::Relay(relay(b, text))),
            Phase::Closed => None,
        }
    }

    fn act(&mut self, act: Act) {
        let closed = self.phase == Phase::Closed;
        // What the act may queue: exactly these messages (a local call), or
        // else (a server message or a clock jump) at most a refusal.
        let expect_out = match act {
            Act::Server { msg, valid } => {
                self.server_message(msg, valid, closed);
                None
            }
            Act::Advance(ms) => {
                self.advance(ms);
                None
            }
            Act::ToDeadline { early } => {
                self.jump_to_deadline(early);
                None
            }
            // The engine drops a failed session; it makes no more calls on it.
            _ if closed => None,
            call => Some(self.local_call(call)),
        };
        self.check_after(expect_out, closed);
    }

    /// A message from the server: the event it makes is the one it means,
    /// and a refusal is passed on.
    fn server_message(&mut self, msg: Message, valid: bool, closed: bool) {
        let want = event_for(&msg);
        let refuse = match &msg {
            Message::Refuse(r) => Some(r.clone()),
            _ => None,
        };
        let bad_version = matches!(&msg, Message::Welcome(w) if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&w.version));
        let res = self.s.handle(self.now, msg);
        if valid {
            assert!(
                matches!(res, Ok(Some(_))),
                "expected message refused in {:?}: {res:?}",
                self.phase
            );
        }
        match res {
            Ok(Some(ev)) => {
                assert!(!closed, "a closed session reported {ev:?}");
                assert!(!bad_version, "welcomed with an unknown version");
                assert_eq!(Some(&ev), want.as_ref(), "event differs from its message");
                self.phase = self
                    .phase
                    .after(&ev)
                    .unwrap_or_else(|| panic!("took {ev:?} in {:?}", self.phase));
            }
            Ok(None) => {}
            Err(e) => {
                if let Some(r) = refuse {
                    assert_eq!(e, SessionError::from(r), "refusal not passed on");
                }
                self.phase = Phase::Closed;
            }
        }
    }

    /// The clock jumps by `ms`: a time-out exactly when a deadline passed.
    fn advance(&mut self, ms: u32) {
        let step = Duration::from_millis(u64::from(ms));
        self.now = self.now.checked_add(step).unwrap_or(self.now);
        let due = self.s.poll_timeout().is_some_and(|d| self.now >= d);
        match self.s.handle_timeout(self.now) {
            Err(e) => {
                assert!(due, "timed out before its deadline");
                assert_eq!(e.code, RefuseCode::Timeout);
                self.phase = Phase::Closed;
            }
            Ok(()) => assert!(!due, "deadline passed without a time-out"),
        }
    }

    /// The clock jumps to the deadline, or just short of it.
    fn jump_to_deadline(&mut self, early: bool) {
        match self.s.poll_timeout() {
            Some(d) => {
                let t = if early {
                    d.checked_sub(Duration::from_millis(1)).unwrap_or(d)
                } else {
                    d
                };
                self.now = self.now.max(t);
                let res = self.s.handle_timeout(self.now);
                if self.now >= d {
                    let e = res.expect_err("deadline passed without a time-out");
                    assert_eq!(e.code, RefuseCode::Timeout);
                    self.phase = Phase::Closed;
                } else {
                    assert!(res.is_ok());
                }
            }
            // Nothing to time out: no jump can fail the session.
            None => assert_eq!(self.s.handle_timeout(self.now), Ok(())),
        }
    }

    /// A call of the engine's on a live session: what it must queue.
    fn local_call(&mut self, call: Act) -> Vec<Message> {
        match call {
            Act::RequestTest(p, max) => {
                self.s.request_test(self.now, p.clone(), max);
                self.phase = Phase::AwaitAccept;
                vec![Message::TestRequest(p)]
            }
            Act::RequestThirdParty(req, max) => {
                self.s.request_third_party(self.now, req.clone(), max);
                self.phase = Phase::ThirdParty;
                vec![Message::ThirdParty(req)]
            }
            Act::Start => {
                self.s.start(self.now);
                if self.phase == Phase::Ready {
                    self.phase = Phase::Running;
                    vec![Message::Start(Start {})]
                } else {
                    Vec::new()
                }
            }
            Act::Active(streams) => {
                let before = self.s.poll_timeout();
                self.s.active(streams);
                // Only a running test has server streams to tune.
                let out = if self.phase == Phase::Running {
                    vec![Message::Active(Active { streams })]
                } else {
                    Vec::new()
                };
                assert_eq!(self.s.poll_timeout(), before, "active moved the deadline");
                out
            }
            Act::Stop(reason) => {
                let before = self.s.poll_timeout();
                self.s.stop(&reason);
                let out = if matches!(self.phase, Phase::Running | Phase::ThirdParty) {
                    vec![Message::Stop(Stop { reason })]
                } else {
                    Vec::new()
                };
                assert_eq!(self.s.poll_timeout(), before, "stop moved the deadline");
                out
            }
            Act::Server { .. } | Act::Advance(_) | Act::ToDeadline { .. } => {
                unreachable!("not a local call")
            }
        }
    }

    /// After every act: what was queued, the deadline and the phase agree.
    fn check_after(&mut self, expect_out: Option<Vec<Message>>, closed: bool) {
        let out = drain(&mut self.s);
        match expect_out {
            Some(want) => assert_eq!(out, want, "queued other than the call's message"),
            None if closed => assert!(out.is_empty(), "closed but sending {out:?}"),
            None => assert!(
                out.iter().all(|m| matches!(m, Message::Refuse(_))),
                "a server message or clock jump made the client send {out:?}"
            ),
        }
        match self.s.poll_timeout() {
            Some(d) => {
                assert!(
                    self.phase.waiting(),
                    "deadline {:?} in {:?}",
                    d - self.now.min(d),
                    self.phase
                );
            }
            None => assert!(!self.phase.waiting(), "no deadline in {:?}", self.phase),
        }
        if self.phase == Phase::Closed {
            assert_eq!(
                self.s.handle_timeout(self.now),
                Ok(()),
                "a closed session timed out"
            );
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    software: String,
    token: Option<String>,
    handshake_ms: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let handshake = Duration::from_millis(input.handshake_ms);
    let now = Instant::now();
    let s = ClientSession::new(now, &input.software, handshake, input.token.clone());
    let mut h = Harness {
        s,
        phase: Phase::AwaitWelcome,
        now,
    };

    assert!(h.s.poll_timeout().is_some(), "no deadline for the welcome");
    assert_eq!(
        drain(&mut h.s),
        vec![Message::Hello(Hello {
            min_version: MIN_PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            software: input.software,
            role: Role::Control,
            token: input.token,
            token_id: None,
        })],
        "the hello is queued at once, alone"
    );

    for op in input.ops {
        let server = |msg| Some(Act::Server { msg, valid: false });
        let act = match op {
            Op::Next { b, text, n, params } => h.next(b, text, n, params),
            Op::Frame { kind, body } => Message::decode(&Frame { kind, body })
                .ok()
                .and_then(&server),
            Op::Welcome {
                version,
                software,
                host,
            } => server(Message::Welcome(Welcome {
                version,
                software,
                host,
                buffers: Default::default(),
                max_streams: None,
                features: Vec::new(),
            })),
            Op::Accept {
                test_id,
                token,
                ports,
            } => server(Message::TestAccept(TestAccept {
                test_id,
                token,
                udp_ports: ports,
                data_key: None,
            })),
            Op::Ready(n) => server(Message::Ready(ready(n))),
            Op::Interval(index) => server(Message::Interval(interval(index))),
            Op::Results(error) => server(Message::Results(results(error))),
            Op::Relay(b, message) => server(Message::Relay(relay(b, message))),
            Op::PeerRefuse(c, message) => server(Message::Refuse(Refuse {
                code: code(c),
                message,
            })),
            Op::Wrong(b) => server(wrong(b)),
            Op::Advance(ms) => Some(Act::Advance(ms)),
            Op::ToDeadline { early } => Some(Act::ToDeadline { early }),
            Op::RequestTest(p, max_s) => {
                Some(Act::RequestTest(p.build(), Duration::from_secs(max_s)))
            }
            Op::RequestThirdParty {
                target,
                params,
                trust,
                token,
                plaintext,
                max_duration_s,
            } => Some(Act::RequestThirdParty(
                ThirdParty {
                    target,
                    params: params.build(),
                    trust,
                    token,
                    plaintext,
                },
                Duration::from_secs(max_duration_s),
            )),
            Op::Start => Some(Act::Start),
            Op::Stop(reason) => Some(Act::Stop(reason)),
            Op::Active(streams) => Some(Act::Active(streams)),
        };
        if let Some(act) = act {
            h.act(act);
        }
    }
});
