//! Control messages: one frame each, a type byte and a JSON body.
//!
//! The JSON bodies are documented field by field in `docs/PROTOCOL.md`.
//! Unknown fields are ignored so that a minor version can add optional
//! fields; anything that changes meaning bumps [`PROTOCOL_VERSION`].

use serde::{Deserialize, Serialize};

use crate::frame::{encode_frame, Frame};
/// The parameters of a test, which [`TestParams`] and other messages
/// carry; re-exported so that `msg::*` names everything a message holds.
pub use crate::params::{Direction, Mode, RecvMode, SendMode, TestParams, Transport};
use crate::report::{IntervalReport, Setup, Summary};
use crate::report::{PeerResults, SideInterval, StreamSetup};
use crate::xfer;
use crate::ProtoError;

/// The protocol version this build speaks best.
pub const PROTOCOL_VERSION: u16 = 3;
/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u16 = 3;

/// What a connection is for, declared in its [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Role {
    /// The control connection of a session.
    Control,
    /// A data stream joining the test identified by `token`.
    Data {
        token: String,
        stream: u16,
        direction: Direction,
    },
    /// A perf data stream of a test that gave a data key: `test` names it
    /// (the `TestAccept.token`, which then is no secret), `proof` shows the
    /// stream knows the key ([`crate::databind`]). Safe to send in clear.
    PerfData {
        test: String,
        stream: u16,
        direction: Direction,
        proof: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub min_version: u16,
    pub max_version: u16,
    pub software: String,
    pub role: Role,
    /// A control connection's credential (`--token-file`), sent inside TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A control connection in plaintext: the grant id of the token the
    /// client will prove instead of sending it; the server answers with a
    /// [`Challenge`] ([`crate::tokenproof`]). Never with `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
}

/// Server to client, in answer to a `Hello` with a `token_id`: 32 bytes
/// from the server's CSPRNG, fresh for this connection (64 lowercase hex
/// digits), which the client's [`Proof`] must answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    pub challenge: String,
}

/// Client to server, in answer to a [`Challenge`]: the proof of the token
/// for it, 64 lowercase hex digits ([`crate::tokenproof::prove`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    pub proof: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub version: u16,
    pub software: String,
    /// The server's host name, for reports.
    pub host: String,
    /// The server's socket-buffer caps, so a client can size a transfer.
    #[serde(default)]
    pub buffers: crate::window::BufferCaps,
    /// The most data streams the server allows a test or transfer
    /// (`--max-streams`), so a client sizing for the path stays within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<u16>,
    /// What this server can do beyond its protocol version, one word each
    /// ([`FEATURE_UDP_BACK`]); a client asks for a feature only where it is
    /// listed. Absent from servers older than the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// The feature of a server that takes `TestParams::udp_back_ports`: it
/// sends the first datagram of each UDP stream, to the client's port
/// (`docs/PROTOCOL.md` 8.2.1), for a client it cannot be reached from.
pub const FEATURE_UDP_BACK: &str = "udp_back";

/// The feature of a server that takes `CopyOrder::connect_back`: as a
/// third-party copy's source it listens, and has a destination that can
/// only connect out connect back to it (`docs/PROTOCOL.md` 13.9).
pub const FEATURE_COPY_BACK: &str = "copy_back";

impl Welcome {
    /// True if the server listed `feature`.
    pub fn can(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}

/// Why a peer refused a request or closed a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseCode {
    /// No protocol version in common.
    Version,
    /// The server runs as many tests as it is allowed to.
    Busy,
    /// The request exceeds a configured limit (streams, duration, bytes).
    Limit,
    /// The request is malformed or names something the server lacks.
    BadRequest,
    /// The server does not run third-party tests.
    ThirdPartyDisabled,
    /// A data stream named no test this server knows.
    UnknownTest,
    /// The peer broke the protocol (unexpected message, bad frame).
    Protocol,
    /// The peer took too long.
    Timeout,
    /// The server failed while running the test.
    ServerError,
    /// No credential, a wrong or revoked one, or one that does not allow
    /// this request.
    Unauthorized,
    /// The client spoke plaintext to a server that requires TLS.
    TlsRequired,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refuse {
    pub code: RefuseCode,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestAccept {
    pub test_id: u64,
    /// 32 hex digits; data streams present it in their [`Hello`].
    pub token: String,
    /// For UDP: the server's port for each (direction, stream), in the
    /// order of [`Mode::directions`] then stream index.
    pub udp_ports: Vec<u16>,
    /// Sent when the request had `data_tls`: the test's data key (64 hex
    /// digits, [`crate::databind`]). Its data streams join with a proof of
    /// it ([`Role::PerfData`]), and `token` only names the test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_key: Option<String>,
}

/// Sent by the server once every data stream has joined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub streams: Vec<StreamSetup>,
    /// The server kernel's caps on socket buffers, for warnings.
    pub rmem_max: Option<u64>,
    pub wmem_max: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    pub reason: String,
}

/// Client to server during a TCP test the server sends in (`-R`,
/// `--bidir`) with `-P auto`: of the server's sending streams, `0..streams`
/// send and the rest wait, connected (the client's online tuning).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    pub streams: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThirdParty {
    /// `HOST[:PORT]` of the server the receiving server should test against.
    pub target: String,
    pub params: TestParams,
    /// Fingerprints the requester trusts for `target`: the receiving
    /// server pins these when it connects there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trust: Vec<String>,
    /// The requester's token, presented to `target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Both ends allow plaintext and the requester uses it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext: bool,
}

