//! The check of a copy against its source, the whole tree: every file's
//! size and BLAKE3, every directory (empty ones too), every symbolic link
//! as a link with its target, and the permission bits of files and
//! directories. What a tool does not claim to keep ([`Keeps`]) and did not
//! keep marks the cell; anything else that differs fails it.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::peers::Keeps;

/// One entry of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File {
        len: u64,
        blake3: [u8; 32],
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Link {
        target: PathBuf,
    },
}

/// A tree: path relative to its top -> entry (the top itself left out).
pub type Manifest = BTreeMap<PathBuf, Entry>;

/// Every entry under `dir`, links not followed.
pub fn manifest(dir: &Path) -> std::io::Result<Manifest> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let path = e.path();
            let rel = path
                .strip_prefix(dir)
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let meta = std::fs::symlink_metadata(&path)?;
            let mode = meta.permissions().mode() & 0o7777;
            let entry = if meta.file_type().is_symlink() {
                Entry::Link {
                    target: std::fs::read_link(&path)?,
                }
            } else if meta.is_dir() {
                stack.push(path);
                Entry::Dir { mode }
            } else {
                let mut h = blake3::Hasher::new();
                h.update_reader(std::fs::File::open(&path)?)?;
                Entry::File {
                    len: meta.len(),
                    blake3: *h.finalize().as_bytes(),
                    mode,
                }
            };
            out.insert(rel, entry);
        }
    }
    Ok(out)
}

/// The bytes of a tree's files.
pub fn bytes(m: &Manifest) -> u64 {
    m.values()
        .map(|e| match e {
            Entry::File { len, .. } => *len,
            _ => 0,
        })
        .sum()
}

/// A copy's verdict: what is wrong with it (None: it verified), and what
/// the tool did not keep that it does not claim to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub wrong: Option<String>,
    pub not_kept: BTreeSet<&'static str>,
}

pub const EMPTY_DIRS: &str = "empty directories";
pub const SYMLINKS: &str = "symbolic links";
pub const MODES: &str = "permission bits";

