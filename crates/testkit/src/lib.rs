//! What every crate's tests share, in one place: the one way to ask for
//! something a host may lack ([`require`]), temporary directories
//! ([`TempDir`]), processes ended by their PID on drop ([`Owned`], the engine's), a
//! private OpenSSH server ([`sshd`]), a throwaway PostgreSQL server
//! ([`pg`], feature `postgres`), reproducible data ([`data`]), the kernel's
//! own byte counters ([`counters`]) and waiting on an event instead of
//! sleeping ([`wait_until`]).
//!
//! Tests depend on it as a dev-dependency; nothing ships it
//! (`publish = false`). The binary's end-to-end tests re-export it from
//! `crates/cli/tests/it/common` under the names they have always used.

pub mod counters;
pub mod data;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod process;
pub mod require;
pub mod sshd;
mod tmp;

use std::time::{Duration, Instant};

pub use process::Owned;
pub use tmp::TempDir;

/// A TCP port free on loopback right now (the kernel's pick).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port on 127.0.0.1")
        .port()
}

/// Polls `happened` every 20 ms until it is true; fails the test, naming
/// `what`, if `limit` passes first. What a test waits on instead of a
/// sleep that guesses how long an event takes.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut happened: impl FnMut() -> bool) {
    let started = Instant::now();
    while !happened() {
        assert!(
            started.elapsed() < limit,
            "waited {limit:?} for {what}, in vain"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
