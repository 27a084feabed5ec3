//! The release `scripts/release.sh` makes (issue 47) and what `--copy-binary`
//! does with it: the portable binary links nothing newer than glibc 2.17 and
//! runs here, the archive holds what it says, and a far host whose glibc is
//! older than this build's gets the portable build, checked first; a host
//! that no build fits gets told what to do.
//!
//! The release is read from `target/dist/` (`bash scripts/release.sh`), and
//! only if it is of this build's commit: a stale one counts as missing. Where
//! it is missing the tests that need it skip, saying so; with
//! `LONGHAUL_REQUIRE_DIST=1` (CI's packaging phase) they fail instead. The
//! far host is this one through the test's private sshd, made to look older,
//! of another machine or with musl by fake `getconf`, `ldd` and `uname` first
//! on the far PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::require;
use crate::common::sshd::{sshd, Sshd, BIN, HOST};

/// The newest glibc the binary at `path` links (`GLIBC_x.y` among the
/// versions it needs), by binutils' readelf.
fn glibc_needed(path: &Path) -> (u32, u32) {
    let o = Command::new("readelf")
        .args(["--version-info", "--wide"])
        .arg(path)
        .output()
        .expect("readelf (binutils)");
    assert!(o.status.success(), "readelf {}", path.display());
    let text = String::from_utf8_lossy(&o.stdout);
    let needs = text
        .split_once(".gnu.version_r")
        .unwrap_or_else(|| panic!("{} needs no versions: {text}", path.display()))
        .1;
    needs
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let (a, b) = v.split_once('.')?;
            let b = b.split('.').next()?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .max()
        .unwrap_or_else(|| panic!("{} links no glibc version", path.display()))
}

fn first_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `tree`'s sibling `tree.EXT` (the release's name holds dots of its own).
fn beside(tree: &Path, ext: &str) -> PathBuf {
    let name = tree.file_name().unwrap().to_str().unwrap();
    tree.with_file_name(format!("{name}.{ext}"))
}