/// What a server running a third-party test relays to the requester.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Relay {
    Start(Box<Setup>),
    Interval(IntervalReport),
    Summary(Box<Summary>),
    Warning { message: String },
    Failed(Refuse),
}

/// Source server -> client (0x53), while a copy runs: its progress and
/// intervals, then exactly one `done` or `failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum CopyRelay {
    Progress(xfer::copy::CopyProgress),
    Interval(crate::tune::TransferInterval),
    Done(Box<xfer::copy::CopyReport>),
    Failed(Refuse),
    Landed(xfer::copy::CopyLanded),
    ConnectBack(xfer::copy::CopyConnectBack),
}

/// Server to client, in place of an answer to a test, transfer or probe
/// request while every slot it may take is in use: the request waits its
/// turn instead of being refused. Sent when the request joins the queue and
/// again every few seconds while it waits (a keep-alive carrying the
/// current position); the answer follows once a slot frees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    /// 1 for the next request to run (an estimate under round robin).
    pub position: u32,
    /// Tests and transfers running now.
    pub running: u32,
    /// The server's limit (`--max-tests`).
    pub limit: u32,
    /// Why this request waits when it is not the plain limit, e.g. the
    /// share of slots anonymous clients may hold.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Every control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    Hello(Hello),
    Welcome(Welcome),
    Refuse(Refuse),
    Queued(Queued),
    Challenge(Challenge),
    Proof(Proof),
    TestRequest(TestParams),
    TestAccept(TestAccept),
    Ready(Ready),
    Start(Start),
    Interval(SideInterval),
    Stop(Stop),
    Active(Active),
    Results(PeerResults),
    ThirdParty(ThirdParty),
    Relay(Relay),
    TransferRequest(xfer::TransferRequest),
    TransferAccept(xfer::TransferAccept),
    Entries(xfer::Entries),
    Wants(xfer::Wants),
    Resend(xfer::Resend),
    FileDone(xfer::FileDone),
    FileSealed(xfer::FileSealed),
    FilesSealed(xfer::FilesSealed),
    FilesDone(xfer::FilesDone),
    EntriesEnd(xfer::EntriesEnd),
    TransferDone(xfer::SinkReport),
    ListRequest(xfer::ListRequest),
    Listing(xfer::Listing),
    SourceDone(xfer::SourceDone),
    SourceInterval(crate::tune::TransferInterval),
    Probe(crate::disk::ProbeRequest),
    ProbeResult(Box<crate::disk::ProbeResult>),
    GrantRequest(xfer::copy::GrantRequest),
    Grant(xfer::copy::Grant),
    CopyOrder(Box<xfer::copy::CopyOrder>),
    CopyRelay(CopyRelay),
    Revoke(xfer::copy::Revoke),
    Revoked(xfer::copy::Revoked),
    Discard(xfer::copy::Discard),
    Discarded(xfer::copy::Discarded),
    JobSubmit(Box<crate::job::JobSpec>),
    JobCommand(crate::job::JobCommand),
    JobAnswer(crate::job::JobAnswer),
}

