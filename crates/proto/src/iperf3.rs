//! iperf3's control protocol (esnet/iperf 3.x), sans I/O, so that longhaul
//! can test against an iperf3 server and answer iperf3 clients
//! (docs/PROTOCOL.md section "iperf3").
//!
//! The wire, as iperf3 speaks it on its control connection (TCP, port 5201
//! by default):
//!
//! * the client opens with a 37-byte cookie: 36 characters of `a-z2-7` and
//!   a NUL; each TCP data stream opens with the same cookie;
//! * the server answers with one signed byte at a time, its state
//!   ([`State`]): `PARAM_EXCHANGE`, `CREATE_STREAMS`, `TEST_START`,
//!   `TEST_RUNNING`, then (after the client's `TEST_END`)
//!   `EXCHANGE_RESULTS` and `DISPLAY_RESULTS`; `ACCESS_DENIED` (-1) instead
//!   of all of it when busy; `SERVER_ERROR` (-2) followed by two 32-bit
//!   big-endian integers (iperf3's error number and an errno) to refuse;
//! * parameters and results are JSON, each preceded by its length as a
//!   32-bit big-endian integer. The length is checked against a bound
//!   before anything is buffered for it.
//!
//! [`Client`] and [`Server`] are the two ends' machines: bytes in
//! (`receive`), events out (`poll_event`), bytes to send
//! (`take_transmit`). They know no sockets and no clock.

use std::collections::VecDeque;

use serde::{Deserialize, Deserializer, Serialize};

/// The length of iperf3's cookie on the wire, its NUL included.
pub const COOKIE_LEN: usize = 37;
/// iperf3's port.
pub const DEFAULT_PORT: u16 = 5201;
/// The longest parameters message a server takes (iperf3's are a few
/// hundred bytes; a title or extra data can add some).
pub const MAX_PARAMS_LEN: u32 = 64 << 10;
/// The longest results message either end takes (about 200 bytes a
/// stream; longhaul never asks for the server's whole output).
pub const MAX_RESULTS_LEN: u32 = 1 << 20;
/// The most streams a results message may list.
pub const MAX_RESULT_STREAMS: usize = 2048;
/// What a UDP stream's first datagram carries (iperf3 >= 3.1: `UDP_CONNECT_MSG`).
pub const UDP_CONNECT_MSG: u32 = 0x3637_3839;
/// The server's answer to it (`UDP_CONNECT_REPLY`).
pub const UDP_CONNECT_REPLY: u32 = 0x3938_3736;
/// The answer of servers before 3.1 (`LEGACY_UDP_CONNECT_REPLY`).
pub const LEGACY_UDP_CONNECT_REPLY: u32 = 987_654_321;
/// What clients before 3.1 sent first on a UDP stream.
pub const LEGACY_UDP_CONNECT_MSG: u32 = 123_456_789;
/// iperf3's UDP datagram header with 32-bit packet counters: seconds,
/// microseconds, counter, each big-endian.
pub const UDP_HEADER_LEN_32: usize = 12;
/// The header with 64-bit counters (`udp_counters_64bit`, iperf3 `--udp-counters-64bit`).
pub const UDP_HEADER_LEN_64: usize = 16;
/// The largest UDP datagram iperf3 sends (`MAX_UDP_BLOCKSIZE`).
pub const MAX_UDP_LEN: u64 = 65_507;

/// The byte order of a 4-byte UDP setup datagram. iperf3 writes the
/// number from memory, so its order is the sending host's (little-endian
/// on x86 and most ARM); a server answers in the order it was asked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordOrder {
    Little,
    Big,
}

fn word(b: &[u8]) -> Option<(u32, u32)> {
    let b: [u8; 4] = b.try_into().ok()?;
    Some((u32::from_le_bytes(b), u32::from_be_bytes(b)))
}

/// The byte order of a UDP stream's setup datagram, if `datagram` is one
/// (`UDP_CONNECT_MSG` or the legacy value, 4 bytes exactly); None for
/// anything else, which a server ignores.
pub fn udp_connect_order(datagram: &[u8]) -> Option<WordOrder> {
    let (le, be) = word(datagram)?;
    if le == UDP_CONNECT_MSG || le == LEGACY_UDP_CONNECT_MSG {
        Some(WordOrder::Little)
    } else if be == UDP_CONNECT_MSG || be == LEGACY_UDP_CONNECT_MSG {
        Some(WordOrder::Big)
    } else {
        None
    }
}

/// The setup datagram a client sends (in x86's order, as iperf3 on it does).
pub fn udp_connect_msg() -> [u8; 4] {
    UDP_CONNECT_MSG.to_le_bytes()
}

/// The server's answer to a setup datagram that came in `order`.
pub fn udp_connect_reply(order: WordOrder) -> [u8; 4] {
    match order {
        WordOrder::Little => UDP_CONNECT_REPLY.to_le_bytes(),
        WordOrder::Big => UDP_CONNECT_REPLY.to_be_bytes(),
    }
}

/// Whether `datagram` is a server's answer to the setup datagram (either
/// order, current or legacy value).
pub fn is_udp_connect_reply(datagram: &[u8]) -> bool {
    word(datagram).is_some_and(|(le, be)| {
        [le, be]
            .iter()
            .any(|&w| w == UDP_CONNECT_REPLY || w == LEGACY_UDP_CONNECT_REPLY)
    })
}

/// The header iperf3 puts at the front of each UDP datagram: the sender's
/// wall clock when it sent it and the datagram's number (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    pub sec: u32,
    pub usec: u32,
    pub count: u64,
}

/// The header's length with 64-bit (`wide`) or 32-bit counters.
pub fn udp_header_len(wide: bool) -> usize {
    if wide {
        UDP_HEADER_LEN_64
    } else {
        UDP_HEADER_LEN_32
    }
}

impl UdpHeader {
    /// A header for datagram `count` sent at `since_epoch` (wall clock).
    pub fn at(since_epoch: std::time::Duration, count: u64) -> UdpHeader {
        UdpHeader {
            sec: since_epoch.as_secs() as u32,
            usec: since_epoch.subsec_micros(),
            count,
        }
    }

    /// Writes the header at the front of `buf`; false (nothing written)
    /// if `buf` is shorter than the header. With 32-bit counters the count
    /// is taken modulo 2^32, as iperf3's is.
    pub fn write(&self, buf: &mut [u8], wide: bool) -> bool {
        let Some(b) = buf.get_mut(..udp_header_len(wide)) else {
            return false;
        };
        b[0..4].copy_from_slice(&self.sec.to_be_bytes());
        b[4..8].copy_from_slice(&self.usec.to_be_bytes());
        if wide {
            b[8..16].copy_from_slice(&self.count.to_be_bytes());
        } else {
            b[8..12].copy_from_slice(&(self.count as u32).to_be_bytes());
        }
        true
    }

