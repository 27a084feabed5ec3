//! What a `cp` is: which side is remote (a push or a pull), where a
//! pull lands, the request sent for it, and how the catalogue names what
//! landed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul_proto::xfer::*;

use super::super::beneath::Anchor;
use super::super::Landed;
use super::CpOptions;
use crate::end::End;
use crate::EngineError;

pub(super) enum Plan {
    Push {
        host: String,
        export: String,
        dest: String,
        /// Named with a trailing `/`.
        dest_dir: bool,
        roots: Vec<PathBuf>,
    },
    Pull {
        host: String,
        export: String,
        sources: Vec<String>,
        dest: PathBuf,
    },
}

impl Plan {
    /// The server's host.
    pub(super) fn host(&self) -> &str {
        match self {
            Plan::Push { host, .. } | Plan::Pull { host, .. } => host,
        }
    }
}

/// Which way the data goes, from the names given: a remote destination
/// is a push of local sources; remote sources (all on one server and
/// export) are a pull to a local destination.
pub(super) fn plan(o: &CpOptions) -> Result<Plan, EngineError> {
    let slashed = o.sources.iter().filter(|s| s.slashed()).count();
    if slashed > 0 && slashed < o.sources.len() {
        return Err(EngineError::Usage(
            "name every source with a trailing '/' (copy their contents) or none (copy them by name), not a mix".into(),
        ));
    }
    if let Some(e) = o
        .sources
        .iter()
        .chain([&o.dest])
        .find(|e| e.ssh().is_some())
    {
        return Err(super::unreached(e));
    }
    match &o.dest {
        End::Server { at: d, .. } => {
            if o.sources.iter().any(End::is_remote) {
                return Err(EngineError::Usage(
                    "remote-to-remote copies are not supported yet: copy to a local directory first".into(),
                ));
            }
            Ok(Plan::Push {
                host: d.host.clone(),
                export: d.export.clone(),
                dest: d.path.clone(),
                dest_dir: d.dir,
                roots: o.sources.iter().map(|s| PathBuf::from(s.arg())).collect(),
            })
        }
        _ if o.share.is_some() => Err(EngineError::Usage(
            "a fleet pushes: name a local source and a remote destination (longhaul://HOST[:PORT]/EXPORT/path)"
                .into(),
        )),
        _ => {
            let rs: Vec<&Remote> = o.sources.iter().filter_map(End::server).collect();
            if rs.is_empty() || rs.len() != o.sources.len() {
                return Err(EngineError::Usage(
                    "neither side is remote: name the far side as [USER@]HOST:path (a host over ssh) or longhaul://HOST[:PORT]/EXPORT/path (a longhaul server)".into(),
                ));
            }
            let (host, export) = (rs[0].host.clone(), rs[0].export.clone());
            if rs.iter().any(|r| r.host != host || r.export != export) {
                return Err(EngineError::Usage(
                    "all remote sources must be on one server and export".into(),
                ));
            }
            Ok(Plan::Pull {
                host,
                export,
                sources: rs.into_iter().map(|r| r.path.clone()).collect(),
                dest: PathBuf::from(o.dest.arg()),
            })
        }
    }
}

/// The request for `plan`, `streams` data streams tuned by `tuning`.
pub(super) fn transfer_request(
    o: &CpOptions,
    plan: &Plan,
    streams: u16,
    tuning: &StreamTuning,
) -> TransferRequest {
    let mut req = TransferRequest {
        op: Op::Push,
        export: String::new(),
        dest: String::new(),
        sources: Vec::new(),
        source_count: o.sources.len() as u32,
        recursive: o.recursive,
        preserve: o.preserve,
        streams,
        chunk_size: o.chunk_size,
        force: o.force,
        sync: o.sync.clone(),
        dry_run: o.dry_run,
        verify: o.verify,
        contents: o.contents(),
        dest_dir: false,
        mkpath: o.mkpath,
        direct: o.direct,
        tuning: tuning.clone(),
        // Used only once the server agrees (`TransferAccept::bundles`).
        bundles: true,
        parts: o.share.is_some(),
        sealed: super::super::sealed_frames(),
        source_dir: false,
        filter: o.filter.clone(),
        compress: o.compress,
        // This client's source and sink both take `FileDone::full`.
        defer_full: true,
        // Used only once the server agrees, on TLS data streams.
        tag_checks: super::super::tag_checks(),
    };
    match plan {
        Plan::Push {
            export,
            dest,
            dest_dir,
            roots,
            ..
        } => {
            req.export = export.clone();
            req.dest = dest.clone();
            req.dest_dir = *dest_dir;
            // A tree cannot replace a file: the server refuses it at once.
            req.source_dir = o.recursive
                && o.share.is_none()
                && matches!(roots.as_slice(), [one] if std::fs::symlink_metadata(one).is_ok_and(|m| m.is_dir()));
        }
        Plan::Pull {
            export, sources, ..
        } => {
            req.op = Op::Pull;
            req.export = export.clone();
            req.sources = sources.clone();
        }
    }
    req
}

