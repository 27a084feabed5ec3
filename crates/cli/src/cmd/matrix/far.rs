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
//!
//! Every wait on the far host (a command over ssh, the far shell's answer,
//! a copy of the data there or back) is bounded by the run's
//! `--run-timeout`: a far host that stops answering ends the wait with an
//! error that says what was awaited there, never hangs the matrix.

use std::io::{BufRead, Write as _};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use longhaul_engine::process::{Owned, Within};
use longhaul_engine::ssh::SshError;
pub use longhaul_engine::ssh::{quote as join, Ssh};

/// The error of a wait on the far host `dest` that reached its `limit`:
/// what was awaited, and what to do.
fn waited(dest: &str, what: &str, limit: Duration) -> String {
    format!(
        "{dest} did not answer within {:.0} s ({what}; ended here): check that {dest} still \
         answers (`ssh {dest} true`) and is not overloaded, or give the matrix a longer \
         --run-timeout (every wait on the far host is bounded by it)",
        limit.as_secs_f64()
    )
}

/// A short command on the far host, for at most `limit`.
fn run_far(
    ssh: &Ssh,
    remote: &str,
    input: Option<&[u8]>,
    what: &str,
    limit: Duration,
) -> Result<String, String> {
    ssh.run_within(remote, input, Some(limit))
        .map_err(|e| match e {
            SshError::TimedOut(said) => format!("{}; {said}", waited(&ssh.dest, what, limit)),
            e => e.to_string(),
        })
}

/// How to reach the far host `dest`: each command in a process group of its
/// own, ended by the kernel if the matrix dies, and never prompting (a
/// process group of its own cannot read the terminal).
pub fn ssh(dest: &str, rsh: Option<&str>) -> Result<Ssh, String> {
    Ok(Ssh::new(dest, rsh)?.owned().unattended())
}

/// For each list of programs, those not found on the far host.
pub fn missing(
    ssh: &Ssh,
    needs: &[Vec<String>],
    limit: Duration,
) -> Result<Vec<Vec<String>>, String> {
    let mut all: Vec<&str> = needs.iter().flatten().map(String::as_str).collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return Ok(vec![vec![]; needs.len()]);
    }
    let words = join(&all)?;
    // sbin too: sshd and the like are off a user's PATH.
    let out = run_far(
        ssh,
        &format!(
            "PATH=$PATH:/usr/sbin:/sbin; for p in {words}; do command -v \"$p\" >/dev/null 2>&1 || echo \"$p\"; done"
        ),
        None,
        "the list of the programs it lacks",
        limit,
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
    /// How long any wait on it may take (`--run-timeout`).
    pub limit: Duration,
}

impl Far {
    /// `sock`: where a master connection's socket may go (a private
    /// directory); `limit`: how long any wait on the far host may take.
    pub fn open(ssh: &Ssh, sock: &Path, limit: Duration) -> Result<Far, String> {
        let (ssh, master) = ssh.multiplex(sock);
        let ssh = &ssh;
        let out = run_far(
            ssh,
            "d=$(mktemp -d \"${TMPDIR:-/tmp}/longhaul-matrix.XXXXXXXX\") && echo \"$d\" && echo $SSH_CONNECTION",
            None,
            "a work directory made there",
            limit,
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
            limit,
        };
        if far.addr.is_empty() {
            return Err(format!(
                "{} did not say its address ($SSH_CONNECTION is empty there)",
                ssh.dest
            ));
        }
        Ok(far)
    }

    /// Runs a short command on the far host (`what` it is awaited for, for
    /// the error), within the limit.
    pub fn run(&self, remote: &str, input: Option<&[u8]>, what: &str) -> Result<String, String> {
        run_far(&self.ssh, remote, input, what, self.limit)
    }

    pub fn mkdir(&self, dir: &str) -> Result<(), String> {
        self.run(
            &format!("mkdir -p {}", join(&[dir])?),
            None,
            &format!("the directory {dir} made"),
        )?;
        Ok(())
    }

