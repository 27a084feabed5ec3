//! `longhaul perf`: the client that negotiates and runs a memory-to-memory
//! test ([`client`]), one side's run of a test ([`side`]), shared by client
//! and server, the stream workers that move the bytes ([`workers`]), and
//! how UDP streams join their test, whichever end sends first
//! ([`register`]).

pub mod client;
pub mod iperf3;
pub mod register;
pub mod side;
pub mod workers;
