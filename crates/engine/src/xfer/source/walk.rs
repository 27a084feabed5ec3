//! The walk: the roots depth first, one directory handle per level, or a
//! fleet rank's share of them; each entry described (`lstat`, never
//! following a final link) as it is to be announced.

use std::collections::{HashSet, VecDeque};
use std::fs::ReadDir;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul_proto::plan::auto_chunk_size;
use longhaul_proto::transfer::source::Source;
use longhaul_proto::xfer::*;

use super::super::beneath::Anchor;
use super::super::filter::Filter;
use super::super::prefetch::Prefetcher;
use super::super::{kind_of, mtime_ns, Stamp};
use super::{at, Fed, Handle, InFlight, Share, ShareFeed, ShareItem, SourceConfig};

/// What a copy without `-r` says of a directory it was named (`shown` as
/// the one who named it would name it).
pub fn directory_without_r(shown: &dyn std::fmt::Display) -> String {
    format!("{shown} is a directory: use -r to copy trees")
}

/// Walks the roots depth first, one directory handle per level.
pub(super) struct Walker {
    /// Set when something under the current directory could not be sent:
    /// its `DirEnd` then says so, and nothing there is deleted.
    level_failed: Vec<bool>,
    dir_ends: bool,
    roots: VecDeque<PathBuf>,
    /// Open listings: the handle, the entry path, the directory's path.
    stack: Vec<(ReadDir, String, PathBuf)>,
    anchor: Option<Arc<Anchor>>,
    next_id: u64,
    recursive: bool,
    chunk_size: Option<u64>,
    streams: u16,
    /// Told of each directory entered, to stat its entries ahead.
    ahead: Option<Arc<Prefetcher>>,
    /// A fleet rank's share, announced in order instead of the walk...
    share: VecDeque<ShareItem>,
    /// ...and where more of it comes from, until it says it has ended.
    feed: Option<ShareFeed>,
    /// Files announced as parts: a part that changed while it was read is
    /// not sent again (the other ranks' parts are of the old version).
    parts: HashSet<PathBuf>,
    /// Include/exclude rules: an excluded entry is not announced, an
    /// excluded directory not listed.
    filter: Option<Arc<Filter>>,
}

/// An entry found by the walk: what is announced, where it is read from,
/// and the version of it that is announced.
pub(super) struct Found {
    pub(super) entry: Entry,
    pub(super) path: PathBuf,
    pub(super) stamp: Stamp,
}

/// The name a root is announced under: the last component the user
/// named, never what a symbolic link leads to (a lone link is copied as
/// itself, under its own name). `.`, `..` and `/` have no name of their
/// own; they are named by the directory they resolve to. (A fleet rank
/// maps a manifest entry's name back to its source by it.)
pub fn root_name(root: &Path) -> String {
    root.file_name()
        .map(|n| n.to_owned())
        .or_else(|| root.canonicalize().ok()?.file_name().map(|n| n.to_owned()))
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
}

impl Walker {
    /// The walk of a transfer: its roots, or its share of them.
    pub(super) fn for_transfer(cfg: &SourceConfig, ahead: Option<Arc<Prefetcher>>) -> Walker {
        let roots = match &cfg.share {
            Some(_) => VecDeque::new(),
            None => cfg.roots.iter().cloned().collect(),
        };
        let mut w = Walker::new(roots, cfg.recursive, cfg.chunk_size, cfg.streams);
        w.dir_ends = cfg.dir_ends;
        w.anchor = cfg.anchor.clone();
        w.ahead = ahead;
        w.filter = cfg.filter.clone();
        match &cfg.share {
            Some(Share::Fixed(items)) => w.share = items.iter().cloned().collect(),
            Some(Share::Fed(feed)) => w.feed = Some(feed.clone()),
            None => {}
        }
        w
    }

    /// A plain walk of `roots`: no `DirEnd`s, no anchor, no prefetch, no
    /// share (the fields are set where a transfer wants them).
    pub(super) fn new(
        roots: VecDeque<PathBuf>,
        recursive: bool,
        chunk_size: Option<u64>,
        streams: u16,
    ) -> Walker {
        Walker {
            level_failed: Vec::new(),
            dir_ends: false,
            roots,
            stack: Vec::new(),
            anchor: None,
            next_id: 0,
            recursive,
            chunk_size,
            streams,
            ahead: None,
            share: VecDeque::new(),
            feed: None,
            parts: HashSet::new(),
            filter: None,
        }
    }