/// Frame type bytes.
pub mod kind {
    pub const HELLO: u8 = 0x01;
    pub const WELCOME: u8 = 0x02;
    pub const REFUSE: u8 = 0x03;
    pub const QUEUED: u8 = 0x04;
    pub const CHALLENGE: u8 = 0x05;
    pub const PROOF: u8 = 0x06;
    pub const TEST_REQUEST: u8 = 0x10;
    pub const TEST_ACCEPT: u8 = 0x11;
    pub const READY: u8 = 0x12;
    pub const START: u8 = 0x13;
    pub const INTERVAL: u8 = 0x14;
    pub const STOP: u8 = 0x15;
    pub const ACTIVE: u8 = 0x17;
    pub const RESULTS: u8 = 0x16;
    pub const THIRD_PARTY: u8 = 0x20;
    pub const RELAY: u8 = 0x21;
    pub const TRANSFER_REQUEST: u8 = 0x30;
    pub const TRANSFER_ACCEPT: u8 = 0x31;
    pub const ENTRIES: u8 = 0x32;
    pub const WANTS: u8 = 0x33;
    pub const RESEND: u8 = 0x34;
    pub const FILE_DONE: u8 = 0x35;
    pub const ENTRIES_END: u8 = 0x36;
    pub const TRANSFER_DONE: u8 = 0x37;
    pub const LIST_REQUEST: u8 = 0x38;
    pub const LISTING: u8 = 0x39;
    pub const SOURCE_DONE: u8 = 0x3a;
    pub const SOURCE_INTERVAL: u8 = 0x3b;
    pub const FILE_SEALED: u8 = 0x3c;
    /// Many `FILE_SEALED` in one (only when bundles were negotiated).
    pub const FILES_SEALED: u8 = 0x3d;
    /// Many `FILE_DONE` in one (only when bundles were negotiated).
    pub const FILES_DONE: u8 = 0x3e;
    pub const PROBE: u8 = 0x40;
    pub const PROBE_RESULT: u8 = 0x41;
    /// Third-party copies (PROTOCOL.md 13.9).
    pub const GRANT_REQUEST: u8 = 0x50;
    pub const GRANT: u8 = 0x51;
    pub const COPY_ORDER: u8 = 0x52;
    pub const COPY_RELAY: u8 = 0x53;
    /// A capability's holder ends it (PROTOCOL.md 13.9a).
    pub const REVOKE: u8 = 0x54;
    pub const REVOKED: u8 = 0x55;
    /// A job's destination removes what a cancelled push left (13.9a).
    pub const DISCARD: u8 = 0x56;
    pub const DISCARDED: u8 = 0x57;
    /// Jobs (PROTOCOL.md 18).
    pub const JOB_SUBMIT: u8 = 0x60;
    pub const JOB_COMMAND: u8 = 0x61;
    pub const JOB_ANSWER: u8 = 0x62;
}

