//! The parameters of a memory-to-memory test and the words both ends use
//! for them: transport, direction, mode, how data meets the kernel. A leaf:
//! the messages ([`crate::msg`]) carry these, and the reports
//! ([`crate::report`]) and tuning ([`crate::tune`]) describe tests with
//! them, without depending on each other.

use serde::{Deserialize, Serialize};

/// Which transport a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    #[default]
    Tcp,
    Udp,
}

/// Which way data flows, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Client sends, server receives.
    #[default]
    Up,
    /// Server sends, client receives (`--reverse`).
    Down,
}

/// Which directions a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Up,
    Down,
    Bidir,
}

impl Mode {
    pub fn directions(self) -> &'static [Direction] {
        match self {
            Mode::Up => &[Direction::Up],
            Mode::Down => &[Direction::Down],
            Mode::Bidir => &[Direction::Up, Direction::Down],
        }
    }
}

/// How a sender hands data to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SendMode {
    /// write(2) from a buffer: one copy into the kernel, as most applications do.
    Copy,
    /// vmsplice(2) the buffer into a pipe, splice(2) the pipe into the
    /// socket: the kernel references the pages instead of copying them.
    #[default]
    Splice,
    /// sendfile(2) from a memory file (iperf3 -Z).
    Sendfile,
}

/// How a receiver takes data from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecvMode {
    /// read(2) into a buffer: one copy out of the kernel.
    Copy,
    /// recv(2) with MSG_TRUNC: TCP discards the bytes without copying them.
    #[default]
    Discard,
}

/// Everything that defines a memory-to-memory test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestParams {
    pub transport: Transport,
    pub mode: Mode,
    /// Streams per direction.
    pub streams: u16,
    /// Run time in milliseconds, after the omitted start. Exactly one of
    /// `duration_ms` and `bytes` is set.
    pub duration_ms: Option<u64>,
    /// Total bytes per direction, spread over the streams.
    pub bytes: Option<u64>,
    /// Bytes per write (TCP) or per datagram (UDP).
    pub length: u32,
    /// Socket buffer size to request on both ends (SO_SNDBUF/SO_RCVBUF).
    pub window: Option<u32>,
    pub congestion: Option<String>,
    /// Pacing rate per direction in bits/s, split over the streams.
    pub pacing_bps: Option<u64>,
    pub mss: Option<u32>,
    /// CPU for the server's stream threads.
    pub server_cpu: Option<u32>,
    /// How senders hand data to the kernel.
    #[serde(default)]
    pub send_mode: SendMode,
    /// How receivers take data from the kernel.
    #[serde(default)]
    pub recv_mode: RecvMode,
    /// Interval between reports in milliseconds; 0 for none.
    pub interval_ms: u64,
    /// Leading milliseconds left out of the results.
    pub omit_ms: u64,
    /// UDP target rate per direction in bits/s.
    pub udp_rate_bps: Option<u64>,
    /// TCP data streams over TLS (`true`) or in plaintext (`false`), each
    /// joining with a proof of the test's data key (`TestAccept.data_key`);
    /// absent (a client older than this field): data streams as the
    /// control connection, joining with the test token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_tls: Option<bool>,
    /// A UDP test whose far end sends first (`docs/PROTOCOL.md` 8.2.1):
    /// the client's UDP port for each (direction, stream), in the order of
    /// [`Mode::directions`] then stream index. The server connects its
    /// socket of each to (the control connection's peer, that port) and
    /// sends registration datagrams there until the test starts. Empty (a
    /// client older than this field, or one that can reach the server's
    /// ports): the client registers ([`crate::msg::TestAccept::udp_ports`]).
    /// Sent only to a server whose `Welcome` lists
    /// [`crate::msg::FEATURE_UDP_BACK`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub udp_back_ports: Vec<u16>,
}

impl TestParams {
    /// Checks `udp_back_ports`: none, or one non-zero port per (direction,
    /// stream) of a UDP test; the error says what is wrong.
    pub fn check_udp_back(&self) -> Result<(), String> {
        let ports = &self.udp_back_ports;
        if ports.is_empty() {
            return Ok(());
        }
        if self.transport != Transport::Udp {
            return Err("udp_back_ports given for a TCP test: they apply to UDP tests only".into());
        }
        let want = usize::from(self.streams) * self.mode.directions().len();
        if ports.len() != want {
            return Err(format!(
                "{} udp_back_ports for {want} UDP streams: give one port per direction and stream",
                ports.len()
            ));
        }
        if ports.contains(&0) {
            return Err(
                "udp_back_ports holds port 0: give the ports the client's sockets are bound to"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Default for TestParams {
    fn default() -> Self {
        Self {
            transport: Transport::Tcp,
            mode: Mode::Up,
            streams: 1,
            duration_ms: Some(10_000),
            bytes: None,
            length: 1 << 20,
            window: None,
            congestion: None,
            pacing_bps: None,
            mss: None,
            server_cpu: None,
            send_mode: SendMode::default(),
            recv_mode: RecvMode::default(),
            interval_ms: 1000,
            omit_ms: 0,
            udp_rate_bps: None,
            data_tls: None,
            udp_back_ports: Vec::new(),
        }
    }
}
