//! `HOST:path` over ssh, as the commands use it: the engine's far ends
//! ([`longhaul_engine::reach`]: the one-shot server started over the
//! user's ssh, the build copied there, connections opened back) with the
//! command line's `--rsh`, `--remote-path`, `--copy-binary` and
//! `--connect-back`, their failures as the command's; and `serve
//! --one-shot`, the far end's own side.
//!
//! Addressing (docs/GUIDE.md "Addressing"): `[USER@]HOST:path` without a port is
//! ssh; a server is `longhaul://HOST[:PORT]/EXPORT/path` or
//! `HOST:PORT:EXPORT/path`. A path on the far host is as scp's: relative to
//! the home directory unless it starts with `/`.

use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::{self, Explained, SshOptions};
use longhaul_engine::server::oneshot::{self, Admits, OneShotConfig};
use longhaul_engine::xfer::Export;

pub use longhaul_engine::reach::{FarEnd, HOME_EXPORT, ROOT_EXPORT};

use super::{usage, Failure, Outcome};
use crate::args::{ServeArgs, SshArgs};
use crate::exit;

impl SshArgs {
    /// The engine's options for far ends over ssh.
    pub fn options(&self) -> SshOptions {
        SshOptions {
            rsh: self.rsh.clone(),
            remote_path: self.remote_path.clone(),
            copy_binary: self.copy_binary.clone(),
            connect_back: self.connect_back.clone(),
            unattended: false,
        }
    }
}

impl From<Explained> for Failure {
    fn from(x: Explained) -> Self {
        Failure {
            code: Failure::from(x.error).code,
            message: x.message,
        }
    }
}

/// [`reach::reach_host`] with the command line's ssh options.
pub fn reach_host(
    hosts: &mut [String],
    client: &mut ClientOptions,
    ssh: &SshArgs,
) -> Result<Option<FarEnd>, Failure> {
    Ok(reach::reach_host(hosts, client, &ssh.options())?)
}

/// A failure of the client against the far end, in the user's words
/// ([`FarEnd::explain`]).
pub fn explain(far: &FarEnd, e: longhaul_engine::EngineError) -> Failure {
    far.explain(e).into()
}

/// `longhaul serve --one-shot`: the far end `reach` starts over ssh. It
/// listens on the address the client's ssh reached (`SSH_CONNECTION`),
/// serves the account's home and `/`, and ends when its standard input
/// closes, its last session ends (one, or `--sessions N`), no client
/// came, or (`--sessions open`) its client was silent too long.
pub fn serve_one_shot(a: ServeArgs) -> Outcome {
    let admits = a.sessions.unwrap_or(Admits::Sessions(1));
    if let Admits::Sessions(n) = admits {
        if !(1..=oneshot::SESSIONS_MAX).contains(&n) {
            return Err(usage(format!(
                "serve --one-shot --sessions {n}: from 1 to {}, or `open`",
                oneshot::SESSIONS_MAX
            )));
        }
    }
    let listen = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_whitespace().nth(2).map(str::to_string))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .ok_or_else(|| {
            usage("serve --one-shot is started by `longhaul cp HOST:path` over ssh (SSH_CONNECTION is not set)")
        })?;
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .and_then(|h| std::fs::canonicalize(h).ok())
        .ok_or_else(|| usage("serve --one-shot: HOME is not set or does not exist"))?;
    let export = |name: &str, root: std::path::PathBuf| Export {
        name: name.to_string(),
        root,
        read_only: false,
        public: false,
    };
    let client = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_whitespace().next().map(str::to_string))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
    let cfg = OneShotConfig {
        client,
        listen,
        exports: vec![export(HOME_EXPORT, home), export(ROOT_EXPORT, "/".into())],
        // Paths read as the user wrote them after `HOST:` (scp's way).
        shown_roots: vec![
            (HOME_EXPORT.to_string(), "~".into()),
            (ROOT_EXPORT.to_string(), "/".into()),
        ],
        claim_wait: oneshot::CLAIM_WAIT,
        admits,
        idle: oneshot::OPEN_IDLE,
    };
    let mut out = std::io::stdout().lock();
    let end = oneshot::run(cfg, std::io::stdin(), &mut out)?;
    Ok(match end {
        oneshot::End::NoClient | oneshot::End::Idle => exit::CONNECT,
        _ => exit::OK,
    })
}