impl Message {
    pub fn kind(&self) -> u8 {
        match self {
            Message::Hello(_) => kind::HELLO,
            Message::Welcome(_) => kind::WELCOME,
            Message::Refuse(_) => kind::REFUSE,
            Message::Queued(_) => kind::QUEUED,
            Message::Challenge(_) => kind::CHALLENGE,
            Message::Proof(_) => kind::PROOF,
            Message::TestRequest(_) => kind::TEST_REQUEST,
            Message::TestAccept(_) => kind::TEST_ACCEPT,
            Message::Ready(_) => kind::READY,
            Message::Start(_) => kind::START,
            Message::Interval(_) => kind::INTERVAL,
            Message::Stop(_) => kind::STOP,
            Message::Active(_) => kind::ACTIVE,
            Message::Results(_) => kind::RESULTS,
            Message::ThirdParty(_) => kind::THIRD_PARTY,
            Message::Relay(_) => kind::RELAY,
            Message::TransferRequest(_) => kind::TRANSFER_REQUEST,
            Message::TransferAccept(_) => kind::TRANSFER_ACCEPT,
            Message::Entries(_) => kind::ENTRIES,
            Message::Wants(_) => kind::WANTS,
            Message::Resend(_) => kind::RESEND,
            Message::FileDone(_) => kind::FILE_DONE,
            Message::FileSealed(_) => kind::FILE_SEALED,
            Message::FilesSealed(_) => kind::FILES_SEALED,
            Message::FilesDone(_) => kind::FILES_DONE,
            Message::EntriesEnd(_) => kind::ENTRIES_END,
            Message::TransferDone(_) => kind::TRANSFER_DONE,
            Message::ListRequest(_) => kind::LIST_REQUEST,
            Message::Listing(_) => kind::LISTING,
            Message::SourceDone(_) => kind::SOURCE_DONE,
            Message::SourceInterval(_) => kind::SOURCE_INTERVAL,
            Message::Probe(_) => kind::PROBE,
            Message::ProbeResult(_) => kind::PROBE_RESULT,
            Message::GrantRequest(_) => kind::GRANT_REQUEST,
            Message::Grant(_) => kind::GRANT,
            Message::CopyOrder(_) => kind::COPY_ORDER,
            Message::CopyRelay(_) => kind::COPY_RELAY,
            Message::Revoke(_) => kind::REVOKE,
            Message::Revoked(_) => kind::REVOKED,
            Message::Discard(_) => kind::DISCARD,
            Message::Discarded(_) => kind::DISCARDED,
            Message::JobSubmit(_) => kind::JOB_SUBMIT,
            Message::JobCommand(_) => kind::JOB_COMMAND,
            Message::JobAnswer(_) => kind::JOB_ANSWER,
        }
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "hello",
            Message::Welcome(_) => "welcome",
            Message::Refuse(_) => "refuse",
            Message::Queued(_) => "queued",
            Message::Challenge(_) => "challenge",
            Message::Proof(_) => "proof",
            Message::TestRequest(_) => "test_request",
            Message::TestAccept(_) => "test_accept",
            Message::Ready(_) => "ready",
            Message::Start(_) => "start",
            Message::Interval(_) => "interval",
            Message::Stop(_) => "stop",
            Message::Active(_) => "active",
            Message::Results(_) => "results",
            Message::ThirdParty(_) => "third_party",
            Message::Relay(_) => "relay",
            Message::TransferRequest(_) => "transfer_request",
            Message::TransferAccept(_) => "transfer_accept",
            Message::Entries(_) => "entries",
            Message::Wants(_) => "wants",
            Message::Resend(_) => "resend",
            Message::FileDone(_) => "file_done",
            Message::FileSealed(_) => "file_sealed",
            Message::FilesSealed(_) => "files_sealed",
            Message::FilesDone(_) => "files_done",
            Message::EntriesEnd(_) => "entries_end",
            Message::TransferDone(_) => "transfer_done",
            Message::ListRequest(_) => "list_request",
            Message::Listing(_) => "listing",
            Message::SourceDone(_) => "source_done",
            Message::SourceInterval(_) => "source_interval",
            Message::Probe(_) => "probe",
            Message::ProbeResult(_) => "probe_result",
            Message::GrantRequest(_) => "grant_request",
            Message::Grant(_) => "grant",
            Message::CopyOrder(_) => "copy_order",
            Message::CopyRelay(_) => "copy_relay",
            Message::Revoke(_) => "revoke",
            Message::Revoked(_) => "revoked",
            Message::Discard(_) => "discard",
            Message::Discarded(_) => "discarded",
            Message::JobSubmit(_) => "job_submit",
            Message::JobCommand(_) => "job_command",
            Message::JobAnswer(_) => "job_answer",
        }
    }

    /// Appends this message as one frame.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let body = match self {
            Message::Hello(m) => serde_json::to_vec(m),
            Message::Welcome(m) => serde_json::to_vec(m),
            Message::Refuse(m) => serde_json::to_vec(m),
            Message::Queued(m) => serde_json::to_vec(m),
            Message::Challenge(m) => serde_json::to_vec(m),
            Message::Proof(m) => serde_json::to_vec(m),
            Message::TestRequest(m) => serde_json::to_vec(m),
            Message::TestAccept(m) => serde_json::to_vec(m),
            Message::Ready(m) => serde_json::to_vec(m),
            Message::Start(m) => serde_json::to_vec(m),
            Message::Interval(m) => serde_json::to_vec(m),
            Message::Stop(m) => serde_json::to_vec(m),
            Message::Active(m) => serde_json::to_vec(m),
            Message::Results(m) => serde_json::to_vec(m),
            Message::ThirdParty(m) => serde_json::to_vec(m),
            Message::Relay(m) => serde_json::to_vec(m),
            Message::TransferRequest(m) => serde_json::to_vec(m),
            Message::TransferAccept(m) => serde_json::to_vec(m),
            Message::Entries(m) => serde_json::to_vec(m),
            Message::Wants(m) => serde_json::to_vec(m),
            Message::Resend(m) => serde_json::to_vec(m),
            Message::FileDone(m) => serde_json::to_vec(m),
            Message::FileSealed(m) => serde_json::to_vec(m),
            Message::FilesSealed(m) => serde_json::to_vec(m),
            Message::FilesDone(m) => serde_json::to_vec(m),
            Message::EntriesEnd(m) => serde_json::to_vec(m),
            Message::TransferDone(m) => serde_json::to_vec(m),
            Message::ListRequest(m) => serde_json::to_vec(m),
            Message::Listing(m) => serde_json::to_vec(m),
            Message::SourceDone(m) => serde_json::to_vec(m),
            Message::SourceInterval(m) => serde_json::to_vec(m),
            Message::Probe(m) => serde_json::to_vec(m),
            Message::ProbeResult(m) => serde_json::to_vec(m),
            Message::GrantRequest(m) => serde_json::to_vec(m),
            Message::Grant(m) => serde_json::to_vec(m),
            Message::CopyOrder(m) => serde_json::to_vec(m),
            Message::CopyRelay(m) => serde_json::to_vec(m),
            Message::Revoke(m) => serde_json::to_vec(m),
            Message::Revoked(m) => serde_json::to_vec(m),
            Message::Discard(m) => serde_json::to_vec(m),
            Message::Discarded(m) => serde_json::to_vec(m),
            Message::JobSubmit(m) => serde_json::to_vec(m),
            Message::JobCommand(m) => serde_json::to_vec(m),
            Message::JobAnswer(m) => serde_json::to_vec(m),
        }
        .map_err(|e| ProtoError::Encode(e.to_string()))?;
        encode_frame(self.kind(), &body, out)
    }

    /// Decodes one frame into a message.
    pub fn decode(frame: &Frame) -> Result<Message, ProtoError> {
        fn body<'a, T: Deserialize<'a>>(kind: u8, b: &'a [u8]) -> Result<T, ProtoError> {
            serde_json::from_slice(b).map_err(|e| ProtoError::BadBody {
                kind,
                reason: e.to_string(),
            })
        }
        let b = &frame.body;
        let k = frame.kind;
        Ok(match k {
            kind::HELLO => Message::Hello(body(k, b)?),
            kind::WELCOME => Message::Welcome(body(k, b)?),
            kind::REFUSE => Message::Refuse(body(k, b)?),
            kind::QUEUED => Message::Queued(body(k, b)?),
            kind::CHALLENGE => Message::Challenge(body(k, b)?),
            kind::PROOF => Message::Proof(body(k, b)?),
            kind::TEST_REQUEST => Message::TestRequest(body(k, b)?),
            kind::TEST_ACCEPT => Message::TestAccept(body(k, b)?),
            kind::READY => Message::Ready(body(k, b)?),
            kind::START => Message::Start(body(k, b)?),
            kind::INTERVAL => Message::Interval(body(k, b)?),
            kind::STOP => Message::Stop(body(k, b)?),
            kind::ACTIVE => Message::Active(body(k, b)?),
            kind::RESULTS => Message::Results(body(k, b)?),
            kind::THIRD_PARTY => Message::ThirdParty(body(k, b)?),
            kind::RELAY => Message::Relay(body(k, b)?),
            kind::TRANSFER_REQUEST => Message::TransferRequest(body(k, b)?),
            kind::TRANSFER_ACCEPT => Message::TransferAccept(body(k, b)?),
            kind::ENTRIES => Message::Entries(body(k, b)?),
            kind::WANTS => Message::Wants(body(k, b)?),
            kind::RESEND => Message::Resend(body(k, b)?),
            kind::FILE_DONE => Message::FileDone(body(k, b)?),
            kind::FILE_SEALED => Message::FileSealed(body(k, b)?),
            kind::FILES_SEALED => Message::FilesSealed(body(k, b)?),
            kind::FILES_DONE => Message::FilesDone(body(k, b)?),
            kind::ENTRIES_END => Message::EntriesEnd(body(k, b)?),
            kind::TRANSFER_DONE => Message::TransferDone(body(k, b)?),
            kind::LIST_REQUEST => Message::ListRequest(body(k, b)?),
            kind::LISTING => Message::Listing(body(k, b)?),
            kind::SOURCE_DONE => Message::SourceDone(body(k, b)?),
            kind::SOURCE_INTERVAL => Message::SourceInterval(body(k, b)?),
            kind::PROBE => Message::Probe(body(k, b)?),
            kind::PROBE_RESULT => Message::ProbeResult(body(k, b)?),
            kind::GRANT_REQUEST => Message::GrantRequest(body(k, b)?),
            kind::GRANT => Message::Grant(body(k, b)?),
            kind::COPY_ORDER => Message::CopyOrder(body(k, b)?),
            kind::COPY_RELAY => Message::CopyRelay(body(k, b)?),
            kind::REVOKE => Message::Revoke(body(k, b)?),
            kind::REVOKED => Message::Revoked(body(k, b)?),
            kind::DISCARD => Message::Discard(body(k, b)?),
            kind::DISCARDED => Message::Discarded(body(k, b)?),
            kind::JOB_SUBMIT => Message::JobSubmit(body(k, b)?),
            kind::JOB_COMMAND => Message::JobCommand(body(k, b)?),
            kind::JOB_ANSWER => Message::JobAnswer(body(k, b)?),
            other => return Err(ProtoError::UnknownFrame(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Decoder;

    #[test]
    fn every_message_round_trips() {
        let msgs = vec![
            Message::Hello(Hello {
                min_version: 1,
                max_version: 1,
                software: "longhaul test".into(),
                role: Role::Data {
                    token: "ab".into(),
                    stream: 3,
                    direction: Direction::Down,
                },
                token: None,
                token_id: None,
            }),
            Message::Hello(Hello {
                min_version: 2,
                max_version: 2,
                software: "longhaul test".into(),
                role: Role::Control,
                token: None,
                token_id: Some("ab12cd34".into()),
            }),
            Message::Challenge(Challenge {
                challenge: "5a".repeat(32),
            }),
            Message::Proof(Proof {
                proof: "ff".repeat(32),
            }),
            Message::Hello(Hello {
                min_version: 2,
                max_version: 2,
                software: "longhaul test".into(),
                role: Role::PerfData {
                    test: "00".into(),
                    stream: 1,
                    direction: Direction::Up,
                    proof: "ff".into(),
                },
                token: None,
                token_id: None,
            }),
            Message::TestAccept(TestAccept {
                test_id: 1,
                token: "00".into(),
                udp_ports: vec![],
                data_key: Some("ab".repeat(32)),
            }),
            Message::TestRequest(TestParams {
                data_tls: Some(false),
                ..TestParams::default()
            }),
            Message::TestRequest(TestParams {
                transport: Transport::Udp,
                mode: Mode::Bidir,
                streams: 2,
                data_tls: Some(false),
                udp_back_ports: vec![40001, 40002, 40003, 40004],
                ..TestParams::default()
            }),
            Message::Welcome(Welcome {
                version: PROTOCOL_VERSION,
                software: "longhaul test".into(),
                host: "far".into(),
                buffers: Default::default(),
                max_streams: Some(8),
                features: vec![FEATURE_UDP_BACK.into()],
            }),
            Message::Refuse(Refuse {
                code: RefuseCode::Busy,
                message: "busy".into(),
            }),
            Message::Queued(Queued {
                position: 3,
                running: 16,
                limit: 16,
                reason: String::new(),
            }),
            Message::TestRequest(TestParams::default()),
            Message::Start(Start {}),
            Message::Stop(Stop {
                reason: "interrupted".into(),
            }),
            Message::Active(Active { streams: 3 }),
            Message::FileSealed(crate::xfer::FileSealed { id: 9, resends: 2 }),
            Message::FilesSealed(crate::xfer::FilesSealed {
                items: vec![crate::xfer::FileSealed { id: 9, resends: 2 }],
            }),
            Message::FilesDone(crate::xfer::FilesDone {
                items: vec![crate::xfer::FileDone {
                    id: 3,
                    digest: Some("ab".into()),
                    ..Default::default()
                }],
            }),
            Message::FileDone(crate::xfer::FileDone {
                id: 9,
                error: Some("changed".into()),
                changed: true,
                retried: true,
                ..Default::default()
            }),
            Message::Probe(crate::disk::ProbeRequest {
                export: "data".into(),
                path: "a/b".into(),
                tests: crate::disk::ProbeTests {
                    write: true,
                    read: false,
                    create: true,
                },
                max_bytes: 1 << 20,
                max_files: 10,
                max_millis: 500,
                host: true,
                remove: Some(".longhaul-doctor-1".into()),
            }),
            Message::ProbeResult(Box::new(crate::disk::ProbeResult {
                report: crate::disk::DiskReport {
                    path: "/x".into(),
                    write: Some(crate::disk::SeqResult {
                        bytes: 1 << 20,
                        seconds: 0.25,
                        bytes_per_second: 4194304.0,
                    }),
                    ..Default::default()
                },
                host: Some(crate::doctor::HostSettings {
                    cpus: 2,
                    cipher_bytes_per_core: 1.5e9,
                    ..Default::default()
                }),
                dir: Some("run7".into()),
            })),
            Message::GrantRequest(crate::xfer::copy::GrantRequest {
                export: "data".into(),
                dest: "in".into(),
                dest_dir: true,
                lifetime_s: 600,
                ..Default::default()
            }),
            Message::Grant(crate::xfer::copy::Grant {
                capability: "lh1c_AAAA".into(),
                lifetime_s: 600,
            }),
            Message::CopyOrder(Box::new(crate::xfer::copy::CopyOrder {
                export: "data".into(),
                sources: vec!["run7/".into()],
                target: "[::1]:5310".into(),
                fingerprint: "SHA256:x".into(),
                capability: "lh1c_AAAA".into(),
                dest_export: "data".into(),
                dest: "in".into(),
                dest_dir: false,
                options: crate::xfer::copy::CopyOptions {
                    recursive: true,
                    sync: Some(crate::xfer::SyncOptions {
                        checksum: true,
                        delete: false,
                    }),
                    streams: Some(4),
                    ..Default::default()
                },
                connect_back: Some(crate::xfer::copy::ConnectBackOrder {
                    addr: "192.0.2.1".into(),
                }),
                share: None,
            })),
            Message::CopyRelay(CopyRelay::ConnectBack(crate::xfer::copy::CopyConnectBack {
                addr: "192.0.2.1:41234".into(),
                ticket: "lh1b_AAAA".into(),
            })),
            Message::CopyRelay(CopyRelay::Progress(crate::xfer::copy::CopyProgress {
                bytes: 5,
                files: 1,
                walk_done: true,
                ..Default::default()
            })),
            Message::CopyRelay(CopyRelay::Done(Box::new(crate::xfer::copy::CopyReport {
                files: 2,
                verified: true,
                failed: vec![crate::xfer::Failure {
                    path: "x".into(),
                    error: "y".into(),
                }],
                ..Default::default()
            }))),
            Message::CopyRelay(CopyRelay::Failed(Refuse {
                code: RefuseCode::Unauthorized,
                message: "no".into(),
            })),
            Message::Revoke(Default::default()),
            Message::Revoked(Default::default()),
            Message::Discard(crate::xfer::copy::Discard {
                paths: vec!["run7/a.h5".into()],
                into: None,
            }),
            Message::Discard(crate::xfer::copy::Discard {
                paths: vec!["run7/a.h5".into()],
                into: Some(crate::xfer::copy::DiscardInto {
                    export: "root".into(),
                    dest: "scratch/in/".into(),
                    made: Some("scratch".into()),
                }),
            }),
            Message::Discarded(crate::xfer::copy::Discarded { removed: 2 }),
            Message::GrantRequest(crate::xfer::copy::GrantRequest {
                export: "data".into(),
                lifetime_s: 600,
                durable: true,
                op: crate::xfer::copy::CapabilityOp::Pull,
                sources: vec!["run7".into()],
                ..Default::default()
            }),
            Message::JobCommand(crate::job::JobCommand::Show {
                id: "3f2a9c1b0d4e5f67".into(),
                files_from: 10,
                files_limit: 5,
                state: Some(crate::job::FileState::Failed),
            }),
            Message::JobAnswer(crate::job::JobAnswer::Retried {
                id: "3f2a9c1b0d4e5f67".into(),
                files: 1,
            }),
            Message::SourceInterval(crate::tune::TransferInterval {
                index: 3,
                bytes: 10,
                busy: 0.5,
                limit: crate::tune::TransferLimit::StorageWrite,
                ..Default::default()
            }),
            Message::SourceDone(crate::xfer::SourceDone {
                read_bytes: 1,
                read_us: 2,
                resent_changed: 1,
                tuning: Some(crate::tune::TuningReport {
                    online: true,
                    initial_streams: 8,
                    final_streams: 4,
                    steps: vec![crate::tune::ClimbStep {
                        at_s: 2.0,
                        streams: 8,
                        utility_bps: 1e9,
                    }],
                    ..Default::default()
                }),
                cpu: Some(crate::xfer::StageCpu {
                    encrypt: 1.5,
                    ..Default::default()
                }),
                compress: None,
            }),
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            m.encode(&mut wire).unwrap();
        }
        let mut d = Decoder::new(1 << 16);
        d.push(&wire);
        for m in &msgs {
            let f = d.next_frame().unwrap().unwrap();
            assert_eq!(&Message::decode(&f).unwrap(), m);
        }
    }

    /// The fields a server that sends the first UDP datagram adds are
    /// absent where unused, so an older peer sees what it always saw, and
    /// what an older peer sends reads as "not asked, not offered".
    #[test]
    fn udp_back_fields_are_absent_when_unused_and_old_peers_read_as_without() {
        let p = serde_json::to_value(TestParams::default()).unwrap();
        assert!(p.get("udp_back_ports").is_none(), "{p}");
        let w = Welcome {
            version: 3,
            software: "x".into(),
            host: "h".into(),
            buffers: Default::default(),
            max_streams: None,
            features: vec![],
        };
        let j = serde_json::to_value(&w).unwrap();
        assert!(j.get("features").is_none(), "{j}");
        assert!(!w.can(FEATURE_UDP_BACK));
        // An older server's welcome, and an older client's request.
        let old: Welcome =
            serde_json::from_str(r#"{"version":3,"software":"longhaul 0.1","host":"h"}"#).unwrap();
        assert!(old.features.is_empty() && !old.can(FEATURE_UDP_BACK));
        let mut req = serde_json::to_value(TestParams::default()).unwrap();
        req.as_object_mut().unwrap().remove("data_tls");
        let old: TestParams = serde_json::from_value(req).unwrap();
        assert!(old.udp_back_ports.is_empty());
        // A later server's words this build does not know are no feature.
        let later: Welcome = serde_json::from_str(
            r#"{"version":3,"software":"s","host":"h","features":["udp_back","warp"],"more":1}"#,
        )
        .unwrap();
        assert!(later.can(FEATURE_UDP_BACK) && !later.can("udp"));
    }

    #[test]
    fn udp_back_ports_are_one_nonzero_port_per_udp_stream() {
        let udp = |mode, streams, ports: Vec<u16>| TestParams {
            transport: Transport::Udp,
            mode,
            streams,
            udp_back_ports: ports,
            ..TestParams::default()
        };
        assert!(udp(Mode::Up, 1, vec![]).check_udp_back().is_ok());
        assert!(udp(Mode::Up, 2, vec![1, 2]).check_udp_back().is_ok());
        assert!(udp(Mode::Bidir, 2, vec![1, 2, 3, 4])
            .check_udp_back()
            .is_ok());
        for bad in [
            udp(Mode::Bidir, 2, vec![1, 2]),
            udp(Mode::Up, 1, vec![1, 2]),
            udp(Mode::Down, 1, vec![0]),
            TestParams {
                udp_back_ports: vec![5],
                ..TestParams::default()
            },
        ] {
            assert!(bad.check_udp_back().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_kind_and_bad_json_are_errors() {
        let f = Frame {
            kind: 0x7f,
            body: b"{}".to_vec(),
        };
        assert!(matches!(
            Message::decode(&f),
            Err(ProtoError::UnknownFrame(0x7f))
        ));
        let f = Frame {
            kind: kind::HELLO,
            body: b"{\"min_version\":".to_vec(),
        };
        assert!(matches!(
            Message::decode(&f),
            Err(ProtoError::BadBody { kind: 1, .. })
        ));
    }

    /// The frames of PROTOCOL.md 13.9a and 18, byte for byte.
    #[test]
    fn the_documented_frames_are_what_is_sent() {
        use crate::job::{JobAnswer, JobCommand};
        let frame = |m: Message| {
            let mut out = Vec::new();
            m.encode(&mut out).unwrap();
            let (head, body) = out.split_at(5);
            format!(
                "{} {}",
                head.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                String::from_utf8_lossy(body)
            )
        };
        let grant = crate::xfer::copy::GrantRequest {
            export: "in".into(),
            dest: "run7".into(),
            dest_dir: true,
            lifetime_s: 604_800,
            durable: true,
            ..Default::default()
        };
        assert_eq!(
            frame(Message::GrantRequest(grant)),
            r#"00 00 00 50 50 {"export":"in","dest":"run7","dest_dir":true,"lifetime_s":604800,"durable":true}"#
        );
        let order = crate::xfer::copy::GrantRequest {
            export: "data".into(),
            lifetime_s: 604_800,
            durable: true,
            op: crate::xfer::copy::CapabilityOp::Order,
            sources: vec!["run7".into()],
            order: Some(crate::xfer::copy::OrderScope {
                target: "dtn-b:5310".into(),
                fingerprint: "SHA256:9f86d0...".into(),
                dest_export: "in".into(),
                dest: String::new(),
                dest_dir: true,
            }),
            ..Default::default()
        };
        assert_eq!(
            frame(Message::GrantRequest(order)),
            r#"00 00 00 cc 50 {"export":"data","dest":"","lifetime_s":604800,"durable":true,"op":"order","sources":["run7"],"order":{"target":"dtn-b:5310","fingerprint":"SHA256:9f86d0...","dest_export":"in","dest":"","dest_dir":true}}"#
        );
        assert_eq!(
            frame(Message::Revoke(Default::default())),
            "00 00 00 02 54 {}"
        );
        let discard = crate::xfer::copy::Discard {
            paths: vec!["run7/a.h5".into(), "run7/b.h5".into()],
            into: None,
        };
        assert_eq!(
            frame(Message::Discard(discard)),
            r#"00 00 00 23 56 {"paths":["run7/a.h5","run7/b.h5"]}"#
        );
        let id = "3f2a9c1b0d4e5f67".to_string();
        assert_eq!(
            frame(Message::JobCommand(JobCommand::Cancel { id: id.clone() })),
            r#"00 00 00 27 61 {"op":"cancel","id":"3f2a9c1b0d4e5f67"}"#
        );
        assert_eq!(
            frame(Message::JobAnswer(JobAnswer::Cancelled { id })),
            r#"00 00 00 2e 62 {"answer":"cancelled","id":"3f2a9c1b0d4e5f67"}"#
        );
    }
}
