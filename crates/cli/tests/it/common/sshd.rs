//! The test kit's private sshd (`longhaul_testkit::sshd`), with this
//! build's binary as the far longhaul.

use std::path::Path;

#[allow(unused_imports)]
pub use longhaul_testkit::sshd::{which, Sshd, HOST};

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// Starts the sshd, or says why not (a skip, or a failure with
/// `LONGHAUL_REQUIRE_SSH=1`).
pub fn sshd() -> Option<Sshd> {
    longhaul_testkit::sshd::start(Path::new(BIN))
}

/// [`sshd`] in network namespace `netns` (None: this one), listening on
/// `addr`; [`HOST`] is that address.
pub fn sshd_in(netns: Option<&str>, addr: &str) -> Option<Sshd> {
    longhaul_testkit::sshd::start_in(Path::new(BIN), netns, addr)
}