/// Compares a copy with its source.
pub fn compare(src: &Manifest, dst: &Manifest, keeps: Keeps) -> Verdict {
    let mut v = Verdict::default();
    let mut lapse = |what: &'static str, claimed: bool, why: String| {
        if claimed {
            v.wrong.get_or_insert(why);
        } else {
            v.not_kept.insert(what);
        }
    };
    let links: Vec<&PathBuf> = src
        .iter()
        .filter(|(_, e)| matches!(e, Entry::Link { .. }))
        .map(|(p, _)| p)
        .collect();
    for (p, e) in src {
        let at = p.display();
        match (e, dst.get(p)) {
            (
                Entry::File { len, blake3, mode },
                Some(Entry::File {
                    len: l,
                    blake3: b,
                    mode: m,
                }),
            ) => {
                if l != len {
                    lapse("", true, format!("{at} has {l} bytes, not {len}"));
                } else if b != blake3 {
                    lapse("", true, format!("{at} differs from the source"));
                } else if m != mode {
                    lapse(
                        MODES,
                        keeps.modes,
                        format!("{at} has mode {m:o}, not {mode:o}"),
                    );
                }
            }
            (Entry::File { .. }, _) => lapse("", true, format!("{at} is missing")),
            (Entry::Dir { mode }, Some(Entry::Dir { mode: m })) if m != mode => {
                lapse(
                    MODES,
                    keeps.modes,
                    format!("{at}/ has mode {m:o}, not {mode:o}"),
                );
            }
            (Entry::Dir { .. }, Some(Entry::Dir { .. })) => {}
            (Entry::Dir { .. }, _) => {
                // A directory with files under it is missed by their own
                // lines; one without is an empty one.
                let files = src
                    .iter()
                    .any(|(q, e)| q.starts_with(p) && matches!(e, Entry::File { .. }));
                if !files {
                    lapse(
                        EMPTY_DIRS,
                        keeps.empty_dirs,
                        format!("{at}/ (empty) is missing"),
                    );
                }
            }
            (Entry::Link { target }, Some(Entry::Link { target: t })) if t == target => {}
            (Entry::Link { target }, _) => lapse(
                SYMLINKS,
                keeps.symlinks,
                format!("{at} is not a link to {}", target.display()),
            ),
        }
    }
    // What a followed link brought is the link's, not an extra.
    if let Some(extra) = dst
        .keys()
        .find(|p| !src.contains_key(*p) && !links.iter().any(|l| p.starts_with(l)))
    {
        lapse(
            "",
            true,
            format!("{} is not in the source", extra.display()),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Manifest {
        let f = |len, b, mode| Entry::File {
            len,
            blake3: [b; 32],
            mode,
        };
        BTreeMap::from([
            ("a".into(), Entry::Dir { mode: 0o755 }),
            ("a/f".into(), f(10, 1, 0o644)),
            ("a/x".into(), f(3, 2, 0o755)),
            ("priv".into(), Entry::Dir { mode: 0o700 }),
            ("priv/s".into(), f(5, 3, 0o600)),
            ("empty".into(), Entry::Dir { mode: 0o755 }),
            ("empty/dir".into(), Entry::Dir { mode: 0o755 }),
            ("a/link".into(), Entry::Link { target: "f".into() }),
        ])
    }

    const ALL: Keeps = Keeps {
        empty_dirs: true,
        symlinks: true,
        modes: true,
    };

    #[test]
    fn an_equal_copy_verifies_and_keeps_everything() {
        assert_eq!(compare(&tree(), &tree(), ALL), Verdict::default());
    }

    /// What GridFTP and XRootD do to the tree: links followed (a file where
    /// the link was), modes of their own, no empty directories.
    fn flattened() -> Manifest {
        let mut d = tree();
        d.insert("a/link".into(), d[Path::new("a/f")].clone());
        for e in d.values_mut() {
            match e {
                Entry::File { mode, .. } => *mode = 0o644,
                Entry::Dir { mode } => *mode = 0o755,
                Entry::Link { .. } => {}
            }
        }
        d.remove(Path::new("empty/dir"));
        d.remove(Path::new("empty"));
        d
    }

    #[test]
    fn what_a_tool_does_not_claim_to_keep_marks_it_and_what_it_claims_fails_it() {
        let v = compare(&tree(), &flattened(), Keeps::default());
        assert_eq!(v.wrong, None);
        assert_eq!(
            v.not_kept.into_iter().collect::<Vec<_>>(),
            [EMPTY_DIRS, MODES, SYMLINKS]
        );
        for (keeps, says) in [
            (
                Keeps {
                    modes: true,
                    ..Keeps::default()
                },
                "has mode",
            ),
            (
                Keeps {
                    symlinks: true,
                    ..Keeps::default()
                },
                "a/link is not a link to f",
            ),
            (
                Keeps {
                    empty_dirs: true,
                    ..Keeps::default()
                },
                "empty/ (empty) is missing",
            ),
        ] {
            let v = compare(&tree(), &flattened(), keeps);
            assert!(
                v.wrong.as_deref().unwrap_or("").contains(says),
                "{keeps:?}: {v:?}"
            );
        }
    }

    #[test]
    fn content_missing_or_extra_fails_whatever_the_tool_claims() {
        let mut d = tree();
        d.insert(
            "a/f".into(),
            Entry::File {
                len: 10,
                blake3: [9; 32],
                mode: 0o644,
            },
        );
        let v = compare(&tree(), &d, Keeps::default());
        assert_eq!(v.wrong.as_deref(), Some("a/f differs from the source"));
        let mut d = tree();
        d.remove(Path::new("priv/s"));
        d.remove(Path::new("priv"));
        let v = compare(&tree(), &d, ALL);
        assert_eq!(v.wrong.as_deref(), Some("priv/s is missing"));
        let mut d = tree();
        d.insert("stray".into(), Entry::Dir { mode: 0o755 });
        let v = compare(&tree(), &d, Keeps::default());
        assert_eq!(v.wrong.as_deref(), Some("stray is not in the source"));
        // A followed link to a directory brings its files: the link's.
        let mut s = tree();
        s.insert("dl".into(), Entry::Link { target: "a".into() });
        let mut d = s.clone();
        d.insert("dl".into(), Entry::Dir { mode: 0o755 });
        d.insert("dl/f".into(), s[Path::new("a/f")].clone());
        let v = compare(&s, &d, Keeps::default());
        assert_eq!((v.wrong, v.not_kept.len()), (None, 1));
    }

    #[test]
    fn a_manifest_reads_links_as_links_with_modes_and_empty_directories() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("e/d")).unwrap();
        std::fs::write(r.join("f"), "data").unwrap();
        std::fs::set_permissions(r.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("f", r.join("l")).unwrap();
        std::os::unix::fs::symlink("nowhere", r.join("dangling")).unwrap();
        let m = manifest(r).unwrap();
        assert!(matches!(m[Path::new("e/d")], Entry::Dir { .. }));
        assert_eq!(m[Path::new("l")], Entry::Link { target: "f".into() });
        assert_eq!(
            m[Path::new("dangling")],
            Entry::Link {
                target: "nowhere".into()
            }
        );
        assert!(matches!(
            m[Path::new("f")],
            Entry::File {
                len: 4,
                mode: 0o600,
                ..
            }
        ));
        assert_eq!(bytes(&m), 4);
    }
}
