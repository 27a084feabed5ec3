//! Connections: TCP and TLS streams with framed message I/O ([`conn`],
//! [`tls`]), socket tuning and kernel counters ([`sock`]), connections opened by
//! a far end that can only connect out ([`back`]).

pub mod back;
pub mod conn;
pub mod dial;
pub mod lobby;
pub mod sealed;
pub mod sock;
pub mod tls;
