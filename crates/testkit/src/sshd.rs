//! A private OpenSSH server on a free loopback port, with its own host key,
//! client key, `authorized_keys` and client config, reached as [`HOST`]
//! with `--rsh "ssh -F CONFIG"`. Nothing of the system's sshd is used or
//! touched; each sshd is ended by its PID (on drop).
//!
//! Without sshd, ssh or ssh-keygen a test skips, saying so; with
//! `LONGHAUL_REQUIRE_SSH=1` (CI) it fails instead.
//!
//! One per test, not one per test binary: it starts in a fraction of a
//! second (two ed25519 keys, one `ssh true`), while a shared one would
//! share its log, its keys and its `authorized_keys` between tests that
//! plant things in them.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::require;

/// The `Host` of the client config.
pub const HOST: &str = "lhtest";

/// Where OpenSSH's `name` is (PATH, or an sbin directory).
pub fn which(name: &str) -> Option<PathBuf> {
    require::find(name)
}

/// A private sshd on loopback and a client config that reaches it as
/// [`HOST`].
pub struct Sshd {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    /// The longhaul binary [`Sshd::longhaul`] runs.
    pub longhaul: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    /// The `--rsh` value.
    pub fn rsh(&self) -> String {
        format!("ssh -F {}", self.config.display())
    }

    /// `longhaul ARGS` with this sshd as the way to [`HOST`] and this
    /// build's binary as the far longhaul.
    pub fn longhaul(&self) -> Command {
        let mut c = Command::new(&self.longhaul);
        c.env("LONGHAUL_RSH", self.rsh())
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env_remove("LONGHAUL_TOKEN")
            .env_remove("LONGHAUL_TRUST");
        c
    }

    pub fn ssh(&self) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-F").arg(&self.config).arg(HOST);
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen -f {}", path.display());
}

/// Starts the sshd, or says why not (a skip, or a failure with
/// `LONGHAUL_REQUIRE_SSH=1`); `longhaul` is the binary
/// [`Sshd::longhaul`] runs.
pub fn start(longhaul: &Path) -> Option<Sshd> {
    start_in(longhaul, None, "127.0.0.1")
}

/// [`start`] in network namespace `netns` (None: this one), listening on
/// `addr`; [`HOST`] is that address.
pub fn start_in(longhaul: &Path, netns: Option<&str>, addr: &str) -> Option<Sshd> {
    let (Some(sshd), Some(_), Some(_)) = (which("sshd"), which("ssh"), which("ssh-keygen")) else {
        let why =
            "sshd, ssh or ssh-keygen is missing (apt-get install openssh-server openssh-client)";
        require::missing("SSH", why);
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    keygen(&d.join("host_key"));
    keygen(&d.join("client_key"));
    std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
    // sshd's privilege separation directory (compiled in); made only if
    // missing, as the package's own service would make it.
    if !Path::new("/run/sshd").exists() {
        let _ = std::fs::create_dir_all("/run/sshd");
    }
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let port = crate::free_port();
    let root = user == "root";
    std::fs::write(
        d.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress {addr}\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nStrictModes no\n\
             PermitRootLogin {}\nUsePAM no\nLogLevel VERBOSE\nSubsystem sftp internal-sftp\n",
            if root { "yes" } else { "no" },
            d = d.display()
        ),
    )
    .unwrap();
    let host_pub = std::fs::read_to_string(d.join("host_key.pub")).unwrap();
    std::fs::write(d.join("known_hosts"), format!("[{addr}]:{port} {host_pub}")).unwrap();
    std::fs::write(
        d.join("ssh_config"),
        format!(
            "Host {HOST}\n  HostName {addr}\n  Port {port}\n  User {user}\n  IdentityFile {d}/client_key\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n  \
             BatchMode yes\n  LogLevel ERROR\n",
            d = d.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(d.join("sshd.log")).unwrap();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(sshd);
            c
        }
        None => Command::new(sshd),
    };
    let child = cmd
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(d.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let s = Sshd {
        child,
        config: d.join("ssh_config"),
        dir,
        longhaul: longhaul.to_path_buf(),
    };
    let until = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect((addr, port)).is_err() {
        assert!(Instant::now() < until, "sshd did not listen: {}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let ok = s.ssh().arg("true").status().unwrap().success();
    assert!(ok, "cannot ssh to the test sshd: {}", s.log());
    Some(s)
}
