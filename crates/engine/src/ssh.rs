//! The user's own ssh (`--rsh`/`LONGHAUL_RSH`, else `ssh`: their config,
//! keys, agent and jump hosts), as every part of longhaul runs it: [`Ssh`]
//! (the command line split once, the destination checked once, an
//! OpenSSH master connection shared when asked), [`Target`] (`[USER@]HOST:path`
//! read as scp reads it), and what ssh said, escaped for a terminal
//! ([`as_said`]).
//!
//! Far ends over ssh (a one-shot server, `cp HOST:path`) are
//! [`crate::reach`]'s; this module only runs commands.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{self, Owned};

/// What went wrong running ssh.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The command line or the host cannot be used (the user's to fix).
    #[error("{0}")]
    Usage(String),
    /// ssh did not run, or the far command failed (what it said follows).
    #[error("{0}")]
    Failed(String),
    /// The far command did not end within the caller's limit (ended here).
    #[error("{0}")]
    TimedOut(String),
}

impl From<SshError> for crate::EngineError {
    fn from(e: SshError) -> Self {
        match e {
            SshError::Usage(m) => crate::EngineError::Usage(m),
            SshError::Failed(m) | SshError::TimedOut(m) => crate::EngineError::Connect(m),
        }
    }
}

impl From<SshError> for String {
    fn from(e: SshError) -> Self {
        e.to_string()
    }
}

/// How to run commands on one far host.
#[derive(Clone, Debug)]
pub struct Ssh {
    /// The ssh command line, split.
    argv: Vec<String>,
    /// Options that make ssh use a master connection ([`Ssh::multiplex`]).
    mux: Vec<String>,
    /// Each command in a process group of its own that dies with this
    /// program ([`process::own`]); not for an ssh that may ask for a
    /// password at the terminal.
    owned: bool,
    /// Nobody is there to answer a prompt ([`Ssh::unattended`]).
    unattended: bool,
    /// `[USER@]HOST` as ssh takes it.
    pub dest: String,
}