    /// The header at the front of a datagram; None if it is too short.
    pub fn read(buf: &[u8], wide: bool) -> Option<UdpHeader> {
        let b = buf.get(..udp_header_len(wide))?;
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let count = if wide {
            u64::from(u32_at(8)) << 32 | u64::from(u32_at(12))
        } else {
            u64::from(u32_at(8))
        };
        Some(UdpHeader {
            sec: u32_at(0),
            usec: u32_at(4),
            count,
        })
    }

    /// The send time in nanoseconds since the epoch (a microsecond field
    /// over a second, which no iperf3 writes, is taken as it is).
    pub fn sent_ns(&self) -> u64 {
        u64::from(self.sec) * 1_000_000_000 + u64::from(self.usec) * 1_000
    }
}

/// iperf3's error numbers (`i_errno`) that this side sends or names.
pub mod errno {
    /// "test duration too long (maximum = 86400 seconds)": iperf3's own
    /// cap, which a client checks itself; never sent for a server's cap.
    pub const DURATION: i32 = 5;
    /// "number of parallel streams too large (maximum = 128)"
    pub const NUM_STREAMS: i32 = 6;
    /// "block size too large (maximum = 1048576 bytes)"
    pub const BLOCK_SIZE: i32 = 7;
    /// "an option you are trying to set is not implemented yet"
    pub const UNIMPLEMENTED: i32 = 13;
    /// "total required bandwidth is larger than server limit"
    pub const TOTAL_RATE: i32 = 27;
    /// "received an unknown control message"
    pub const MESSAGE: i32 = 110;
    /// "the server has terminated"
    pub const SERVER_TERMINATED: i32 = 120;
    /// "the server is busy running a test. try again later"
    pub const ACCESS_DENIED: i32 = 121;
    /// "unable to set TCP_CONGESTION: Supplied congestion control
    /// algorithm not supported on this host"
    pub const SET_CONGESTION: i32 = 134;
    /// "test authorization failed"
    pub const AUTH_TEST: i32 = 142;
    /// "client's requested duration exceeds the server's maximum permitted
    /// limit": what iperf3 3.17 and later send for `--server-max-duration`
    /// (an older client prints `int_errno=37`, which at least claims no
    /// wrong maximum, where `DURATION` would print iperf3's 86400 s).
    pub const MAX_DURATION: i32 = 37;
}

/// What iperf3 prints for an error number (the ones a server is likely
/// to send); None for others.
pub fn error_text(code: i32) -> Option<&'static str> {
    Some(match code {
        errno::DURATION => "test duration too long",
        errno::NUM_STREAMS => "number of parallel streams too large",
        errno::BLOCK_SIZE => "block size too large",
        errno::UNIMPLEMENTED => "an option you are trying to set is not implemented yet",
        errno::TOTAL_RATE => "total required bandwidth is larger than server limit",
        errno::MESSAGE => "received an unknown control message",
        errno::SERVER_TERMINATED => "the server has terminated",
        errno::ACCESS_DENIED => "the server is busy running a test. try again later",
        errno::SET_CONGESTION => "congestion control algorithm not supported on the server",
        errno::AUTH_TEST => "test authorization failed",
        errno::MAX_DURATION => {
            "client's requested duration exceeds the server's maximum permitted limit"
        }
        101 => "test initialization failed",
        102 => "unable to start listener for connections",
        114 => "unable to receive parameters from client",
        124 | 130 => "unable to set socket buffer size",
        204 => "unable to accept stream connection",
        _ => return None,
    })
}

/// The state byte of iperf3's control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    TestStart,
    TestRunning,
    TestEnd,
    ParamExchange,
    CreateStreams,
    ServerTerminate,
    ClientTerminate,
    ExchangeResults,
    DisplayResults,
    IperfDone,
    AccessDenied,
    ServerError,
}

impl State {
    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        let v: i8 = match self {
            State::TestStart => 1,
            State::TestRunning => 2,
            State::TestEnd => 4,
            State::ParamExchange => 9,
            State::CreateStreams => 10,
            State::ServerTerminate => 11,
            State::ClientTerminate => 12,
            State::ExchangeResults => 13,
            State::DisplayResults => 14,
            State::IperfDone => 16,
            State::AccessDenied => -1,
            State::ServerError => -2,
        };
        v as u8
    }

    /// The state a byte names; None for the unused and unknown ones.
    pub fn from_byte(b: u8) -> Option<State> {
        Some(match b as i8 {
            1 => State::TestStart,
            2 => State::TestRunning,
            4 => State::TestEnd,
            9 => State::ParamExchange,
            10 => State::CreateStreams,
            11 => State::ServerTerminate,
            12 => State::ClientTerminate,
            13 => State::ExchangeResults,
            14 => State::DisplayResults,
            16 => State::IperfDone,
            -1 => State::AccessDenied,
            -2 => State::ServerError,
            _ => return None,
        })
    }
}

/// What went wrong on an iperf3 control connection.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Iperf3Error {
    #[error("iperf3 message of {len} bytes is longer than the {max} allowed")]
    TooLong { len: u32, max: u32 },
    #[error("malformed iperf3 JSON message: {0}")]
    BadJson(String),
    #[error("bad iperf3 cookie: expected 36 characters of a-z and 2-7, then a NUL")]
    BadCookie,
    #[error("unknown iperf3 control byte {0}")]
    UnknownState(i8),
    #[error("unexpected iperf3 control message {got:?} while {during}")]
    Unexpected { got: State, during: &'static str },
    #[error(
        "the iperf3 server is busy running a test (it answered ACCESS_DENIED); try again later"
    )]
    Busy,
    #[error("the iperf3 server refused the test: {message} (iperf3 error {code})")]
    ServerError {
        code: i32,
        errno: i32,
        message: String,
    },
    #[error("the iperf3 server terminated the test")]
    ServerTerminated,
    #[error("the iperf3 client terminated the test")]
    ClientTerminated,
}

/// A test's cookie: what names it on its control connection and joins its
/// data streams to it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Cookie([u8; COOKIE_LEN]);

const COOKIE_CHARS: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

impl Cookie {
    /// A cookie from 36 random bytes (the caller's entropy).
    pub fn from_random(raw: [u8; COOKIE_LEN - 1]) -> Cookie {
        let mut c = [0u8; COOKIE_LEN];
        for (o, r) in c.iter_mut().zip(raw) {
            *o = COOKIE_CHARS[usize::from(r) % COOKIE_CHARS.len()];
        }
        Cookie(c)
    }

    /// The cookie in these 37 bytes, if they are one as iperf3 makes them.
    pub fn parse(b: &[u8]) -> Result<Cookie, Iperf3Error> {
        let b: [u8; COOKIE_LEN] = b.try_into().map_err(|_| Iperf3Error::BadCookie)?;
        let (last, chars) = b.split_last().ok_or(Iperf3Error::BadCookie)?;
        if *last != 0 || !chars.iter().all(|c| COOKIE_CHARS.contains(c)) {
            return Err(Iperf3Error::BadCookie);
        }
        Ok(Cookie(b))
    }

