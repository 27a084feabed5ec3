//! Reaching a host over ssh, with no longhaul server there (as scp, rsync
//! and bbcp do): `HOST:path` names a path on a host the user can ssh to.
//!
//! The client runs the user's own ssh (`-e/--rsh`, else `ssh`: their
//! config, keys, agent and jump hosts) to start a one-shot server under
//! their account on the far host (`longhaul serve --one-shot`,
//! [`longhaul_engine::server::oneshot`]). That server listens on an
//! ephemeral port of the address ssh reached, and sends back over the ssh
//! channel one line: its port, its fresh certificate's fingerprint and a
//! one-time secret. The client then connects with its ordinary TLS client,
//! pinning that fingerprint and presenting that secret, and the ordinary
//! transfer runs; the data never passes through ssh. The ssh channel
//! stays open while the transfer runs: when it closes (the client is done
//! or gone), the far end exits.
//!
//! A far end that can only connect out (its firewall drops new
//! connections to it, a common DTN policy) is reached the other way: when
//! the direct connection to its port is refused or unanswered within a few
//! seconds, or with `--connect-back`, this side listens and the far end,
//! asked over the ssh channel, opens every connection
//! ([`longhaul_engine::net::back`]); the report says so.
//!
//! Addressing (docs/GUIDE.md "Addressing"): `[USER@]HOST:path` without a port is
//! ssh; a server is `longhaul://HOST[:PORT]/EXPORT/path` or
//! `HOST:PORT:EXPORT/path`. A path on the far host is as scp's: relative to
//! the home directory unless it starts with `/`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_engine::net::back;
use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::net::tls::TrustOptions;
use longhaul_engine::server::oneshot::{self, Admits, Handshake, OneShotConfig};
use longhaul_engine::xfer::Export;
use longhaul_engine::EngineError;

use super::{portable, usage, Failure, Outcome};
use crate::args::{ServeArgs, SshArgs};
use crate::exit;

/// The far end's export of the remote home directory (relative paths).
pub const HOME_EXPORT: &str = "home";
/// The far end's export of `/` (absolute paths).
pub const ROOT_EXPORT: &str = "root";
/// How long the far end may take to answer (ssh's own connection, a
/// password or a second factor typed at the terminal, the far start).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(120);
/// How much of ssh's standard error is kept for an error message.
const STDERR_KEPT: usize = 8 << 10;
/// The longest line read from the far end (longer ones are cut there).
const LINE_MAX: u64 = 4096;
/// Lines before the handshake a login script may print, at most.
const NOISE_LINES: usize = 256;

/// A path on a host reached over ssh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// `[USER@]HOST` as ssh takes it (an IPv6 address without brackets).
    pub dest: String,
    /// The path as written after the `:` (relative to the far home unless
    /// it starts with `/`).
    pub path: String,
}

/// Reads `arg` as `[USER@]HOST:path` (ssh), or None: a local path (no
/// `:` before the first `/`, as scp), a server (`longhaul://...`, or a
/// port after the host: `HOST:PORT:EXPORT/path`).
pub fn ssh_target(arg: &str) -> Option<SshTarget> {
    if arg.contains("://") {
        return None;
    }
    let (user, rest) = match arg.split_once('@') {
        Some((u, r)) if !u.is_empty() && !u.contains('/') && !u.contains(':') => (Some(u), r),
        _ => (None, arg),
    };
    let (host, path) = if let Some(s) = rest.strip_prefix('[') {
        let (h, p) = s.split_once("]:")?;
        (h, p)
    } else {
        let (h, p) = rest.split_once(':')?;
        (h, p)
    };
    if host.is_empty() || host.contains('/') {
        return None;
    }
    // HOST:PORT:EXPORT/path is a server's.
    if let Some((port, _)) = path.split_once(':') {
        if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    let dest = match user {
        Some(u) => format!("{u}@{host}"),
        None => host.to_string(),
    };
    Some(SshTarget {
        dest,
        path: path.to_string(),
    })
}

/// The export and the path in it that a far path names: relative (and
/// `~/...`) in the home directory, absolute from `/`.
fn export_path(path: &str) -> Result<(&'static str, String), String> {
    if let Some(abs) = path.strip_prefix('/') {
        return Ok((ROOT_EXPORT, abs.to_string()));
    }
    if path == "~" {
        return Ok((HOME_EXPORT, String::new()));
    }
    if let Some(rel) = path.strip_prefix("~/") {
        return Ok((HOME_EXPORT, rel.to_string()));
    }
    if path.starts_with('~') {
        return Err(format!(
            "'{path}': another user's home (~USER) is not supported over ssh; give the absolute path"
        ));
    }
    Ok((HOME_EXPORT, path.to_string()))
}

/// The ssh command line that runs `remote` on `dest`.
fn ssh_command(ssh: &SshArgs, dest: &str, remote: &str) -> Result<Command, Failure> {
    let rsh = ssh.rsh.as_deref().unwrap_or("ssh");
    let argv = shlex::split(rsh).filter(|v| !v.is_empty()).ok_or_else(|| {
        usage(format!(
            "--rsh '{rsh}': not a command line (check its quotes)"
        ))
    })?;
    // A host that starts with '-' would be read by ssh as an option
    // (-oProxyCommand=...).
    if dest.starts_with('-') {
        return Err(usage(format!(
            "'{dest}': a host name cannot start with '-'"
        )));
    }
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]).arg(dest).arg(remote);
    Ok(c)
}

