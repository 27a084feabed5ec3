//! Helpers of the file-transfer tests: reproducible data, servers in this
//! process, journals, trees compared byte for byte.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_engine::server::{ServeConfig, Server, ServerHandle};
use longhaul_engine::xfer::storage::{Faults, Faulty, Local, Storage};
use longhaul_engine::xfer::Export;
use serde_json::Value;

use super::{assert_exit, bin, stderr, stdout};

pub use longhaul_testkit::data::{write_random, write_text, Rng, MIB};

/// Journal layout: a header, then one record per verified chunk.
pub const JOURNAL_HEADER: u64 = 32;
pub const JOURNAL_RECORD: u64 = 36;

pub fn longhaul(args: &[&str]) -> Output {
    bin()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run longhaul")
}

pub fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): exit {:?} stdout {} stderr {}",
            o.status,
            stdout(o),
            stderr(o)
        )
    })
}

/// Runs `cp ... --json`, asserts exit 0 and returns the document.
#[track_caller]
pub fn cp_ok(args: &[&str]) -> Value {
    let o = longhaul(&[&["cp", "--json"], args].concat());
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["failed"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["verified"], true, "{v}");
    v
}

pub fn export(name: &str, root: &Path, read_only: bool) -> Export {
    Export {
        name: name.into(),
        root: root.canonicalize().unwrap(),
        read_only,
        public: false,
    }
}

/// An in-process server with `cfg`, on loopback.
pub fn spawn_server(cfg: ServeConfig) -> ServerHandle {
    Server::bind(&[SocketAddr::from(([127, 0, 0, 1], 0))], cfg)
        .expect("bind loopback")
        .spawn()
}

/// The settings of a server exporting `root` as `data`, its state in
/// `state`, every other setting at its default.
pub fn data_config(root: &Path, state: &Path, read_only: bool) -> ServeConfig {
    ServeConfig {
        exports: vec![export("data", root, read_only)],
        state_dir: super::prepare_state(state),
        ..ServeConfig::default()
    }
}

pub fn server_with(exports: Vec<Export>, storage: Arc<dyn Storage>, state: &Path) -> ServerHandle {
    spawn_server(ServeConfig {
        exports,
        storage,
        sync_files: false,
        state_dir: super::prepare_state(state),
        ..ServeConfig::default()
    })
}

/// `longhaul --archive ARCHIVE ARGS...`, stdin closed.
pub fn with_archive(archive: &Path, args: &[&str]) -> Output {
    bin()
        .arg("--archive")
        .arg(archive)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run longhaul")
}

/// A push of one file of `len` bytes to a fresh server through
/// `longhaul --archive ARCHIVE cp`: whatever the archive does, the file
/// must land. What the client said on stderr.
pub fn push_archived(archive: &Path, len: usize) -> String {
    let t = super::TempDir::new("archived-push");
    let src = t.path().join("f");
    write_random(&src, len, 4);
    let exp = t.dir("export");
    let s = data_server(&exp, &t.dir("state"));
    let o = with_archive(
        archive,
        &["cp", src.to_str().unwrap(), &remote(s.addr(), "")],
    );
    assert_exit(&o, 0);
    assert_same_file(&src, &exp.join("f"));
    stderr(&o)
}

/// [`with_archive`], which must succeed: its `--json` output.
pub fn json_ok(archive: &Path, args: &[&str]) -> Value {
    let o = with_archive(archive, args);
    assert_exit(&o, 0);
    json_of(&o)
}

/// A server exporting `root` as `data`, on the local file system.
pub fn data_server(root: &Path, state: &Path) -> ServerHandle {
    server_with(vec![export("data", root, false)], Arc::new(Local), state)
}

pub fn faulty(f: Faults) -> Arc<dyn Storage> {
    Arc::new(Faulty {
        faults: Arc::new(f),
    })
}

/// `--token-file=HOST=FILE` for the server of each remote path: a
/// credential of its own for each (here the tests' one token, which every
/// test server grants), as a third-party copy between two servers takes.
pub fn tokens_for(paths: &[&str]) -> Vec<String> {
    let file = std::env::temp_dir().join(format!("longhaul-test-token-{}", std::process::id()));
    longhaul_testkit::data::write_secret(&file, super::TOKEN);
    paths
        .iter()
        .filter_map(|p| longhaul_proto::xfer::parse_remote(p))
        .map(|r| format!("--token-file={}={}", r.host, file.display()))
        .collect()
}

