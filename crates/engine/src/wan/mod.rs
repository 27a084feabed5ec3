//! `longhaul wan`: a user-space WAN emulator (issue 5). Two network
//! namespaces ("hosts" `a` and `b`), each with a TUN device; a forwarder
//! in this process carries every packet between the two devices and
//! applies, per direction, what the link model ([`model`]) decides.

pub mod forward;
pub mod model;
pub mod net;

pub use model::{Drop, Link, LinkParams, LinkStats, Verdict};
