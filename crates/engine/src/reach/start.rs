//! Starting a far end over ssh: `longhaul serve --one-shot` there, its
//! handshake read from ssh's output, and with `--copy-binary` a build
//! copied there first when longhaul is missing.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::process::Owned;
use crate::server::oneshot::{Admits, Handshake};
use crate::ssh::{as_said, Ssh};
use crate::EngineError;

use super::{portable, FarEnd, SshOptions};

/// How long the far end may take to answer (ssh's own connection, a
/// password or a second factor typed at the terminal, the far start).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(120);
/// How much of ssh's standard error is kept for an error message.
const STDERR_KEPT: usize = 8 << 10;
/// The longest line read from the far end (longer ones are cut there).
const LINE_MAX: u64 = 4096;
/// Lines before the handshake a login script may print, at most.
const NOISE_LINES: usize = 256;

/// What became of a start.
enum Started {
    Up(FarEnd),
    /// The far command was not found (the shell's 127).
    Missing(String),
}

/// Starts the far end on `dest`: `--remote-path` (else `longhaul`), and
/// with `--copy-binary` a copy of this binary when that is missing. Its
/// secret admits `admits` control sessions (`--sessions N` or `--sessions
/// open` on its command line unless one: a count or a word, nothing
/// secret); an open one is told now and then that this client is there.
pub fn start(opts: &SshOptions, dest: &str, admits: Admits) -> Result<FarEnd, EngineError> {
    // ssh here may ask for a password at the terminal: not a group of its own.
    let mut ssh = Ssh::new(dest, opts.rsh.as_deref())?;
    if opts.unattended {
        ssh = ssh.unattended();
    }
    let mut far = start_far(&ssh, opts, admits)?;
    if admits == Admits::Open {
        far.keep_alive();
    }
    Ok(far)
}

fn start_far(ssh: &Ssh, opts: &SshOptions, admits: Admits) -> Result<FarEnd, EngineError> {
    let dest = &ssh.dest;
    let remote = opts.remote_path.as_deref().unwrap_or("longhaul");
    let command = |bin: &str| match admits {
        Admits::Sessions(0 | 1) => format!("{bin} serve --one-shot"),
        a => format!("{bin} serve --one-shot --sessions {a}"),
    };
    let said = match start_once(ssh, &command(remote))? {
        Started::Up(f) => return Ok(f),
        Started::Missing(said) => said,
    };
    if let Some(named) = &opts.copy_binary {
        let (from, bytes) = build_for(ssh, named.as_deref())?;
        let copied = copied_path(&bytes);
        if let Started::Up(f) = start_once(ssh, &command(&copied))? {
            return Ok(f);
        }
        copy_binary(ssh, &bytes, &copied)?;
        tracing::info!("copied {} to {dest}:{copied}", from.display());
        return match start_once(ssh, &command(&copied))? {
            Started::Up(f) => Ok(f),
            Started::Missing(said) => Err(EngineError::Connect(format!(
                "copied {} to {dest}:{copied}, but it does not run there; it said:{}",
                from.display(),
                as_said(&said)
            ))),
        };
    }
    let said = if said.is_empty() {
        String::new()
    } else {
        format!("; it said:{}", as_said(&said))
    };
    Err(EngineError::Connect(format!(
        "longhaul is not installed on {dest}, or not as '{remote}': install it there (the same version as here, {}), name it with --remote-path PATH, or pass --copy-binary to copy a build that runs there (checked against its machine type and glibc first){said}",
        env!("CARGO_PKG_VERSION")
    )))
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
fn start_once(ssh: &Ssh, remote: &str) -> Result<Started, EngineError> {
    let dest = &ssh.dest;
    let rsh = ssh.line().unwrap_or_else(|_| ssh.program().to_string());
    let mut c = ssh.command(remote);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Owned::new(c.spawn().map_err(|e| {
        EngineError::Connect(format!(
            "cannot run '{rsh}' to reach {dest}: {e} (is ssh installed? choose the command with -e/--rsh)"
        ))
    })?);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(EngineError::Failed("ssh's pipes were not made".into()));
    };
    crate::net::tls::seed_random_early();
    let (kept, stderr_ended) = keep_stderr(stderr);
    let lines = watch_stdout(stdout);
    match lines.recv_timeout(HANDSHAKE_WAIT) {
        Ok(Ok(line)) => {
            let handshake = Handshake::parse(&line).map_err(|e| {
                EngineError::Connect(format!("the far end on {dest} answered, but: {e}"))
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
        Err(_) => Err(EngineError::Connect(format!(
            "no answer from the far end on {dest} within {} s (ssh still running: check that `{rsh} {dest}` works without prompting)",
            HANDSHAKE_WAIT.as_secs()
        ))),
        Ok(Err(())) => {
            drop(stdin);
            // ssh ended (or said too much): its status and its words.
            let status = child.wait_for(Duration::from_secs(5));
            // What ssh wrote last (why it failed) may still be in the pipe.
            let _ = stderr_ended.recv_timeout(Duration::from_secs(2));
            let said = kept.lock().map(|k| k.trim().to_string()).unwrap_or_default();
            let code = status.and_then(|s| s.code());
            if let Some(e) = ssh.refused_login(code, &said) {
                return Err(EngineError::Connect(e));
            }
            not_started(dest, code, said)
        }
    }
}

/// Why a far end did not start: its command missing (worth a copied
/// binary), or ssh's status and words.
fn not_started(dest: &str, code: Option<i32>, said: String) -> Result<Started, EngineError> {
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
    Err(EngineError::Connect(format!(
        "cannot start the far end on {dest}: {how}{said}"
    )))
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

/// A build that runs on the far host, for `--copy-binary`: `named`, else
/// this binary or the portable build beside it, by that host's own account
/// of its machine type and C library. Where it came from, and its bytes.
fn build_for(ssh: &Ssh, named: Option<&Path>) -> Result<(PathBuf, Vec<u8>), EngineError> {
    let dest = &ssh.dest;
    let said = ssh.run(portable::PROBE, None)?;
    let far = portable::parse_probe(&said).map_err(|e| {
        EngineError::Connect(format!("--copy-binary cannot tell what {dest} runs: {e}"))
    })?;
    let exe = std::env::current_exe()
        .map_err(|e| EngineError::Failed(format!("cannot find this program's binary: {e}")))?;
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
            EngineError::Usage(format!(
                "--copy-binary: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let needs = portable::needs(&bytes)
            .map_err(|e| EngineError::Usage(format!("--copy-binary: {}: {e}", path.display())))?;
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
    let (_, path, bytes) =
        pick.ok_or_else(|| EngineError::Connect(portable::advice(dest, &far, &tried)))?;
    tracing::info!(
        "{dest} is {} with {}: copying {}",
        far.machine,
        far.libc,
        path.display()
    );
    Ok((path, bytes))
}

/// Puts `bytes` at `path` on the far host, its owner's alone.
fn copy_binary(ssh: &Ssh, bytes: &[u8], path: &str) -> Result<(), EngineError> {
    let part = format!("{path}.part");
    let script = format!(
        "umask 077 && mkdir -p .cache/longhaul && cat > {part} && chmod 700 {part} && mv -f {part} {path}"
    );
    ssh.run(&script, Some(bytes))?;
    Ok(())
}