    pub fn remove(&self, path: &str) {
        if let Ok(p) = join(&[path]) {
            let _ = self.run(&format!("rm -rf {p}"), None, &format!("{path} removed"));
        }
    }

    pub fn write(&self, path: &str, text: &str) -> Result<(), String> {
        self.run(
            &format!("cat > {}", join(&[path])?),
            Some(text.as_bytes()),
            &format!("the file {path} written"),
        )?;
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
        let child = Owned::new(
            c.spawn()
                .map_err(|e| format!("cannot run ssh to {}: {e}", self.ssh.dest))?,
        );
        let mut s = FarServer::attach(child, &self.ssh, port, self.limit)?;
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if super::run::connects(None, &self.addr, port) {
                return Ok(s);
            }
            if s.ask("alive")? != "up" {
                let text = self
                    .run(
                        &format!("cd {} && tail -n 3 {}", join(&[&self.root])?, join(&[log])?),
                        None,
                        "its server's log",
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
        let mut c = Command::new(bin);
        c.args([
            "--no-archive",
            "cp",
            "-a",
            "--force",
            "--remote-path",
            remote_path,
        ])
        .args([from, to])
        .env("LONGHAUL_RSH", self.ssh.line()?);
        let ran = longhaul_engine::process::output_within(
            longhaul_engine::process::own(&mut c),
            None,
            Some(self.limit),
        )
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let out = match ran {
            Within::Ended { output, .. } => output,
            Within::TimedOut { .. } => {
                return Err(waited(
                    &self.ssh.dest,
                    &format!("`longhaul cp -r {from} {to}`"),
                    self.limit,
                ))
            }
        };
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
    /// The far shell's lines, read on a thread of their own so that every
    /// wait for one has a limit.
    lines: Receiver<String>,
    pub pid: i32,
    /// The port it listens on.
    pub port: u16,
    ssh: Ssh,
    /// How long an answer may take.
    limit: Duration,
    /// Why the far shell is no longer asked (it did not answer in time, or
    /// its session ended): every later request fails at once.
    gone: Option<String>,
}

/// Sends each line `out` gives until its end.
fn lines_of(out: ChildStdout) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl FarServer {
    /// Takes the ssh session of a far shell that has just started a server,
    /// and its first line, the server's process id (within `limit`).
    fn attach(
        mut child: Owned,
        ssh: &Ssh,
        port: u16,
        limit: Duration,
    ) -> Result<FarServer, String> {
        let out = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let mut s = FarServer {
            child,
            stdin,
            lines: lines_of(out),
            pid: 0,
            port,
            ssh: ssh.clone(),
            limit,
            gone: None,
        };
        let line = s.answer("the process id of its server")?;
        s.pid = line.trim().parse().unwrap_or(0);
        if s.pid <= 0 {
            return Err(format!("its server did not start on {}", ssh.dest));
        }
        Ok(s)
    }

    /// The far shell's next line, within the limit.
    fn answer(&mut self, what: &str) -> Result<String, String> {
        if let Some(why) = &self.gone {
            return Err(why.clone());
        }
        let why = match self.lines.recv_timeout(self.limit) {
            Ok(l) => return Ok(l.trim_end().to_string()),
            Err(RecvTimeoutError::Timeout) => waited(&self.ssh.dest, what, self.limit),
            Err(RecvTimeoutError::Disconnected) => format!(
                "the ssh session of its server on {} ended ({what} not said): check that {} \
                 is reachable and its sshd still runs",
                self.ssh.dest, self.ssh.dest
            ),
        };
        self.gone = Some(why.clone());
        Err(why)
    }

    /// The far shell's one-line answer to `req`.
    fn ask(&mut self, req: &str) -> Result<String, String> {
        if let Some(why) = &self.gone {
            return Err(why.clone());
        }
        let w = self
            .stdin
            .as_mut()
            .ok_or("the far shell's input is closed")?;
        writeln!(w, "{req}")
            .and_then(|()| w.flush())
            .map_err(|e| format!("cannot ask the far shell on {} `{req}`: {e}", self.ssh.dest))?;
        self.answer(&format!("the far shell's answer to `{req}`"))
    }

    /// CPU seconds of the server and all it forked, from its far cgroup;
    /// None where the far host would not make one, or did not say in time
    /// (said once on stderr).
    pub fn cpu(&mut self) -> Option<f64> {
        let first = self.gone.is_none();
        match self.ask("cpu") {
            Ok(a) => far_cpu(&a),
            Err(e) => {
                if first {
                    eprintln!("longhaul matrix: its server's CPU is unknown from now on: {e}");
                }
                None
            }
        }
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
            let _ = run_far(
                &self.ssh,
                &format!(
                    "kill -TERM -- -{p} 2>/dev/null; sleep 0.5; kill -KILL -- -{p} 2>/dev/null; true",
                    p = self.pid
                ),
                None,
                "its server ended",
                self.limit,
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

    /// `f`'s result, or a failure if it has none within 30 s (a wait with
    /// no limit would hang the test).
    fn ends<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the wait on the far host has no limit: still waiting after 30 s")
    }

    /// A far shell started as the matrix starts one, whose script is `sh`.
    fn far_shell(script: &str) -> Owned {
        let mut c = Command::new("sh");
        c.args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        Owned::spawn(&mut c).expect("start sh")
    }

    #[test]
    fn a_far_shell_that_never_says_its_servers_pid_ends_the_wait_at_the_limit() {
        let ssh = Ssh::new("far-host", None).unwrap();
        let child = far_shell("sleep 600");
        let t0 = Instant::now();
        let e = ends(move || FarServer::attach(child, &ssh, 1, Duration::from_secs(1)).err())
            .expect("an error");
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        assert!(
            e.contains("far-host did not answer within 1 s (the process id of its server"),
            "{e}"
        );
        assert!(e.contains("--run-timeout"), "{e}");
    }

    #[test]
    fn a_far_shell_that_stops_answering_ends_each_ask_at_the_limit() {
        let ssh = Ssh::new("far-host", None).unwrap();
        // Says its server's pid, then reads requests and answers none
        // (and ends when its input does, as the real one does).
        let child = far_shell("echo 4242; while read -r r; do :; done");
        let (first, again, asked) = ends(move || {
            let mut s = FarServer::attach(child, &ssh, 1, Duration::from_secs(1)).unwrap();
            assert_eq!(s.pid, 4242);
            let t0 = Instant::now();
            let first = s.cpu();
            let t1 = Instant::now();
            let again = s.cpu();
            let asked = s.ask("alive");
            (first, again, (asked, t1.elapsed(), t1 - t0))
        });
        assert_eq!((first, again), (None, None));
        let (asked, later, waited) = asked;
        let e = asked.expect_err("no answer");
        assert!(
            e.contains("far-host did not answer within 1 s (the far shell's answer to `cpu`"),
            "{e}"
        );
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
        // Once it has not answered, it is not waited for again.
        assert!(later < Duration::from_millis(500), "{later:?}");
    }

    #[test]
    fn a_far_host_whose_ssh_hangs_ends_the_wait_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let rsh = dir.path().join("rsh");
        std::fs::write(&rsh, "#!/bin/sh\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let ssh = ssh("far-host", Some(&rsh.display().to_string())).unwrap();
        let sock = dir.path().join("sock");
        let t0 = Instant::now();
        let e =
            ends(move || Far::open(&ssh, &sock, Duration::from_secs(1)).err()).expect("an error");
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        assert!(
            e.contains("far-host did not answer within 1 s (a work directory made there"),
            "{e}"
        );
    }

    #[test]
    fn the_far_shells_cpu_answers_read_in_seconds() {
        assert_eq!(far_cpu("ns 2500000000"), Some(2.5));
        assert_eq!(far_cpu("us 1500000"), Some(1.5));
        assert_eq!(far_cpu("unknown"), None);
        assert_eq!(far_cpu("us "), None);
        assert_eq!(far_cpu("ns x"), None);
    }
}
