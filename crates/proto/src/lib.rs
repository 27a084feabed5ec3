//! The longhaul wire protocol, sans I/O.
//!
//! This crate owns everything two longhaul peers agree on: the connection
//! preamble and frame format ([`frame`]), the control messages ([`msg`])
//! and the test parameters they carry ([`params`]),
//! the session state machines of both ends ([`session`]), the UDP test
//! datagram and its receiver accounting ([`udp`]), and how the measurements
//! of both ends merge into reports ([`report`]), and how a transfer is sized
//! for its path ([`window`]), and how a perf test's plaintext data streams
//! prove they belong to it ([`databind`]), and how a plaintext control
//! connection proves its token for the server's challenge ([`tokenproof`]),
//! and the jobs a server runs unattended and their rules ([`job`]).
//! It opens no sockets, touches no files and reads no clock: time (and a
//! server's challenge) is passed in. `docs/PROTOCOL.md` describes the bytes.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cpulimit;
pub mod data;
pub mod databind;
pub mod digest;
pub mod disk;
pub mod doctor;
pub mod frame;
pub mod iperf3;
pub mod job;
pub mod msg;
pub mod params;
pub mod plan;
pub mod report;
pub mod session;
pub mod tokenproof;
pub mod transfer;
pub mod tune;
pub mod udp;
pub mod units;
pub mod window;
pub mod xfer;

/// A decoding or encoding failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("peer did not start with the longhaul preamble (it does not speak longhaul)")]
    BadMagic,
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("unknown frame type 0x{0:02x}")]
    UnknownFrame(u8),
    #[error("malformed body of frame type 0x{kind:02x}: {reason}")]
    BadBody { kind: u8, reason: String },
    #[error("failed to encode a message: {0}")]
    Encode(String),
}