/// Names a landed file in full for the catalogue: where each entry of the
/// transfer came from and where it went, as a local absolute path or
/// `HOST:EXPORT/path`.
pub(super) struct Place {
    /// Each root: the name its entries start with (whether it was named
    /// `dir` or `dir/`) and the directory that holds it; or None and the
    /// root itself when its entries are named by the server (an export's
    /// root) or it has no name (`/`).
    roots: Vec<(Option<String>, String)>,
    /// The destination as named, and whether the first component of an
    /// entry is replaced by it ([`Landing::Onto`]) or kept.
    dest: String,
    onto: bool,
}

impl Place {
    pub(super) fn push(plan: &Plan, onto: bool) -> Place {
        let Plan::Push {
            host,
            export,
            dest,
            roots,
            ..
        } = plan
        else {
            unreachable!("a push plan")
        };
        // A root's entries start with its name, `dir/` (its contents) or
        // not: the walk names them so, and the landing drops the name.
        let roots = roots
            .iter()
            .map(|r| {
                let abs = std::path::absolute(r).unwrap_or_else(|_| r.clone());
                let named = match abs.file_name() {
                    Some(_) if !abs.ends_with("..") => abs,
                    _ => abs.canonicalize().unwrap_or(abs),
                };
                let named = named.to_string_lossy().trim_end_matches('/').to_string();
                match named.rsplit_once('/') {
                    Some((parent, name)) if !name.is_empty() => {
                        (Some(name.to_string()), parent.to_string())
                    }
                    _ => (None, named),
                }
            })
            .collect();
        Place {
            roots,
            dest: format!("{host}:{export}/{dest}"),
            onto,
        }
    }

    pub(super) fn pull(plan: &Plan, o: &CpOptions, landing: Landing) -> Place {
        let Plan::Pull {
            host,
            export,
            sources,
            ..
        } = plan
        else {
            unreachable!("a pull plan")
        };
        let roots = sources
            .iter()
            .map(|s| {
                let full = format!("{host}:{export}/{}", s.trim_end_matches('/'));
                if s.trim_end_matches('/').is_empty() {
                    (None, full.trim_end_matches('/').to_string())
                } else {
                    let (parent, name) = full.rsplit_once('/').unwrap_or(("", &full));
                    (Some(name.to_string()), parent.to_string())
                }
            })
            .collect();
        let named = o.dest.arg();
        let dest = std::path::absolute(named)
            .map_or_else(|_| named.to_string(), |p| p.to_string_lossy().into_owned());
        Place {
            roots,
            dest,
            onto: landing == Landing::Onto,
        }
    }

    /// What the source and sink threads call as a file lands: the row for
    /// `catalogue`, its naming left to whoever writes it.
    pub(super) fn hook(self, catalogue: super::super::Catalogue) -> super::super::OnLanded {
        let place = Arc::new(self);
        let namer: super::super::Namer = Arc::new(move |path: &str| place.names(path));
        Arc::new(move |path: &str, size, mtime_ns, digest: Option<&str>| {
            catalogue(Landed {
                path: path.to_string(),
                size,
                mtime_ns,
                digest: digest.map(str::to_string),
                namer: namer.clone(),
            });
        })
    }

