//! Control-session state machines for both ends, with no I/O and no clock.
//!
//! The engine feeds decoded messages in with [`ServerSession::handle`] /
//! [`ClientSession::handle`], tells them what the local side decided
//! (`accept_test`, `ready`, `start`, ...), sends what
//! `poll_transmit` yields, and calls `handle_timeout` once `now` passes
//! `poll_timeout`. Time is always passed in. A session that fails queues a
//! [`Refuse`] for the peer (where the peer should hear why) and becomes
//! closed; the engine flushes the queue and drops the connection.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::msg::*;
use crate::report::{PeerResults, SideInterval};
use crate::tokenproof::{self, CHALLENGE_LEN};

/// Why a session ended badly. `code` is what the peer is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SessionError {
    pub code: RefuseCode,
    pub message: String,
}

impl SessionError {
    pub fn new(code: RefuseCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<Refuse> for SessionError {
    fn from(r: Refuse) -> Self {
        Self {
            code: r.code,
            message: r.message,
        }
    }
}

/// What a server allows one test to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_streams: u16,
    pub max_duration: Duration,
    pub max_bytes: u64,
    /// Memory for stream buffers one test may take (streams x length).
    pub max_buffer_bytes: u64,
    pub allow_third_party: bool,
    /// Time a new connection has to say hello, and a test to get going.
    pub handshake_timeout: Duration,
    /// Time a control connection may sit with no test.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_streams: 128,
            max_duration: Duration::from_secs(3600),
            max_bytes: 1 << 50,
            max_buffer_bytes: 512 << 20,
            allow_third_party: true,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Largest TCP write the server accepts as `length`.
pub const MAX_TCP_LENGTH: u32 = 64 << 20;
/// Largest UDP payload over IPv4.
pub const MAX_UDP_LENGTH: u32 = 65_507;
/// Extra time after the planned end before a running test is given up.
pub const END_GRACE: Duration = Duration::from_secs(30);

impl Limits {
    /// Checks a request against these limits; the error says which limit
    /// and what the server allows.
    pub fn check(&self, p: &TestParams) -> Result<(), SessionError> {
        let limit = |m: String| Err(SessionError::new(RefuseCode::Limit, m));
        let bad = |m: String| Err(SessionError::new(RefuseCode::BadRequest, m));
        if p.streams == 0 {
            return bad("stream count 0: ask for at least 1 stream".into());
        }
        if p.streams > self.max_streams {
            return limit(format!(
                "{} streams requested, this server allows at most {} per test",
                p.streams, self.max_streams
            ));
        }
        match (p.duration_ms, p.bytes) {
            (Some(0), _) => return bad("duration 0: ask for a positive time".into()),
            (_, Some(0)) => return bad("byte count 0: ask for a positive size".into()),
            (Some(_), Some(_)) | (None, None) => {
                return bad("exactly one of duration and byte count must be set".into())
            }
            _ => {}
        }
        let total = Duration::from_millis(p.duration_ms.unwrap_or(0).saturating_add(p.omit_ms));
        if total > self.max_duration {
            return limit(format!(
                "test of {} s requested, this server allows at most {} s",
                total.as_secs(),
                self.max_duration.as_secs()
            ));
        }
        if p.bytes.is_some_and(|b| b > self.max_bytes) {
            return limit(format!(
                "{} bytes requested, this server allows at most {}",
                p.bytes.unwrap_or(0),
                self.max_bytes
            ));
        }
        let max_len = match p.transport {
            Transport::Tcp => MAX_TCP_LENGTH,
            Transport::Udp => MAX_UDP_LENGTH,
        };
        let min_len = match p.transport {
            Transport::Tcp => 1,
            Transport::Udp => crate::udp::HEADER_LEN as u32,
        };
        if p.length < min_len || p.length > max_len {
            return bad(format!(
                "buffer length {} out of range: use {min_len}..={max_len} bytes",
                p.length
            ));
        }
        if let Some(cc) = &p.congestion {
            if cc.is_empty()
                || cc.len() > 15
                || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return bad(format!("congestion control name '{cc}' is not valid"));
            }
        }
        p.check_udp_back().or_else(bad)?;
        let buffers = u64::from(p.length)
            .saturating_mul(u64::from(p.streams))
            .saturating_mul(p.mode.directions().len() as u64);
        if buffers > self.max_buffer_bytes {
            return limit(format!(
                "{} streams of {} byte buffers need {} bytes of memory, this server allows {} per test; use fewer streams or a smaller -l",
                p.streams, p.length, buffers, self.max_buffer_bytes
            ));
        }
        Ok(())
    }
}

/// How long a test may run before its peer gives up on it.
fn run_limit(p: &TestParams, max_duration: Duration) -> Duration {
    match p.duration_ms {
        Some(ms) => Duration::from_millis(ms.saturating_add(p.omit_ms)).saturating_add(END_GRACE),
        None => max_duration,
    }
}

/// `now + d`, or a date far enough away where that overflows.
fn deadline(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Server-side settings of a session.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub limits: Limits,
    pub software: String,
    pub host: String,
    /// This host's socket-buffer caps, told to clients in the welcome.
    pub buffers: crate::window::BufferCaps,
}

/// What the server engine must act on.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// A control connection in plaintext names the grant whose token it
    /// will prove (`Hello.token_id`); the server's [`Challenge`] is queued:
    /// send it, then read the client's [`Proof`].
    Challenged { token_id: String },
    /// The client's answer to the challenge: check `proof` with
    /// [`tokenproof::verify`] against the grant `token_id`'s stored hash,
    /// then call [`ServerSession::authenticated`] or
    /// [`ServerSession::refuse`].
    TokenProof {
        token_id: String,
        challenge: [u8; CHALLENGE_LEN],
        proof: String,
    },
    /// A data stream wants to join a test: look the token up.
    DataStream {
        token: String,
        stream: u16,
        direction: Direction,
        /// The stream's proof of the test's data key ([`Role::PerfData`]);
        /// None for a stream that joins by token ([`Role::Data`]).
        proof: Option<String>,
    },
    /// The client asks for a test within limits: answer with
    /// [`ServerSession::accept_test`] or [`ServerSession::refuse`].
    TestRequested(TestParams),
    /// The client asks this server to test against another one.
    ThirdPartyRequested(ThirdParty),
    /// Streams are up and the client says go.
    Start,
    /// The client asks to stop early.
    Stop(String),
    /// The client's tuner: of this side's sending streams, the first this
    /// many send, the others wait.
    Active(u16),
    /// The client asks for a file transfer; the engine runs it on this
    /// connection and calls [`ServerSession::finish`] after.
    TransferRequested(crate::xfer::TransferRequest),
    /// The client asks for a listing; likewise.
    ListRequested(crate::xfer::ListRequest),
    /// The client asks the server to measure itself (`longhaul doctor`).
    ProbeRequested(crate::disk::ProbeRequest),
    /// The client asks for a third-party copy capability into this server
    /// (PROTOCOL.md 13.9): the engine answers [`Message::Grant`] or refuses,
    /// holds the capability while the session lasts, and calls
    /// [`ServerSession::finish`] once it is revoked.
    GrantRequested(crate::xfer::copy::GrantRequest),
    /// The client orders this server to push to another with a capability;
    /// the engine runs it and relays it, then calls
    /// [`ServerSession::finish`].
    CopyOrdered(Box<crate::xfer::copy::CopyOrder>),
    /// The holder of a capability revokes it ([`crate::xfer::copy::Revoke`]);
    /// the engine answers `Revoked` and calls [`ServerSession::finish`].
    RevokeRequested,
    /// The holder of a push capability has the partial files of these
    /// entries removed; the engine answers `Discarded`, then
    /// [`ServerSession::finish`].
    DiscardRequested(crate::xfer::copy::Discard),
    /// A job to run unattended (PROTOCOL.md 18); the engine answers a
    /// `JobAnswer` or refuses, then calls [`ServerSession::finish`].
    JobSubmitted(Box<crate::job::JobSpec>),
    /// About the client's jobs; likewise.
    JobCommanded(crate::job::JobCommand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerState {
    AwaitHello,
    AwaitProof,
    Authenticating,
    AwaitRequest,
    Deciding,
    AwaitStreams,
    AwaitStart,
    Running,
    Closed,
}

/// The server's end of one connection, from its preamble until close.
#[derive(Debug)]
pub struct ServerSession {
    cfg: ServerConfig,
    state: ServerState,
    version: u16,
    deadline: Option<Instant>,
    run_limit: Duration,
    out: VecDeque<Message>,
    /// This connection's challenge for a token proof (from the engine's
    /// CSPRNG; there is none without [`ServerSession::with_challenge`]).
    challenge: Option<[u8; CHALLENGE_LEN]>,
    /// The grant a plaintext client proves its token of.
    token_id: Option<String>,
}

impl ServerSession {
    /// A data connection's hello: the engine hands the connection to its
    /// test, and this session has nothing more to do.
    fn data_stream(
        &mut self,
        token: String,
        stream: u16,
        direction: Direction,
        proof: Option<String>,
    ) -> ServerEvent {
        self.state = ServerState::Closed;
        self.deadline = None;
        ServerEvent::DataStream {
            token,
            stream,
            direction,
            proof,
        }
    }

    pub fn new(now: Instant, cfg: ServerConfig) -> Self {
        let deadline = Some(deadline(now, cfg.limits.handshake_timeout));
        Self {
            cfg,
            state: ServerState::AwaitHello,
            version: 0,
            deadline,
            run_limit: Duration::ZERO,
            out: VecDeque::new(),
            challenge: None,
            token_id: None,
        }
    }

    /// Gives this connection its challenge for a token proof: 32 bytes
    /// from a CSPRNG, never used for another connection. A session
    /// without one refuses a `Hello` with a `token_id`.
    pub fn with_challenge(mut self, challenge: [u8; CHALLENGE_LEN]) -> Self {
        self.challenge = Some(challenge);
        self
    }

    fn welcome(&mut self, now: Instant) {
        self.out.push_back(Message::Welcome(Welcome {
            version: self.version,
            software: self.cfg.software.clone(),
            host: self.cfg.host.clone(),
            buffers: self.cfg.buffers,
            max_streams: Some(self.cfg.limits.max_streams),
            features: vec![
                FEATURE_UDP_BACK.into(),
                FEATURE_COPY_BACK.into(),
                crate::xfer::copy::FEATURE_JOB_GRANTS.into(),
            ],
        }));
        self.state = ServerState::AwaitRequest;
        self.deadline = Some(deadline(now, self.cfg.limits.idle_timeout));
    }

    /// The client's token proof checked out: welcome it.
    pub fn authenticated(&mut self, now: Instant) {
        if self.state == ServerState::Authenticating {
            self.welcome(now);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.state == ServerState::Closed
    }

    /// The negotiated protocol version (0 before hello).
    pub fn version(&self) -> u16 {
        self.version
    }

    fn fail(&mut self, e: SessionError) -> SessionError {
        self.out.push_back(Message::Refuse(Refuse {
            code: e.code,
            message: e.message.clone(),
        }));
        self.state = ServerState::Closed;
        self.deadline = None;
        e
    }

    fn unexpected(&mut self, m: &Message) -> SessionError {
        let e = SessionError::new(
            RefuseCode::Protocol,
            format!("unexpected {} message in state {:?}", m.name(), self.state),
        );
        self.fail(e)
    }

    pub fn handle(
        &mut self,
        now: Instant,
        msg: Message,
    ) -> Result<Option<ServerEvent>, SessionError> {
        use ServerState as S;
        match (self.state, msg) {
            (S::Closed, _) => Ok(None),
            (S::AwaitHello, Message::Hello(h)) => self.hello(now, h),
            (S::AwaitProof, Message::Proof(p)) => {
                let (Some(token_id), Some(challenge)) = (self.token_id.take(), self.challenge)
                else {
                    return Err(self.unexpected(&Message::Proof(p)));
                };
                self.state = S::Authenticating;
                Ok(Some(ServerEvent::TokenProof {
                    token_id,
                    challenge,
                    proof: p.proof,
                }))
            }
            (S::AwaitRequest, m) => self.request(m),
            (S::AwaitStart, Message::Start(_)) => {
                self.state = S::Running;
                self.deadline = Some(deadline(now, self.run_limit));
                Ok(Some(ServerEvent::Start))
            }
            (S::AwaitStreams | S::AwaitStart | S::Running, Message::Stop(s)) => {
                Ok(Some(ServerEvent::Stop(s.reason)))
            }
            (S::Running, Message::Active(a)) => Ok(Some(ServerEvent::Active(a.streams))),
            (_, Message::Refuse(r)) => Err(self.refused(r)),
            (_, m) => Err(self.unexpected(&m)),
        }
    }

    /// The peer refused: the session is over.
    fn refused(&mut self, r: Refuse) -> SessionError {
        self.state = ServerState::Closed;
        self.deadline = None;
        r.into()
    }

    /// The first message: a common version, then the connection's role (a
    /// control connection, maybe to be challenged, or a data stream).
    fn hello(&mut self, now: Instant, h: Hello) -> Result<Option<ServerEvent>, SessionError> {
        let lo = h.min_version.max(MIN_PROTOCOL_VERSION);
        let hi = h.max_version.min(PROTOCOL_VERSION);
        if lo > hi {
            return Err(self.fail(SessionError::new(
                RefuseCode::Version,
                format!(
                    "no common protocol version: peer speaks {}..={}, this server {}..={}; upgrade the older side",
                    h.min_version, h.max_version, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
                ),
            )));
        }
        self.version = hi;
        match h.role {
            Role::Control => match h.token_id {
                None => {
                    self.welcome(now);
                    Ok(None)
                }
                Some(id) => self.challenge_for(id, h.token.is_some()),
            },
            Role::Data {
                token,
                stream,
                direction,
            } => Ok(Some(self.data_stream(token, stream, direction, None))),
            Role::PerfData {
                test,
                stream,
                direction,
                proof,
            } => Ok(Some(self.data_stream(test, stream, direction, Some(proof)))),
        }
    }

    /// A request on an idle control connection: a test (decided by the
    /// engine), or anything else the engine runs at once.
    fn request(&mut self, msg: Message) -> Result<Option<ServerEvent>, SessionError> {
        // Whether the request ends the idle deadline; the job and
        // capability commands are answered at once and keep it.
        let (event, ends_idle) = match msg {
            Message::TestRequest(p) => {
                if let Err(e) = self.cfg.limits.check(&p) {
                    return Err(self.fail(e));
                }
                self.run_limit = run_limit(&p, self.cfg.limits.max_duration);
                self.state = ServerState::Deciding;
                self.deadline = None;
                return Ok(Some(ServerEvent::TestRequested(p)));
            }
            Message::ThirdParty(t) => {
                if !self.cfg.limits.allow_third_party {
                    return Err(self.fail(SessionError::new(
                        RefuseCode::ThirdPartyDisabled,
                        "this server does not run third-party tests (started with --no-third-party)",
                    )));
                }
                if let Err(e) = self.cfg.limits.check(&t.params) {
                    return Err(self.fail(e));
                }
                (ServerEvent::ThirdPartyRequested(t), true)
            }
            Message::TransferRequest(t) => {
                if t.streams == 0 || t.streams > self.cfg.limits.max_streams {
                    return Err(self.fail(SessionError::new(
                        RefuseCode::Limit,
                        format!(
                            "{} streams requested, this server allows 1..={} per transfer",
                            t.streams, self.cfg.limits.max_streams
                        ),
                    )));
                }
                (ServerEvent::TransferRequested(t), true)
            }
            Message::ListRequest(l) => (ServerEvent::ListRequested(l), true),
            Message::Probe(p) => (ServerEvent::ProbeRequested(p), true),
            Message::GrantRequest(g) => (ServerEvent::GrantRequested(g), true),
            Message::CopyOrder(o) => (ServerEvent::CopyOrdered(o), true),
            Message::Revoke(_) => (ServerEvent::RevokeRequested, false),
            Message::Discard(d) => (ServerEvent::DiscardRequested(d), false),
            Message::JobSubmit(j) => (ServerEvent::JobSubmitted(j), false),
            Message::JobCommand(c) => (ServerEvent::JobCommanded(c), false),
            Message::Refuse(r) => return Err(self.refused(r)),
            m => return Err(self.unexpected(&m)),
        };
        self.state = ServerState::Running;
        if ends_idle {
            self.deadline = None;
        }
        Ok(Some(event))
    }

    /// A control `Hello` with `token_id`: queue this connection's
    /// challenge, and wait for the proof (under the handshake deadline).
    fn challenge_for(
        &mut self,
        id: String,
        with_token: bool,
    ) -> Result<Option<ServerEvent>, SessionError> {
        if with_token {
            return Err(self.fail(SessionError::new(
                RefuseCode::Protocol,
                "a hello carries a token or a token_id to prove, not both",
            )));
        }
        if !tokenproof::valid_id(&id) {
            return Err(self.fail(SessionError::new(
                RefuseCode::Unauthorized,
                "the token_id of the hello is not a grant id: check the token (lh1_ID_SECRET)",
            )));
        }
        let Some(challenge) = self.challenge else {
            return Err(self.fail(SessionError::new(
                RefuseCode::Unauthorized,
                "this server cannot check a token proof; use TLS",
            )));
        };
        self.out.push_back(Message::Challenge(Challenge {
            challenge: tokenproof::challenge_hex(&challenge),
        }));
        self.token_id = Some(id.clone());
        self.state = ServerState::AwaitProof;
        Ok(Some(ServerEvent::Challenged { token_id: id }))
    }

    /// The engine took the test: tell the client where to connect.
    pub fn accept_test(&mut self, now: Instant, accept: TestAccept) {
        if self.state == ServerState::Deciding {
            self.out.push_back(Message::TestAccept(accept));
            self.state = ServerState::AwaitStreams;
            self.deadline = Some(deadline(now, self.cfg.limits.handshake_timeout));
        }
    }

    /// Every data stream has joined.
    pub fn ready(&mut self, ready: Ready) {
        if self.state == ServerState::AwaitStreams {
            self.out.push_back(Message::Ready(ready));
            self.state = ServerState::AwaitStart;
        }
    }

    /// Refuses and closes, for reasons the engine found (busy, unknown
    /// congestion control, a failure while running).
    pub fn refuse(&mut self, code: RefuseCode, message: impl Into<String>) -> SessionError {
        self.fail(SessionError::new(code, message))
    }

    pub fn interval(&mut self, sample: SideInterval) {
        if self.state == ServerState::Running {
            self.out.push_back(Message::Interval(sample));
        }
    }

    pub fn relay(&mut self, relay: Relay) {
        if self.state == ServerState::Running {
            self.out.push_back(Message::Relay(relay));
        }
    }

    /// The test is over: send the results; the session then waits for another request.
    pub fn results(&mut self, now: Instant, results: PeerResults) {
        if matches!(
            self.state,
            ServerState::Running | ServerState::AwaitStart | ServerState::AwaitStreams
        ) {
            self.out.push_back(Message::Results(results));
            self.finish(now);
        }
    }

    /// A third-party run is over (its summary was relayed).
    pub fn finish(&mut self, now: Instant) {
        if self.state != ServerState::Running {
            return;
        }
        self.state = ServerState::AwaitRequest;
        self.deadline = Some(deadline(now, self.cfg.limits.idle_timeout));
    }

    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.out.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SessionError> {
        match self.deadline {
            Some(d) if now >= d => {
                let what = match self.state {
                    ServerState::AwaitHello => "no hello within the handshake time-out",
                    ServerState::AwaitProof | ServerState::Authenticating => {
                        "no proof of the token within the handshake time-out"
                    }
                    ServerState::AwaitRequest => "no request within the idle time-out",
                    ServerState::AwaitStreams => "data streams did not all connect in time",
                    ServerState::AwaitStart => "no start after the streams were ready",
                    _ => "test ran past its planned end",
                };
                Err(self.fail(SessionError::new(RefuseCode::Timeout, what)))
            }
            _ => Ok(()),
        }
    }
}

/// What the client engine must act on.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    Welcomed(Welcome),
    /// The request waits for a slot (see [`Queued`]).
    Queued(Queued),
    Accepted(TestAccept),
    Ready(Ready),
    Interval(SideInterval),
    Results(PeerResults),
    Relay(Relay),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    AwaitChallenge,
    AwaitWelcome,
    Idle,
    AwaitAccept,
    AwaitReady,
    Ready,
    Running,
    ThirdParty,
    Closed,
}

/// The client's end of a control connection.
#[derive(Debug)]
pub struct ClientSession {
    state: ClientState,
    handshake_timeout: Duration,
    run_limit: Duration,
    deadline: Option<Instant>,
    out: VecDeque<Message>,
    /// The token to prove once the server's challenge comes; dropped then.
    proving: Option<String>,
}

impl ClientSession {
    /// Starts a session; the hello is queued at once.
    /// A session that introduces itself with `token` (if any) as credential.
    pub fn new(
        now: Instant,
        software: &str,
        handshake_timeout: Duration,
        token: Option<String>,
    ) -> Self {
        let mut out = VecDeque::new();
        out.push_back(Message::Hello(Hello {
            min_version: MIN_PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            software: software.to_string(),
            role: Role::Control,
            token,
            token_id: None,
        }));
        Self {
            state: ClientState::AwaitWelcome,
            handshake_timeout,
            run_limit: Duration::ZERO,
            deadline: Some(deadline(now, handshake_timeout)),
            out,
            proving: None,
        }
    }

    /// A session that proves `token` (`lh1_ID_SECRET`) for the server's
    /// challenge instead of sending it, for a plaintext connection
    /// ([`tokenproof`]); None if `token` is not of that form. Nothing may
    /// be sent after the hello until [`ClientSession::awaits_challenge`]
    /// is false: the server reads the proof next.
    pub fn proving(
        now: Instant,
        software: &str,
        handshake_timeout: Duration,
        token: &str,
    ) -> Option<Self> {
        let id = tokenproof::token_id(token)?.to_string();
        let mut s = Self::new(now, software, handshake_timeout, None);
        if let Some(Message::Hello(h)) = s.out.front_mut() {
            h.token_id = Some(id);
        }
        s.state = ClientState::AwaitChallenge;
        s.proving = Some(token.to_string());
        Some(s)
    }

    /// The hello named a token to prove and the server's challenge has not
    /// come yet.
    pub fn awaits_challenge(&self) -> bool {
        self.state == ClientState::AwaitChallenge
    }

    fn fail(&mut self, e: SessionError) -> SessionError {
        self.state = ClientState::Closed;
        self.deadline = None;
        self.proving = None;
        e
    }

    pub fn request_test(&mut self, now: Instant, params: TestParams, max_duration: Duration) {
        self.run_limit = run_limit(&params, max_duration);
        self.out.push_back(Message::TestRequest(params));
        self.state = ClientState::AwaitAccept;
        self.deadline = Some(deadline(now, self.handshake_timeout));
    }

    pub fn request_third_party(&mut self, now: Instant, req: ThirdParty, max_duration: Duration) {
        self.run_limit =
            run_limit(&req.params, max_duration).saturating_add(self.handshake_timeout);
        self.out.push_back(Message::ThirdParty(req));
        self.state = ClientState::ThirdParty;
        self.deadline = Some(deadline(now, self.run_limit));
    }

    /// All data streams are connected and the server said ready: go.
    pub fn start(&mut self, now: Instant) {
        if self.state == ClientState::Ready {
            self.out.push_back(Message::Start(Start {}));
            self.state = ClientState::Running;
            self.deadline = Some(deadline(now, self.run_limit));
        }
    }

    /// The tuner's count of the server's sending streams (see [`Active`]).
    pub fn active(&mut self, streams: u16) {
        if self.state == ClientState::Running {
            self.out.push_back(Message::Active(Active { streams }));
        }
    }

    pub fn stop(&mut self, reason: &str) {
        if matches!(self.state, ClientState::Running | ClientState::ThirdParty) {
            self.out.push_back(Message::Stop(Stop {
                reason: reason.to_string(),
            }));
        }
    }

    pub fn handle(
        &mut self,
        now: Instant,
        msg: Message,
    ) -> Result<Option<ClientEvent>, SessionError> {
        use ClientState as S;
        match (self.state, msg) {
            (_, Message::Refuse(r)) => Err(self.fail(r.into())),
            (S::AwaitChallenge, Message::Challenge(c)) => {
                let token = self.proving.take().unwrap_or_default();
                let proof = tokenproof::parse_challenge(&c.challenge)
                    .and_then(|c| tokenproof::prove(&token, &c));
                let Some(proof) = proof else {
                    return Err(self.fail(SessionError::new(
                        RefuseCode::Protocol,
                        "server sent a challenge that is not 64 hex digits",
                    )));
                };
                self.out.push_back(Message::Proof(Proof { proof }));
                self.state = S::AwaitWelcome;
                Ok(None)
            }
            (S::AwaitChallenge, Message::Welcome(_)) => Err(self.fail(SessionError::new(
                RefuseCode::Version,
                "server welcomed this plaintext connection without asking for a proof of the token: it predates challenge proofs and would take the connection as anonymous; use TLS, or upgrade the server",
            ))),
            (S::AwaitWelcome, Message::Welcome(w)) => {
                if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&w.version) {
                    return Err(self.fail(SessionError::new(
                        RefuseCode::Version,
                        format!(
                            "server chose protocol version {}, which this client does not speak",
                            w.version
                        ),
                    )));
                }
                self.state = S::Idle;
                self.deadline = None;
                Ok(Some(ClientEvent::Welcomed(w)))
            }
            // The server queued the request: its keep-alives hold the
            // answer's deadline off while it waits.
            (S::AwaitAccept, Message::Queued(q)) => {
                self.deadline = Some(deadline(now, self.handshake_timeout));
                Ok(Some(ClientEvent::Queued(q)))
            }
            (S::AwaitAccept, Message::TestAccept(a)) => {
                self.state = S::AwaitReady;
                self.deadline = Some(deadline(now, self.handshake_timeout));
                Ok(Some(ClientEvent::Accepted(a)))
            }
            (S::AwaitReady, Message::Ready(r)) => {
                self.state = S::Ready;
                self.deadline = Some(deadline(now, self.handshake_timeout));
                Ok(Some(ClientEvent::Ready(r)))
            }
            (S::Running, Message::Interval(i)) => Ok(Some(ClientEvent::Interval(i))),
            (S::Running, Message::Results(r)) => {
                self.state = S::Idle;
                self.deadline = None;
                Ok(Some(ClientEvent::Results(r)))
            }
            (S::ThirdParty, Message::Relay(r)) => {
                if matches!(r, Relay::Summary(_) | Relay::Failed(_)) {
                    self.state = S::Idle;
                    self.deadline = None;
                }
                Ok(Some(ClientEvent::Relay(r)))
            }
            (state, m) => Err(self.fail(SessionError::new(
                RefuseCode::Protocol,
                format!(
                    "server sent an unexpected {} message in state {state:?}",
                    m.name()
                ),
            ))),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.out.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SessionError> {
        match self.deadline {
            Some(d) if now >= d => {
                let what = match self.state {
                    ClientState::AwaitWelcome | ClientState::AwaitChallenge => {
                        "server did not answer the hello within the handshake time-out"
                    }
                    ClientState::AwaitAccept => "server did not answer the test request in time",
                    ClientState::AwaitReady => {
                        "server did not report the data streams ready in time"
                    }
                    ClientState::Ready => "start was not sent in time",
                    _ => "server sent no results after the planned end of the test",
                };
                Err(self.fail(SessionError::new(RefuseCode::Timeout, what)))
            }
            _ => Ok(()),
        }
    }
}
