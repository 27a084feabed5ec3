//! `--far HOST`: a real second host reached by the user's ssh (the same
//! `--rsh`/`LONGHAUL_RSH` as `longhaul cp HOST:path`). It needs only ssh, a
//! POSIX shell and longhaul there. The matrix makes a work directory there
//! (removed at the end), copies the data there with `longhaul cp` (which
//! verifies every file), starts the peers' servers there on free ports and
//! ends them by their process id, and verifies a put's far copy by pulling
//! it back with `longhaul cp` (the far longhaul reads and hashes the far
//! files; this end compares them with the source's manifest).
//!
//! Each far server runs under a small far shell that holds the ssh
//! session's standard input: when the matrix ends the server, is
//! interrupted or dies, that input closes and the far shell kills the
//! server's process group; the matrix also kills it by its PID over ssh.

use std::io::{BufRead, Write as _};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use longhaul_engine::process::Owned;
pub use longhaul_engine::ssh::{quote as join, Ssh};

/// How to reach the far host `dest`: each command in a process group of its
/// own, ended by the kernel if the matrix dies, and never prompting (a
/// process group of its own cannot read the terminal).
pub fn ssh(dest: &str, rsh: Option<&str>) -> Result<Ssh, String> {
    Ok(Ssh::new(dest, rsh)?.owned().unattended())
}

/// For each list of programs, those not found on the far host.
pub fn missing(ssh: &Ssh, needs: &[Vec<String>]) -> Result<Vec<Vec<String>>, String> {
    let mut all: Vec<&str> = needs.iter().flatten().map(String::as_str).collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return Ok(vec![vec![]; needs.len()]);
    }
    let words = join(&all)?;
    // sbin too: sshd and the like are off a user's PATH.
    let out = ssh.run(
        &format!(
            "PATH=$PATH:/usr/sbin:/sbin; for p in {words}; do command -v \"$p\" >/dev/null 2>&1 || echo \"$p\"; done"
        ),
        None,
    )?;
    let absent: Vec<&str> = out.lines().map(str::trim).collect();
    Ok(needs
        .iter()
        .map(|n| {
            n.iter()
                .filter(|p| absent.contains(&p.as_str()))
                .cloned()
                .collect()
        })
        .collect())
}

/// The far host's work directory, removed when dropped.
pub struct Far {
    pub ssh: Ssh,
    /// The OpenSSH master connection the matrix's own commands share.
    master: Option<Owned>,
    /// Its work directory (absolute).
    pub root: String,
    /// Its address as its sshd saw this connection (`$SSH_CONNECTION`):
    /// where its servers listen and this host's clients connect.
    pub addr: String,
}

impl Far {
    /// `sock`: where a master connection's socket may go (a private directory).
    pub fn open(ssh: &Ssh, sock: &Path) -> Result<Far, String> {
        let (ssh, master) = ssh.multiplex(sock);
        let ssh = &ssh;
        let out = ssh.run(
            "d=$(mktemp -d \"${TMPDIR:-/tmp}/longhaul-matrix.XXXXXXXX\") && echo \"$d\" && echo $SSH_CONNECTION",
            None,
        )?;
        let mut lines = out.lines();
        let root = lines.next().unwrap_or_default().trim().to_string();
        let addr = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or_default()
            .to_string();
        if !root.starts_with('/') {
            return Err(format!(
                "no work directory made on {}: mktemp said '{root}'",
                ssh.dest
            ));
        }
        let far = Far {
            ssh: ssh.clone(),
            master,
            root,
            addr,
        };
        if far.addr.is_empty() {
            return Err(format!(
                "{} did not say its address ($SSH_CONNECTION is empty there)",
                ssh.dest
            ));
        }
        Ok(far)
    }

    pub fn mkdir(&self, dir: &str) -> Result<(), String> {
        self.ssh.run(&format!("mkdir -p {}", join(&[dir])?), None)?;
        Ok(())
    }

    pub fn remove(&self, path: &str) {
        if let Ok(p) = join(&[path]) {
            let _ = self.ssh.run(&format!("rm -rf {p}"), None);
        }
    }

