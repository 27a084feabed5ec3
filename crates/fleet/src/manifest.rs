//! The run's one manifest: every entry of the sources, sorted by the path
//! it is announced under, with the size and chunk size every rank cuts its
//! share by. One rank walks; the others read what it wrote (the run
//! directory or the queue's database), so 100 nodes do not walk one
//! parallel file system 100 times, and a rank restarted later gets the
//! share it had, whatever changed in the tree since.
//!
//! Encoded as JSON lines: a header line, then one line an entry. Its hash
//! (BLAKE3 of those bytes) names it across ranks.

use std::path::{Path, PathBuf};

use longhaul_engine::reach::End;
use longhaul_engine::xfer::source::ShareItem;
use longhaul_proto::xfer::{Failure, Kind};
use serde::{Deserialize, Serialize};

use crate::shard::{Item, Unit};

/// The format's name and version, in the header line.
pub const FORMAT: &str = "longhaul-manifest";
pub const VERSION: u32 = 1;

/// One entry: what a transfer of the sources would announce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The name it is announced under (`/`-separated, its root's name first).
    pub rel: String,
    /// Where it is read from.
    pub path: PathBuf,
    pub kind: Kind,
    pub size: u64,
    pub mtime_ns: i64,
    /// The chunk size shares are cut by (files; 0 otherwise).
    pub chunk_size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    /// The sources as the command named them.
    sources: Vec<String>,
    entries: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub sources: Vec<String>,
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Walks `sources` as `cp` would (`-r` with `recursive`); anything that
    /// cannot be read fails the walk, naming it: a fleet's share must not
    /// silently leave things out.
    pub fn walk(
        sources: &[String],
        recursive: bool,
        chunk_size: Option<u64>,
    ) -> Result<Manifest, Vec<Failure>> {
        let roots: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
        // One stream: chunk sizes depend on the file alone (see
        // `longhaul_proto::plan::auto_chunk_size`), the same on every rank.
        let (found, failed) = longhaul_engine::xfer::source::walk(&roots, recursive, chunk_size, 1);
        if !failed.is_empty() {
            return Err(failed);
        }
        let mut entries: Vec<Entry> = found
            .into_iter()
            .map(|(e, path)| Entry {
                chunk_size: if e.kind == Kind::File {
                    e.chunk_size
                } else {
                    0
                },
                rel: e.path,
                path: std::path::absolute(&path).unwrap_or(path),
                kind: e.kind,
                size: e.size,
                mtime_ns: e.mtime_ns,
            })
            .collect();
        entries.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
        entries.dedup_by(|a, b| a.rel == b.rel);
        Ok(Manifest {
            sources: sources.to_vec(),
            entries,
        })
    }

    /// The manifest of remote sources (a fleet of third-party copies):
    /// each source listed by its server (`ls -R`, PROTOCOL.md 13.3) and
    /// named as that server's walk names what it pushes: a source `dir`
    /// gives `dir` and `dir/...`, a file or link itself (a source `dir/`
    /// too gives `dir/...`: the destination leaves that name out). Each
    /// entry's `path` is its path within the source's export. A name the
    /// listing could not give as it is (not UTF-8) fails, as a walk does.
    pub fn remote(
        sources: &[End],
        recursive: bool,
        chunk_size: Option<u64>,
        client: &longhaul_engine::net::dial::ClientOptions,
    ) -> Result<Manifest, String> {
        use longhaul_engine::xfer::client::ls;
        let mut entries = Vec::new();
        for source in sources {
            let s = source.arg();
            let root = RemoteRoot::of(source)?;
            let listed =
                ls(source, recursive, client).map_err(|e| format!("cannot list {s}: {e}"))?;
            // A directory lists its contents, anything else itself: one
            // entry of the source's own name that is not a directory may
            // be either, which its parent's listing tells.
            let itself = match listed.as_slice() {
                [one]
                    if one.kind != Kind::Dir
                        && one.name == root.name
                        && !root.path.as_os_str().is_empty() =>
                {
                    let parent = root.parent();
                    ls(&parent, false, client)
                        .map_err(|e| format!("cannot list {}: {e}", parent.arg()))?
                        .into_iter()
                        .find(|e| e.name == root.name)
                        .filter(|e| e.kind != Kind::Dir)
                }
                _ => None,
            };
            let entry = |rel: String, path: PathBuf, e: &longhaul_proto::xfer::ListEntry| {
                let size = if e.kind == Kind::File { e.size } else { 0 };
                Entry {
                    rel,
                    path,
                    kind: e.kind,
                    size,
                    mtime_ns: e.mtime_ns,
                    chunk_size: if e.kind == Kind::File {
                        chunk_of(size, chunk_size)
                    } else {
                        0
                    },
                }
            };
            if let Some(e) = itself {
                entries.push(entry(root.name.clone(), root.path.clone(), &e));
                continue;
            }
            if !recursive {
                return Err(longhaul_engine::xfer::source::directory_without_r(&s));
            }
            entries.push(Entry {
                rel: root.name.clone(),
                path: root.path.clone(),
                kind: Kind::Dir,
                size: 0,
                mtime_ns: 0,
                chunk_size: 0,
            });
            for e in &listed {
                if e.name.contains('\u{fffd}') {
                    return Err(format!(
                        "{s}: an entry's name is not UTF-8 ({}); rename it or leave it out",
                        e.name
                    ));
                }
                entries.push(entry(
                    format!("{}/{}", root.name, e.name),
                    root.path.join(&e.name),
                    e,
                ));
            }
        }
        entries.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
        entries.dedup_by(|a, b| a.rel == b.rel);
        Ok(Manifest {
            sources: sources.iter().map(|s| s.arg().to_string()).collect(),
            entries,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(&Header {
            format: FORMAT.into(),
            version: VERSION,
            sources: self.sources.clone(),
            entries: self.entries.len() as u64,
        })
        .expect("a header serializes");
        out.push(b'\n');
        for e in &self.entries {
            serde_json::to_writer(&mut out, e).expect("an entry serializes");
            out.push(b'\n');
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let mut lines = bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        let head: Header = lines
            .next()
            .ok_or("the manifest is empty")
            .and_then(|l| serde_json::from_slice(l).map_err(|_| "its header is not JSON"))
            .map_err(|e| format!("not a longhaul manifest: {e}"))?;
        if head.format != FORMAT || head.version != VERSION {
            return Err(format!(
                "not a manifest this build reads: {} version {} (this build reads {FORMAT} version {VERSION})",
                head.format, head.version
            ));
        }
        let entries = lines
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_slice::<Entry>(l)
                    .map_err(|e| format!("manifest line {}: {e}", i + 2))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if entries.len() as u64 != head.entries {
            return Err(format!(
                "the manifest is cut short: {} of its {} entries",
                entries.len(),
                head.entries
            ));
        }
        Ok(Manifest {
            sources: head.sources,
            entries,
        })
    }

    /// The manifest's name across ranks: BLAKE3 of its encoding, in hex.
    pub fn hash(&self) -> String {
        blake3::hash(&self.encode()).to_hex()[..32].to_string()
    }

    /// What the shard planner weighs.
    pub fn items(&self) -> Vec<Item> {
        self.entries
            .iter()
            .map(|e| Item {
                size: e.size,
                chunk_size: e.chunk_size,
                file: e.kind == Kind::File,
            })
            .collect()
    }

    /// The entries of `units`, as a transfer announces them.
    pub fn share(&self, units: &[Unit]) -> Vec<ShareItem> {
        let mut out = Vec::new();
        for u in units {
            for e in self
                .entries
                .iter()
                .take(u.end as usize)
                .skip(u.first as usize)
            {
                out.push(ShareItem {
                    path: e.path.clone(),
                    rel: e.rel.clone(),
                    chunk_size: e.chunk_size,
                    part: u.chunks,
                });
            }
        }
        out
    }

    pub fn files(&self) -> u64 {
        self.entries.iter().filter(|e| e.kind == Kind::File).count() as u64
    }

    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Reads a manifest file (the run directory's).
    pub fn read(path: &Path) -> Result<Manifest, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Manifest::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The chunk size a walk gives a file of `size` bytes (one stream, as
/// [`Manifest::walk`] asks: see `longhaul_engine::xfer::source::walk`).
fn chunk_of(size: u64, chunk_size: Option<u64>) -> u64 {
    chunk_size.map_or_else(
        || longhaul_proto::plan::auto_chunk_size(size, 1),
        longhaul_proto::digest::usable_chunk_size,
    )
}

/// A remote source as the fleet names it: its path within its export, in
/// the form a walk gives (no `.`, no `//`), and the name its entries are
/// announced under (its last component; the export's name for the
/// export's root, whose own name only its server knows: the destination
/// of a source `EXPORT/` leaves it out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRoot {
    pub host: String,
    pub export: String,
    pub path: PathBuf,
    pub name: String,
}

impl RemoteRoot {
    pub fn of(source: &End) -> Result<RemoteRoot, String> {
        let r = source
            .server()
            .ok_or_else(|| format!("{} is not a remote source", source.arg()))?;
        let comps = longhaul_proto::xfer::components(&r.path).map_err(|e| e.to_string())?;
        Ok(RemoteRoot {
            name: comps
                .last()
                .map_or_else(|| r.export.clone(), |c| c.to_string()),
            path: comps.iter().collect(),
            host: r.host.clone(),
            export: r.export.clone(),
        })
    }

    /// The directory that holds it, on its server.
    fn parent(&self) -> End {
        let parent = self.path.parent().unwrap_or(Path::new(""));
        End::on_server(longhaul_proto::xfer::Remote {
            host: self.host.clone(),
            export: self.export.clone(),
            path: parent.display().to_string(),
            dir: parent.as_os_str().is_empty(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rel: &str, kind: Kind, size: u64) -> Entry {
        Entry {
            rel: rel.into(),
            path: PathBuf::from("/src").join(rel),
            kind,
            size,
            mtime_ns: 7,
            chunk_size: if kind == Kind::File { 1 << 20 } else { 0 },
        }
    }

    #[test]
    fn a_manifest_decodes_to_itself_and_its_hash_follows_its_content() {
        let m = Manifest {
            sources: vec!["/src/a".into()],
            entries: vec![
                entry("a", Kind::Dir, 0),
                entry("a/x y", Kind::File, 5 << 20),
                entry("a/\u{e9}", Kind::Symlink, 0),
            ],
        };
        let back = Manifest::decode(&m.encode()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.hash(), m.hash());
        let mut other = m.clone();
        other.entries[1].size += 1;
        assert_ne!(other.hash(), m.hash());
    }

    #[test]
    fn a_manifest_cut_short_or_of_another_format_is_refused() {
        let m = Manifest {
            sources: vec!["s".into()],
            entries: vec![entry("s", Kind::Dir, 0), entry("s/f", Kind::File, 1)],
        };
        let bytes = m.encode();
        let cut = &bytes[..bytes.len() - 10];
        assert!(Manifest::decode(cut).is_err());
        assert!(Manifest::decode(
            b"{\"format\":\"other\",\"version\":1,\"sources\":[],\"entries\":0}\n"
        )
        .unwrap_err()
        .contains("not a manifest this build reads"));
        assert!(Manifest::decode(b"").is_err());
    }
}
