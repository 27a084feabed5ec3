//! Reaching a host over ssh, with no longhaul server there (as scp, rsync
//! and bbcp do): `HOST:path` names a path on a host the user can ssh to.
//!
//! The client runs the user's own ssh ([`crate::ssh::Ssh`]) to start a
//! one-shot server under their account on the far host (`longhaul serve
//! --one-shot`, [`crate::server::oneshot`]). That server listens on an
//! ephemeral port of the address ssh reached, and sends back over the ssh
//! channel one line: its port, its fresh certificate's fingerprint and a
//! one-time secret. The client then connects with its ordinary TLS client,
//! pinning that fingerprint and presenting that secret, and the ordinary
//! transfer runs; the data never passes through ssh. The ssh channel
//! stays open while the transfer runs: when it closes (the client is done
//! or gone), the far end exits.
//!
//! A far end that can only connect out (its firewall drops new
//! connections to it, a common DTN policy) is reached the other way: when
//! the direct connection to its port is refused or unanswered within a few
//! seconds, or with `--connect-back`, this side listens and the far end,
//! asked over the ssh channel, opens every connection ([`crate::net::back`]);
//! the report says so.
//!
//! Where longhaul is missing on the far host, `--copy-binary` copies a
//! build that runs there ([`portable`] tells which). Errors say what ssh
//! said ([`crate::ssh::as_said`]) and what to do; [`FarEnd::explain`] words
//! a failure of the transfer against the far end.
//!
//! A path on the far host is as scp's: relative to the home directory
//! unless it starts with `/` ([`export_path`]).

mod end;
mod far;
pub mod portable;
mod start;

use std::path::PathBuf;

use crate::net::dial::ClientOptions;
use crate::server::oneshot::Admits;
use crate::ssh::Target;
use crate::EngineError;

pub use crate::end::{is_third_party, End};
pub use end::reach_ends;
pub use far::{explain_third_party, AsWritten, Explained, Exported, FarEnd};
pub use start::start;

/// The far end's export of the remote home directory (relative paths).
pub const HOME_EXPORT: &str = "home";
/// The far end's export of `/` (absolute paths).
pub const ROOT_EXPORT: &str = "root";

/// How to reach far ends over ssh (the command line's "Over ssh" options).
#[derive(Clone, Debug, Default)]
pub struct SshOptions {
    /// The command that runs ssh, with its options (default: `ssh`).
    pub rsh: Option<String>,
    /// The longhaul program on the far host (default: `longhaul` on its PATH).
    pub remote_path: Option<String>,
    /// Where longhaul is missing on the far host, copy a build that runs
    /// there: `Some(None)` this binary or the portable build beside it,
    /// `Some(Some(path))` that one.
    pub copy_binary: Option<Option<PathBuf>>,
    /// Have the far end connect back: `Some("")` always, to the address its
    /// ssh saw this client come from; `Some("ADDR[:PORT]")` to that.
    pub connect_back: Option<String>,
    /// Nobody answers ssh's prompts (a job, a fleet's rank): ssh runs with
    /// `BatchMode=yes` ([`crate::ssh::Ssh::unattended`]).
    pub unattended: bool,
}

/// The export and the path in it that a far path names: relative (and
/// `~/...`) in the home directory, absolute from `/`.
pub fn export_path(path: &str) -> Result<(&'static str, String), String> {
    if let Some(abs) = path.strip_prefix('/') {
        return Ok((ROOT_EXPORT, abs.to_string()));
    }
    if path == "~" {
        return Ok((HOME_EXPORT, String::new()));
    }
    if let Some(rel) = path.strip_prefix("~/") {
        return Ok((HOME_EXPORT, rel.to_string()));
    }
    if path.starts_with('~') {
        return Err(format!(
            "'{path}': another user's home (~USER) is not supported over ssh; give the absolute path"
        ));
    }
    Ok((HOME_EXPORT, path.to_string()))
}

/// `perf [USER@]HOST:`: a host named with an empty ssh path (nothing else
/// a perf target can be) is reached over ssh; its argument becomes the
/// one-shot server's `ADDR:PORT`, and `client` trusts and proves itself as
/// in [`reach_ends`]. One host only: a third-party test over ssh is not built.
pub fn reach_host(
    hosts: &mut [String],
    client: &mut ClientOptions,
    ssh: &SshOptions,
) -> Result<Option<FarEnd>, EngineError> {
    let is_ssh = |h: &String| Target::parse(h).is_some_and(|t| t.path.is_empty());
    let Some(at) = hosts.iter().position(is_ssh) else {
        return Ok(None);
    };
    if hosts.len() > 1 {
        return Err(EngineError::Usage(
            "a third-party test with a host over ssh (HOST:) is not supported yet: test one host at a time".into(),
        ));
    }
    let dest = Target::parse(&hosts[at])
        .map(|t| t.dest)
        .unwrap_or_default();
    let (far, _) = FarEnd::open_for(ssh, &dest, Admits::Sessions(1), &[])?;
    hosts[at] = far.server();
    client.security = far.security();
    Ok(Some(far))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_in_the_home_and_absolute_ones_from_the_root() {
        assert_eq!(export_path("a/b").unwrap(), (HOME_EXPORT, "a/b".into()));
        assert_eq!(export_path("").unwrap(), (HOME_EXPORT, String::new()));
        assert_eq!(export_path("~/a").unwrap(), (HOME_EXPORT, "a".into()));
        assert_eq!(
            export_path("/tmp/x/").unwrap(),
            (ROOT_EXPORT, "tmp/x/".into())
        );
        assert!(export_path("~bob/x").is_err());
    }
}