/// `HOST:PORT:data/path`
pub fn remote(addr: SocketAddr, path: &str) -> String {
    format!("{}:{}:data/{path}", addr.ip(), addr.port())
}

/// The partial-file names the sink uses next to `target`.
pub fn side(target: &Path, suffix: &str) -> PathBuf {
    let name = target.file_name().unwrap().to_str().unwrap();
    target.with_file_name(format!(".{name}.{suffix}"))
}

/// Chunk indices recorded in a journal (whole records only).
pub fn journal_indices(journal: &Path) -> Vec<u32> {
    let b = fs::read(journal).unwrap_or_default();
    if (b.len() as u64) < JOURNAL_HEADER {
        return Vec::new();
    }
    b[JOURNAL_HEADER as usize..]
        .chunks_exact(JOURNAL_RECORD as usize)
        .map(|r| u32::from_le_bytes(r[..4].try_into().unwrap()))
        .collect()
}

pub fn journal_records(journal: &Path) -> u64 {
    fs::metadata(journal)
        .map(|m| m.len().saturating_sub(JOURNAL_HEADER) / JOURNAL_RECORD)
        .unwrap_or(0)
}

/// Polls until `journal` holds at least `n` records; panics (after killing
/// `child`) if the transfer ends or `limit` passes first.
pub fn wait_for_records(journal: &Path, n: u64, child: &mut Child, limit: Duration) {
    let start = Instant::now();
    loop {
        if journal_records(journal) >= n {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "the transfer ended ({st}) before {} had {n} records: too fast to interrupt",
                journal.display()
            );
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{} never reached {n} records", journal.display());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until a file's length has not changed for `quiet`.
pub fn wait_quiet(path: &Path, quiet: Duration) {
    let mut last = (fs::metadata(path).map(|m| m.len()).ok(), Instant::now());
    let start = Instant::now();
    while last.1.elapsed() < quiet {
        assert!(start.elapsed() < Duration::from_secs(30), "never quiet");
        std::thread::sleep(Duration::from_millis(20));
        let now = fs::metadata(path).map(|m| m.len()).ok();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
}

#[track_caller]
pub fn assert_same_file(a: &Path, b: &Path) {
    let x = fs::read(a).unwrap_or_else(|e| panic!("read {}: {e}", a.display()));
    let y = fs::read(b).unwrap_or_else(|e| panic!("read {}: {e}", b.display()));
    assert_eq!(
        x.len(),
        y.len(),
        "{} and {} differ in length",
        a.display(),
        b.display()
    );
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ at byte {i}", a.display(), b.display());
    }
}

#[derive(Debug, PartialEq)]
pub enum Node {
    File(Vec<u8>),
    Dir,
    Link(PathBuf),
}

/// Every entry beneath `root` (and `root` itself as ""), with its kind,
/// content or target, mtime in ns and permission bits.
pub fn snapshot(root: &Path) -> BTreeMap<String, (Node, i64, u32)> {
    fn walk(base: &Path, rel: &str, out: &mut BTreeMap<String, (Node, i64, u32)>) {
        let p = if rel.is_empty() {
            base.to_path_buf()
        } else {
            base.join(rel)
        };
        let m = fs::symlink_metadata(&p).unwrap();
        let mtime = m.mtime() * 1_000_000_000 + m.mtime_nsec();
        let mode = m.mode() & 0o7777;
        let node = if m.file_type().is_symlink() {
            Node::Link(fs::read_link(&p).unwrap())
        } else if m.is_dir() {
            for de in fs::read_dir(&p).unwrap() {
                let name = de.unwrap().file_name().into_string().unwrap();
                let child = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                walk(base, &child, out);
            }
            Node::Dir
        } else {
            Node::File(fs::read(&p).unwrap())
        };
        out.insert(rel.to_string(), (node, mtime, mode));
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

/// Trees are identical: the same names, kinds, bytes, link targets and
/// mtimes, and with `modes` the same permission bits (links excepted).
#[track_caller]
pub fn assert_same_tree(src: &Path, dst: &Path, modes: bool) {
    let a = snapshot(src);
    let b = snapshot(dst);
    let names_a: Vec<&String> = a.keys().collect();
    let names_b: Vec<&String> = b.keys().collect();
    assert_eq!(
        names_a,
        names_b,
        "{} and {} hold different names",
        src.display(),
        dst.display()
    );
    for (name, (na, ta, ma)) in &a {
        let (nb, tb, mb) = &b[name];
        match (na, nb) {
            (Node::File(x), Node::File(y)) => {
                assert_eq!(x.len(), y.len(), "'{name}' differs in length");
                if let Some(i) = x.iter().zip(y).position(|(p, q)| p != q) {
                    panic!("'{name}' differs at byte {i}");
                }
            }
            (x, y) => assert_eq!(x, y, "'{name}' differs"),
        }
        assert_eq!(ta, tb, "mtime of '{name}' in {} differs", dst.display());
        if modes && !matches!(na, Node::Link(_)) {
            assert_eq!(ma, mb, "mode of '{name}': {ma:o} vs {mb:o}");
        }
    }
}

/// No partial or journal file anywhere beneath `root`.
#[track_caller]
pub fn assert_no_leftovers(root: &Path) {
    for (name, _) in snapshot(root) {
        assert!(
            !name.ends_with(".lhpart") && !name.ends_with(".lhjournal"),
            "left behind: {name}"
        );
    }
}

/// Builds the tree for the round trip; returns how many regular files it has.
pub fn build_tree(root: &Path) -> u64 {
    let mut rng = Rng::new(7);
    let mut files = 0;
    fs::create_dir_all(root).unwrap();
    write_random(&root.join("big file.bin"), 5 * MIB as usize + 12345, 1);
    files += 1;
    // A few hundred small files of random sizes, some empty, over a few dirs.
    let dirs = ["", "small", "small/a", "dir with space", "ünïcødé ☃ 日本"];
    for i in 0..300u64 {
        let d = dirs[(i % dirs.len() as u64) as usize];
        let size = if i % 10 == 0 { 0 } else { rng.below(70_000) };
        let name = match i % 3 {
            0 => format!("f{i}.dat"),
            1 => format!("file {i} with spaces.txt"),
            _ => format!("größe-{i}-ファイル"),
        };
        write_random(&root.join(d).join(name), size as usize, 100 + i);
        files += 1;
    }
    write_random(&root.join("small/f5.dat"), 4321, 3);
    files += 1;
    // Ten levels deep, with a file at the bottom and an empty dir there too.
    let mut deep = root.join("deep");
    for l in 0..10 {
        deep = deep.join(format!("level {l}"));
    }
    write_random(&deep.join("bottom.bin"), 3000, 2);
    files += 1;
    fs::create_dir_all(deep.join("empty at the bottom")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("empty ünï")).unwrap();
    // Relative links: to a file in another dir, and to a dir.
    std::os::unix::fs::symlink("../small/f5.dat", root.join("dir with space/link to f5")).unwrap();
    std::os::unix::fs::symlink("deep/level 0", root.join("link-to-deep")).unwrap();
    // Some modes to keep with -p.
    fs::set_permissions(root.join("small/f5.dat"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(root.join("big file.bin"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(root.join("f0.dat"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("small"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o700)).unwrap();
    // Varied mtimes, in the past and with nanoseconds, set last so that
    // creating children does not change them.
    stamp(&root.join("big file.bin"), 1_500_000_000, 123_456_789);
    stamp(&root.join("small/f5.dat"), 1_600_000_000, 1);
    stamp(&root.join("empty"), 1_400_000_000, 999_999_999);
    stamp(&deep, 1_300_000_000, 5);
    stamp(&root.join("small"), 1_550_000_000, 42);
    files
}

/// Sets a path's mtime (and atime) without following links, via `touch -h`
/// so the test needs no libc dependency.
pub fn stamp(p: &Path, secs: i64, ns: i64) {
    let st = Command::new("touch")
        .arg("-h")
        .arg("-d")
        .arg(format!("@{secs}.{ns:09}"))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}
