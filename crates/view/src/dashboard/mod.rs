//! `longhaul dashboard`: a web page of the live runs, the history, each
//! run's graphs and the doctor's verdicts over time, read from the archive.
//!
//! - [`server`]: the axum routes, the token check, binding and the runtime.
//! - [`api`]: the JSON the page reads (history, a run, doctor verdicts,
//!   the matrix and each cell's history).
//! - [`live`]: the poller that reads the running runs from the archive and
//!   the Server-Sent Events that push them to the page.
//!
//! The page itself (`assets/dashboard/`: HTML, hand-written JS drawing SVG,
//! CSS) is embedded in the binary; nothing is fetched from elsewhere.

pub mod api;
pub mod live;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use server::{serve_dashboard, Dashboard};

/// What every handler shares.
pub struct AppState {
    pub archive_path: PathBuf,
    /// None only with `--open`.
    token: Option<String>,
    cookie: String,
    /// The names an open dashboard answers to.
    hosts: crate::http::Hosts,
    /// HTTPS: the cookie is `Secure`.
    secure: bool,
    pub live: live::LiveFeed,
}

/// The address the dashboard listens on unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5380";

/// Connections the dashboard serves at once (a page holds its event
/// stream and a few requests); more wait until one closes.
pub const MAX_CONNECTIONS: usize = 64;

/// What `longhaul dashboard` was asked for.
#[derive(Debug, Clone)]
pub struct DashboardOptions {
    pub listen: SocketAddr,
    /// The archive to read (it need not exist yet).
    pub archive_path: PathBuf,
    /// The token every request must carry (`--token-file`). Without one,
    /// a random one is made and given once in the URL
    /// ([`Dashboard::url`]), unless `open`.
    pub token: Option<String>,
    /// No token at all (`--open`, loopback only): every account on this
    /// host reads the archive.
    pub open: bool,
    /// Serve HTTPS with this configuration ([`tls::config`]).
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Connections at once, header and handshake time limits.
    pub limits: crate::http::Limits,
}

impl DashboardOptions {
    /// The defaults: a token made at random, plain HTTP, the usual limits.
    pub fn new(listen: SocketAddr, archive_path: PathBuf) -> DashboardOptions {
        DashboardOptions {
            listen,
            archive_path,
            token: None,
            open: false,
            tls: None,
            limits: crate::http::Limits::new(MAX_CONNECTIONS),
        }
    }
}

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("dashboard: --listen {0} is not a loopback address, and without a token anyone who reaches it reads every run; give --token-file FILE (and put the dashboard behind TLS), or listen on 127.0.0.1 (--open is for loopback only)")]
    OpenOffLoopback(SocketAddr),
    #[error(
        "dashboard: --open serves without a token, yet --token-file gives one; choose one of them"
    )]
    OpenWithToken,
    #[error("dashboard: the token file holds no token (an empty token lets anyone in)")]
    EmptyToken,
    #[error("dashboard: {0}")]
    Bind(String),
    #[error("dashboard: {0}")]
    Runtime(String),
}

/// Refuses what would serve the archive to anyone: a non-loopback address
/// without a token, `--open` with a token, or an empty token.
pub fn check_options(o: &DashboardOptions) -> Result<(), DashboardError> {
    if let Some(t) = &o.token {
        if t.trim().is_empty() {
            return Err(DashboardError::EmptyToken);
        }
        if o.open {
            return Err(DashboardError::OpenWithToken);
        }
    }
    if !o.listen.ip().is_loopback() && o.token.is_none() {
        return Err(DashboardError::OpenOffLoopback(o.listen));
    }
    Ok(())
}

/// A new random token: 32 bytes from the OS, in hex.
pub fn random_token() -> Result<String, DashboardError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| DashboardError::Runtime(format!("no random token: {e}")))?;
    Ok(longhaul_proto::units::hex(&b))
}

/// Compares a presented token with the right one in time that does not
/// depend on where they differ: their BLAKE3 hashes, which compare in
/// constant time (as the protocol's proofs do), not a loop of our own.
pub fn token_matches(presented: &[u8], right: &[u8]) -> bool {
    blake3::hash(presented) == blake3::hash(right)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(listen: &str, token: Option<&str>) -> DashboardOptions {
        DashboardOptions {
            token: token.map(str::to_string),
            ..DashboardOptions::new(
                listen.parse().unwrap(),
                PathBuf::from("/nonexistent/archive.db"),
            )
        }
    }

    #[test]
    fn loopback_needs_no_token_file_elsewhere_does() {
        assert!(check_options(&opts("127.0.0.1:5380", None)).is_ok());
        assert!(check_options(&opts("[::1]:5380", None)).is_ok());
        let e = check_options(&opts("0.0.0.0:5380", None)).unwrap_err();
        assert!(matches!(e, DashboardError::OpenOffLoopback(_)));
        assert!(e.to_string().contains("--token-file"), "{e}");
        assert!(check_options(&opts("192.0.2.1:5380", None)).is_err());
        assert!(check_options(&opts("[::]:5380", None)).is_err());
        assert!(check_options(&opts("0.0.0.0:5380", Some("s3cret"))).is_ok());
        assert!(matches!(
            check_options(&opts("127.0.0.1:1", Some("  "))),
            Err(DashboardError::EmptyToken)
        ));
        let open = |listen: &str, token: Option<&str>| DashboardOptions {
            open: true,
            ..opts(listen, token)
        };
        assert!(check_options(&open("127.0.0.1:5380", None)).is_ok());
        assert!(matches!(
            check_options(&open("0.0.0.0:5380", None)),
            Err(DashboardError::OpenOffLoopback(_))
        ));
        assert!(matches!(
            check_options(&open("127.0.0.1:5380", Some("t"))),
            Err(DashboardError::OpenWithToken)
        ));
    }

    #[test]
    fn random_tokens_are_long_and_differ() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"abcd", b"abc"));
        assert!(!token_matches(b"", b"abc"));
        assert!(!token_matches(b"abc\0", b"abc"));
    }
}
