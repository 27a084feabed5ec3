//! One end of a copy or a listing as the user named it, read once: a
//! local path, a path on a longhaul server, or a path on a host over ssh
//! ([`End::read`]); and the ends over ssh put on the far end started for
//! them ([`reach_ends`]).

use longhaul_proto::xfer::{parse_remote, Remote};

use crate::net::dial::ClientOptions;
use crate::server::oneshot::Admits;
use crate::ssh::Target;
use crate::EngineError;

use super::{FarEnd, SshOptions};

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

/// If any of `ends` is over ssh: checks they all name one host and no
/// server beside it, starts the far end there (its secret admits `admits`
/// control sessions, see [`FarEnd::open_for`]) and turns each of them into
/// its path on the far end's one-shot server, and sets the trust and
/// credential of `client` to the far end's. Returns the far end to finish
/// when the command is done.
pub fn reach_ends(
    ends: &mut [End],
    client: &mut ClientOptions,
    ssh: &SshOptions,
    admits: Admits,
) -> Result<Option<FarEnd>, EngineError> {
    let Some(first) = ends.iter().find_map(End::ssh).cloned() else {
        return Ok(None);
    };
    if ends
        .iter()
        .filter_map(End::ssh)
        .any(|t| t.dest != first.dest)
    {
        return Err(EngineError::Usage(
            "all sources over ssh must be on one host (a copy goes from one end to another)".into(),
        ));
    }
    if let Some(server) = ends.iter().find(|e| e.server().is_some()) {
        return Err(EngineError::Usage(format!(
            "'{}' names a longhaul server, and '{}:{}' a host over ssh: name the sources on one end (a copy goes from one end to another)",
            server.arg(),
            first.dest,
            first.path
        )));
    }
    let paths: Vec<Option<&str>> = ends
        .iter()
        .map(|e| e.ssh().map(|t| t.path.as_str()))
        .collect();
    let (far, urls) = FarEnd::open_for(ssh, &first.dest, admits, &paths)?;
    let server = far.server();
    for (end, url) in ends.iter_mut().zip(urls) {
        if let Some((url, (export, path))) = url {
            *end = End::Server {
                arg: url,
                at: Remote {
                    host: server.clone(),
                    export: export.to_string(),
                    path: path.trim_end_matches('/').to_string(),
                    dir: path.is_empty() || path.ends_with('/'),
                },
            };
        }
    }
    client.security = far.security();
    Ok(Some(far))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_is_read_once_as_local_server_or_ssh() {
        assert!(matches!(End::read("/tmp/x"), End::Local(_)));
        assert!(matches!(End::read("./a:b"), End::Local(_)));
        assert!(matches!(End::read("dtn1:data/x"), End::Ssh { .. }));
        let e = End::read("dtn1:5310:data/x/");
        let r = e.server().unwrap();
        assert_eq!(
            (r.host.as_str(), r.export.as_str(), r.path.as_str(), r.dir),
            ("dtn1:5310", "data", "x", true)
        );
        assert!(End::read("longhaul://dtn1/data").server().is_some());
        assert!(End::read_server("dtn1:data/x").server().is_some());
        let (a, b) = (End::read("a:x"), End::read("/here"));
        assert!(is_third_party(std::slice::from_ref(&a), &a));
        assert!(!is_third_party(std::slice::from_ref(&b), &a));
        assert!(!is_third_party(&[], &a));
    }
}