/// The release's tree (`target/dist/longhaul-V-x86_64-linux-gnu/`), if it
/// is there and of this build; else says what is missing.
fn dist() -> Option<PathBuf> {
    let name = format!(
        "longhaul-{}-{}-linux-gnu",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    let tree = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/dist")
        .join(name);
    let version = |bin: &Path| Command::new(bin).arg("--version").output().ok();
    let ours = first_line(&version(Path::new(BIN)).unwrap());
    let why = match version(&tree.join("longhaul")) {
        None => format!("no release in {} (bash scripts/release.sh)", tree.display()),
        Some(o) if first_line(&o) != ours => format!(
            "the release in {} is '{}', this build is '{ours}' (bash scripts/release.sh)",
            tree.display(),
            first_line(&o)
        ),
        Some(_) => return Some(tree),
    };
    require::missing("DIST", &why);
    None
}

#[test]
fn the_portable_binary_needs_glibc_2_17_at_most_and_runs_here() {
    let Some(tree) = dist() else { return };
    let bin = tree.join("longhaul");
    let needed = glibc_needed(&bin);
    assert!(
        needed <= (2, 17),
        "{} links GLIBC_{}.{}: newer than 2.17",
        bin.display(),
        needed.0,
        needed.1
    );
    // Stripped, its debug info in the file its .gnu_debuglink names.
    let sections = Command::new("readelf")
        .args(["--sections", "--wide"])
        .arg(&bin)
        .output()
        .unwrap();
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(!sections.contains(".debug_info"), "not stripped");
    assert!(!sections.contains(".symtab"), "not stripped");
    assert!(sections.contains(".gnu_debuglink"), "no debug link");
    let debug = beside(&tree, "debug");
    let debug_sections = Command::new("readelf")
        .args(["--sections", "--wide"])
        .arg(&debug)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&debug_sections.stdout).contains(".debug_info"),
        "{} holds no debug info",
        debug.display()
    );
    // The README's first command: TLS, perf over TCP and UDP, a verified cp.
    let o = Command::new(&bin).arg("demo").output().unwrap();
    assert!(
        o.status.success(),
        "the portable binary's demo failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_release_archive_holds_the_binary_pages_completions_service_and_licences() {
    let Some(tree) = dist() else { return };
    let archive = beside(&tree, "tar.gz");
    let o = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(o.status.success(), "tar -tzf {}", archive.display());
    let listed = String::from_utf8_lossy(&o.stdout);
    let name = tree.file_name().unwrap().to_str().unwrap();
    for want in [
        "longhaul",
        "man/man1/longhaul.1",
        "man/man1/longhaul-cp.1",
        "completions/longhaul.bash",
        "completions/_longhaul",
        "completions/longhaul.fish",
        "systemd/longhaul-serve.service",
        "systemd/serve.conf",
        "README.md",
        "docs/GUIDE.md",
        "CHANGELOG.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "SHA256SUMS",
    ] {
        assert!(
            listed.lines().any(|l| l == format!("{name}/{want}")),
            "{want} is not in {}:\n{listed}",
            archive.display()
        );
    }
    // Both checksum files verify what they list.
    for dir in [tree.as_path(), tree.parent().unwrap()] {
        let o = Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "sha256sum --check in {}: {}{}",
            dir.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let sums = std::fs::read_to_string(tree.parent().unwrap().join("SHA256SUMS")).unwrap();
    assert!(sums.contains(".deb") && sums.contains(".debug") && sums.contains(".tar.gz"));
}

/// An `--rsh` that reaches the test sshd with `fakes` (`getconf`, `ldd`,
/// `uname`, each a shell script) first on the far PATH.
fn rsh_with_fakes(s: &Sshd, dir: &Path, fakes: &[(&str, String)]) -> String {
    let bin = dir.join("fakes");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, script) in fakes {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let rsh = dir.join("rsh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nhost=$1\nshift\nexec {} \"$host\" \"PATH={}:\\$PATH; export PATH; $*\"\n",
            s.rsh(),
            bin.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
    rsh.display().to_string()
}

/// A far glibc of `v`, by `getconf GNU_LIBC_VERSION`.
fn getconf_says(v: &str) -> (&'static str, String) {
    (
        "getconf",
        format!("[ \"$1\" = GNU_LIBC_VERSION ] && {{ echo 'glibc {v}'; exit 0; }}; exec /usr/bin/getconf \"$@\""),
    )
}

/// `cp --copy-binary[=named] FILE HOST:DIR/` where longhaul is missing.
fn cp_copying(s: &Sshd, rsh: &str, named: Option<&Path>, dir: &Path) -> Output {
    let f = dir.join("f.bin");
    std::fs::write(&f, b"what the far end should get\n".repeat(4096)).unwrap();
    let far = dir.join("far");
    std::fs::create_dir_all(&far).unwrap();
    let copy = match named {
        Some(p) => format!("--copy-binary={}", p.display()),
        None => "--copy-binary".into(),
    };
    s.longhaul()
        .env("LONGHAUL_RSH", rsh)
        .args([
            "-v",
            "cp",
            "-z",
            &copy,
            "--remote-path",
            "/nonexistent/longhaul",
        ])
        .arg(&f)
        .arg(format!("{HOST}:{}/", far.display()))
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where `--copy-binary` puts `bytes` in the far home.
fn copied_name(bytes: &[u8]) -> PathBuf {
    let home = std::fs::canonicalize(std::env::var("HOME").unwrap()).unwrap();
    home.join(format!(
        ".cache/longhaul/longhaul-{}-{}",
        env!("CARGO_PKG_VERSION"),
        &blake3::hash(bytes).to_hex()[..12]
    ))
}

#[test]
fn copy_binary_sends_the_portable_build_to_a_host_with_an_older_glibc() {
    let Some(tree) = dist() else { return };
    let Some(s) = sshd() else { return };
    let ours = glibc_needed(Path::new(BIN));
    assert!(
        ours > (2, 17),
        "this build needs only glibc {}.{}: it is portable itself, so no far host needs another",
        ours.0,
        ours.1
    );
    let older = format!("{}.{}", ours.0, ours.1 - 1);
    let work = tempfile::tempdir().unwrap();
    let rsh = rsh_with_fakes(&s, work.path(), &[getconf_says(&older)]);
    let portable = std::fs::read(tree.join("longhaul")).unwrap();
    let copied = copied_name(&portable);
    // The test's far host is this host: only a copy this test made is removed.
    let was_there = copied.exists();
    let o = cp_copying(&s, &rsh, None, work.path());
    let got = std::fs::read(&copied);
    let mode = std::fs::metadata(&copied).map(|m| m.permissions().mode());
    if !was_there {
        let _ = std::fs::remove_file(&copied);
    }
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(work.path().join("far/f.bin")).unwrap(),
        std::fs::read(work.path().join("f.bin")).unwrap()
    );
    assert!(
        got.is_ok_and(|b| b == portable),
        "the far end's copy is not the portable build: {}",
        text(&o)
    );
    assert_eq!(
        mode.unwrap() & 0o777,
        0o700,
        "the copy is its owner's alone"
    );
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains(&format!("glibc {older}")) && said.contains("target/dist"),
        "the log does not say what was chosen and why: {said}"
    );
}

/// A far host no build fits: what it is, its fakes, the build named, and
/// what the error must say.
type Misfit<'a> = (
    &'a str,
    Vec<(&'a str, String)>,
    Option<&'a Path>,
    Vec<String>,
);

#[test]
fn copy_binary_says_what_to_do_when_no_build_fits_the_far_host() {
    let Some(s) = sshd() else { return };
    let ours = glibc_needed(Path::new(BIN));
    let cases: Vec<Misfit> = vec![
        (
            "another machine",
            vec![(
                "uname",
                "[ \"$1\" = -m ] && { echo aarch64; exit 0; }; exec /bin/uname \"$@\"".into(),
            )],
            None,
            vec![
                "that host is aarch64".into(),
                "--remote-path PATH".into(),
                "a build for aarch64 with --copy-binary=PATH".into(),
            ],
        ),
        (
            "musl",
            vec![
                ("getconf", "exit 1".into()),
                ("ldd", "echo 'musl libc (x86_64)' >&2; exit 1".into()),
            ],
            None,
            vec![
                "that host has musl libc".into(),
                "--remote-path PATH".into(),
            ],
        ),
        (
            "a glibc older than any build",
            vec![getconf_says("2.12")],
            None,
            vec!["glibc 2.12 is older than any longhaul build runs on (2.17)".into()],
        ),
        (
            "a glibc older than the one build named",
            vec![getconf_says(&format!("{}.{}", ours.0, ours.1 - 1))],
            Some(Path::new(BIN)),
            vec![
                format!("it needs glibc {}.{}", ours.0, ours.1),
                "bash scripts/release.sh".into(),
                "--copy-binary=PATH".into(),
            ],
        ),
    ];
    for (what, fakes, named, want) in cases {
        let work = tempfile::tempdir().unwrap();
        let rsh = rsh_with_fakes(&s, work.path(), &fakes);
        let o = cp_copying(&s, &rsh, named, work.path());
        assert_eq!(o.status.code(), Some(3), "{what}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        for w in &want {
            assert!(err.contains(w.as_str()), "{what}: no '{w}' in: {err}");
        }
        assert!(
            !err.contains("copied"),
            "{what}: copied a build that cannot run: {err}"
        );
        assert!(!work.path().join("far/f.bin").exists(), "{what}");
    }
}