/// The far end, started: its handshake and the ssh process that carries
/// its lifeline (its standard input), and the requests to connect back.
pub struct FarEnd {
    pub handshake: Handshake,
    dest: String,
    child: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    /// What ssh (so the far end) wrote on standard error, the last of it.
    said: Arc<Mutex<String>>,
    /// How connections to it are opened, once [`FarEnd::route`] set it up.
    route: Option<Arc<back::Route>>,
    /// An open far end's: says `alive` on the channel until dropped.
    alive: Option<std::sync::mpsc::Sender<()>>,
}

impl FarEnd {
    /// `[USER@]HOST`, as ssh was given it.
    pub fn dest(&self) -> &str {
        &self.dest
    }

    /// How the user wrote paths on this far end.
    pub fn as_written(&self) -> AsWritten {
        AsWritten {
            server: server_of(&self.handshake),
            dest: self.dest.clone(),
        }
    }

    /// Which side opened the connections to the far end, and why (None if
    /// none was opened).
    pub fn opened(&self) -> Option<back::Opened> {
        self.route.as_ref().and_then(|r| r.opened())
    }

    /// Puts connections to the far end on a route that connects back when
    /// the direct connection fails (or always, with `--connect-back`).
    fn route(&mut self, ssh: &SshArgs) -> Result<(), Failure> {
        let h = &self.handshake;
        let forced = ssh.connect_back.as_deref();
        let given = match forced {
            Some("") | None => None,
            Some(a) => Some(connect_back_addr(a).map_err(usage)?),
        };
        let listen = match (given, h.client) {
            (Some(a), _) => a,
            (None, Some(ip)) => std::net::SocketAddr::new(ip, 0),
            (None, None) if forced.is_some() => {
                return Err(usage(format!(
                    "--connect-back: the far end on {} did not say where this client's ssh came from; give the address it can reach, --connect-back=ADDR[:PORT]",
                    self.dest
                )))
            }
            (None, None) => return Ok(()),
        };
        if !h.back {
            if forced.is_some() {
                return Err(Failure {
                    code: exit::CONNECT,
                    message: format!(
                        "--connect-back: the longhaul on {} does not connect back (an older version): install this version there ({})",
                        self.dest,
                        env!("CARGO_PKG_VERSION")
                    ),
                });
            }
            return Ok(());
        }
        let stdin = self.stdin.clone();
        let said = self.said.clone();
        let dest = self.dest.clone();
        let ask = move |line: &str| {
            let mut w = stdin
                .lock()
                .map_err(|_| EngineError::Failed("internal error".into()))?;
            let w = w
                .as_mut()
                .ok_or_else(|| EngineError::Closed(format!("the ssh channel to {dest}")))?;
            writeln!(w, "{line}").and_then(|()| w.flush()).map_err(|e| {
                EngineError::io(
                    format!("cannot ask the far end on {dest} to connect back over ssh"),
                    e,
                )
            })
        };
        let heard = move || {
            let k = said.lock().ok()?;
            k.lines()
                .rev()
                .find_map(|l| l.strip_prefix(oneshot::BACK_FAILED))
                .map(|l| longhaul_proto::units::escaped(l.trim()).to_string())
        };
        // A listening address other than where ssh came from (a NAT
        // between): the far end connects only where its client named.
        if Some(listen.ip()) != h.client {
            use longhaul_proto::xfer::back::{allow_line, ALLOW_MAX};
            ask(&allow_line(listen.ip(), ALLOW_MAX)).map_err(Failure::from)?;
        }
        let target = std::net::SocketAddr::new(h.addr, h.port);
        self.route = Some(back::Route::install(
            target,
            forced.map(|_| "--connect-back was given".to_string()),
            listen,
            Box::new(ask),
            Box::new(heard),
        ));
        Ok(())
    }

