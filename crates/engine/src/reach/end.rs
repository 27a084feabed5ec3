//! The ends over ssh put on the far end started for them
//! ([`reach_ends`]); the ends themselves are [`crate::end::End`].

use longhaul_proto::xfer::Remote;

use crate::end::End;
use crate::net::dial::ClientOptions;
use crate::server::oneshot::Admits;
use crate::EngineError;

use super::{FarEnd, SshOptions};

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
    use crate::end::is_third_party;

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