    pub fn as_bytes(&self) -> &[u8; COOKIE_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for Cookie {
    // The cookie admits data streams: not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cookie(..)")
    }
}

/// The id iperf3 gives the stream at `index` (0-based, in the order the
/// client connects them): 1, 3, 4, 5, ... (iperf3 skips 2, and both ends
/// must agree, since results name streams by id).
pub fn stream_id(index: usize) -> i64 {
    match index {
        0 => 1,
        i => i as i64 + 2,
    }
}

/// The index of the stream with this id, the inverse of [`stream_id`].
pub fn stream_index(id: i64) -> Option<usize> {
    match id {
        1 => Some(0),
        i if i >= 3 => usize::try_from(i - 2).ok(),
        _ => None,
    }
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    // iperf3 reads a flag by its presence, whatever its value.
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A JSON number as iperf3's cJSON writes it: an integer, or a double
/// such as `1e+10` for large values.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    f64::deserialize(d)
}

fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v = number(d)?;
    if !(0.0..=1.8e19).contains(&v) || v.fract() != 0.0 {
        return Err(serde::de::Error::custom(format!("{v} is not a count")));
    }
    Ok(Some(v as u64))
}

fn u64_of<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    opt_u64(d).map(|v| v.unwrap_or(0))
}

fn i64_of<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let v = number(d)?;
    // iperf3 3.12 writes a -1 it holds unsigned as 2^64 (the stream
    // results' `errors` of a sender, as a double).
    if (9.2e18..=1.85e19).contains(&v) {
        return Ok(-1);
    }
    if !(-9.2e18..=9.2e18).contains(&v) {
        return Err(serde::de::Error::custom(format!("{v} is out of range")));
    }
    Ok(v as i64)
}

/// The parameters message (iperf3's `send_parameters`): what the client
/// asks for. Flags count by presence, as iperf3 reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Params {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub tcp: bool,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub udp: bool,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub sctp: bool,
    /// Seconds left out at the start.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub omit: Option<u64>,
    /// Seconds of the test (0: bound by `num` or `blockcount`).
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub time: Option<u64>,
    /// Bytes to send instead of a time.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub num: Option<u64>,
    /// Blocks to send instead of a time.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub blockcount: Option<u64>,
    #[serde(
        rename = "MSS",
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub mss: Option<u64>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub nodelay: bool,
    /// Streams per direction.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub parallel: Option<u64>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub reverse: bool,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "is_false"
    )]
    pub bidirectional: bool,
    /// Socket buffer bytes.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub window: Option<u64>,
    /// Bytes per write or datagram.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub len: Option<u64>,
    /// Bits per second per stream; 0 unlimited.
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub fqrate: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub pacing_timer: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub burst: Option<u64>,
    #[serde(
        rename = "TOS",
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub tos: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub flowlabel: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_used: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub get_server_output: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub udp_counters_64bit: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub repeating_payload: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub zerocopy: Option<u64>,
    #[serde(
        default,
        deserialize_with = "opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub dont_fragment: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authtoken: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_version: Option<String>,
}

/// What a server allows one iperf3 test to ask for.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Streams per direction.
    pub max_streams: u16,
    /// Seconds of omit plus test.
    pub max_seconds: u64,
    /// Total bits per second of the test (all streams, both directions);
    /// None for no cap. With a cap, a test must ask for a rate (`-b`).
    pub max_rate_bps: Option<u64>,
    /// Bytes per write.
    pub max_len: u64,
    /// Congestion controls this host has.
    pub congestion: Vec<String>,
}

/// A test a server took: the parameters it runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub reverse: bool,
    pub bidirectional: bool,
    /// Streams per direction.
    pub streams: u16,
    pub seconds: u64,
    pub omit: u64,
    /// Bytes per write (the server's sends, in reverse).
    pub len: u32,
    pub window: Option<u32>,
    pub congestion: Option<String>,
    /// Bits per second per stream the client asked for; 0 unlimited.
    pub rate_bps: u64,
    /// The stream count the client connects (both directions).
    pub total_streams: usize,
    /// A UDP test (`-u`): `len` is the datagram size, `rate_bps` the
    /// rate each stream sends at.
    pub udp: bool,
    /// UDP datagrams carry 64-bit counters (`udp_counters_64bit`).
    pub wide_counters: bool,
}

/// A refusal: iperf3's error number (what the client prints) and the
/// server's own words (logged, recorded).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: i32,
    /// A fixed word: `unsupported`, `limit`, `duration`, `rate`, `streams`.
    pub reason: &'static str,
    pub message: String,
}

fn refuse(code: i32, reason: &'static str, message: String) -> Refusal {
    Refusal {
        code,
        reason,
        message,
    }
}

impl Params {
    /// Checks a client's parameters against a server's limits.
    pub fn check(&self, l: &ServerLimits) -> Result<Accepted, Refusal> {
        self.check_features()?;
        let streams = self.check_streams(l)?;
        let (seconds, omit) = self.check_duration(l)?;
        let (len, wide) = self.check_len(l)?;
        let directions: u64 = if self.bidirectional { 2 } else { 1 };
        let rate = self.check_rate(l, streams, directions)?;
        self.check_congestion(l)?;
        let window = self.check_window()?;
        Ok(Accepted {
            reverse: self.reverse && !self.bidirectional,
            bidirectional: self.bidirectional,
            streams,
            seconds,
            omit,
            len: len as u32,
            window,
            congestion: self.congestion.clone(),
            rate_bps: rate,
            total_streams: usize::from(streams) * directions as usize,
            udp: self.udp,
            wide_counters: self.udp && wide,
        })
    }

    /// What this server does not do at all.
    fn check_features(&self) -> Result<(), Refusal> {
        let unsupported = |what: &str| {
            refuse(
                errno::UNIMPLEMENTED,
                "unsupported",
                format!("{what} is not supported by this server"),
            )
        };
        if self.sctp {
            return Err(unsupported("SCTP"));
        }
        if self.authtoken.is_some() {
            return Err(refuse(
                errno::AUTH_TEST,
                "unsupported",
                "iperf3 authentication (--username) is not supported: this server's iperf3 tests are open".into(),
            ));
        }
        if self.num.is_some_and(|n| n > 0) || self.blockcount.is_some_and(|n| n > 0) {
            return Err(unsupported(
                "a byte or block count (-n, -k); give a time with -t",
            ));
        }
        // iperf3 reads this flag by its presence.
        if self.get_server_output.is_some() {
            return Err(unsupported(
                "--get-server-output; the server's figures are in the client's own output (-J: end.sum_received)",
            ));
        }
        Ok(())
    }

