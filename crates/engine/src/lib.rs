//! The longhaul engine: drives the sans-IO protocol of `longhaul-proto`
//! over real sockets. It holds the server ([`server`]), the perf client
//! ([`client`]), the stream workers ([`stream`]), socket tuning and kernel
//! counters ([`sock`]), and the [`report::Reporter`] trait through which every
//! command reports.

pub mod auth;
pub mod client;
pub mod conn;
pub mod disk;
pub mod doctor;
pub mod paths;
pub mod proof;
pub mod report;
pub mod run;
pub mod server;
pub mod sock;
pub mod stream;
pub mod tls;
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
    /// The server said no.
    #[error("server refused: {message}")]
    Refused { code: RefuseCode, message: String },
    /// The test started but did not complete.
    #[error("test failed: {0}")]
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
