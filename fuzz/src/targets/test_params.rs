//! A perf test's parameters made from fuzz input, shared by the client
//! and the server session targets.

use arbitrary::Arbitrary;
use longhaul_proto::msg::{Mode, TestParams, Transport};

/// [`TestParams`] with every field the fuzzer may choose.
#[derive(Arbitrary, Debug)]
pub struct Params {
    pub udp: bool,
    pub mode: u8,
    pub streams: u16,
    pub duration_ms: Option<u64>,
    pub bytes: Option<u64>,
    pub length: u32,
    pub congestion: Option<String>,
    pub interval_ms: u64,
    pub omit_ms: u64,
}

impl Params {
    pub fn build(self) -> TestParams {
        TestParams {
            transport: if self.udp {
                Transport::Udp
            } else {
                Transport::Tcp
            },
            mode: match self.mode % 3 {
                0 => Mode::Up,
                1 => Mode::Down,
                _ => Mode::Bidir,
            },
            streams: self.streams,
            duration_ms: self.duration_ms,
            bytes: self.bytes,
            length: self.length,
            congestion: self.congestion,
            interval_ms: self.interval_ms,
            omit_ms: self.omit_ms,
            ..TestParams::default()
        }
    }
}