impl Ssh {
    /// `rsh` (else `ssh`) to reach `dest`. A host that starts with `-` is
    /// refused: ssh would read it as an option (`-oProxyCommand=...`).
    pub fn new(dest: &str, rsh: Option<&str>) -> Result<Ssh, SshError> {
        let line = rsh.unwrap_or("ssh");
        let argv = shlex::split(line)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                SshError::Usage(format!(
                    "--rsh '{line}': not a command line (check its quotes)"
                ))
            })?;
        if dest.starts_with('-') {
            return Err(SshError::Usage(format!(
                "'{dest}': a host name cannot start with '-'"
            )));
        }
        if dest.is_empty() {
            return Err(SshError::Usage("an empty host name".into()));
        }
        Ok(Ssh {
            argv,
            mux: Vec::new(),
            owned: false,
            unattended: false,
            dest: dest.to_string(),
        })
    }

    /// Every command in a process group of its own that ends if this
    /// program dies (for commands that never prompt: a matrix's).
    pub fn owned(mut self) -> Ssh {
        self.owned = true;
        self
    }

    /// For a command nobody watches (a job, a fleet's rank, a matrix): with
    /// OpenSSH, `-o BatchMode=yes`, so that a password, a key's passphrase
    /// or an unknown host key fails the login at once instead of waiting
    /// for an answer that never comes (another `--rsh` must not prompt);
    /// and a refused login says it needs a key ([`needs_key`]).
    pub fn unattended(mut self) -> Ssh {
        if !self.unattended && self.is_openssh() {
            self.argv
                .splice(1..1, ["-o".to_string(), "BatchMode=yes".to_string()]);
        }
        self.unattended = true;
        self
    }

    /// Whether nobody answers its prompts ([`Ssh::unattended`]).
    pub fn is_unattended(&self) -> bool {
        self.unattended
    }

    fn is_openssh(&self) -> bool {
        Path::new(self.program()).file_name() == Some(std::ffi::OsStr::new("ssh"))
    }

    /// The program that runs ssh (the first word of `--rsh`).
    pub fn program(&self) -> &str {
        &self.argv[0]
    }

    /// The command line with its multiplexing options, quoted for a shell:
    /// what another longhaul takes as `LONGHAUL_RSH`.
    pub fn line(&self) -> Result<String, SshError> {
        let words: Vec<&str> = self
            .argv
            .iter()
            .chain(&self.mux)
            .map(String::as_str)
            .collect();
        quote(&words)
    }

    /// ssh running `remote` (a shell command line) on the far host.
    pub fn command(&self, remote: &str) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .args(&self.mux)
            .arg(&self.dest)
            .arg(remote);
        if self.owned {
            process::own(&mut c);
        }
        c
    }

    /// Runs a short far command, feeding it `input`: its standard output,
    /// trimmed.
    pub fn run(&self, remote: &str, input: Option<&[u8]>) -> Result<String, SshError> {
        self.run_within(remote, input, None)
    }

    /// [`Ssh::run`], for at most `limit` (None: no limit): a far host that
    /// stops answering ends in an error that says how long it was waited for.
    pub fn run_within(
        &self,
        remote: &str,
        input: Option<&[u8]>,
        limit: Option<Duration>,
    ) -> Result<String, SshError> {
        let dest = &self.dest;
        let ran = process::output_within(&mut self.command(remote), input, limit).map_err(|e| {
            SshError::Failed(format!(
                "cannot run `{}` to reach {dest}: {e}",
                self.program()
            ))
        })?;
        let (out, fed) = match ran {
            process::Within::Ended { output, fed } => (output, fed),
            process::Within::TimedOut { stderr } => {
                return Err(SshError::TimedOut(format!(
                    "`{remote}` on {dest} did not end within {:.0} s (ended here); it said:{}",
                    limit.unwrap_or_default().as_secs_f64(),
                    as_said(&String::from_utf8_lossy(&stderr))
                )))
            }
        };
        // A far command that ended before taking all its input says why on
        // its standard error: that, not the broken pipe, is the error.
        if let (Err(e), true) = (fed, out.status.success()) {
            return Err(SshError::Failed(format!(
                "cannot write to `{remote}` on {dest} over ssh: {e}"
            )));
        }
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            if let Some(e) = self.refused_login(out.status.code(), &said) {
                return Err(SshError::Failed(e));
            }
            return Err(SshError::Failed(format!(
                "`{remote}` on {dest} failed ({}); it said:{}",
                out.status,
                as_said(&said)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// With OpenSSH (`ssh` as the command), a master connection of ours in
    /// the foreground (`ControlMaster=yes -N`, not `-M`: with the option
    /// that makes it `ask`; ended by its process group when dropped, and
    /// with this program), and an `Ssh` that uses it: one key exchange for
    /// many short commands. Otherwise, or if it does not come up within
    /// 15 s, this `Ssh` as it is. `sock`: where its socket goes (a
    /// private directory).
    pub fn multiplex(&self, sock: &Path) -> (Ssh, Option<Owned>) {
        if !self.is_openssh() {
            return (self.clone(), None);
        }
        let path = format!("ControlPath={}", sock.display());
        let mut c = Command::new(self.program());
        c.args(&self.argv[1..])
            .args([
                "-o",
                &path,
                "-o",
                "ControlMaster=yes",
                "-o",
                "ControlPersist=no",
            ])
            .arg("-N")
            .arg(&self.dest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let Ok(master) = Owned::spawn(&mut c) else {
            return (self.clone(), None);
        };
        let mut master = master.with_grace(Duration::from_secs(3));
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if sock.exists() {
                let mut s = self.clone();
                s.mux = vec!["-o".into(), path, "-o".into(), "ControlMaster=no".into()];
                return (s, Some(master));
            }
            if master.ended() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (self.clone(), None)
    }

    /// An unattended ssh that ended with ssh's own status (255) because the
    /// login needed an answer: the error that says so and what to do.
    pub fn refused_login(&self, code: Option<i32>, said: &str) -> Option<String> {
        if !self.unattended || code != Some(255) || !needs_key(said) {
            return None;
        }
        Some(format!(
            "ssh needs a key or agent: the login to {} asked for a password, a key's passphrase or the confirmation of a host key, and nobody is there to answer (ssh runs with BatchMode=yes here); give the account that runs longhaul a key it can use unprompted (an agent, or a key without a passphrase that the far host limits) and the host's key in its known_hosts; ssh said:{}",
            self.dest,
            as_said(said)
        ))
    }
}

/// Whether what ssh said is a login that needed an answer: a password or
/// passphrase it could not ask for, or a host key nobody confirmed.
pub fn needs_key(said: &str) -> bool {
    [
        "Permission denied",
        "Host key verification failed",
        "No more authentication methods",
        "read_passphrase",
        "Too many authentication failures",
    ]
    .iter()
    .any(|w| said.contains(w))
}

/// `words` quoted for the far shell.
pub fn quote(words: &[&str]) -> Result<String, SshError> {
    shlex::try_join(words.iter().copied())
        .map_err(|e| SshError::Usage(format!("cannot quote {words:?} for the far shell: {e}")))
}

/// Lines of ssh's own words shown at most: the last, where ssh says why.
const SAID_LINES: usize = 20;

/// What ssh (or the far shell) said, as it printed it: its last lines,
/// each on a line of its own, indented under the message; control bytes
/// escaped for the terminal, nothing else changed.
pub fn as_said(said: &str) -> String {
    let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(SAID_LINES);
    lines[from..]
        .iter()
        .map(|l| format!("\n    {}", longhaul_proto::units::escaped(l.trim_end())))
        .collect()
}

/// A path on a host reached over ssh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `[USER@]HOST` as ssh takes it (an IPv6 address without brackets).
    pub dest: String,
    /// The path as written after the `:` (relative to the far home unless
    /// it starts with `/`).
    pub path: String,
}

impl Target {
    /// Reads `arg` as `[USER@]HOST:path` (ssh), or None: a local path (no
    /// `:` before the first `/`, as scp), a server (`longhaul://...`, or a
    /// port after the host: `HOST:PORT:EXPORT/path`).
    pub fn parse(arg: &str) -> Option<Target> {
        if arg.contains("://") {
            return None;
        }
        let (user, rest) = match arg.split_once('@') {
            Some((u, r)) if !u.is_empty() && !u.contains('/') && !u.contains(':') => (Some(u), r),
            _ => (None, arg),
        };
        let (host, path) = if let Some(s) = rest.strip_prefix('[') {
            s.split_once("]:")?
        } else {
            rest.split_once(':')?
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
        Some(Target {
            dest,
            path: path.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_colon_path_is_ssh_and_a_port_or_scheme_is_a_server() {
        let t = Target::parse("dtn1:data/run7").unwrap();
        assert_eq!((t.dest.as_str(), t.path.as_str()), ("dtn1", "data/run7"));
        let t = Target::parse("me@dtn1:/scratch/x").unwrap();
        assert_eq!(
            (t.dest.as_str(), t.path.as_str()),
            ("me@dtn1", "/scratch/x")
        );
        let t = Target::parse("me@[::1]:x").unwrap();
        assert_eq!(t.dest, "me@::1");
        assert_eq!(Target::parse("dtn1:").unwrap().path, "");
        assert_eq!(Target::parse("dtn1:5310:data/x"), None);
        assert_eq!(Target::parse("[::1]:5310:data"), None);
        assert_eq!(Target::parse("longhaul://dtn1/data/x"), None);
        assert_eq!(Target::parse("./a:b"), None);
        assert_eq!(Target::parse("/tmp/x"), None);
        assert_eq!(Target::parse("plain"), None);
        assert_eq!(Target::parse(":x"), None);
    }

    #[test]
    fn a_host_that_ssh_would_read_as_an_option_or_a_broken_rsh_is_refused() {
        assert!(matches!(
            Ssh::new("-oProxyCommand=x", None),
            Err(SshError::Usage(_))
        ));
        assert!(matches!(
            Ssh::new("h", Some("ssh 'unclosed")),
            Err(SshError::Usage(_))
        ));
        let s = Ssh::new("h", Some("ssh -F 'my config'")).unwrap();
        assert_eq!(s.line().unwrap(), "ssh -F 'my config'");
    }

    /// A far command that fails before it read its input (no room for a
    /// copied binary, say): the error is what it said, not a broken pipe.
    #[test]
    fn a_far_command_that_ends_before_its_input_says_why() {
        let ssh = Ssh::new("h", Some("sh -c 'echo no room left >&2; exit 3'")).unwrap();
        let e = ssh
            .run("cat > x", Some(&vec![0u8; 4 << 20]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no room left") && e.contains("3"), "{e}");
    }

    #[test]
    fn an_unattended_openssh_never_prompts_and_a_refused_login_says_it_needs_a_key() {
        let s = Ssh::new("h", Some("/usr/bin/ssh -F cfg"))
            .unwrap()
            .unattended();
        assert_eq!(s.line().unwrap(), "/usr/bin/ssh -o 'BatchMode=yes' -F cfg");
        assert_eq!(s.clone().unattended().line().unwrap(), s.line().unwrap());
        let other = Ssh::new("h", Some("my-rsh -x")).unwrap().unattended();
        assert_eq!(other.line().unwrap(), "my-rsh -x");
        let said = "me@h: Permission denied (publickey,password).";
        let e = s.refused_login(Some(255), said).unwrap();
        assert!(
            e.starts_with("ssh needs a key or agent: ") && e.contains(said),
            "{e}"
        );
        assert!(s.refused_login(Some(1), said).is_none());
        assert!(s.refused_login(Some(255), "Connection refused").is_none());
        let attended = Ssh::new("h", None).unwrap();
        assert!(attended.refused_login(Some(255), said).is_none());
        assert!(needs_key("Host key verification failed."));
    }

    #[test]
    fn what_ssh_said_is_escaped_and_indented() {
        assert_eq!(as_said("a\n\n\x1b[31mb\n"), "\n    a\n    \\u{1b}[31mb");
    }
}
