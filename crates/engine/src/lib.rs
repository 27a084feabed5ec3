//! The longhaul engine: drives the sans-IO protocol of `longhaul-proto`
//! over real sockets, threads and disks. Its modules, from the bottom up
//! (a module uses only those on its floor or below; `docs/ARCHITECTURE.md`
//! draws them, `crates/proto/tests/layering.rs` keeps them so):
//!
//! 0. [`report`] (the [`report::Reporter`] trait through which the engine
//!    reports), [`state`] (the state directory and the environment that
//!    names it), [`process`] (processes this program owns, and the one
//!    lookup of a program on PATH), [`ssh`] (the user's ssh, as every part
//!    runs it), and this file: errors and constants.
//! 1. [`net`]: connections, TLS, socket tuning, every client's dialing;
//!    [`wan`]: the emulated WAN; [`pathdb`]: path rates `doctor` remembered.
//! 2. [`perf`]: memory-to-memory tests; [`xfer`]: file transfers.
//! 3. [`bench`](mod@bench): benchmarks of this host's storage.
//! 4. [`doctor`]: measures every stage of a transfer and names the limit.
//! 5. [`server`]: `longhaul serve`, which serves all of the above;
//!    [`results`]: the reporter of each command's result
//!    ([`results::CommandReporter`], which extends [`report::Reporter`]).
//! 6. [`reach`]: a far end over ssh (`HOST:path`): the one-shot server
//!    started there, the build copied there, connections opened back.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod bench;
pub mod doctor;
pub mod end;
pub mod net;
pub mod pathdb;
pub mod perf;
pub mod process;
pub mod reach;
pub mod report;
pub mod results;
pub mod server;
pub mod ssh;
pub mod stages;
pub mod state;
pub mod wan;
pub mod xfer;

use longhaul_proto::msg::RefuseCode;
use longhaul_proto::session::SessionError;
use longhaul_proto::ProtoError;

/// Default TCP (and UDP) port of `longhaul serve`.
pub const DEFAULT_PORT: u16 = 5310;

/// How often a control loop looks at its streams while a test runs (data
/// attached, workers finished) when no message or sample is due sooner.
pub const CONTROL_TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// What this build calls itself on the wire.
pub fn software() -> String {
    format!("longhaul {}", env!("CARGO_PKG_VERSION"))
}

/// Everything that can go wrong in the engine, grouped by what the user
/// should do about it (the CLI maps these to exit codes).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad local parameters.
    #[error("{0}")]
    Usage(String),
    /// The server could not be reached.
    #[error("{0}")]
    Connect(String),
    /// The server said no (its words escaped: they may hold anything).
    #[error("server refused: {}", longhaul_proto::units::escaped(.message))]
    Refused { code: RefuseCode, message: String },
    /// A test or transfer started but did not complete (the message says what).
    #[error("{0}")]
    Failed(String),
    #[error("timed out during {0}")]
    Timeout(String),
    #[error("connection closed by {0}")]
    Closed(String),
    /// The user asked to stop (Ctrl-C); what is done so far is kept.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// The server's identity could not be verified (unknown, changed, not
    /// TLS): nothing was sent.
    #[error("{0}")]
    Trust(String),
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    pub fn io(context: String, source: std::io::Error) -> Self {
        EngineError::Io { context, source }
    }
}

impl From<SessionError> for EngineError {
    fn from(e: SessionError) -> Self {
        match e.code {
            RefuseCode::Timeout => EngineError::Timeout(e.message),
            code => EngineError::Refused {
                code,
                message: e.message,
            },
        }
    }
}
