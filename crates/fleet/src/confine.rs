//! Every entry a rank reads, resolved beneath the sources it was given.
//!
//! A manifest comes from a shared directory or a database, and whoever
//! can write there could name any file the rank's user can read. So a
//! rank trusts an entry's name only as a name: its first component must
//! be the name of one of the rank's own sources (as the walk names a
//! root), the rest a relative path (no `..`, no absolute path, checked by
//! [`components`]), and the path it is read from is that source joined
//! with the rest, which must be the path the manifest recorded. Before a
//! byte of a share is read, the directory of each of its entries is opened
//! beneath its source with the engine's confinement ([`Anchor`]:
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`), so no symbolic link
//! in the tree leads out of it; the final component is never followed
//! (the source reads with `O_NOFOLLOW` and checks the inode it announced).
//!
//! What is left to a forger is naming entries the command would have
//! copied anyway (beneath the sources, to the same names at the
//! destination), or leaving some out, which the final check (a `sync` of
//! the sources themselves) sends.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use longhaul_engine::xfer::beneath::Anchor;
use longhaul_engine::xfer::source::{root_name, ShareItem};
use longhaul_proto::xfer::components;
use longhaul_proto::xfer::copy::CopyShareItem;

use crate::manifest::{Entry, Manifest};

/// An entry a rank will not read, and why (export-relative: its name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing the manifest's entry {rel:?}: {why}; a manifest of other sources, or one someone else wrote: check who can write the run directory or the queue's tables, and start again with a fresh --run-dir or --run-id")]
pub struct Refused {
    pub rel: String,
    pub why: String,
}

/// The sources one rank was given, each with its name and, opened when
/// first needed, the anchor entries beneath it are resolved from.
pub struct Sources {
    roots: Vec<Root>,
}

struct Root {
    name: String,
    /// As the walk records it (absolute, not resolved).
    path: PathBuf,
    /// None: not a directory the walk descends into (a file, a link).
    anchor: OnceLock<Option<Arc<Anchor>>>,
}

impl Sources {
    pub fn new(sources: &[String]) -> Sources {
        Sources {
            roots: sources
                .iter()
                .map(|s| {
                    let p = PathBuf::from(s);
                    Root {
                        name: root_name(&p),
                        path: std::path::absolute(&p).unwrap_or(p),
                        anchor: OnceLock::new(),
                    }
                })
                .collect(),
        }
    }

    /// Remote sources (a fleet of third-party copies): each named as
    /// [`crate::manifest::RemoteRoot`] names it, its entries' paths within
    /// its export. Nothing of them is on this node: they are checked by
    /// name here ([`Self::check`], [`Self::remote_share`]), and by their
    /// server, which confines each item of an order's share itself.
    pub fn remote(sources: &[longhaul_engine::reach::End]) -> Result<Sources, String> {
        let roots = sources
            .iter()
            .map(|s| {
                let r = crate::manifest::RemoteRoot::of(s)?;
                Ok(Root {
                    name: r.name,
                    path: r.path,
                    anchor: OnceLock::from(None),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Sources { roots })
    }

    /// A share of remote sources as an order names it: each item by the
    /// index of its source and its path beneath it, checked by name as
    /// [`Self::check`] checks an entry.
    pub fn remote_share(&self, items: &[ShareItem]) -> Result<Vec<CopyShareItem>, Refused> {
        items
            .iter()
            .map(|item| {
                let root = self.resolve(&item.rel, &item.path)?;
                let source = self
                    .roots
                    .iter()
                    .position(|r| std::ptr::eq(r, root))
                    .unwrap_or_default();
                let rel = item
                    .rel
                    .split_once('/')
                    .map_or(String::new(), |(_, rest)| rest.to_string());
                Ok(CopyShareItem {
                    source: source as u32,
                    rel,
                    chunk_size: item.chunk_size,
                    part: item.part,
                })
            })
            .collect()
    }

    /// The source an entry belongs to: one its name's first component
    /// names, beneath which the rest of its name is the path recorded. By
    /// name alone, no file system.
    fn resolve(&self, rel: &str, recorded: &Path) -> Result<&Root, Refused> {
        let refuse = |why: &str| Refused {
            rel: rel.chars().take(200).collect(),
            why: why.into(),
        };
        let parts = components(rel).map_err(|e| refuse(&format!("its name {}", e.why)))?;
        if parts.join("/") != rel {
            return Err(refuse("its name is not in the form a walk gives"));
        }
        let (first, rest) = parts
            .split_first()
            .ok_or_else(|| refuse("its name is empty"))?;
        // Two sources of one name land in one place: either may hold it.
        let mut named = self.roots.iter().filter(|r| r.name == *first).peekable();
        if named.peek().is_none() {
            return Err(refuse("it is not beneath any of this rank's sources"));
        }
        named
            .find(|r| {
                let mut path = r.path.clone();
                path.extend(rest);
                path == recorded
            })
            .ok_or_else(|| refuse("the manifest reads it from elsewhere than beneath its source"))
    }

    /// Checks a manifest's every entry by name: each is beneath one of
    /// the sources, at the path its name gives. No file system: cheap
    /// enough for every rank and the whole manifest.
    pub fn check(&self, m: &Manifest) -> Result<(), Refused> {
        m.entries
            .iter()
            .try_for_each(|e: &Entry| self.resolve(&e.rel, &e.path).map(|_| ()))
    }

    /// Confines the items of a share before any is read: each by name
    /// (as [`Self::check`]), and its directory opened beneath its source
    /// without following a symbolic link. An item whose directory is gone
    /// since the walk passes: the transfer reports it missing.
    pub fn confine(&self, items: &[ShareItem]) -> Result<(), Refused> {
        for item in items {
            let root = self.resolve(&item.rel, &item.path)?;
            if item.path == root.path {
                continue;
            }
            let refuse = |why: &str| Refused {
                rel: item.rel.clone(),
                why: why.into(),
            };
            let Some(anchor) = root.anchor() else {
                return Err(refuse(
                    "its source is not a directory: nothing is beneath it",
                ));
            };
            let parent = item.path.parent().unwrap_or(&root.path);
            if let Err(e) = anchor.dir(parent, false) {
                if anchor.gone(&root.path, parent) {
                    continue;
                }
                tracing::debug!("{}: {e}", item.rel);
                return Err(refuse(
                    "it does not resolve beneath its source without following a symbolic link",
                ));
            }
        }
        Ok(())
    }
}

impl Root {
    /// The anchor beneath this source, if the walk descends into it (a
    /// directory itself, not a link to one: a link is copied as a link).
    fn anchor(&self) -> Option<Arc<Anchor>> {
        self.anchor
            .get_or_init(|| {
                let is_dir = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_dir());
                is_dir
                    .then(|| Anchor::open(&self.path).ok().map(Arc::new))
                    .flatten()
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::xfer::Kind;

    fn item(rel: &str, path: &Path) -> ShareItem {
        ShareItem {
            path: path.to_path_buf(),
            rel: rel.into(),
            chunk_size: 1 << 20,
            part: None,
        }
    }

    #[test]
    fn entries_outside_the_sources_by_name_path_or_link_are_refused() {
        let base = std::env::temp_dir().join(format!("lh-confine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let src = base.join("src");
        let outside = base.join("outside");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(src.join("d/f"), b"mine").unwrap();
        std::fs::write(outside.join("secret"), b"not yours").unwrap();
        std::os::unix::fs::symlink(&outside, src.join("esc")).unwrap();
        let s = Sources::new(&[src.display().to_string()]);
        // What the walk gives passes, and so does a file gone since.
        s.confine(&[
            item("src", &src),
            item("src/d", &src.join("d")),
            item("src/d/f", &src.join("d/f")),
            item("src/esc", &src.join("esc")),
            item("src/gone/x", &src.join("gone/x")),
            item("src/d/gone/x/y", &src.join("d/gone/x/y")),
        ])
        .unwrap();
        let refused = |rel: &str, path: &Path| {
            let e = s.confine(&[item(rel, path)]).unwrap_err();
            assert_eq!(e.rel, rel);
            assert!(!e.to_string().contains(&*base.to_string_lossy()), "{e}");
            e.why
        };
        assert!(refused("src/shadow", &outside.join("secret")).contains("elsewhere"));
        assert!(refused("src/../outside/secret", &outside.join("secret")).contains(".."));
        assert!(refused("/etc/shadow", Path::new("/etc/shadow")).contains("absolute"));
        assert!(refused("other/secret", &outside.join("secret")).contains("not beneath"));
        assert!(refused("src//d/f", &src.join("d/f")).contains("form"));
        assert!(refused("src/esc/secret", &src.join("esc/secret")).contains("symbolic link"));
        assert!(refused("src/esc/no/such", &src.join("esc/no/such")).contains("symbolic link"));
        // A manifest's entries by name.
        let m = Manifest {
            sources: vec![src.display().to_string()],
            entries: vec![Entry {
                rel: "src/x".into(),
                path: outside.join("secret"),
                kind: Kind::File,
                size: 9,
                mtime_ns: 0,
                chunk_size: 1 << 20,
            }],
        };
        assert_eq!(s.check(&m).unwrap_err().rel, "src/x");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
