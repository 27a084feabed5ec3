//! One end of a copy or a listing as the user named it, read once: a
//! local path, a path on a longhaul server, or a path on a host over ssh
//! ([`End::read`]). A leaf below xfer, server and doctor, which hand ends
//! on; [`crate::reach`] puts the ends over ssh on a far end.

use longhaul_proto::xfer::{parse_remote, Remote};

use crate::ssh::Target;

/// One end, as the user wrote it (`arg`) and what it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A path on this host.
    Local(String),
    /// A path on a longhaul server: `longhaul://HOST[:PORT]/EXPORT/path`,
    /// `HOST:PORT:EXPORT/path`, or (where an ssh path is not meant: a
    /// fleet's `--servers`) `HOST:EXPORT/path`.
    Server { arg: String, at: Remote },
    /// A path on a host reached over ssh: `[USER@]HOST:path`.
    Ssh { arg: String, at: Target },
}

impl End {
    /// Reads `arg`: ssh's `[USER@]HOST:path` (no port after the host, no
    /// scheme), else a server's, else a local path (no `:` before its
    /// first `/`, as scp and rsync read it).
    pub fn read(arg: &str) -> End {
        if let Some(at) = Target::parse(arg) {
            return End::Ssh {
                arg: arg.to_string(),
                at,
            };
        }
        End::read_server(arg)
    }

    /// Reads `arg` as a server's path (`HOST:EXPORT/path` too), else a
    /// local one: never ssh.
    pub fn read_server(arg: &str) -> End {
        match parse_remote(arg) {
            Some(at) => End::Server {
                arg: arg.to_string(),
                at,
            },
            None => End::Local(arg.to_string()),
        }
    }

    /// A path on this host.
    pub fn local(path: impl Into<String>) -> End {
        End::Local(path.into())
    }

    /// `at` on its server, named `longhaul://HOST/EXPORT/path` (with the
    /// trailing `/` of a directory below the export's root).
    pub fn on_server(at: Remote) -> End {
        let slash = if at.dir && !at.path.is_empty() {
            "/"
        } else {
            ""
        };
        End::Server {
            arg: format!("longhaul://{}/{}/{}{slash}", at.host, at.export, at.path),
            at,
        }
    }

    /// As the user wrote it (or, once reached, its server's address).
    pub fn arg(&self) -> &str {
        match self {
            End::Local(a) | End::Server { arg: a, .. } | End::Ssh { arg: a, .. } => a,
        }
    }

    /// Named with a trailing `/`: as a source, its contents (rsync's
    /// `SRC/`); as a destination, a directory.
    pub fn slashed(&self) -> bool {
        self.arg().ends_with('/')
    }

    /// A server's or an ssh host's: not on this host.
    pub fn is_remote(&self) -> bool {
        !matches!(self, End::Local(_))
    }

    /// Its ssh host and path, if over ssh.
    pub fn ssh(&self) -> Option<&Target> {
        match self {
            End::Ssh { at, .. } => Some(at),
            _ => None,
        }
    }

    /// Its server, export and path, if on a server.
    pub fn server(&self) -> Option<&Remote> {
        match self {
            End::Server { at, .. } => Some(at),
            _ => None,
        }
    }
}

/// Whether ends copy between two remote ends (servers, or hosts over ssh):
/// every source remote, and the destination too.
pub fn is_third_party(sources: &[End], dest: &End) -> bool {
    dest.is_remote() && !sources.is_empty() && sources.iter().all(End::is_remote)
}
