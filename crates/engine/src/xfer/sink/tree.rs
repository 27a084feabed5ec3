//! What the sink does to the destination tree besides files: links made
//! in place, directories given their modes and times at the end, and
//! what `sync --delete` removes.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use longhaul_proto::transfer::sink::Sink;

use longhaul_proto::xfer::*;

use super::super::set_mtime;
use super::{io_err, one_create, side_path, SinkConfig};
use crate::EngineError;

/// Makes the link `e` at `t`: true if it was made, false if a link there
/// already pointed the same way (left as it is: up to date).
pub(super) fn make_link(t: &Path, e: &Entry, cfg: &SinkConfig) -> Result<bool, EngineError> {
    let target = e.target.clone().unwrap_or_default();
    let (dir, name) = cfg.anchor.parent_of(t, true)?;
    let at = dir.join(&name);
    if std::fs::read_link(&at).is_ok_and(|old| old == Path::new(&target)) {
        return Ok(false);
    }
    let tmp = dir.join(side_path(t, "lhlink").file_name().expect("named"));
    let _ = std::fs::remove_file(&tmp);
    one_create(dir.on_ext4_without_journal(), || {
        std::os::unix::fs::symlink(&target, &tmp)
    })
    .and_then(|()| std::fs::rename(&tmp, &at))
    .map_err(|err| EngineError::Usage(io_err("create link", &cfg.anchor.show(t), err)))?;
    let _ = set_mtime(&at, e.mtime_ns);
    Ok(true)
}

/// Whether a link at `t` already points where `e` does (a dry run's
/// question: nothing is made, not even the directory it would go in).
pub(super) fn link_in_place(t: &Path, e: &Entry, cfg: &SinkConfig) -> bool {
    let target = e.target.as_deref().unwrap_or_default();
    cfg.anchor
        .anchored(t)
        .ok()
        .and_then(|at| std::fs::read_link(at).ok())
        .is_some_and(|old| old == Path::new(target))
}

/// Removes what a destination directory holds beyond `keep` (sync --delete),
/// except what the rules exclude (`listed`: the directory's entry path).
pub(super) fn prune(
    dir: &Path,
    listed: &str,
    keep: &HashSet<OsString>,
    cfg: &SinkConfig,
    report: &mut SinkReport,
) {
    // Listed and deleted through the directory's descriptor: a link
    // swapped in for it cannot turn the deletion elsewhere.
    let Ok(d) = cfg.anchor.dir(dir, false) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(d.path()) else {
        return;
    };
    for de in rd.flatten() {
        let name = de.file_name();
        if keep.contains(&name) {
            continue;
        }
        let s = name.to_string_lossy();
        if is_reserved_name(&s) {
            // A partial file, journal or mark of a file the source has
            // too may be in use (this transfer's, or a fleet's other
            // parts'); one of a file the source no longer has is stale.
            if !side_of(&s).iter().any(|n| keep.contains(OsStr::new(n))) && !cfg.dry_run {
                let _ = std::fs::remove_file(d.join(&name));
            }
            continue;
        }
        if let Some(f) = &cfg.filter {
            let is_dir = de.file_type().is_ok_and(|t| t.is_dir());
            if f.excludes_entry(&format!("{listed}/{s}"), is_dir) {
                continue;
            }
        }
        let at = d.join(&name);
        let path = dir.join(&name);
        // Reported relative to the destination: the peer need not learn the
        // server's directory layout.
        let shown = path
            .strip_prefix(&cfg.dest)
            .unwrap_or(&path)
            .display()
            .to_string();
        report.deleted.push(shown.clone());
        if cfg.dry_run {
            continue;
        }
        let is_dir = std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir());
        let r = if is_dir {
            std::fs::remove_dir_all(&at)
        } else {
            std::fs::remove_file(&at)
        };
        if let Err(e) = r {
            report.failed.push(Failure {
                path: shown,
                error: format!("cannot delete: {e}"),
            });
        }
    }
}

