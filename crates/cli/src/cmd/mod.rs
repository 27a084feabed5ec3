//! The commands, one file per family. Each returns the exit code of a
//! success or the [`Failure`] that `main` prints once.

mod archive;
mod cp;
#[cfg(feature = "dashboard")]
mod dashboard;
mod doctor;
mod fleet;
mod jobs;
mod manual;
mod matrix;
mod perf;
mod plan;
#[cfg(feature = "plot")]
mod plot;
pub mod remote;
mod serve;
mod wan;

pub use archive::{history, show, where_};
pub use cp::{cp, ls};
#[cfg(feature = "dashboard")]
pub use dashboard::dashboard;
pub use doctor::{bench_disk, doctor};
pub use jobs::{jobs, submit};
pub use manual::{completions, man};
pub use matrix::matrix;
pub use perf::{demo, perf};
#[cfg(feature = "plot")]
pub use plot::plot;
pub use serve::{id, serve, token, trust};
pub use wan::wan;

/// `longhaul dashboard` in a build without it.
#[cfg(not(feature = "dashboard"))]
pub fn dashboard(_: crate::args::DashboardArgs, _: &ArchiveArgs) -> Outcome {
    Err(left_out("dashboard", "dashboard"))
}

/// `longhaul plot` in a build without it.
#[cfg(not(feature = "plot"))]
pub fn plot(_: crate::args::PlotArgs, _: &ArchiveArgs) -> Outcome {
    Err(left_out("plot", "plot"))
}

/// What a command (or option) left out of this build says: which Cargo
/// feature it needs. A usage error: the command line asks for what this
/// binary cannot do.
#[cfg_attr(
    all(feature = "dashboard", feature = "plot", feature = "metrics"),
    allow(dead_code)
)]
fn left_out(what: &str, feature: &str) -> Failure {
    usage(format!(
        "{what}: this longhaul was built without it (a data node's build); it needs the Cargo feature `{feature}`, in the default build (cargo build --release, or --features {feature})"
    ))
}

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use longhaul_engine::net::dial::Security;
use longhaul_engine::net::tls::TrustOptions;
use longhaul_engine::results::CommandReporter;
use longhaul_engine::EngineError;

use longhaul_archive::reporter::ArchiveReporter;

use crate::args::{ArchiveArgs, SecurityArgs};
use crate::exit;
use crate::print::Printer;

/// What a command ends with: the exit code of a success (0, or 6 when
/// some files failed, 130 when interrupted), or the failure to print.
pub type Outcome = Result<i32, Failure>;

/// A failure with the exit code it maps to.
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::Usage(_) => exit::USAGE,
            EngineError::Connect(_) => exit::CONNECT,
            EngineError::Refused { .. } => exit::REFUSED,
            EngineError::Trust(_) => exit::UNTRUSTED,
            EngineError::Timeout(_) | EngineError::Failed(_) | EngineError::Closed(_) => {
                exit::FAILED
            }
            EngineError::Proto(_) => exit::FAILED,
            EngineError::Io { .. } => exit::FAILED,
            EngineError::Interrupted(_) => exit::INTERRUPTED,
        };
        Failure {
            code,
            message: format!("{e:#}"),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Failure {
    /// A failure of this program itself (exit code 1).
    pub fn internal(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::INTERNAL,
            message: message.into(),
        }
    }
}

/// Worth another attempt for a command that has done nothing yet (perf,
/// ls, doctor): the server could not be reached (its name did not
/// resolve, or no connection opened). A peer that answered, and is no
/// longhaul server (or iperf3 server) or failed the TLS handshake, is not
/// retried.
pub fn unreachable(e: &EngineError) -> bool {
    match e {
        EngineError::Connect(m) => {
            m.starts_with("cannot connect") || m.starts_with("cannot resolve")
        }
        _ => false,
    }
}

/// A failure of the command line (exit code 2).
pub fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::USAGE,
        message: message.into(),
    }
}

impl SecurityArgs {
    /// Whom to trust and which identity to present.
    fn trust_options(&self) -> Result<TrustOptions, Failure> {
        // An identity to present must exist: a new key made here would be
        // one no server has a grant for.
        let identity = match &self.identity {
            Some(dir) => {
                let file = dir.join(longhaul_engine::net::tls::IDENTITY_FILE);
                if !file.is_file() {
                    return Err(usage(format!(
                        "--identity {d}: no identity there ({f} is missing); make one with `longhaul id {d}` and have the server grant its fingerprint (`longhaul token create --client-cert`)",
                        d = dir.display(),
                        f = file.display()
                    )));
                }
                Some(
                    longhaul_engine::net::tls::Identity::load(&file, &file)
                        .map_err(Failure::from)?,
                )
            }
            None => None,
        };
        Ok(TrustOptions {
            pins: self.trust.clone(),
            known_hosts: self
                .known_hosts
                .clone()
                .or_else(longhaul_engine::state::default_known_hosts),
            ca: self.ca.clone(),
            identity,
            accept_any: false,
        })
    }