    /// The streams per direction, within the server's limit.
    fn check_streams(&self, l: &ServerLimits) -> Result<u16, Refusal> {
        let streams = self.parallel.unwrap_or(1);
        if streams == 0 || streams > u64::from(l.max_streams) {
            return Err(refuse(
                errno::NUM_STREAMS,
                "streams",
                format!(
                    "{streams} streams asked for; this server allows 1 to {}",
                    l.max_streams
                ),
            ));
        }
        Ok(streams as u16)
    }

    /// The test's seconds and the omitted ones, together within the limit.
    fn check_duration(&self, l: &ServerLimits) -> Result<(u64, u64), Refusal> {
        let seconds = self.time.unwrap_or(10);
        let omit = self.omit.unwrap_or(0);
        if seconds == 0 || seconds.saturating_add(omit) > l.max_seconds {
            return Err(refuse(
                errno::MAX_DURATION,
                "duration",
                format!(
                    "a test of {seconds} s (and {omit} s omitted) asked for; this server allows 1 to {} s in all",
                    l.max_seconds
                ),
            ));
        }
        Ok((seconds, omit))
    }

    /// The length of a write or a datagram, and whether UDP counters are
    /// 64-bit.
    fn check_len(&self, l: &ServerLimits) -> Result<(u64, bool), Refusal> {
        let wide = self.udp_counters_64bit.is_some();
        let (min_len, max_len) = match self.udp {
            true => (udp_header_len(wide) as u64, l.max_len.min(MAX_UDP_LEN)),
            false => (1, l.max_len),
        };
        let len = self.len.unwrap_or(if self.udp { 1460 } else { 128 << 10 });
        if len < min_len || len > max_len {
            return Err(refuse(
                errno::BLOCK_SIZE,
                "limit",
                format!(
                    "a length of {len} bytes asked for; this server allows {min_len} to {max_len}{}",
                    if self.udp { " for UDP datagrams" } else { "" }
                ),
            ));
        }
        Ok((len, wide))
    }

    /// The rate per stream (0: unlimited), within the server's cap over
    /// every stream and direction.
    fn check_rate(&self, l: &ServerLimits, streams: u16, directions: u64) -> Result<u64, Refusal> {
        // iperf3 leaves `bandwidth` out when it is 0 (unlimited); its
        // UDP default (1 Mbit/s a stream) is sent like any other rate.
        let rate = self.bandwidth.unwrap_or(0);
        if let Some(cap) = l.max_rate_bps {
            let total = rate
                .saturating_mul(u64::from(streams))
                .saturating_mul(directions);
            if rate == 0 || total > cap {
                return Err(refuse(
                    errno::TOTAL_RATE,
                    "rate",
                    format!(
                        "{} asked for; this server allows at most {} bit/s in all: ask with -b (per stream)",
                        if rate == 0 {
                            "an unlimited rate".to_string()
                        } else {
                            format!("{total} bit/s in all")
                        },
                        cap
                    ),
                ));
            }
        }
        Ok(rate)
    }