/// The names of the files a reserved name ([`is_reserved_name`]) may
/// belong to: `NAME` for `.NAME.lhpart`, and also `NAME` for a part's
/// `.NAME.F-E.lhdone` (whose `NAME` may itself hold dots and dashes).
fn side_of(reserved: &str) -> Vec<&str> {
    let Some(rest) = reserved.strip_prefix('.').and_then(|r| {
        RESERVED_SUFFIXES
            .iter()
            .find_map(|suffix| r.strip_suffix(suffix))
    }) else {
        return Vec::new();
    };
    let mut names = vec![rest];
    if let Some((name, range)) = rest.rsplit_once('.') {
        if range
            .split_once('-')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        {
            names.push(name);
        }
    }
    names
}

/// Gives the directories made their modes and times (with `--preserve`;
/// without, a directory's time is a courtesy), deepest first, so that
/// filling one does not change its time again.
pub(super) fn set_directories(dirs: &[(PathBuf, Entry)], cfg: &SinkConfig, m: &mut Sink) {
    for (path, e) in dirs.iter().rev() {
        // Opened again beneath the anchor; changed through its
        // descriptor, so never through a link swapped in since.
        let Ok(d) = cfg.anchor.dir(path, false) else {
            continue;
        };
        let mode = std::fs::Permissions::from_mode(cfg.mode_of(e));
        let set = |what, r: io::Result<()>| r.map_err(|err| dir_attr_failure(what, path, &err));
        let mtime = super::super::set_mtime_through(&d.path(), e.mtime_ns);
        if cfg.preserve {
            if let Err(err) =
                set("mode", std::fs::set_permissions(d.path(), mode)).and(set("mtime", mtime))
            {
                m.failed(&e.path, err);
            }
        }
    }
}

/// A directory's mode or mtime that `--preserve` could not give it.
fn dir_attr_failure(what: &str, dir: &Path, e: &io::Error) -> String {
    format!(
        "failed to set the {what} of directory {}: {e}; check that it is not immutable \
         (lsattr -d) and that its file system is not mounted read-only, or copy without --preserve",
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::config;
    use super::*;

    #[test]
    fn side_of_names_the_files_a_reserved_name_may_belong_to() {
        assert_eq!(side_of(".a.txt.lhpart"), ["a.txt"]);
        assert_eq!(side_of(".a-b.c.lhjournal"), ["a-b.c"]);
        // A part's done mark: its file's name, dots and dashes and all.
        assert_eq!(side_of(".x.tar.3-9.lhdone"), ["x.tar.3-9", "x.tar"]);
        assert_eq!(side_of(".x.a-b.lhdone"), ["x.a-b"]);
        assert!(side_of("plain.lhpart").is_empty());
        assert!(side_of(".a.txt").is_empty());
    }

    fn dest() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("old/deep")).unwrap();
        for f in [
            "keep",
            "extra",
            ".keep.lhpart",
            ".gone.lhjournal",
            "old/deep/f",
        ] {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        t
    }

    #[test]
    fn prune_removes_what_the_source_lacks_and_stale_side_files() {
        let t = dest();
        let cfg = config(t.path());
        let keep: HashSet<OsString> = ["keep".into()].into();
        let mut report = SinkReport::default();
        prune(t.path(), "dest", &keep, &cfg, &mut report);
        report.deleted.sort();
        // Named relative to the destination.
        assert_eq!(report.deleted, ["extra", "old"]);
        assert!(report.failed.is_empty());
        let left: HashSet<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|d| d.unwrap().file_name().into_string().unwrap())
            .collect();
        // A side file of a kept name may be in use; one of a name the
        // source no longer has is stale.
        assert_eq!(
            left,
            ["keep".to_string(), ".keep.lhpart".to_string()].into()
        );
    }

    #[test]
    fn a_dry_run_prune_reports_and_removes_nothing() {
        let t = dest();
        let cfg = SinkConfig {
            dry_run: true,
            ..config(t.path())
        };
        let mut report = SinkReport::default();
        prune(t.path(), "dest", &["keep".into()].into(), &cfg, &mut report);
        report.deleted.sort();
        assert_eq!(report.deleted, ["extra", "old"]);
        for f in ["extra", "old/deep/f", ".gone.lhjournal"] {
            assert!(t.path().join(f).exists(), "{f} removed in a dry run");
        }
    }
}