    /// Tells an open far end (`--sessions open`) that this client is
    /// there: [`oneshot::ALIVE_LINE`] on the channel every
    /// [`oneshot::ALIVE_EVERY`], until the far end is finished.
    fn keep_alive(&mut self) {
        let (tx, rx) = channel::<()>();
        let stdin = self.stdin.clone();
        let spawned = std::thread::Builder::new()
            .name("lh-ssh-alive".into())
            .spawn(move || {
                use std::sync::mpsc::RecvTimeoutError::Timeout;
                // Until `finish` (or a drop) lets go of the sender.
                while rx.recv_timeout(oneshot::ALIVE_EVERY) == Err(Timeout) {
                    let Ok(mut w) = stdin.lock() else { return };
                    let Some(w) = w.as_mut() else { return };
                    if writeln!(w, "{}", oneshot::ALIVE_LINE)
                        .and_then(|()| w.flush())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        self.alive = spawned.is_ok().then_some(tx);
    }

    /// Closes the lifeline (the far end exits) and waits for ssh a moment;
    /// ends it if it lingers.
    pub fn finish(mut self) {
        self.route = None;
        self.alive = None;
        if let Ok(mut s) = self.stdin.lock() {
            drop(s.take());
        }
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= until => break,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        tracing::warn!(
            "ssh to {} did not end after the transfer; stopping it",
            self.dest
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Names paths on a far end as its user wrote them (see [`AsWritten::name`]).
#[derive(Clone)]
pub struct AsWritten {
    /// The one-shot server's `ADDR:PORT`, as the engine names it.
    server: String,
    /// `[USER@]HOST`, as given to ssh.
    dest: String,
}

impl AsWritten {
    /// A name the engine gave a path on the far end (`ADDR:PORT:root/tmp/x`,
    /// by its one-shot server's address and exports) as the user wrote it:
    /// `HOST:/tmp/x`, or `HOST:x` in the home. Any other name as it is.
    pub fn name(&self, name: &str) -> String {
        let Some(rest) = name
            .strip_prefix(self.server.as_str())
            .and_then(|r| r.strip_prefix(':'))
        else {
            return name.to_string();
        };
        let (export, path) = rest.split_once('/').unwrap_or((rest, ""));
        match export {
            ROOT_EXPORT => format!("{}:/{path}", self.dest),
            HOME_EXPORT => format!("{}:{path}", self.dest),
            _ => name.to_string(),
        }
    }
}

/// What became of a start.
enum Started {
    Up(FarEnd),
    /// The far command was not found (the shell's 127).
    Missing(String),
}

/// Keeps the last [`STDERR_KEPT`] bytes of what ssh writes to standard
/// error, and shows each line at debug level. The receiver hears when
/// ssh's standard error has ended (all of it kept).
fn keep_stderr(r: impl Read + Send + 'static) -> (Arc<Mutex<String>>, Receiver<()>) {
    let kept = Arc::new(Mutex::new(String::new()));
    let k = kept.clone();
    let (ended, on_end) = channel();
    let _ = std::thread::Builder::new()
        .name("lh-ssh-err".into())
        .spawn(move || {
            // Any bytes: a line that is not UTF-8 is kept as it can be shown.
            for line in BufReader::new(r).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches('\r');
                tracing::debug!("ssh: {}", longhaul_proto::units::escaped(line));
                if let Ok(mut k) = k.lock() {
                    k.push_str(line);
                    k.push('\n');
                    if k.len() > STDERR_KEPT {
                        let cut = k.len() - STDERR_KEPT;
                        let cut = (cut..k.len()).find(|&i| k.is_char_boundary(i)).unwrap_or(0);
                        k.drain(..cut);
                    }
                }
            }
            let _ = ended.send(());
        });
    (kept, on_end)
}

/// Lines of ssh's own words shown at most: the last, where ssh says why.
const SAID_LINES: usize = 20;

/// What ssh (or the far shell) said, as it printed it: its last lines,
/// each on a line of its own, indented under the message; control bytes
/// escaped for the terminal, nothing else changed.
fn as_said(said: &str) -> String {
    let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(SAID_LINES);
    lines[from..]
        .iter()
        .map(|l| format!("\n    {}", longhaul_proto::units::escaped(l.trim_end())))
        .collect()
}

/// Sends each line of `r` (the far end's standard output) to a channel
/// until the handshake, then drains the rest.
fn watch_stdout(r: impl Read + Send + 'static) -> Receiver<Result<String, ()>> {
    let (tx, rx) = channel();
    let _ = std::thread::Builder::new()
        .name("lh-ssh-out".into())
        .spawn(move || {
            let mut r = BufReader::new(r);
            let mut noise = 0usize;
            loop {
                // Bounded, and any bytes: a login script may print anything.
                let mut raw = Vec::new();
                match (&mut r).take(LINE_MAX).read_until(b'\n', &mut raw) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Err(()));
                        return;
                    }
                    Ok(_) => {}
                }
                let line = String::from_utf8_lossy(&raw);
                let line = line.trim_end();
                if Handshake::is_handshake(line) {
                    let _ = tx.send(Ok(line.to_string()));
                    break;
                }
                noise += 1;
                if noise > NOISE_LINES {
                    let _ = tx.send(Err(()));
                    return;
                }
                tracing::debug!("far end said: {}", longhaul_proto::units::escaped(line));
            }
            // Nothing more is expected; keep the pipe drained.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
    rx
}

/// Runs `remote` over ssh and waits for the handshake.
fn start_once(ssh: &SshArgs, dest: &str, remote: &str) -> Result<Started, Failure> {
    let mut c = ssh_command(ssh, dest, remote)?;
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let rsh = ssh.rsh.as_deref().unwrap_or("ssh");
    let mut child = c.spawn().map_err(|e| Failure {
        code: exit::CONNECT,
        message: format!(
            "cannot run '{rsh}' to reach {dest}: {e} (is ssh installed? choose the command with -e/--rsh)"
        ),
    })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Failure::internal("ssh's pipes were not made"));
    };
    let (kept, stderr_ended) = keep_stderr(stderr);
    let lines = watch_stdout(stdout);
    let got = lines.recv_timeout(HANDSHAKE_WAIT);
    let fail = |child: &mut Child, code: i32, what: String| {
        let _ = child.kill();
        let _ = child.wait();
        Failure {
            code,
            message: what,
        }
    };
    match got {
        Ok(Ok(line)) => {
            let handshake = Handshake::parse(&line).map_err(|e| {
                fail(
                    &mut child,
                    exit::CONNECT,
                    format!("the far end on {dest} answered, but: {e}"),
                )
            })?;
            tracing::info!(
                "far end on {dest} is pid {} listening on {}:{}, identity {}",
                handshake.pid,
                handshake.addr,
                handshake.port,
                handshake.fingerprint
            );
            Ok(Started::Up(FarEnd {
                handshake,
                dest: dest.to_string(),
                child,
                stdin: Arc::new(Mutex::new(Some(stdin))),
                said: kept,
                route: None,
                alive: None,
            }))
        }
        Err(_) => Err(fail(
            &mut child,
            exit::CONNECT,
            format!(
                "no answer from the far end on {dest} within {} s (ssh still running: check that `{rsh} {dest}` works without prompting)",
                HANDSHAKE_WAIT.as_secs()
            ),
        )),
        Ok(Err(())) => {
            drop(stdin);
            // ssh ended (or said too much): its status and its words.
            let status = wait_a_moment(&mut child);
            // What ssh wrote last (why it failed) may still be in the pipe.
            let _ = stderr_ended.recv_timeout(Duration::from_secs(2));
            let said = kept.lock().map(|k| k.trim().to_string()).unwrap_or_default();
            let code = status.and_then(|s| s.code());
            let missing = code == Some(127)
                || said.contains("command not found")
                || said.contains("No such file or directory");
            if missing {
                return Ok(Started::Missing(said));
            }
            let said = if said.is_empty() {
                String::new()
            } else {
                format!("; it said:{}", as_said(&said))
            };
            let how = match code {
                Some(255) => "ssh could not connect or log in".to_string(),
                Some(2) => "the far longhaul refused the command (too old for this client's `serve --one-shot`? install this version there)".to_string(),
                Some(c) => format!("the far command ended with status {c}"),
                None => "ssh was ended by a signal".to_string(),
            };
            Err(Failure {
                code: exit::CONNECT,
                message: format!("cannot start the far end on {dest}: {how}{said}"),
            })
        }
    }
}

/// Waits up to a few seconds for a process that is ending.
fn wait_a_moment(child: &mut Child) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                return child.wait().ok();
            }
        }
    }
}

