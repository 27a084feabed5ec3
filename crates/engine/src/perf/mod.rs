//! `longhaul perf`: the client that negotiates and runs a memory-to-memory
//! test ([`client`]), one side's run of a test ([`side`]), shared by client
//! and server, and the stream workers that move the bytes ([`workers`]).

pub mod client;
pub mod iperf3;
pub mod side;
pub mod workers;
