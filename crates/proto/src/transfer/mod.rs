//! The transfer session, sans-IO: the [`source`] and [`sink`] state
//! machines that speak the messages of [`crate::xfer`]. Events and `now`
//! go in; messages to send, file and stream actions, and timers come out.
//! The engine (or the in-memory harness, `tests/transfer.rs`) drives them
//! with files, streams and a clock.
//!
//! A floor above [`crate::msg`] and [`crate::xfer`]: the messages know
//! nothing of the machines.

pub mod sink;
pub mod source;
