//! Connections: TCP and TLS streams with framed message I/O ([`conn`],
//! [`tls`]), socket tuning and kernel counters ([`sock`]).

pub mod conn;
pub mod dial;
pub mod sealed;
pub mod sock;
pub mod tls;