    fn entry(
        &mut self,
        path: PathBuf,
        rel: String,
        meta: Option<std::fs::Metadata>,
    ) -> Result<Option<Found>, Failure> {
        let found = self.stat(path, rel, meta)?;
        // A root (nothing listed yet) the rules exclude; children are
        // weighed before they are described, in `child`.
        if self.stack.is_empty() && self.excluded(&found.entry.path, found.entry.kind == Kind::Dir)
        {
            return Ok(None);
        }
        if found.entry.kind == Kind::Dir {
            let (path, rel) = (&found.path, &found.entry.path);
            let fail = |error: String| Failure {
                path: rel.clone(),
                error,
            };
            if !self.recursive {
                return Err(fail(directory_without_r(&self.shown(path).display())));
            }
            let listed = match &self.anchor {
                Some(a) => a.dir(path, false).map(|d| d.path()),
                None => Ok(path.clone()),
            }
            .map_err(|e| fail(e.to_string()))?;
            let rd = std::fs::read_dir(&listed)
                .map_err(|e| fail(format!("cannot list {}: {e}", self.shown(path).display())))?;
            if let Some(p) = &self.ahead {
                p.list(path.clone());
            }
            self.stack.push((rd, rel.clone(), path.clone()));
            self.level_failed.push(false);
        }
        Ok(Some(found))
    }

    /// The next entry of a share, as the walk that cut it found it.
    fn shared(&mut self, item: ShareItem) -> Result<Found, Failure> {
        let mut found = self.stat(item.path, item.rel, None)?;
        let e = &mut found.entry;
        if e.kind == Kind::File {
            e.chunk_size = item.chunk_size;
            if let Some([first, end]) = item.part {
                let count = longhaul_proto::plan::chunk_count(e.size, e.chunk_size);
                if first >= end || u64::from(end) > count {
                    return Err(Failure {
                        path: e.path.clone(),
                        error: format!(
                            "changed since the fleet's manifest was made (now {} bytes): run the transfer again with a fresh manifest",
                            e.size
                        ),
                    });
                }
                e.part = Some([first, end]);
                self.parts.insert(found.path.clone());
            }
        }
        Ok(found)
    }

    /// A file announced again under a new id, after it changed while it
    /// was read: it must still be a regular file.
    pub(super) fn again(&mut self, path: PathBuf, rel: String) -> Result<Found, Failure> {
        if self.parts.contains(&path) {
            return Err(Failure {
                path: rel,
                error: "changed while it was read; other ranks hold other parts of it, so it is not sent again: run the transfer again once it stays still".into(),
            });
        }
        let found = self.stat(path, rel, None)?;
        if found.entry.kind != Kind::File {
            return Err(Failure {
                path: found.entry.path,
                error: "changed while it was read, and is no longer a regular file".into(),
            });
        }
        Ok(found)
    }

    /// Describes one path, without following a final symlink; `meta` is
    /// its `lstat` if the caller has it already.
    fn stat(
        &mut self,
        path: PathBuf,
        rel: String,
        meta: Option<std::fs::Metadata>,
    ) -> Result<Found, Failure> {
        let fail = |error: String| Failure {
            path: rel.clone(),
            error,
        };
        let at_path = at(&self.anchor, &path).map_err(|e| fail(e.to_string()))?;
        let m = match meta {
            Some(m) => m,
            None => std::fs::symlink_metadata(&at_path)
                .map_err(|e| fail(format!("cannot read {}: {e}", self.shown(&path).display())))?,
        };
        let Some(kind) = kind_of(&m) else {
            return Err(fail(
                "not a regular file, directory or symlink; skipped".into(),
            ));
        };
        let target = match kind {
            Kind::Symlink => Some(
                std::fs::read_link(&at_path)
                    .map_err(|e| fail(format!("cannot read link: {e}")))?
                    .to_str()
                    .ok_or_else(|| fail("link target is not UTF-8".into()))?
                    .to_string(),
            ),
            _ => None,
        };
        let size = if kind == Kind::File { m.len() } else { 0 };
        self.next_id += 1;
        Ok(Found {
            stamp: Stamp::of(&m),
            entry: Entry {
                id: self.next_id,
                path: rel,
                kind,
                size,
                mode: m.mode() & 0o7777,
                mtime_ns: mtime_ns(&m),
                target,
                // A power of two, so that chunk values combine into the
                // file's BLAKE3 (--chunk is rounded down to one).
                chunk_size: self.chunk_size.map_or_else(
                    || auto_chunk_size(size, self.streams),
                    longhaul_proto::digest::usable_chunk_size,
                ),
                sparse: kind == Kind::File && m.blocks() * 512 < size,
                incomplete: false,
                digest: None,
                part: None,
            },
            path,
        })
    }

