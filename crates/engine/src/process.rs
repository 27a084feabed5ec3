//! Processes this program starts and owns: [`own`] puts one in a process
//! group of its own that the kernel ends should this program die,
//! [`Owned`] ends that group when it is dropped, and [`find_program`] is
//! the one lookup of a program on PATH.
//!
//! Every process is ended by its own id (or its group's, which is its id),
//! never by name: other users and other runs on the same host run the same
//! programs. Syscalls go through rustix.
//!
//! This file needs only std and rustix: the test kit (`longhaul-testkit`,
//! below the engine in the tests' build) compiles it as its own process
//! module, so that tests and the binary end their processes one way.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, kill_process_group, Pid, Signal};

/// Puts the process `c` starts in a process group of its own (so that
/// ending the group ends what it forked), and has the kernel send it
/// SIGTERM when the thread that started it dies (the parent-death signal).
///
/// Not for a process that reads the terminal (ssh asking for a password):
/// a group other than the terminal's foreground group cannot.
pub fn own(c: &mut Command) -> &mut Command {
    c.process_group(0);
    // SAFETY: prctl(2) only, which is async-signal-safe; nothing else runs
    // between fork and exec.
    unsafe {
        c.pre_exec(|| {
            let _ = rustix::process::set_parent_process_death_signal(Some(Signal::TERM));
            Ok(())
        });
    }
    c
}

/// A child process of ours, ended when dropped: its process group (and it)
/// get SIGTERM, then SIGKILL after its grace (none by default: SIGKILL at
/// once), and it is reaped.
#[derive(Debug)]
pub struct Owned {
    child: Child,
    grace: Duration,
}

impl Owned {
    /// Takes `child` (started from a command [`own`] set up, or any).
    pub fn new(child: Child) -> Owned {
        Owned {
            child,
            grace: Duration::ZERO,
        }
    }

    /// Starts `c` in a group of its own that dies with this program ([`own`]).
    pub fn spawn(c: &mut Command) -> std::io::Result<Owned> {
        own(c).spawn().map(Owned::new)
    }

    /// When dropped, SIGTERM first and SIGKILL only after `grace`.
    pub fn with_grace(mut self, grace: Duration) -> Owned {
        self.grace = grace;
        self
    }

    /// Its process id (and, started by [`own`], its group's).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its process id as the standard library gives it.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has ended (reaped if so).
    pub fn ended(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for it to end by itself; its status if it did.
    pub fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => return None,
            }
        }
    }

    /// Sends `signal` to its process group, else (not a group's leader) to
    /// it while it is not reaped: once reaped, its id may be another's.
    fn signal(&mut self, signal: Signal) {
        let Some(pid) = Pid::from_raw(self.pid()) else {
            return;
        };
        if kill_process_group(pid, signal).is_err() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill_process(pid, signal);
        }
    }

    /// Ends it now: SIGKILL to its group and to it, then reaps it.
    pub fn kill(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.signal(Signal::KILL);
        let _ = self.child.kill();
        self.child.wait()
    }
}

impl std::ops::Deref for Owned {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Owned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.grace.is_zero() {
            self.signal(Signal::TERM);
            // What its group forked may outlive it: SIGKILL follows either way.
            let _ = self.wait_for(self.grace);
        }
        let _ = self.kill();
    }
}

/// Sends SIGKILL to the process group `pgid` (a process [`own`] started,
/// or what it left behind), and to the process `pgid` should it lead none.
pub fn kill_group(pgid: i32) {
    let Some(pid) = Pid::from_raw(pgid) else {
        return;
    };
    if kill_process_group(pid, Signal::KILL).is_err() {
        let _ = kill_process(pid, Signal::KILL);
    }
}

/// How a command run by [`output_within`] ended.
#[derive(Debug)]
pub enum Within {
    /// It ended: its status and output, and whether all its input was
    /// written (a command that ends before reading it says why on stderr).
    Ended {
        output: std::process::Output,
        fed: std::io::Result<()>,
    },
    /// It was still running at the limit and was killed (its process
    /// group too): what it had written to its standard error by then.
    TimedOut { stderr: Vec<u8> },
}