    pub fn write(&self, path: &str, text: &str) -> Result<(), String> {
        self.ssh
            .run(&format!("cat > {}", join(&[path])?), Some(text.as_bytes()))?;
        Ok(())
    }

    /// Starts `argv` in the far work directory in a session of its own
    /// and, where the far host lets this user make one, a cgroup of its own
    /// (as here: cgroup.rs), its output to `log` there; waits until this
    /// host connects to `port`. The far shell that started it stays, on
    /// the ssh session's standard input: `cpu` prints the cgroup's CPU
    /// (`ns N`, `us N`, or `unknown`), `alive` prints `up` or `down`; end
    /// of input kills the server's group and what is left in its cgroup.
    pub fn start_server(&self, argv: &[String], log: &str, port: u16) -> Result<FarServer, String> {
        // A port someone already serves would pass the ready check.
        if super::run::connects(None, &self.addr, port) {
            return Err(format!("port {port} on {} is in use", self.addr));
        }
        let words: Vec<&str> = argv.iter().map(String::as_str).collect();
        let dir = Path::new(log)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| self.root.clone());
        let remote = format!(
            "cd {root} && mkdir -p {dir} && {{ {find}; cg=; v=; set -- $(lh_cg); \
             if [ -n \"$1\" ] && mkdir \"$1/longhaul-matrix-$$\" 2>/dev/null; then cg=\"$1/longhaul-matrix-$$\"; v=$2; fi; \
             setsid sh -c '[ -z \"$0\" ] || echo $$ > \"$0/cgroup.procs\" || exit 125; exec \"$@\"' \"$cg\" {cmd} >{log} 2>&1 </dev/null & p=$!; echo $p; \
             while read -r r; do case $r in \
             cpu) if [ -z \"$cg\" ]; then echo unknown; elif [ \"$v\" = 1 ]; then echo \"ns $(cat \"$cg/cpuacct.usage\")\"; \
             else echo \"us $(sed -n 's/^usage_usec //p' \"$cg/cpu.stat\")\"; fi;; \
             alive) if kill -0 $p 2>/dev/null; then echo up; else echo down; fi;; esac; done; \
             kill -TERM -- -$p 2>/dev/null; for i in 1 2 3 4 5 6 7 8 9 10; do \
             kill -0 -- -$p 2>/dev/null || break; sleep 0.1; done; kill -KILL -- -$p 2>/dev/null; \
             if [ -n \"$cg\" ]; then for i in 1 2 3 4 5 6 7 8 9 10; do \
             for q in $(cat \"$cg/cgroup.procs\" 2>/dev/null); do kill -KILL $q 2>/dev/null; done; \
             rmdir \"$cg\" 2>/dev/null && break; sleep 0.1; done; fi; }}",
            root = join(&[&self.root])?,
            dir = join(&[&dir])?,
            find = super::cgroup::FAR_FIND,
            cmd = join(&words)?,
            log = join(&[log])?,
        );
        let mut c = self.ssh.command(&remote);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = Owned::new(
            c.spawn()
                .map_err(|e| format!("cannot run ssh to {}: {e}", self.ssh.dest))?,
        );
        let out = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let mut s = FarServer {
            child,
            stdin,
            out: std::io::BufReader::new(out),
            pid: 0,
            port,
            ssh: self.ssh.clone(),
        };
        let mut line = String::new();
        let _ = s.out.read_line(&mut line);
        let pid: i32 = line.trim().parse().unwrap_or(0);
        if pid <= 0 {
            return Err(format!("its server did not start on {}", self.ssh.dest));
        }
        s.pid = pid;
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if super::run::connects(None, &self.addr, port) {
                return Ok(s);
            }
            if s.ask("alive").as_deref() != Some("up") {
                let text = self
                    .ssh
                    .run(
                        &format!("cd {} && tail -n 3 {}", join(&[&self.root])?, join(&[log])?),
                        None,
                    )
                    .unwrap_or_default();
                s.pid = 0;
                return Err(format!(
                    "its server exited on {}: {}",
                    self.ssh.dest,
                    text.lines().collect::<Vec<_>>().join(" | ")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "its server did not accept on {}:{port} within 15 s",
            self.addr
        ))
    }