    /// How to secure a client's connections: the trust options and the
    /// tokens (one for any server, and one each for servers named with
    /// `--token-file HOST[:PORT]=FILE`).
    pub fn security(&self) -> Result<Security, Failure> {
        let read = |p: &str| {
            longhaul_engine::state::read_credential(std::path::Path::new(p))
                .map(|t| t.trim().to_string())
                .map_err(|e| usage(format!("cannot read the token file {p}: {e}")))
        };
        let (mut token, mut tokens) = (None, Vec::new());
        for given in &self.token_file {
            match token_file_host(given) {
                Some((host, file)) => tokens.push(longhaul_engine::net::dial::HostToken {
                    host: host.to_string(),
                    token: read(file)?,
                }),
                None if token.is_none() => token = Some(read(given)?),
                None => {
                    return Err(usage(format!(
                        "--token-file {given}: a second token for any server; name the server each is for, --token-file HOST[:PORT]=FILE"
                    )))
                }
            }
        }
        if token.is_none() {
            token = std::env::var("LONGHAUL_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty());
        }
        Ok(Security {
            plaintext: self.insecure_plaintext,
            trust: self.trust_options()?,
            token,
            tokens,
        })
    }
}

/// `HOST[:PORT]=FILE` of `--token-file`, split; None for a plain FILE
/// (no `=`, or a `/` before it: a path; name a file whose name has a `=`
/// as `./NAME`).
fn token_file_host(given: &str) -> Option<(&str, &str)> {
    given
        .split_once('=')
        .filter(|(host, file)| !host.is_empty() && !host.contains('/') && !file.is_empty())
}

/// Set by the first Ctrl-C (the command ends its work and reports what
/// it did); a second one ends the process at once.
pub fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            crate::leave(exit::INTERRUPTED);
        }
    });
    flag
}

/// The directory given, else the default one; an error, not a shared
/// fallback such as /tmp, when HOME is unset.
pub fn state_dir_or_default(d: Option<PathBuf>) -> Result<PathBuf, EngineError> {
    d.map_or_else(longhaul_engine::state::state_dir_from_env, Ok)
}

/// Tells `printer` how the command ended (a `--json` printer writes its
/// document then) and hands the outcome on, for `main` to print a failure.
pub fn ended(printer: &mut dyn CommandReporter, outcome: Outcome) -> Outcome {
    if let Ok(&code) = outcome.as_ref() {
        if code != 0 {
            printer.exit_code(code);
        }
    }
    printer.end(outcome.as_ref().err().map(|f| (f.message.as_str(), f.code)));
    outcome
}

/// The printer, with this run archived beside it unless `--no-archive`.
/// An archive that cannot be opened (damaged, from a newer longhaul, no
/// room) is said once on stderr and the command runs unarchived: moving
/// the data matters more than remembering it.
pub fn archived(
    args: &ArchiveArgs,
    run: longhaul_archive::model::NewRun,
    printer: Printer,
) -> Printer {
    with_archive(printer, archive_reporter(args, &run))
}

/// The archive file a run goes into: none with `--no-archive`.
pub fn archive_file(args: &ArchiveArgs) -> Option<std::path::PathBuf> {
    if args.no_archive {
        return None;
    }
    args.archive.clone().or_else(longhaul_archive::default_path)
}

/// The reporter that archives `run`, unless `--no-archive` or the archive
/// cannot be opened (said on stderr).
pub fn archive_reporter(
    args: &ArchiveArgs,
    run: &longhaul_archive::model::NewRun,
) -> Option<ArchiveReporter> {
    let path = archive_file(args)?;
    ArchiveReporter::start(&path, run)
        .map_err(|e| crate::errln!("longhaul: warning: not archiving this run: {e}"))
        .ok()
}

/// `printer`, with `archive` beside it when there is one.
pub fn with_archive(printer: Printer, archive: Option<ArchiveReporter>) -> Printer {
    match archive {
        Some(a) => Box::new(crate::print::archived::Archived::new(printer, a)),
        None => printer,
    }
}

/// The command line as a run records it: credentials removed
/// ([`longhaul_archive::scrub`]).
pub fn command_line() -> String {
    longhaul_archive::scrub::command_line(&std::env::args().collect::<Vec<_>>())
}
