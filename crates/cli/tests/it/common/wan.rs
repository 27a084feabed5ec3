//! The emulated WAN for end-to-end tests: `longhaul wan up` as a guard,
//! commands in its hosts, a server in host b.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Owned;

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// True where the emulator can run; else SKIP, or a failure under
/// `LONGHAUL_REQUIRE_TUN=1` (see [`super::require`]).
#[track_caller]
pub fn can_emulate() -> bool {
    super::require::have("TUN", super::require::tun())
}

pub fn namespaces() -> String {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A running `longhaul wan up`; SIGTERM and `wan down` on drop.
pub struct Wan {
    pub child: Child,
    pub name: String,
}

impl Wan {
    pub fn up(name: &str, args: &[&str]) -> Wan {
        let mut child = Command::new(BIN)
            .args(["wan", "up", "--json", "--name", name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("wan up printed {line:?}: {e}"));
        assert_eq!(v["format"], "longhaul-wan");
        assert_eq!(v["format_version"], 1);
        assert_eq!(v["hosts"]["a"], "198.18.0.1");
        assert_eq!(v["hosts"]["b"], "198.18.0.2");
        Wan {
            child,
            name: name.to_string(),
        }
    }

    /// `longhaul ARGS` run in host `h`.
    pub fn exec(&self, h: &str, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(["wan", "exec", h, "--name", &self.name, "--", BIN])
            .args(args)
            .env("LONGHAUL_TOKEN", super::TOKEN)
            .env("LONGHAUL_PATHS", super::paths_file())
            .stdin(Stdio::null());
        c
    }

    /// SIGTERM, and the forwarder's own cleanup.
    pub fn down(mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new(BIN)
            .args(["wan", "down", "--name", &self.name])
            .output();
    }
}

/// A server in host b exporting `dir`, anyone allowed (plaintext too).
pub fn serve_in_b(w: &Wan, dir: &Path, state: &Path) -> Owned {
    let c = Owned::spawn(
        w.exec(
            "b",
            &[
                "serve",
                "--listen",
                "198.18.0.2:5310",
                "--public-perf",
                "--allow-plaintext",
                "--no-sync",
                "--state-dir",
                super::prepare_state(state).to_str().unwrap(),
                "--export",
                &format!("data={}", dir.display()),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null()),
    )
    .unwrap();
    // Until it listens.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let o = w
            .exec(
                "a",
                &["perf", "198.18.0.2", "--insecure-plaintext", "-n", "1K"],
            )
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    c
}