    /// The congestion control asked for, if any, is one the server has.
    fn check_congestion(&self, l: &ServerLimits) -> Result<(), Refusal> {
        if let Some(cc) = &self.congestion {
            if !l.congestion.iter().any(|c| c == cc) {
                return Err(refuse(
                    errno::SET_CONGESTION,
                    "unsupported",
                    format!(
                        "congestion control '{}' is not available here (available: {})",
                        crate::units::escaped(cc),
                        l.congestion.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The socket buffer asked for (none for 0), as a socket can take it.
    fn check_window(&self) -> Result<Option<u32>, Refusal> {
        Ok(match self.window {
            Some(0) | None => None,
            Some(w) => Some(u32::try_from(w).map_err(|_| {
                refuse(
                    errno::UNIMPLEMENTED,
                    "limit",
                    format!("a window of {w} bytes is larger than any socket can have"),
                )
            })?),
        })
    }
}

/// One stream's line in a results message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamResult {
    #[serde(deserialize_with = "i64_of")]
    pub id: i64,
    /// Bytes this end sent (its sending streams) or received.
    #[serde(deserialize_with = "u64_of")]
    pub bytes: u64,
    /// The sender's retransmits; -1 when this end did not send or cannot tell.
    #[serde(deserialize_with = "i64_of")]
    pub retransmits: i64,
    /// Seconds (UDP receivers).
    #[serde(deserialize_with = "number")]
    pub jitter: f64,
    #[serde(deserialize_with = "i64_of")]
    pub errors: i64,
    #[serde(deserialize_with = "i64_of")]
    pub packets: i64,
    /// Seconds since the test started (absent before iperf3 3.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<f64>,
}

/// A results message (iperf3's `send_results`), each end's own view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Percent of one core, the whole process.
    #[serde(deserialize_with = "number")]
    pub cpu_util_total: f64,
    #[serde(deserialize_with = "number")]
    pub cpu_util_user: f64,
    #[serde(deserialize_with = "number")]
    pub cpu_util_system: f64,
    /// 1 when this end sent and counted retransmits, 0 when it cannot,
    /// -1 when it did not send.
    #[serde(deserialize_with = "i64_of")]
    pub sender_has_retransmits: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_used: Option<String>,
    pub streams: Vec<StreamResult>,
}

impl Results {
    fn parse(body: &[u8]) -> Result<Results, Iperf3Error> {
        let r: Results =
            serde_json::from_slice(body).map_err(|e| Iperf3Error::BadJson(e.to_string()))?;
        if r.streams.len() > MAX_RESULT_STREAMS {
            return Err(Iperf3Error::BadJson(format!(
                "{} streams listed, more than the {MAX_RESULT_STREAMS} allowed",
                r.streams.len()
            )));
        }
        Ok(r)
    }
}

/// A length-prefixed JSON message of `value`.
pub fn json_frame<T: Serialize>(value: &T) -> Vec<u8> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The next state byte of `buf`, taken off it, or None until one is in;
/// a byte that names no state is an error.
fn take_state(buf: &mut Vec<u8>) -> Result<Option<State>, Iperf3Error> {
    let Some(&b) = buf.first() else {
        return Ok(None);
    };
    buf.remove(0);
    State::from_byte(b)
        .map(Some)
        .ok_or(Iperf3Error::UnknownState(b as i8))
}

/// Takes one length-prefixed JSON message off the front of `buf` if it is
/// all there; refuses a length over `max` as soon as the 4 length bytes
/// are in, before buffering any of it.
fn take_json(buf: &mut Vec<u8>, max: u32) -> Result<Option<Vec<u8>>, Iperf3Error> {
    let Some(len) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    if len > max {
        return Err(Iperf3Error::TooLong { len, max });
    }
    let end = 4 + len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    let body = buf[4..end].to_vec();
    buf.drain(..end);
    Ok(Some(body))
}

/// Takes a `SERVER_ERROR`'s two numbers if they are in.
fn take_server_error(buf: &mut Vec<u8>) -> Option<Iperf3Error> {
    if buf.len() < 8 {
        return None;
    }
    let code = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    buf.drain(..8);
    let message = error_text(code)
        .unwrap_or("an error this side does not know")
        .to_string();
    Some(Iperf3Error::ServerError {
        code,
        errno,
        message,
    })
}

/// The bytes a server sends to refuse a test it has read the parameters
/// of: `SERVER_ERROR`, iperf3's error number, errno 0.
pub fn server_error_bytes(code: i32) -> Vec<u8> {
    let mut out = vec![State::ServerError.byte()];
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes());
    out
}

/// What the client learns.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// Connect the data streams now (each sends the cookie).
    CreateStreams,
    /// The server starts its clock.
    TestStart,
    /// Send and receive now; call [`Client::end_test`] when the time is up.
    Running,
    /// Call [`Client::send_results`] with this end's results.
    SendResults,
    /// The server's results.
    ServerResults(Box<Results>),
    /// The test is over (`IPERF_DONE` sent).
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientPhase {
    ParamExchange,
    CreateStreams,
    TestStart,
    TestRunning,
    Running,
    ExchangeResults,
    SendingResults,
    ServerResults,
    DisplayResults,
    ServerError,
    Done,
}

impl ClientPhase {
    fn during(self) -> &'static str {
        match self {
            ClientPhase::ParamExchange => "waiting for PARAM_EXCHANGE",
            ClientPhase::CreateStreams => "waiting for CREATE_STREAMS",
            ClientPhase::TestStart => "waiting for TEST_START",
            ClientPhase::TestRunning => "waiting for TEST_RUNNING",
            ClientPhase::Running => "the test ran",
            ClientPhase::ExchangeResults => "waiting for EXCHANGE_RESULTS",
            ClientPhase::SendingResults => "sending results",
            ClientPhase::ServerResults => "waiting for the server's results",
            ClientPhase::DisplayResults => "waiting for DISPLAY_RESULTS",
            ClientPhase::ServerError => "reading a SERVER_ERROR",
            ClientPhase::Done => "the test was over",
        }
    }
}

/// The client's end of an iperf3 control connection.
pub struct Client {
    phase: ClientPhase,
    params: Vec<u8>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    events: VecDeque<ClientEvent>,
}

impl Client {
    /// A client that opens with `cookie` and asks for `params`.
    pub fn new(cookie: &Cookie, params: &Params) -> Client {
        Client {
            phase: ClientPhase::ParamExchange,
            params: json_frame(params),
            inbuf: Vec::new(),
            out: cookie.as_bytes().to_vec(),
            events: VecDeque::new(),
        }
    }

    /// Takes bytes from the server.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), Iperf3Error> {
        self.inbuf.extend_from_slice(bytes);
        loop {
            match self.phase {
                ClientPhase::Done => {
                    self.inbuf.clear();
                    return Ok(());
                }
                ClientPhase::ServerError => {
                    return match take_server_error(&mut self.inbuf) {
                        Some(e) => {
                            self.phase = ClientPhase::Done;
                            Err(e)
                        }
                        None => Ok(()),
                    };
                }
                ClientPhase::ServerResults => {
                    let Some(body) = take_json(&mut self.inbuf, MAX_RESULTS_LEN)? else {
                        return Ok(());
                    };
                    let r = Results::parse(&body)?;
                    self.events
                        .push_back(ClientEvent::ServerResults(Box::new(r)));
                    self.phase = ClientPhase::DisplayResults;
                    continue;
                }
                _ => {}
            }
            let Some(s) = take_state(&mut self.inbuf)? else {
                return Ok(());
            };
            let next = match (s, self.phase) {
                (State::AccessDenied, _) => {
                    self.phase = ClientPhase::Done;
                    return Err(Iperf3Error::Busy);
                }
                (State::ServerError, _) => ClientPhase::ServerError,
                (State::ServerTerminate, _) => {
                    self.phase = ClientPhase::Done;
                    return Err(Iperf3Error::ServerTerminated);
                }
                (State::ParamExchange, ClientPhase::ParamExchange) => {
                    let p = std::mem::take(&mut self.params);
                    self.out.extend_from_slice(&p);
                    ClientPhase::CreateStreams
                }
                (State::CreateStreams, ClientPhase::CreateStreams) => {
                    self.events.push_back(ClientEvent::CreateStreams);
                    ClientPhase::TestStart
                }
                (State::TestStart, ClientPhase::TestStart) => {
                    self.events.push_back(ClientEvent::TestStart);
                    ClientPhase::TestRunning
                }
                (State::TestRunning, ClientPhase::TestRunning) => {
                    self.events.push_back(ClientEvent::Running);
                    ClientPhase::Running
                }
                (State::ExchangeResults, ClientPhase::ExchangeResults) => {
                    self.events.push_back(ClientEvent::SendResults);
                    ClientPhase::SendingResults
                }
                (State::DisplayResults, ClientPhase::DisplayResults) => {
                    self.out.push(State::IperfDone.byte());
                    self.events.push_back(ClientEvent::Done);
                    ClientPhase::Done
                }
                (got, phase) => {
                    self.phase = ClientPhase::Done;
                    return Err(Iperf3Error::Unexpected {
                        got,
                        during: phase.during(),
                    });
                }
            };
            self.phase = next;
        }
    }

    /// Ends the test (the time is up): `TEST_END`.
    pub fn end_test(&mut self) {
        if matches!(
            self.phase,
            ClientPhase::Running | ClientPhase::TestRunning | ClientPhase::TestStart
        ) {
            self.out.push(State::TestEnd.byte());
            self.phase = ClientPhase::ExchangeResults;
        }
    }

    /// This end's results, once [`ClientEvent::SendResults`] came.
    pub fn send_results(&mut self, r: &Results) {
        if self.phase == ClientPhase::SendingResults {
            self.out.extend_from_slice(&json_frame(r));
            self.phase = ClientPhase::ServerResults;
            // The server's results may already be buffered.
            let _ = self.receive(&[]);
        }
    }

    /// Gives up (an interrupt): `CLIENT_TERMINATE`.
    pub fn terminate(&mut self) {
        if self.phase != ClientPhase::Done {
            self.out.push(State::ClientTerminate.byte());
            self.phase = ClientPhase::Done;
        }
    }

    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// What to send now.
    pub fn take_transmit(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    pub fn is_done(&self) -> bool {
        self.phase == ClientPhase::Done
    }
}

/// What the server learns.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// The client's parameters: [`Server::accept`] or [`Server::refuse`].
    Params(Box<Params>),
    /// The client ended the test: stop, then [`Server::send_results`]
    /// once [`ServerEvent::ClientResults`] came.
    TestEnd,
    /// The client's results.
    ClientResults(Box<Results>),
    /// The client said `IPERF_DONE`: over.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerPhase {
    Params,
    Deciding,
    Streams,
    Running,
    ClientResults,
    SendingResults,
    IperfDone,
    Done,
}

impl ServerPhase {
    fn during(self) -> &'static str {
        match self {
            ServerPhase::Params => "waiting for the parameters",
            ServerPhase::Deciding => "deciding on the parameters",
            ServerPhase::Streams => "waiting for the data streams",
            ServerPhase::Running => "the test ran",
            ServerPhase::ClientResults => "waiting for the client's results",
            ServerPhase::SendingResults => "sending results",
            ServerPhase::IperfDone => "waiting for IPERF_DONE",
            ServerPhase::Done => "the test was over",
        }
    }
}