    /// Asks the share's feed for more once what it gave is announced:
    /// false when it says later (the walk waits; it has not ended).
    pub(super) fn refill(&mut self, m: &Source<Handle>) -> bool {
        if !self.share.is_empty() {
            return true;
        }
        let Some(feed) = &self.feed else {
            return true;
        };
        let in_flight = InFlight {
            files: m.in_flight(),
            unsent: m.unsent_bytes(),
            sent: m.tally().read_bytes,
        };
        match feed(in_flight) {
            Fed::More(items) => {
                self.share.extend(items);
                true
            }
            // Nothing in flight to wait for: asking later would idle.
            Fed::Later if in_flight.files > 0 => false,
            Fed::Later | Fed::End => {
                self.feed = None;
                true
            }
        }
    }

    /// `path` as messages name it: under the anchor's shown root (an
    /// export's name) when the walk has one, so that a server's absolute
    /// paths reach no peer.
    fn shown(&self, path: &Path) -> PathBuf {
        match &self.anchor {
            Some(a) => a.show(path),
            None => path.to_path_buf(),
        }
    }

    fn excluded(&self, rel: &str, is_dir: bool) -> bool {
        self.filter
            .as_ref()
            .is_some_and(|f| f.excludes_entry(rel, is_dir))
    }

    fn mark_failed(&mut self) {
        if let Some(l) = self.level_failed.last_mut() {
            *l = true;
        }
    }

    /// The next entry, a failure to report, or `None` at the end.
    pub(super) fn next(&mut self) -> Option<Result<Found, Failure>> {
        if let Some(item) = self.share.pop_front() {
            return Some(self.shared(item));
        }
        loop {
            let step = if self.stack.is_empty() {
                let root = self.roots.pop_front()?;
                let name = root_name(&root);
                self.entry(root, name, None).transpose()
            } else {
                self.listed()
            };
            if step.is_some() {
                return step;
            }
        }
    }

    /// One step of the innermost listing: an entry, a failure, or None
    /// when this step has nothing to announce.
    fn listed(&mut self) -> Option<Result<Found, Failure>> {
        let (rd, prefix, dir) = self.stack.last_mut()?;
        let (prefix, dir) = (prefix.clone(), dir.clone());
        match rd.next() {
            None => self.dir_end(prefix).map(Ok),
            Some(Err(e)) => {
                self.mark_failed();
                Some(Err(Failure {
                    path: prefix,
                    error: format!("cannot list: {e}"),
                }))
            }
            Some(Ok(de)) => self.child(&de, &prefix, &dir),
        }
    }

    /// Closes the innermost listing: its `DirEnd`, if the transfer
    /// sends them.
    fn dir_end(&mut self, prefix: String) -> Option<Found> {
        self.stack.pop();
        // Only this directory's own listing counts: a child that failed
        // was either announced (and so kept) or marked this level already.
        let incomplete = self.level_failed.pop().unwrap_or(false);
        if !self.dir_ends {
            return None;
        }
        self.next_id += 1;
        Some(Found {
            entry: Entry {
                id: self.next_id,
                path: prefix,
                kind: Kind::DirEnd,
                size: 0,
                mode: 0,
                mtime_ns: 0,
                target: None,
                chunk_size: 0,
                sparse: false,
                incomplete,
                digest: None,
                part: None,
            },
            path: PathBuf::new(),
            stamp: Stamp::default(),
        })
    }

    /// An entry of the listing of `dir` (announced as `prefix`): None for
    /// a name that is never data.
    fn child(
        &mut self,
        de: &std::fs::DirEntry,
        prefix: &str,
        dir: &Path,
    ) -> Option<Result<Found, Failure>> {
        let Some(name) = de.file_name().to_str().map(str::to_string) else {
            self.mark_failed();
            return Some(Err(Failure {
                path: format!("{prefix}/{}", de.file_name().to_string_lossy()),
                error: "name is not UTF-8; skipped".into(),
            }));
        };
        // A sink's partial files, journals and marks are never data: a
        // later pull or push must not carry one.
        if is_reserved_name(&name) {
            return None;
        }
        let rel = format!("{prefix}/{name}");
        // Left out by the rules: not described, and (a directory) not
        // walked. The type comes with the listing; no stat is needed.
        if self.filter.is_some() {
            let is_dir = de.file_type().is_ok_and(|t| t.is_dir());
            if self.excluded(&rel, is_dir) {
                return None;
            }
        }
        // fstatat relative to the listed directory, never following a
        // final link: no walk of the path.
        let meta = de.metadata().ok();
        match self.entry(dir.join(de.file_name()), rel, meta) {
            Ok(found) => found.map(Ok),
            Err(f) => {
                self.mark_failed();
                Some(Err(f))
            }
        }
    }
}