/// Runs `c` to its end, `input` on its standard input (else none), its
/// standard output and error captured, for at most `limit` (None: no
/// limit); past it, the command and its process group are killed. A
/// descendant that keeps the output pipes open (an OpenSSH master that was
/// handed them) cannot hold the caller past the limit: what was read by
/// then is what is returned.
pub fn output_within(
    c: &mut Command,
    input: Option<&[u8]>,
    limit: Option<Duration>,
) -> std::io::Result<Within> {
    use std::process::Stdio;
    c.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = Owned::new(c.spawn()?);
    let out = Collected::start(child.stdout.take(), usize::MAX);
    let err = Collected::start(child.stderr.take(), usize::MAX);
    let fed = match (input, child.stdin.take()) {
        (Some(data), Some(mut w)) => {
            let data = data.to_vec();
            Some(std::thread::spawn(move || {
                std::io::Write::write_all(&mut w, &data)
            }))
        }
        _ => None,
    };
    let status = match limit {
        Some(limit) => child.wait_for(limit),
        None => Some(child.wait()?),
    };
    let Some(status) = status else {
        let _ = child.kill();
        let stderr = err.within(Duration::ZERO);
        return Ok(Within::TimedOut { stderr });
    };
    let fed = fed.map_or(Ok(()), |t| {
        t.join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the input writer panicked")))
    });
    Ok(Within::Ended {
        output: std::process::Output {
            status,
            stdout: out.all(),
            stderr: err.all(),
        },
        fed,
    })
}

/// A child's output stream read to its end on a thread of its own (so
/// that a chatty child never blocks on a full pipe), its last bytes kept.
pub struct Collected {
    thread: Option<std::thread::JoinHandle<()>>,
    buf: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    ended: std::sync::mpsc::Receiver<()>,
}

impl Collected {
    /// Reads `from` (if any) to its end, keeping its last `keep` bytes at most.
    pub fn start(from: Option<impl std::io::Read + Send + 'static>, keep: usize) -> Collected {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, ended) = std::sync::mpsc::channel();
        let thread = from.map(|mut r| {
            let buf = buf.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n @ 1..) = std::io::Read::read(&mut r, &mut chunk) {
                    if let Ok(mut b) = buf.lock() {
                        b.extend_from_slice(&chunk[..n]);
                        // Trimmed by halves: a long stream costs no copy per read.
                        if b.len() > keep.saturating_mul(2) {
                            let cut = b.len() - keep;
                            b.drain(..cut);
                        }
                    }
                }
                let _ = tx.send(());
            })
        });
        Collected { thread, buf, ended }
    }

    /// What was read, once the stream has ended or `wait` has passed (a
    /// descendant may hold the stream open): its last bytes kept.
    pub fn within(&self, wait: Duration) -> Vec<u8> {
        if self.thread.is_some() {
            let _ = self.ended.recv_timeout(wait);
        }
        self.buf.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Everything kept, once the stream has ended.
    pub fn all(mut self) -> Vec<u8> {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.buf
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }
}

/// Where `program` is: a path with a `/` as it is, else the first
/// executable file of that name on PATH, then in /usr/sbin and /sbin
/// (sshd and the like are off a user's PATH).
pub fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &PathBuf| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return Some(PathBuf::from(program)).filter(executable);
    }
    if program.is_empty() {
        return None;
    }
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(executable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_child_and_what_it_forked_are_ended() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 60 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        let mut owned = Owned::spawn(&mut c)
            .expect("start sh")
            .with_grace(Duration::from_millis(200));
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(owned.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the grandchild's pid");
        let grandchild: i32 = line.trim().parse().expect("a pid");
        drop(owned);
        let gone = || {
            std::fs::read_to_string(format!("/proc/{grandchild}/stat")).map_or(true, |s| {
                s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
            })
        };
        let until = Instant::now() + Duration::from_secs(10);
        while !gone() {
            assert!(
                Instant::now() < until,
                "the grandchild {grandchild} lives on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn output_within_ends_a_command_at_its_limit_and_reads_a_chatty_one_whole() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo started >&2; exec sleep 60"]);
        let t0 = Instant::now();
        let Ok(Within::TimedOut { stderr }) =
            output_within(own(&mut c), None, Some(Duration::from_millis(300)))
        else {
            panic!("not ended at its limit");
        };
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert_eq!(stderr, b"started\n");
        // 1 MiB on each stream, far past a pipe's 64 KiB, and its input read back.
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "head -c 1048576 /dev/zero >&2; cat; head -c 1048576 /dev/zero",
        ]);
        let Ok(Within::Ended { output, fed }) =
            output_within(&mut c, Some(b"in"), Some(Duration::from_secs(60)))
        else {
            panic!("not ended");
        };
        assert!(output.status.success() && fed.is_ok());
        assert_eq!(output.stderr.len(), 1 << 20);
        assert_eq!(&output.stdout[..2], b"in");
        assert_eq!(output.stdout.len(), 2 + (1 << 20));
    }

    #[test]
    fn a_collected_stream_keeps_its_last_bytes() {
        let c = Collected::start(Some(std::io::Cursor::new(vec![7u8; 100_000])), 10);
        let kept = c.all();
        assert!((10..=20).contains(&kept.len()), "{}", kept.len());
    }

    #[test]
    fn programs_are_found_on_the_path_and_in_sbin() {
        assert!(find_program("sh").is_some());
        assert_eq!(find_program("no-such-program-longhaul"), None);
        assert_eq!(find_program(""), None);
        assert_eq!(find_program("/no/such/sh"), None);
    }
}
