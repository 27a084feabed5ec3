//! What the end-to-end tests share: one server identity and one token, so
//! that the binary, as a client, trusts and is let in by every server the
//! tests start (in this process or as `longhaul serve`).
//!
//! What every crate's tests share (require-or-skip, temporary directories,
//! the private sshd, PostgreSQL, data generators, the kernel's counters)
//! is the test kit, `crates/testkit`; it is re-exported here under the
//! names these tests have always used (`common::require`, `common::pg`,
//! `common::TempDir`, ...). What is here is this binary's own.

#![allow(dead_code)]

pub mod http;
pub mod launchers;
pub mod ontime;
pub mod served;
pub mod sshd;
pub mod wan;
pub mod xfer;

// Every name of the kit, used or not by today's tests (tests being written use them).
#[allow(unused_imports)]
pub use longhaul_testkit::{counters, free_port, pg, require, wait_until, Owned, TempDir};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use longhaul_engine::net::tls::{Identity, IDENTITY_FILE};
use longhaul_engine::server::auth::{self, ExportGrant};

/// The token every test server grants (every export, read-write).
pub const TOKEN: &str = "lh1_7e570000_testsecret-testsecret-testsecret-0123";

/// The shared identity's directory and fingerprint.
pub fn identity() -> &'static (PathBuf, String) {
    static ID: OnceLock<(PathBuf, String)> = OnceLock::new();
    ID.get_or_init(|| {
        let dir = std::env::temp_dir().join("longhaul-test-identity");
        let (id, _) = Identity::load_or_create(&dir).expect("test identity");
        (dir, id.fingerprint())
    })
}

pub fn fingerprint() -> &'static str {
    &identity().1
}

/// Puts the shared identity and a grant for [`TOKEN`] into a server's
/// state directory; returns it.
pub fn prepare_state(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(format!(".id.{}", std::process::id()));
    std::fs::copy(identity().0.join(IDENTITY_FILE), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join(IDENTITY_FILE)).unwrap();
    let granted = auth::list(dir)
        .map(|g| g.iter().any(|g| TOKEN.contains(&g.id)))
        .unwrap_or(false);
    if !granted {
        auth::add_token(
            dir,
            TOKEN,
            vec![ExportGrant {
                name: "*".into(),
                write: true,
            }],
            "tests",
        )
        .unwrap();
    }
    dir.to_path_buf()
}

/// The binary, trusting the shared identity and holding [`TOKEN`], with a
/// known-hosts file of its own (never the user's).
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    c.env("LONGHAUL_TRUST", fingerprint())
        .env("LONGHAUL_TOKEN", TOKEN)
        .env(
            "LONGHAUL_KNOWN_HOSTS",
            std::env::temp_dir().join("longhaul-test-known-hosts"),
        )
        .env("LONGHAUL_PATHS", paths_file())
        // Runs (and what a `serve` serves) go to a test archive, never the user's.
        .env("LONGHAUL_ARCHIVE", archive_file());
    c
}

/// What [`bin`] sets, for a launcher to hand to every rank it starts.
pub fn client_env() -> Vec<(&'static str, String)> {
    vec![
        ("LONGHAUL_TRUST", fingerprint().to_string()),
        ("LONGHAUL_TOKEN", TOKEN.to_string()),
        (
            "LONGHAUL_KNOWN_HOSTS",
            std::env::temp_dir()
                .join("longhaul-test-known-hosts")
                .display()
                .to_string(),
        ),
        ("LONGHAUL_PATHS", paths_file().display().to_string()),
        ("LONGHAUL_ARCHIVE", archive_file().display().to_string()),
    ]
}

/// This test process's own archive (never the user's).
pub fn archive_file() -> PathBuf {
    std::env::temp_dir().join(format!(
        "longhaul-test-archive-{}/archive.db",
        std::process::id()
    ))
}

/// This test process's own file of remembered path rates (never the
/// user's, never another test's).
pub fn paths_file() -> PathBuf {
    std::env::temp_dir().join(format!("longhaul-test-paths-{}.json", std::process::id()))
}

/// A tmpfs of `kib` KiB mounted at `dir`, unmounted on drop: a disk a
/// test can fill. Needs root (else SKIP, or a failure under
/// `LONGHAUL_REQUIRE_ROOT=1`); a mount that fails as root fails the test.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    #[track_caller]
    pub fn mount(dir: &Path, kib: u64) -> Option<SmallDisk> {
        if !require::have("ROOT", require::root("mounting a small tmpfs")) {
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "mount tmpfs on {}: {}",
            dir.display(),
            stderr(&o)
        );
        Some(SmallDisk(dir.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
pub fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "expected exit {code}; stdout: {} stderr: {}",
        stdout(o),
        stderr(o)
    );
}

/// A TLS connection to a test server at `addr`, trusting the shared
/// identity; reads time out after 5 s.
pub fn tls_to(addr: std::net::SocketAddr) -> Box<dyn longhaul_engine::net::conn::Stream> {
    use longhaul_engine::net::tls::{ClientTls, TrustOptions};
    let t = ClientTls::new(
        &TrustOptions {
            pins: vec![fingerprint().to_string()],
            ..Default::default()
        },
        &addr.to_string(),
    )
    .unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    t.connect(tcp).expect("TLS handshake with the test server")
}