/// Where `--copy-binary` puts a build on the far host (relative to the far
/// home, where ssh starts): named by this version and the build's content,
/// so that a copy of another build is never taken for it.
fn copied_path(bytes: &[u8]) -> String {
    let id = blake3::hash(bytes).to_hex();
    format!(
        ".cache/longhaul/longhaul-{}-{}",
        env!("CARGO_PKG_VERSION"),
        &id[..12]
    )
}

/// Runs a short command over ssh, feeding it `input`; returns its output.
fn ssh_run(
    ssh: &SshArgs,
    dest: &str,
    remote: &str,
    input: Option<&[u8]>,
) -> Result<String, Failure> {
    let mut c = ssh_command(ssh, dest, remote)?;
    c.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| Failure {
        code: exit::CONNECT,
        message: format!("cannot run ssh to reach {dest}: {e}"),
    })?;
    if let (Some(data), Some(mut w)) = (input, child.stdin.take()) {
        w.write_all(data).map_err(|e| Failure {
            code: exit::CONNECT,
            message: format!("cannot send the binary to {dest}: {e}"),
        })?;
    }
    let out = child.wait_with_output().map_err(|e| Failure {
        code: exit::CONNECT,
        message: format!("ssh to {dest}: {e}"),
    })?;
    if !out.status.success() {
        return Err(Failure {
            code: exit::CONNECT,
            message: format!(
                "`{remote}` on {dest} failed ({}); it said:{}",
                out.status,
                as_said(&String::from_utf8_lossy(&out.stderr))
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A build that runs on `dest`, for `--copy-binary`: `named`, else this
/// binary or the portable build beside it, by that host's own account of
/// its machine type and C library. Where it came from, and its bytes.
fn build_for(
    ssh: &SshArgs,
    dest: &str,
    named: Option<&Path>,
) -> Result<(PathBuf, Vec<u8>), Failure> {
    let said = ssh_run(ssh, dest, portable::PROBE, None)?;
    let far = portable::parse_probe(&said).map_err(|e| Failure {
        code: exit::CONNECT,
        message: format!("--copy-binary cannot tell what {dest} runs: {e}"),
    })?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::internal(format!("cannot find this program's binary: {e}")))?;
    let mut fits = Vec::new();
    let mut tried = Vec::new();
    for path in portable::candidates(named, &exe) {
        // This binary as it runs: the file at its path may have been replaced since.
        let from = if path == exe {
            Path::new("/proc/self/exe")
        } else {
            &path
        };
        let bytes = std::fs::read(from).map_err(|e| {
            usage(format!(
                "--copy-binary: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let needs = portable::needs(&bytes)
            .map_err(|e| usage(format!("--copy-binary: {}: {e}", path.display())))?;
        match needs.misfit(&far) {
            Some(why) => tried.push((path, why)),
            None => fits.push((needs.glibc, path, bytes)),
        }
    }
    // A host that did not name its C library gets the build that asks least of it.
    let pick = match far.libc {
        portable::FarLibc::Unknown(_) => fits.into_iter().min_by_key(|f| f.0),
        _ => fits.into_iter().next(),
    };
    let (_, path, bytes) = pick.ok_or_else(|| Failure {
        code: exit::CONNECT,
        message: portable::advice(dest, &far, &tried),
    })?;
    tracing::info!(
        "{dest} is {} with {}: copying {}",
        far.machine,
        far.libc,
        path.display()
    );
    Ok((path, bytes))
}

/// Puts `bytes` at `path` on the far host, its owner's alone.
fn copy_binary(ssh: &SshArgs, dest: &str, bytes: &[u8], path: &str) -> Result<(), Failure> {
    let part = format!("{path}.part");
    let script = format!(
        "umask 077 && mkdir -p .cache/longhaul && cat > {part} && chmod 700 {part} && mv -f {part} {path}"
    );
    ssh_run(ssh, dest, &script, Some(bytes))?;
    Ok(())
}

/// Starts the far end on `dest`: `--remote-path` (else `longhaul`), and
/// with `--copy-binary` a copy of this binary when that is missing. Its
/// secret admits `admits` control sessions (`--sessions N` or `--sessions
/// open` on its command line unless one: a count or a word, nothing
/// secret); an open one is told now and then that this client is there.
pub fn start(ssh: &SshArgs, dest: &str, admits: Admits) -> Result<FarEnd, Failure> {
    let mut far = start_far(ssh, dest, admits)?;
    if admits == Admits::Open {
        far.keep_alive();
    }
    Ok(far)
}

fn start_far(ssh: &SshArgs, dest: &str, admits: Admits) -> Result<FarEnd, Failure> {
    let remote = ssh.remote_path.as_deref().unwrap_or("longhaul");
    let command = |bin: &str| match admits {
        Admits::Sessions(0 | 1) => format!("{bin} serve --one-shot"),
        a => format!("{bin} serve --one-shot --sessions {a}"),
    };
    let said = match start_once(ssh, dest, &command(remote))? {
        Started::Up(f) => return Ok(f),
        Started::Missing(said) => said,
    };
    if let Some(named) = &ssh.copy_binary {
        let (from, bytes) = build_for(ssh, dest, named.as_deref())?;
        let copied = copied_path(&bytes);
        if let Started::Up(f) = start_once(ssh, dest, &command(&copied))? {
            return Ok(f);
        }
        copy_binary(ssh, dest, &bytes, &copied)?;
        tracing::info!("copied {} to {dest}:{copied}", from.display());
        return match start_once(ssh, dest, &command(&copied))? {
            Started::Up(f) => Ok(f),
            Started::Missing(said) => Err(Failure {
                code: exit::CONNECT,
                message: format!(
                    "copied {} to {dest}:{copied}, but it does not run there; it said:{}",
                    from.display(),
                    as_said(&said)
                ),
            }),
        };
    }
    let said = if said.is_empty() {
        String::new()
    } else {
        format!("; it said:{}", as_said(&said))
    };
    Err(Failure {
        code: exit::CONNECT,
        message: format!(
            "longhaul is not installed on {dest}, or not as '{remote}': install it there (the same version as here, {}), name it with --remote-path PATH, or pass --copy-binary to copy a build that runs there (checked against its machine type and glibc first){said}",
            env!("CARGO_PKG_VERSION")
        ),
    })
}

/// `--connect-back=ADDR[:PORT]`: where to listen and what to tell the far
/// end (port 0 or none: any).
fn connect_back_addr(a: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(s) = a.parse::<std::net::SocketAddr>() {
        return Ok(s);
    }
    a.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, 0))
        .map_err(|_| {
            format!("--connect-back={a}: not an address (ADDR or ADDR:PORT, [V6]:PORT; names are not looked up)")
        })
}

/// A failure of the client against the far end, with a hint when it
/// could not connect: the far end listens on the address ssh reached,
/// which a jump host or a NAT may hide from here.
pub fn explain(far: &FarEnd, e: longhaul_engine::EngineError) -> Failure {
    let connect = matches!(e, longhaul_engine::EngineError::Connect(_));
    let back = far.opened().is_some_and(|o| o.opened_by == "far_end");
    // The user named a host, not a server: the refusal is that host's.
    let refused = match &e {
        longhaul_engine::EngineError::Refused { message, .. } => Some(message.clone()),
        _ => None,
    };
    let mut f = Failure::from(e);
    if let Some(m) = refused {
        f.message = format!("{} refused: {m}", far.dest);
    }
    if back {
        f.message = format!(
            "{} (the far end on {} was to connect back: {})",
            f.message,
            far.dest,
            far.opened().and_then(|o| o.reason).unwrap_or_default()
        );
    } else if connect {
        f.message = format!(
            "{} (the far end on {} listens on {}, the address ssh reached there; through a jump host or a NAT that address may not be reachable from here)",
            f.message,
            far.dest,
            server_of(&far.handshake)
        );
    }
    f
}

/// A failed third-party copy (`from`: the source's far end, `to`: the
/// destination's, each when over ssh): when the destination's far end
/// could only be reached by connecting back, it was to connect back to
/// the source too; say what that needs, and what to run instead.
pub fn explain_third_party(
    from: Option<&FarEnd>,
    to: Option<&FarEnd>,
    e: longhaul_engine::EngineError,
) -> Failure {
    let walled = to.filter(|t| t.opened().is_some_and(|o| o.opened_by == "far_end"));
    let mut f = match (from, to) {
        (Some(far), _) | (None, Some(far)) => explain(far, e),
        (None, None) => return Failure::from(e),
    };
    if let Some(to) = walled {
        f.message = format!(
            "{}; the destination's far end on {} takes no new connection (it connected back to this client), so it was to connect back to the source, at the address this client reached the source at: that needs a source of longhaul {} or later, reachable from {}; else copy in two steps through this host (`longhaul cp -r SRC... LOCAL`, then `longhaul cp -r LOCAL {}:PATH`), or run the copy on the destination's host, pulling from the source",
            f.message, to.dest, env!("CARGO_PKG_VERSION"), to.dest, to.dest
        );
    }
    f
}

/// The server address a handshake names, as the engine parses it.
fn server_of(h: &Handshake) -> String {
    match h.addr {
        std::net::IpAddr::V6(a) => format!("[{a}]:{}", h.port),
        std::net::IpAddr::V4(a) => format!("{a}:{}", h.port),
    }
}

/// If any of `args` is an ssh path: checks they all name one host,
/// starts the far end there and rewrites them into the one-shot server's
/// addresses, and sets the trust and credential of `client` to the
/// handshake's. Returns the far end to finish when the command is done.
/// Its secret admits one control session (see [`reach_for`]).
pub fn reach(
    args: &mut [String],
    client: &mut ClientOptions,
    ssh: &SshArgs,
) -> Result<Option<FarEnd>, Failure> {
    reach_for(args, client, ssh, 1)
}

/// [`reach`] for a command that opens up to `sessions` control sessions
/// one after another (the doctor's stages): the far end admits that many
/// on its one secret, then ends (or when ssh's stdin closes, as always);
/// or, [`Admits::Open`], as many as it opens while the channel lives (a
/// fleet's queue rank).
pub fn reach_for(
    args: &mut [String],
    client: &mut ClientOptions,
    ssh: &SshArgs,
    sessions: impl Into<Admits>,
) -> Result<Option<FarEnd>, Failure> {
    let sessions = sessions.into();
    let targets: Vec<Option<SshTarget>> = args.iter().map(|a| ssh_target(a)).collect();
    let Some(first) = targets.iter().flatten().next().cloned() else {
        return Ok(None);
    };
    if targets.iter().flatten().any(|t| t.dest != first.dest) {
        return Err(usage(
            "all sources over ssh must be on one host (a copy goes from one end to another)",
        ));
    }
    let mut rewritten = Vec::with_capacity(args.len());
    for (a, t) in args.iter().zip(&targets) {
        match t {
            Some(t) => rewritten.push(Some(export_path(&t.path).map_err(usage)?)),
            None if longhaul_proto::xfer::parse_remote(a).is_some() => {
                return Err(usage(format!(
                    "'{a}' names a longhaul server, and '{}:{}' a host over ssh: name the sources on one end (a copy goes from one end to another)",
                    first.dest, first.path
                )))
            }
            None => rewritten.push(None),
        }
    }
    let mut far = start(ssh, &first.dest, sessions)?;
    if let Err(f) = far.route(ssh) {
        far.finish();
        return Err(f);
    }
    let server = server_of(&far.handshake);
    for (a, r) in args.iter_mut().zip(rewritten) {
        if let Some((export, path)) = r {
            *a = format!("longhaul://{server}/{export}/{path}");
        }
    }
    client.security = handshake_security(&far.handshake);
    Ok(Some(far))
}

/// `perf [USER@]HOST:`: a host named with an empty ssh path (nothing else
/// a perf target can be) is reached over ssh; its argument becomes the
/// one-shot server's `ADDR:PORT`, and `client` trusts and proves itself as
/// in [`reach`]. One host only: a third-party test over ssh is not built.
pub fn reach_host(
    hosts: &mut [String],
    client: &mut ClientOptions,
    ssh: &SshArgs,
) -> Result<Option<FarEnd>, Failure> {
    let is_ssh = |h: &String| ssh_target(h).is_some_and(|t| t.path.is_empty());
    let Some(at) = hosts.iter().position(is_ssh) else {
        return Ok(None);
    };
    if hosts.len() > 1 {
        return Err(usage(
            "a third-party test with a host over ssh (HOST:) is not supported yet: test one host at a time",
        ));
    }
    let dest = ssh_target(&hosts[at]).map(|t| t.dest).unwrap_or_default();
    let mut far = start(ssh, &dest, Admits::Sessions(1))?;
    if let Err(f) = far.route(ssh) {
        far.finish();
        return Err(f);
    }
    hosts[at] = server_of(&far.handshake);
    client.security = handshake_security(&far.handshake);
    Ok(Some(far))
}

/// The trust and credential of a client of the far end: its fingerprint
/// pinned (nothing else), its one-time secret.
fn handshake_security(h: &Handshake) -> longhaul_engine::net::dial::Security {
    longhaul_engine::net::dial::Security {
        plaintext: false,
        trust: TrustOptions {
            pins: vec![h.fingerprint.clone()],
            ..TrustOptions::default()
        },
        token: Some(h.secret.clone()),
        tokens: Vec::new(),
    }
}

/// `longhaul serve --one-shot`: the far end `reach` starts over ssh. It
/// listens on the address the client's ssh reached (`SSH_CONNECTION`),
/// serves the account's home and `/`, and ends when its standard input
/// closes, its last session ends (one, or `--sessions N`), no client
/// came, or (`--sessions open`) its client was silent too long.
pub fn serve_one_shot(a: ServeArgs) -> Outcome {
    let admits = a.sessions.unwrap_or(Admits::Sessions(1));
    if let Admits::Sessions(n) = admits {
        if !(1..=oneshot::SESSIONS_MAX).contains(&n) {
            return Err(usage(format!(
                "serve --one-shot --sessions {n}: from 1 to {}, or `open`",
                oneshot::SESSIONS_MAX
            )));
        }
    }
    let listen = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_whitespace().nth(2).map(str::to_string))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .ok_or_else(|| {
            usage("serve --one-shot is started by `longhaul cp HOST:path` over ssh (SSH_CONNECTION is not set)")
        })?;
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .and_then(|h| std::fs::canonicalize(h).ok())
        .ok_or_else(|| usage("serve --one-shot: HOME is not set or does not exist"))?;
    let export = |name: &str, root: std::path::PathBuf| Export {
        name: name.to_string(),
        root,
        read_only: false,
        public: false,
    };
    let client = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_whitespace().next().map(str::to_string))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
    let cfg = OneShotConfig {
        client,
        listen,
        exports: vec![export(HOME_EXPORT, home), export(ROOT_EXPORT, "/".into())],
        // Paths read as the user wrote them after `HOST:` (scp's way).
        shown_roots: vec![
            (HOME_EXPORT.to_string(), "~".into()),
            (ROOT_EXPORT.to_string(), "/".into()),
        ],
        claim_wait: oneshot::CLAIM_WAIT,
        admits,
        idle: oneshot::OPEN_IDLE,
    };
    let mut out = std::io::stdout().lock();
    let end = oneshot::run(cfg, std::io::stdin(), &mut out)?;
    Ok(match end {
        oneshot::End::NoClient | oneshot::End::Idle => exit::CONNECT,
        _ => exit::OK,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_colon_path_is_ssh_and_a_port_or_scheme_is_a_server() {
        let t = ssh_target("dtn1:data/run7").unwrap();
        assert_eq!((t.dest.as_str(), t.path.as_str()), ("dtn1", "data/run7"));
        let t = ssh_target("me@dtn1:/scratch/x").unwrap();
        assert_eq!(
            (t.dest.as_str(), t.path.as_str()),
            ("me@dtn1", "/scratch/x")
        );
        let t = ssh_target("me@[::1]:x").unwrap();
        assert_eq!(t.dest, "me@::1");
        assert_eq!(ssh_target("dtn1:").unwrap().path, "");
        assert_eq!(ssh_target("dtn1:5310:data/x"), None);
        assert_eq!(ssh_target("[::1]:5310:data"), None);
        assert_eq!(ssh_target("longhaul://dtn1/data/x"), None);
        assert_eq!(ssh_target("./a:b"), None);
        assert_eq!(ssh_target("/tmp/x"), None);
        assert_eq!(ssh_target("plain"), None);
        assert_eq!(ssh_target(":x"), None);
    }

    #[test]
    fn relative_paths_are_in_the_home_and_absolute_ones_from_the_root() {
        assert_eq!(export_path("a/b").unwrap(), (HOME_EXPORT, "a/b".into()));
        assert_eq!(export_path("").unwrap(), (HOME_EXPORT, String::new()));
        assert_eq!(export_path("~/a").unwrap(), (HOME_EXPORT, "a".into()));
        assert_eq!(
            export_path("/tmp/x/").unwrap(),
            (ROOT_EXPORT, "tmp/x/".into())
        );
        assert!(export_path("~bob/x").is_err());
    }
}