/// The server's end of an iperf3 control connection, from after the
/// cookie (which the engine reads to tell control from data connections).
pub struct Server {
    phase: ServerPhase,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    events: VecDeque<ServerEvent>,
}

impl Default for Server {
    fn default() -> Self {
        Server::new()
    }
}

impl Server {
    /// Asks for the parameters (`PARAM_EXCHANGE`).
    pub fn new() -> Server {
        Server {
            phase: ServerPhase::Params,
            inbuf: Vec::new(),
            out: vec![State::ParamExchange.byte()],
            events: VecDeque::new(),
        }
    }

    /// Takes bytes from the client.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), Iperf3Error> {
        self.inbuf.extend_from_slice(bytes);
        loop {
            match self.phase {
                ServerPhase::Done => {
                    self.inbuf.clear();
                    return Ok(());
                }
                ServerPhase::Params => {
                    let Some(body) = take_json(&mut self.inbuf, MAX_PARAMS_LEN)? else {
                        return Ok(());
                    };
                    let p: Params = serde_json::from_slice(&body)
                        .map_err(|e| Iperf3Error::BadJson(e.to_string()))?;
                    self.events.push_back(ServerEvent::Params(Box::new(p)));
                    self.phase = ServerPhase::Deciding;
                    continue;
                }
                ServerPhase::ClientResults => {
                    let Some(body) = take_json(&mut self.inbuf, MAX_RESULTS_LEN)? else {
                        return Ok(());
                    };
                    let r = Results::parse(&body)?;
                    self.events
                        .push_back(ServerEvent::ClientResults(Box::new(r)));
                    self.phase = ServerPhase::SendingResults;
                    continue;
                }
                _ => {}
            }
            let Some(s) = take_state(&mut self.inbuf)? else {
                return Ok(());
            };
            match (s, self.phase) {
                (State::ClientTerminate, _) => {
                    self.phase = ServerPhase::Done;
                    return Err(Iperf3Error::ClientTerminated);
                }
                (State::TestEnd, ServerPhase::Running) => {
                    self.events.push_back(ServerEvent::TestEnd);
                    self.out.push(State::ExchangeResults.byte());
                    self.phase = ServerPhase::ClientResults;
                }
                (State::IperfDone, ServerPhase::IperfDone) => {
                    self.events.push_back(ServerEvent::Done);
                    self.phase = ServerPhase::Done;
                }
                (got, phase) => {
                    self.phase = ServerPhase::Done;
                    return Err(Iperf3Error::Unexpected {
                        got,
                        during: phase.during(),
                    });
                }
            }
        }
    }

    /// Takes the test: `CREATE_STREAMS`.
    pub fn accept(&mut self) {
        if self.phase == ServerPhase::Deciding {
            self.out.push(State::CreateStreams.byte());
            self.phase = ServerPhase::Streams;
        }
    }

    /// Refuses the test (or ends it) with iperf3's error number `code`.
    pub fn refuse(&mut self, code: i32) {
        if self.phase != ServerPhase::Done {
            self.out.extend_from_slice(&server_error_bytes(code));
            self.phase = ServerPhase::Done;
        }
    }

    /// Ends a running test from this side (a cap reached, a time-out):
    /// `SERVER_TERMINATE`, which iperf3 prints as "the server has terminated".
    pub fn terminate(&mut self) {
        if self.phase != ServerPhase::Done {
            self.out.push(State::ServerTerminate.byte());
            self.phase = ServerPhase::Done;
        }
    }

    /// Every stream is in: `TEST_START`, `TEST_RUNNING`.
    pub fn start(&mut self) {
        if self.phase == ServerPhase::Streams {
            self.out.push(State::TestStart.byte());
            self.out.push(State::TestRunning.byte());
            self.phase = ServerPhase::Running;
            let _ = self.receive(&[]);
        }
    }

    /// This end's results, then `DISPLAY_RESULTS`.
    pub fn send_results(&mut self, r: &Results) {
        if self.phase == ServerPhase::SendingResults {
            self.out.extend_from_slice(&json_frame(r));
            self.out.push(State::DisplayResults.byte());
            self.phase = ServerPhase::IperfDone;
        }
    }

    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    pub fn take_transmit(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    pub fn is_done(&self) -> bool {
        self.phase == ServerPhase::Done
    }

    /// Whether the test runs (between `TEST_RUNNING` and `TEST_END`).
    pub fn is_running(&self) -> bool {
        self.phase == ServerPhase::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ServerLimits {
        ServerLimits {
            max_streams: 8,
            max_seconds: 60,
            max_rate_bps: None,
            max_len: 1 << 20,
            congestion: vec!["cubic".into(), "reno".into()],
        }
    }

    fn cookie() -> Cookie {
        Cookie::from_random([7u8; 36])
    }

    /// Moves bytes between the two machines until neither has any.
    fn pump(c: &mut Client, s: &mut Server) -> Result<(), Iperf3Error> {
        for _ in 0..16 {
            let a = c.take_transmit();
            let b = s.take_transmit();
            if a.is_empty() && b.is_empty() {
                return Ok(());
            }
            s.receive(&a)?;
            c.receive(&b)?;
        }
        Ok(())
    }

    #[test]
    fn a_whole_test_in_memory() {
        let params = Params {
            tcp: true,
            time: Some(2),
            parallel: Some(2),
            bidirectional: true,
            len: Some(131072),
            client_version: Some("3.12".into()),
            ..Params::default()
        };
        let mut c = Client::new(&cookie(), &params);
        // The cookie first: the engine reads it, then starts the server machine.
        let first = c.take_transmit();
        assert_eq!(Cookie::parse(&first).expect("a cookie"), cookie());
        let mut s = Server::new();
        pump(&mut c, &mut s).expect("params");
        let Some(ServerEvent::Params(p)) = s.poll_event() else {
            panic!("no params")
        };
        assert_eq!(*p, params);
        let a = p.check(&limits()).expect("allowed");
        assert_eq!(a.total_streams, 4);
        assert!(a.bidirectional && !a.reverse);
        s.accept();
        pump(&mut c, &mut s).expect("create");
        assert_eq!(c.poll_event(), Some(ClientEvent::CreateStreams));
        s.start();
        pump(&mut c, &mut s).expect("start");
        assert_eq!(c.poll_event(), Some(ClientEvent::TestStart));
        assert_eq!(c.poll_event(), Some(ClientEvent::Running));
        c.end_test();
        pump(&mut c, &mut s).expect("end");
        assert_eq!(s.poll_event(), Some(ServerEvent::TestEnd));
        assert_eq!(c.poll_event(), Some(ClientEvent::SendResults));
        let mine = Results {
            cpu_util_total: 12.5,
            sender_has_retransmits: 1,
            streams: (0..4)
                .map(|i| StreamResult {
                    id: stream_id(i),
                    bytes: 1 << 30,
                    ..StreamResult::default()
                })
                .collect(),
            ..Results::default()
        };
        c.send_results(&mine);
        pump(&mut c, &mut s).expect("results");
        let Some(ServerEvent::ClientResults(r)) = s.poll_event() else {
            panic!("no client results")
        };
        assert_eq!(*r, mine);
        s.send_results(&Results::default());
        pump(&mut c, &mut s).expect("display");
        assert_eq!(
            c.poll_event(),
            Some(ClientEvent::ServerResults(Box::default()))
        );
        assert_eq!(c.poll_event(), Some(ClientEvent::Done));
        assert_eq!(s.poll_event(), Some(ServerEvent::Done));
        assert!(c.is_done() && s.is_done());
    }

    #[test]
    fn byte_at_a_time_is_the_same() {
        let mut s = Server::new();
        let frame = json_frame(&Params {
            tcp: true,
            ..Params::default()
        });
        for b in &frame {
            s.receive(std::slice::from_ref(b)).expect("partial is fine");
        }
        assert!(matches!(s.poll_event(), Some(ServerEvent::Params(_))));
    }

    #[test]
    fn a_huge_length_is_refused_before_its_body() {
        let mut s = Server::new();
        let e = s.receive(&u32::MAX.to_be_bytes()).unwrap_err();
        assert_eq!(
            e,
            Iperf3Error::TooLong {
                len: u32::MAX,
                max: MAX_PARAMS_LEN
            }
        );
        let mut c = Client::new(&cookie(), &Params::default());
        c.receive(&[9, 10, 1, 2]).expect("to running");
        c.end_test();
        c.receive(&[13]).expect("exchange");
        c.send_results(&Results::default());
        assert!(matches!(
            c.receive(&(MAX_RESULTS_LEN + 1).to_be_bytes()),
            Err(Iperf3Error::TooLong { .. })
        ));
    }

    #[test]
    fn bad_cookies_are_refused() {
        assert!(Cookie::parse(&[b'a'; 37]).is_err(), "no NUL");
        let mut b = [b'a'; 37];
        b[36] = 0;
        assert!(Cookie::parse(&b).is_ok());
        b[3] = b'1';
        assert!(Cookie::parse(&b).is_err(), "1 is not in iperf3's alphabet");
        assert!(Cookie::parse(&b[..36]).is_err());
        assert_eq!(format!("{:?}", cookie()), "Cookie(..)");
    }

    #[test]
    fn busy_and_server_errors_are_clear() {
        let mut c = Client::new(&cookie(), &Params::default());
        assert_eq!(c.receive(&[0xff]), Err(Iperf3Error::Busy));
        let mut c = Client::new(&cookie(), &Params::default());
        let mut bytes = vec![9u8];
        bytes.extend(server_error_bytes(errno::DURATION));
        let (a, b) = bytes.split_at(4);
        c.receive(a).expect("partial error");
        match c.receive(b) {
            Err(Iperf3Error::ServerError { code, message, .. }) => {
                assert_eq!(code, errno::DURATION);
                assert!(message.contains("duration"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let mut c = Client::new(&cookie(), &Params::default());
        assert_eq!(c.receive(&[77]), Err(Iperf3Error::UnknownState(77)));
        let mut c = Client::new(&cookie(), &Params::default());
        assert!(matches!(
            c.receive(&[2]),
            Err(Iperf3Error::Unexpected { .. })
        ));
    }

    #[test]
    fn a_server_refuses_out_of_order_and_terminate() {
        let mut s = Server::new();
        s.receive(&json_frame(&Params::default())).expect("params");
        s.accept();
        assert!(matches!(
            s.receive(&[4]),
            Err(Iperf3Error::Unexpected { .. })
        ));
        let mut s = Server::new();
        s.receive(&json_frame(&Params::default())).expect("params");
        s.accept();
        s.start();
        assert_eq!(s.receive(&[12]), Err(Iperf3Error::ClientTerminated));
        let mut s = Server::new();
        assert!(matches!(
            s.receive(&[0, 0, 0, 2, b'{', b'x']),
            Err(Iperf3Error::BadJson(_))
        ));
    }

    #[test]
    fn flags_count_by_presence_and_numbers_as_cjson_writes_them() {
        let p: Params = serde_json::from_str(
            r#"{"tcp":true,"reverse":false,"time":1e1,"parallel":2,"len":131072.0,"client_version":"3.12","unknown":[1]}"#,
        )
        .expect("parse");
        assert!(p.tcp && p.reverse && !p.bidirectional);
        assert_eq!(
            (p.time, p.parallel, p.len),
            (Some(10), Some(2), Some(131072))
        );
        assert!(serde_json::from_str::<Params>(r#"{"time":1.5}"#).is_err());
        assert!(serde_json::from_str::<Params>(r#"{"time":-1}"#).is_err());
        let r: StreamResult = serde_json::from_str(
            r#"{"id":1,"bytes":5,"retransmits":-1,"jitter":0,"errors":18446744073709552000,"packets":0}"#,
        )
        .expect("3.12's unsigned -1");
        assert_eq!((r.errors, r.retransmits), (-1, -1));
        let j = serde_json::to_string(&Params {
            tcp: true,
            time: Some(1),
            ..Params::default()
        })
        .expect("json");
        assert_eq!(j, r#"{"tcp":true,"time":1}"#);
    }

    /// A peer's congestion control name is shown as the project escapes
    /// every peer string (`units::escaped`): controls and overrides
    /// written out, quotes as they are, so the text names it exactly.
    #[test]
    fn an_unknown_congestion_control_is_named_escaped_as_every_peer_string() {
        let asked = "bbr'\u{1b}[2J\u{202e}x";
        let p = Params {
            tcp: true,
            time: Some(5),
            congestion: Some(asked.into()),
            ..Params::default()
        };
        let m = p.check(&limits()).unwrap_err().message;
        assert!(
            m.contains(&format!("'{}'", crate::units::escaped(asked))),
            "{m}"
        );
        assert!(m.contains("bbr'\\u{1b}[2J\\u{202e}x"), "{m}");
    }

    #[test]
    fn limits_are_checked() {
        let l = limits();
        let ok = Params {
            tcp: true,
            time: Some(5),
            ..Params::default()
        };
        assert!(ok.check(&l).is_ok());
        let code = |p: Params| p.check(&l).unwrap_err().code;
        assert_eq!(
            code(Params {
                time: Some(61),
                ..ok.clone()
            }),
            errno::MAX_DURATION
        );
        assert_eq!(
            code(Params {
                time: Some(0),
                ..ok.clone()
            }),
            errno::MAX_DURATION
        );
        assert_eq!(
            code(Params {
                time: Some(50),
                omit: Some(20),
                ..ok.clone()
            }),
            errno::MAX_DURATION
        );
        assert_eq!(
            code(Params {
                parallel: Some(9),
                ..ok.clone()
            }),
            errno::NUM_STREAMS
        );
        assert_eq!(
            code(Params {
                sctp: true,
                ..ok.clone()
            }),
            errno::UNIMPLEMENTED
        );
        assert_eq!(
            code(Params {
                get_server_output: Some(0),
                ..ok.clone()
            }),
            errno::UNIMPLEMENTED,
            "a flag by its presence"
        );
        assert_eq!(
            code(Params {
                num: Some(5),
                ..ok.clone()
            }),
            errno::UNIMPLEMENTED
        );
        assert_eq!(
            code(Params {
                len: Some(2 << 20),
                ..ok.clone()
            }),
            errno::BLOCK_SIZE
        );
        assert_eq!(
            code(Params {
                congestion: Some("nope".into()),
                ..ok.clone()
            }),
            errno::SET_CONGESTION
        );
        let capped = ServerLimits {
            max_rate_bps: Some(1_000_000_000),
            ..l.clone()
        };
        let r = |bw, n| {
            Params {
                bandwidth: Some(bw),
                parallel: Some(n),
                ..ok.clone()
            }
            .check(&capped)
        };
        assert_eq!(r(0, 1).unwrap_err().code, errno::TOTAL_RATE);
        assert_eq!(r(600_000_000, 2).unwrap_err().code, errno::TOTAL_RATE);
        assert!(r(500_000_000, 2).is_ok());
    }

    #[test]
    fn udp_setup_datagrams_in_either_order() {
        // iperf3 on x86 writes 0x36373839 from memory: "9876" on the wire.
        assert_eq!(&udp_connect_msg(), b"9876");
        assert_eq!(udp_connect_order(b"9876"), Some(WordOrder::Little));
        assert_eq!(udp_connect_order(b"6789"), Some(WordOrder::Big));
        assert_eq!(
            udp_connect_order(&LEGACY_UDP_CONNECT_MSG.to_le_bytes()),
            Some(WordOrder::Little)
        );
        assert_eq!(udp_connect_reply(WordOrder::Little), *b"6789");
        assert_eq!(udp_connect_reply(WordOrder::Big), *b"9876");
        for bad in [&b"987"[..], b"98765", b"abcd", b""] {
            assert_eq!(udp_connect_order(bad), None, "{bad:?}");
        }
        assert!(is_udp_connect_reply(b"6789") && is_udp_connect_reply(b"9876"));
        assert!(is_udp_connect_reply(
            &LEGACY_UDP_CONNECT_REPLY.to_le_bytes()
        ));
        assert!(!is_udp_connect_reply(b"67890") && !is_udp_connect_reply(b"abcd"));
    }

    #[test]
    fn udp_headers_both_widths() {
        let h = UdpHeader {
            sec: 1_700_000_000,
            usec: 999_999,
            count: 7,
        };
        let mut b = [0u8; 16];
        assert!(h.write(&mut b, false));
        assert_eq!(
            &b[..12],
            &[0x65, 0x53, 0xf1, 0x00, 0, 0x0f, 0x42, 0x3f, 0, 0, 0, 7]
        );
        assert_eq!(UdpHeader::read(&b, false), Some(h));
        let wide = UdpHeader {
            count: (1 << 40) + 3,
            ..h
        };
        assert!(wide.write(&mut b, true));
        assert_eq!(UdpHeader::read(&b, true), Some(wide));
        assert_eq!(UdpHeader::read(&b[..15], true), None);
        assert_eq!(UdpHeader::read(&b[..11], false), None);
        assert!(!h.write(&mut [0u8; 11], false));
        assert_eq!(h.sent_ns(), 1_700_000_000_999_999_000);
        let t = std::time::Duration::new(5, 1_500);
        assert_eq!(
            UdpHeader::at(t, 1),
            UdpHeader {
                sec: 5,
                usec: 1,
                count: 1
            }
        );
    }

    #[test]
    fn udp_tests_are_checked() {
        let l = ServerLimits {
            max_rate_bps: Some(100_000_000),
            ..limits()
        };
        let udp = Params {
            udp: true,
            time: Some(2),
            parallel: Some(2),
            bandwidth: Some(40_000_000),
            len: Some(1460),
            ..Params::default()
        };
        let a = udp.check(&l).expect("within the cap");
        assert!(a.udp && !a.wide_counters);
        assert_eq!((a.rate_bps, a.len, a.total_streams), (40_000_000, 1460, 2));
        let code = |p: Params| p.check(&l).unwrap_err().code;
        // 2 x 60M is over 100M; 0 is unlimited: both refused, not capped.
        assert_eq!(
            code(Params {
                bandwidth: Some(60_000_000),
                ..udp.clone()
            }),
            errno::TOTAL_RATE
        );
        assert_eq!(
            code(Params {
                bandwidth: Some(0),
                ..udp.clone()
            }),
            errno::TOTAL_RATE
        );
        // iperf3 leaves out a 0 (unlimited): refused under a cap too.
        assert_eq!(
            code(Params {
                bandwidth: None,
                ..udp.clone()
            }),
            errno::TOTAL_RATE
        );
        for bad in [11, 65_508] {
            assert_eq!(
                code(Params {
                    len: Some(bad),
                    ..udp.clone()
                }),
                errno::BLOCK_SIZE
            );
        }
        let wide = Params {
            udp_counters_64bit: Some(1),
            len: Some(16),
            ..udp.clone()
        };
        assert!(wide.check(&l).expect("16 fits").wide_counters);
        assert_eq!(
            code(Params {
                len: Some(12),
                ..wide
            }),
            errno::BLOCK_SIZE
        );
    }

    #[test]
    fn stream_ids_skip_two() {
        let ids: Vec<i64> = (0..4).map(stream_id).collect();
        assert_eq!(ids, [1, 3, 4, 5]);
        for i in 0..100 {
            assert_eq!(stream_index(stream_id(i)), Some(i));
        }
        assert_eq!(stream_index(2), None);
        assert_eq!(stream_index(0), None);
    }
}