/// Every entry a walk of `roots` finds, named and sized as a transfer of
/// them would announce it (chunk sizes for `streams` streams unless
/// `chunk_size` is set), in walk order; and what could not be read. The
/// manifest a fleet's ranks share is made of it.
pub fn walk(
    roots: &[PathBuf],
    recursive: bool,
    chunk_size: Option<u64>,
    streams: u16,
) -> (Vec<(Entry, PathBuf)>, Vec<Failure>) {
    walk_beneath(None, roots, recursive, chunk_size, streams)
}

/// [`walk`] of roots beneath `anchor` (an export's root), when there is
/// one: each path reached beneath it, and named under its shown name.
pub fn walk_beneath(
    anchor: Option<Arc<Anchor>>,
    roots: &[PathBuf],
    recursive: bool,
    chunk_size: Option<u64>,
    streams: u16,
) -> (Vec<(Entry, PathBuf)>, Vec<Failure>) {
    let mut walker = Walker::new(
        roots.iter().cloned().collect(),
        recursive,
        chunk_size,
        streams,
    );
    walker.anchor = anchor;
    let (mut found, mut failed) = (Vec::new(), Vec::new());
    while let Some(next) = walker.next() {
        match next {
            Ok(f) => found.push((f.entry, f.path)),
            Err(f) => failed.push(f),
        }
    }
    (found, failed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    /// `root/` with a file, an empty directory, a nested file, a link, a
    /// sink's partial file, an odd but valid name and a name that is not
    /// UTF-8.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("temp dir");
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"hello").unwrap();
        std::fs::write(root.join("sub/b.bin"), vec![7u8; 1000]).unwrap();
        std::fs::write(root.join(".a.txt.lhpart"), b"partial").unwrap();
        std::fs::write(root.join("sp ace é\n.txt"), b"x").unwrap();
        std::os::unix::fs::symlink("sub/missing", root.join("link")).unwrap();
        let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
        std::fs::write(root.join(bad), b"y").unwrap();
        t
    }

    fn all(w: &mut Walker) -> (Vec<Found>, Vec<Failure>) {
        let (mut found, mut failed) = (Vec::new(), Vec::new());
        while let Some(next) = w.next() {
            match next {
                Ok(f) => found.push(f),
                Err(f) => failed.push(f),
            }
        }
        (found, failed)
    }

    fn kind_of<'a>(found: &'a [Found], path: &str) -> Option<&'a Entry> {
        found
            .iter()
            .map(|f| &f.entry)
            .find(|e| e.path == path && e.kind != Kind::DirEnd)
    }

    #[test]
    fn walks_a_tree_with_odd_names_links_and_empty_directories() {
        let t = tree();
        let mut w = Walker::new([t.path().join("root")].into(), true, None, 4);
        w.dir_ends = true;
        let (found, failed) = all(&mut w);

        assert_eq!(kind_of(&found, "root").map(|e| e.kind), Some(Kind::Dir));
        assert_eq!(
            kind_of(&found, "root/empty").map(|e| e.kind),
            Some(Kind::Dir)
        );
        let a = kind_of(&found, "root/a.txt").expect("a.txt announced");
        assert_eq!((a.kind, a.size), (Kind::File, 5));
        assert!(a.chunk_size.is_power_of_two());
        let b = kind_of(&found, "root/sub/b.bin").expect("nested file announced");
        assert_eq!(b.size, 1000);
        assert!(kind_of(&found, "root/sp ace é\n.txt").is_some());
        // A link is sent as itself (dangling or not), never followed.
        let link = kind_of(&found, "root/link").expect("link announced");
        assert_eq!(link.kind, Kind::Symlink);
        assert_eq!(link.target.as_deref(), Some("sub/missing"));
        // A sink's partial file is never data.
        assert!(found.iter().all(|f| !f.entry.path.contains("lhpart")));
        // The name that is not UTF-8 is a failure of its own...
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].path, "root/bad\u{fffd}");
        assert!(failed[0].error.contains("not UTF-8"), "{}", failed[0].error);
        // ...and marks its directory's end incomplete (nothing deleted
        // there), but not its siblings'.
        let end = |p: &str| {
            found
                .iter()
                .find(|f| f.entry.kind == Kind::DirEnd && f.entry.path == p)
                .map(|f| f.entry.incomplete)
        };
        assert_eq!(end("root"), Some(true));
        assert_eq!(end("root/empty"), Some(false));
        assert_eq!(end("root/sub"), Some(false));
        // A directory ends after everything in it.
        let at = |p: &str, k: Kind| {
            found
                .iter()
                .position(|f| f.entry.path == p && f.entry.kind == k)
                .unwrap()
        };
        assert!(at("root/sub/b.bin", Kind::File) < at("root/sub", Kind::DirEnd));
        // Ids are fresh and rising.
        assert!(found.windows(2).all(|p| p[0].entry.id < p[1].entry.id));
    }

    #[test]
    fn plain_walk_sends_no_dir_ends_and_names_roots_by_their_last_component() {
        let t = tree();
        let (found, _) = walk(&[t.path().join("root/sub/")], true, Some(100 << 10), 1);
        let paths: Vec<_> = found.iter().map(|(e, _)| e.path.as_str()).collect();
        assert_eq!(paths, ["sub", "sub/b.bin"]);
        // --chunk is rounded down to a power of two.
        assert_eq!(found[1].0.chunk_size, 64 << 10);
        assert_eq!(root_name(Path::new("/")), "root");
        assert_eq!(root_name(&t.path().join("root/sub/..")), "root");
    }

    /// An excluded directory is not walked: a FIFO inside it (which the
    /// walk would report as a failure) is never seen; an excluded root is
    /// left out whole.
    #[test]
    fn excluded_directories_are_not_walked() {
        let t = tree();
        let skipped = t.path().join("root/skipped");
        std::fs::create_dir(&skipped).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            skipped.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let rules = ["- skipped/".to_string(), "- *.bin".to_string()];
        let mut w = Walker::new([t.path().join("root")].into(), true, None, 1);
        w.filter = Some(Arc::new(Filter::new(&rules, false).unwrap()));
        let (found, failed) = all(&mut w);
        assert!(
            failed.iter().all(|f| !f.path.contains("skipped")),
            "walked into it"
        );
        let paths: Vec<&str> = found.iter().map(|f| f.entry.path.as_str()).collect();
        assert!(paths.contains(&"root/sub"), "{paths:?}");
        assert!(
            !paths
                .iter()
                .any(|p| p.contains("skipped") || p.ends_with(".bin")),
            "{paths:?}"
        );

        let rules = ["- /root".to_string()];
        let mut w = Walker::new([t.path().join("root")].into(), true, None, 1);
        w.filter = Some(Arc::new(Filter::new(&rules, false).unwrap()));
        let (found, failed) = all(&mut w);
        assert!(found.is_empty() && failed.is_empty());
    }

    #[test]
    fn a_directory_without_recursion_is_refused() {
        let t = tree();
        let (found, failed) = walk(&[t.path().join("root")], false, None, 1);
        assert!(found.is_empty());
        assert_eq!(failed.len(), 1);
        assert!(failed[0].error.contains("use -r"), "{}", failed[0].error);
    }

    #[test]
    fn a_file_announced_again_must_still_be_a_file_and_not_a_part() {
        let t = tree();
        let root = t.path().join("root");
        let mut w = Walker::new(VecDeque::new(), true, None, 1);
        let again = w.again(root.join("a.txt"), "root/a.txt".into()).unwrap();
        assert_eq!(again.entry.kind, Kind::File);
        let dir = w.again(root.join("sub"), "root/sub".into()).err().unwrap();
        assert!(
            dir.error.contains("no longer a regular file"),
            "{}",
            dir.error
        );

        let item = ShareItem {
            path: root.join("sub/b.bin"),
            rel: "root/sub/b.bin".into(),
            chunk_size: 64 << 10,
            part: Some([0, 1]),
        };
        let part = w.shared(item.clone()).unwrap();
        assert_eq!(part.entry.part, Some([0, 1]));
        let again = w.again(item.path.clone(), item.rel.clone()).err().unwrap();
        assert!(again.error.contains("other ranks"), "{}", again.error);
        // A part the file no longer has: the manifest is stale.
        let stale = w
            .shared(ShareItem {
                part: Some([1, 2]),
                ..item
            })
            .err()
            .unwrap();
        assert!(stale.error.contains("fresh manifest"), "{}", stale.error);
    }
}