    /// (source, destination) of an entry path.
    fn names(&self, path: &str) -> (String, String) {
        let first = path.split('/').next().unwrap_or("");
        let source = match self
            .roots
            .iter()
            .find(|(name, _)| name.as_deref() == Some(first))
        {
            Some((_, parent)) => format!("{parent}/{path}"),
            // A root named by the server (an export's root): its entries
            // start with a name of the server's, in place of the root.
            None => match self.roots.iter().find(|(name, _)| name.is_none()) {
                Some((_, root)) => match path.split_once('/') {
                    Some((_, rest)) => format!("{root}/{rest}"),
                    None => root.clone(),
                },
                None => path.to_string(),
            },
        };
        let rest = if self.onto {
            path.split_once('/').map_or("", |(_, r)| r)
        } else {
            path
        };
        let base = self.dest.trim_end_matches('/');
        let dest = if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}/{rest}")
        };
        (source, dest)
    }
}

/// A pull's destination, by the rule of [`landing`]: where entries land
/// and the anchor everything written stays beneath (the destination, or
/// the directory that holds it when the source becomes it), whatever
/// names the server sends. The user's own links on the way are followed:
/// the path is theirs to choose.
pub(super) fn local_dest(
    o: &CpOptions,
    dest: &Path,
) -> Result<(PathBuf, Landing, Anchor), EngineError> {
    let abs = std::path::absolute(dest)
        .map_err(|e| EngineError::Usage(format!("{}: {e}", dest.display())))?;
    let parent = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| abs.clone());
    // Looked at without its trailing '/': `file/` is a file named as a
    // directory (refused as one), not a path that does not exist.
    let named: PathBuf = abs.components().collect();
    let link = std::fs::read_link(&named).ok();
    let state = match std::fs::metadata(&named) {
        Ok(m) if m.is_dir() => DestState::Dir,
        // A link is never replaced or written through (a link to a
        // directory is that directory, as above).
        Ok(_) if link.is_some() => return Err(dest_link(o, link, "not a directory")),
        Err(_) if link.is_some() => return Err(dest_link(o, link, "which does not exist")),
        Ok(_) => DestState::Other,
        Err(_) if std::fs::symlink_metadata(&named).is_ok() => DestState::Other,
        Err(_) => DestState::Missing {
            parent: parent.is_dir(),
        },
    };
    let (landing, create) = landing(
        o.dest.arg(),
        o.sources.len() as u32,
        o.contents(),
        o.dest.slashed(),
        state,
        o.mkpath,
    )
    .map_err(|e| EngineError::Usage(format!("destination {e}")))?;
    let make = match create {
        Create::Nothing => None,
        Create::Dest => Some(&abs),
        Create::Parents => Some(&parent),
    };
    if let (Some(dir), false) = (make, o.dry_run) {
        std::fs::create_dir_all(dir)
            .map_err(|e| EngineError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mut root = match landing {
        Landing::Into => abs.clone(),
        Landing::Onto => parent,
    };
    // A dry run creates nothing: it looks from what exists.
    while o.dry_run && !root.is_dir() {
        match root.parent() {
            Some(p) => root = p.to_path_buf(),
            None => break,
        }
    }
    Ok((abs, landing, Anchor::open(&root)?))
}

/// A pull's destination that is a link leading to no directory: refused,
/// worded as a server words it.
fn dest_link(o: &CpOptions, link: Option<PathBuf>, what: &str) -> EngineError {
    EngineError::Usage(format!(
        "destination {} is a symbolic link to {}, {what}: a link is never replaced or written through; name what it leads to, or remove the link",
        o.dest.arg(),
        link.unwrap_or_default().display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::dial::ClientOptions;

    fn opts(sources: &[&str], dest: &str) -> CpOptions {
        let sources = sources.iter().map(|s| End::read_server(s)).collect();
        CpOptions::new(sources, End::read_server(dest), ClientOptions::default())
    }

    fn refused(o: &CpOptions) -> String {
        match plan(o) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("planned what should be refused"),
        }
    }

    #[test]
    fn a_remote_destination_is_a_push_and_remote_sources_a_pull() {
        let Plan::Push {
            host,
            export,
            dest,
            dest_dir,
            roots,
        } = plan(&opts(&["a", "b/c"], "srv:data/in/")).unwrap()
        else {
            panic!("a push");
        };
        assert_eq!(
            (host.as_str(), export.as_str(), dest.as_str()),
            ("srv", "data", "in")
        );
        assert!(dest_dir);
        assert_eq!(roots, [PathBuf::from("a"), PathBuf::from("b/c")]);

        let p = plan(&opts(&["srv:data/x", "srv:data/y/z"], "local")).unwrap();
        assert_eq!(p.host(), "srv");
        let Plan::Pull {
            export,
            sources,
            dest,
            ..
        } = p
        else {
            panic!("a pull");
        };
        assert_eq!(export, "data");
        assert_eq!(sources, ["x", "y/z"]);
        assert_eq!(dest, PathBuf::from("local"));
    }

    #[test]
    fn plans_that_cannot_be_are_refused_with_the_fix() {
        assert!(refused(&opts(&["a/", "b"], "srv:d/x")).contains("not a mix"));
        assert!(refused(&opts(&["srv:d/a"], "other:d/x")).contains("remote-to-remote"));
        assert!(refused(&opts(&["a"], "b")).contains("neither side is remote"));
        assert!(refused(&opts(&["srv:d/a", "b"], "c")).contains("neither side is remote"));
        assert!(refused(&opts(&["s1:d/a", "s2:d/b"], "c")).contains("one server and export"));
        assert!(refused(&opts(&["s1:d/a", "s1:e/b"], "c")).contains("one server and export"));
        let mut ssh = opts(&["a"], "c");
        ssh.dest = End::read("host:in/");
        assert!(refused(&ssh).contains("'host:in/' is a path on a host over ssh"));
        let mut fleet = opts(&["srv:d/a"], "c");
        fleet.share = Some(super::super::super::source::Share::Fixed(Arc::default()));
        assert!(refused(&fleet).contains("a fleet pushes"));
    }

    #[test]
    fn the_request_says_what_the_plan_is() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        let o = opts(&[root.to_str().unwrap()], "srv:data/in/");
        let req = transfer_request(&o, &plan(&o).unwrap(), 4, &StreamTuning::default());
        assert_eq!(req.op, Op::Push);
        assert_eq!((req.export.as_str(), req.dest.as_str()), ("data", "in"));
        assert!(req.dest_dir && req.recursive && !req.contents);
        assert_eq!((req.streams, req.source_count), (4, 1));
        // One directory, recursively: a tree, which cannot replace a file.
        assert!(req.source_dir);
        let contents = opts(&[&format!("{}/", root.display())], "srv:data/in");
        let req = transfer_request(&contents, &plan(&contents).unwrap(), 1, &Default::default());
        assert!(req.contents && !req.dest_dir);

        let o = opts(&["srv:data/a/", "srv:data/b/"], "here");
        let req = transfer_request(&o, &plan(&o).unwrap(), 2, &StreamTuning::default());
        assert_eq!(req.op, Op::Pull);
        assert_eq!(req.sources, ["a", "b"]);
        assert!(req.contents && !req.source_dir);
        assert_eq!(req.source_count, 2);
    }

    #[test]
    fn the_catalogue_names_each_entry_where_it_came_from_and_went() {
        let o = opts(&["/data/run7"], "srv:exp/in");
        let p = plan(&o).unwrap();
        let into = Place::push(&p, false);
        assert_eq!(
            into.names("run7/a/b"),
            ("/data/run7/a/b".into(), "srv:exp/in/run7/a/b".into())
        );
        // Onto: the root's own name is replaced by the destination.
        let onto = Place::push(&p, true);
        assert_eq!(
            onto.names("run7/a"),
            ("/data/run7/a".into(), "srv:exp/in/a".into())
        );
        assert_eq!(
            onto.names("run7"),
            ("/data/run7".into(), "srv:exp/in".into())
        );

        let o = opts(&["srv:exp/sub/x"], "/tmp/dst");
        let pull = Place::pull(&plan(&o).unwrap(), &o, Landing::Into);
        assert_eq!(
            pull.names("x/f"),
            ("srv:exp/sub/x/f".into(), "/tmp/dst/x/f".into())
        );
        // An export's root: its entries are named by the server.
        let o = opts(&["srv:exp/"], "/tmp/dst");
        let pull = Place::pull(&plan(&o).unwrap(), &o, Landing::Into);
        assert_eq!(
            pull.names("exp/f"),
            ("srv:exp/f".into(), "/tmp/dst/exp/f".into())
        );
    }
}