    /// Copies the local directory `src` into the far directory `dir` with
    /// `longhaul cp` (every file verified).
    pub fn push(&self, bin: &Path, remote_path: &str, src: &Path, dir: &str) -> Result<(), String> {
        self.longhaul_cp(
            bin,
            remote_path,
            &src.display().to_string(),
            &format!("{}:{dir}/", self.ssh.dest),
        )
    }

    /// Copies the far `path` into the local directory `dir`.
    pub fn pull(
        &self,
        bin: &Path,
        remote_path: &str,
        path: &str,
        dir: &Path,
    ) -> Result<(), String> {
        self.longhaul_cp(
            bin,
            remote_path,
            &format!("{}:{path}", self.ssh.dest),
            &format!("{}/", dir.display()),
        )
    }

    fn longhaul_cp(
        &self,
        bin: &Path,
        remote_path: &str,
        from: &str,
        to: &str,
    ) -> Result<(), String> {
        // -a: the permission bits too, which the check compares.
        let out = Command::new(bin)
            .args([
                "--no-archive",
                "cp",
                "-a",
                "--force",
                "--remote-path",
                remote_path,
            ])
            .args([from, to])
            .env("LONGHAUL_RSH", self.ssh.line()?)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "`longhaul cp -r {from} {to}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }
}

impl Drop for Far {
    fn drop(&mut self) {
        self.remove(&self.root.clone());
        // The master connection last (ended by its process group).
        drop(self.master.take());
    }
}

/// A server on the far host; ended (its process group) when dropped.
pub struct FarServer {
    child: Owned,
    /// The far shell's input: requests, and the server's lifeline.
    stdin: Option<ChildStdin>,
    out: std::io::BufReader<ChildStdout>,
    pub pid: i32,
    /// The port it listens on.
    pub port: u16,
    ssh: Ssh,
}

impl FarServer {
    /// The far shell's one-line answer to `req`.
    fn ask(&mut self, req: &str) -> Option<String> {
        let w = self.stdin.as_mut()?;
        writeln!(w, "{req}").and_then(|()| w.flush()).ok()?;
        let mut l = String::new();
        match self.out.read_line(&mut l) {
            Ok(n) if n > 0 => Some(l.trim_end().to_string()),
            _ => None,
        }
    }

    /// CPU seconds of the server and all it forked, from its far cgroup;
    /// None where the far host would not make one.
    pub fn cpu(&mut self) -> Option<f64> {
        far_cpu(&self.ask("cpu")?)
    }
}

impl Drop for FarServer {
    fn drop(&mut self) {
        // Its lifeline: on EOF the far shell kills the server's group and exits.
        drop(self.stdin.take());
        if self.child.wait_for(Duration::from_secs(5)).is_some() {
            return;
        }
        // The session hangs: end the server by its PID over a new one.
        if self.pid > 0 {
            let _ = self.ssh.run(
                &format!(
                    "kill -TERM -- -{p} 2>/dev/null; sleep 0.5; kill -KILL -- -{p} 2>/dev/null; true",
                    p = self.pid
                ),
                None,
            );
        }
    }
}

/// The far shell's `cpu` answer in seconds: `ns N` (cgroup v1's
/// cpuacct.usage), `us N` (v2's usage_usec); None for `unknown`.
fn far_cpu(answer: &str) -> Option<f64> {
    let (unit, n) = answer.split_once(' ')?;
    let n: f64 = n.trim().parse().ok()?;
    match unit {
        "ns" => Some(n / 1e9),
        "us" => Some(n / 1e6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_far_shells_cpu_answers_read_in_seconds() {
        assert_eq!(far_cpu("ns 2500000000"), Some(2.5));
        assert_eq!(far_cpu("us 1500000"), Some(1.5));
        assert_eq!(far_cpu("unknown"), None);
        assert_eq!(far_cpu("us "), None);
        assert_eq!(far_cpu("ns x"), None);
    }
}
