//! What the matrix runs: the emulated path, the peers' servers, one timed
//! client run with its CPU (from its cgroup), the data.
//!
//! Every process started here is ended by its process id (its own process
//! group, SIGTERM then SIGKILL), when its path is done, when the matrix is
//! interrupted, and by the kernel (parent-death signal) should the matrix
//! itself die.

use std::collections::BTreeMap;
use std::io::{BufRead, Write as _};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::cgroup::Group;

/// A process of ours, ended (by its process group: SIGTERM, then SIGKILL
/// after [`GRACE`]) when dropped.
pub use longhaul_engine::process::Owned;

/// How long a process of ours has to end after SIGTERM.
const GRACE: Duration = Duration::from_secs(3);

/// A command in its own process group (and `cgroup`, where CPU is
/// counted), killed if the matrix dies.
fn command(
    argv: &[String],
    netns: Option<&str>,
    cgroup: Option<&Group>,
) -> Result<Command, String> {
    let mut full: Vec<String> = Vec::new();
    if let Some(ns) = netns {
        full.extend(["ip".into(), "netns".into(), "exec".into(), ns.into()]);
    }
    full.extend(argv.iter().cloned());
    let (prog, rest) = full.split_first().ok_or("an empty command")?;
    let mut c = Command::new(prog);
    longhaul_engine::process::own(c.args(rest).stdin(Stdio::null()));
    if let Some(g) = cgroup {
        let join = g.joiner();
        // SAFETY: the joiner only opens and writes a path made before the fork.
        unsafe { c.pre_exec(move || join.join_self()) };
    }
    Ok(c)
}

/// An emulated path: `longhaul wan up` as our child.
pub struct Wan {
    /// Ends the emulator when dropped.
    pub _proc: Owned,
    /// Its standard error, read (and dropped but for its end) while it runs.
    _said: longhaul_engine::process::Collected,
    pub ns_a: String,
    pub ns_b: String,
    pub host_b: String,
}

/// How long `longhaul wan up` may take to say that its path is up (its
/// namespaces, TUN devices and routes made: seconds on a loaded host).
pub const WAN_UP_LIMIT: Duration = Duration::from_secs(60);

/// The last bytes of the emulator's standard error kept for an error.
const WAN_SAID: usize = 16 << 10;

/// Starts the emulated path and waits (at most `limit`) for `wan up`'s
/// first line, which says its hosts. Its standard output and error are
/// read to their end meanwhile, so a chatty emulator never blocks on a
/// full pipe; the last of its standard error goes into the error.
pub fn wan_up(
    bin: &Path,
    rtt: Duration,
    loss: f64,
    rate: u64,
    limit: Duration,
) -> Result<Wan, String> {
    let name = format!("lhm{}", std::process::id());
    let names = longhaul_engine::wan::net::Names::new(&name).map_err(|e| e.to_string())?;
    let argv: Vec<String> = vec![
        bin.display().to_string(),
        "wan".into(),
        "up".into(),
        "--name".into(),
        name,
        "--rtt".into(),
        format!("{}us", rtt.as_micros()),
        "--loss".into(),
        loss.to_string(),
        "--rate".into(),
        rate.to_string(),
        "--mtu".into(),
        "9000".into(),
        "--json".into(),
    ];
    let mut c = command(&argv, None, None)?;
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start `longhaul wan up`: {e}"))?;
    let mut proc = Owned::new(child).with_grace(GRACE);
    let said = longhaul_engine::process::Collected::start(proc.stderr.take(), WAN_SAID);
    let first = first_line(proc.stdout.take().ok_or("no stdout")?);
    let line = match first.recv_timeout(limit) {
        Ok(l) => l,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            return Err(format!(
                "the emulated path did not come up within {:.0} s (`longhaul wan up` said \
                 nothing on its standard output; ended here): the host may be overloaded, run \
                 the matrix again when it is not{}",
                limit.as_secs_f64(),
                said_text(&said.within(Duration::ZERO))
            ));
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => String::new(),
    };
    if !line.contains("\"hosts\"") {
        let _ = proc.wait_for(GRACE);
        return Err(format!(
            "the emulated path did not come up (it needs root and /dev/net/tun){}",
            said_text(&said.within(GRACE))
        ));
    }
    Ok(Wan {
        _proc: proc,
        _said: said,
        ns_a: names.ns_a,
        ns_b: names.ns_b,
        host_b: longhaul_engine::wan::net::ADDR_B.to_string(),
    })
}

/// The first line `out` gives, sent when read; the rest is read and
/// dropped, so the writer never blocks on a full pipe.
fn first_line(out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(out);
        let mut line = String::new();
        if r.read_line(&mut line).is_ok_and(|n| n > 0) {
            let _ = tx.send(line);
        }
        drop(tx);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    rx
}

/// What a child said on its standard error, for an error message
/// ([`super::peers::error_text`]), after a colon; nothing when it said nothing.
fn said_text(said: &[u8]) -> String {
    let text = super::peers::error_text(&String::from_utf8_lossy(said));
    if text.is_empty() {
        return String::new();
    }
    format!(": {text}")
}

/// A network namespace with only its loopback, for the `loopback` path;
/// removed when dropped.
pub struct PrivateNs {
    pub name: String,
}

impl PrivateNs {
    /// None where this process may not make one (not root, no iproute2):
    /// the path then uses the host's own loopback.
    pub fn new() -> Option<PrivateNs> {
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        let name = format!("lhm{}-l", std::process::id());
        longhaul_engine::wan::net::ip(&["netns", "add", &name]).ok()?;
        let ns = PrivateNs { name };
        longhaul_engine::wan::net::ip(&["-n", &ns.name, "link", "set", "lo", "up"]).ok()?;
        Some(ns)
    }
}

impl Drop for PrivateNs {
    fn drop(&mut self) {
        let _ = longhaul_engine::wan::net::ip(&["netns", "del", &self.name]);
    }
}

/// Runs `f` on a thread of its own in the network namespace `netns` (as
/// `ip netns add` names it) or here: its sockets and its /proc/sys/net are
/// that namespace's.
fn in_netns<T: Send + 'static>(
    netns: Option<&str>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let ns = netns.map(|n| format!("/run/netns/{n}"));
    std::thread::spawn(move || {
        if let Some(ns) = ns {
            let file = std::fs::File::open(&ns).map_err(|e| format!("{ns}: {e}"))?;
            use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
            use std::os::fd::AsFd;
            // This thread only.
            move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
                .map_err(|e| format!("cannot enter the network namespace {ns}: {e}"))?;
        }
        Ok(f())
    })
    .join()
    .map_err(|_| "a thread in a network namespace panicked".to_string())?
}

/// Connects to `host:port` from inside `netns` (or here): the ready check.
pub fn connects(netns: Option<&str>, host: &str, port: u16) -> bool {
    let addr = format!("{host}:{port}");
    in_netns(netns, move || {
        let Ok(a) = addr.parse::<std::net::SocketAddr>() else {
            return false;
        };
        std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok()
    })
    .unwrap_or(false)
}

pub use longhaul_archive::matrix::HostTuning;

/// The least TCP autotuning maximum an emulated host gets: Linux's default.
const DTN_LEAST_MAX: u64 = 4 << 20;
/// The most a tcp_rmem or tcp_wmem number can be (an int).
const SYSCTL_MOST: u64 = i32::MAX as u64;

/// A host's TCP autotuning maximum on a path of `bdp` bytes: twice the
/// product (fasterdata.es.net's host tuning: room for the window and the
/// kernel's overhead), or what it had where that is more, at least 4 MiB.
pub fn dtn_max(current: u64, bdp: u64) -> u64 {
    current
        .max(bdp.saturating_mul(2).min(SYSCTL_MOST))
        .max(DTN_LEAST_MAX)
}

/// tcp_rmem's or tcp_wmem's `MIN DEFAULT MAX` (`text`) with its MAX
/// raised for a path of `bdp` bytes ([`dtn_max`]); MIN and DEFAULT kept.
pub fn dtn_triple(text: &str, bdp: u64) -> Result<[u64; 3], String> {
    let v: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("'{}': {e}", text.trim()))?;
    let [min, default, max] = v[..] else {
        return Err(format!("'{}': not three numbers", text.trim()));
    };
    Ok([min, default, dtn_max(max, bdp)])
}

/// Tunes the emulated path's hosts (`namespaces`) as data transfer nodes
/// for a path of `bdp` bytes: net.ipv4.tcp_wmem and tcp_rmem (one per
/// namespace since Linux 4.15) raised to [`dtn_max`] in each, so that a
/// tool left to the kernel's autotuning can fill the path with one
/// stream. net.core.wmem_max and rmem_max, what an explicit SO_SNDBUF or
/// SO_RCVBUF may get, are not per namespace: the host's stay.
pub fn tune_hosts(namespaces: [&str; 2], bdp: u64) -> Result<HostTuning, String> {
    let mut t = HostTuning {
        tcp_wmem_max: u64::MAX,
        tcp_rmem_max: u64::MAX,
        bdp_bytes: bdp,
        wmem_max: longhaul_engine::net::sock::sysctl_u64("/proc/sys/net/core/wmem_max"),
        rmem_max: longhaul_engine::net::sock::sysctl_u64("/proc/sys/net/core/rmem_max"),
    };
    for ns in namespaces {
        let [w, r] = in_netns(Some(ns), move || {
            ["tcp_wmem", "tcp_rmem"].map(|name| tune_sysctl(name, bdp))
        })?;
        let (w, r) = (
            w.map_err(|e| format!("{ns}: {e}"))?,
            r.map_err(|e| format!("{ns}: {e}"))?,
        );
        t.tcp_wmem_max = t.tcp_wmem_max.min(w);
        t.tcp_rmem_max = t.tcp_rmem_max.min(r);
    }
    Ok(t)
}

/// Raises net.ipv4.`name` (tcp_wmem or tcp_rmem) of this thread's network
/// namespace for a path of `bdp` bytes; its MAX as it reads back.
fn tune_sysctl(name: &str, bdp: u64) -> Result<u64, String> {
    let file = format!("/proc/sys/net/ipv4/{name}");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
    let [min, default, max] = dtn_triple(&text, bdp).map_err(|e| format!("{file}: {e}"))?;
    std::fs::write(&file, format!("{min} {default} {max}"))
        .map_err(|e| format!("cannot raise {file} to {max}: {e}"))?;
    longhaul_engine::net::sock::sysctl_triple(&file)
        .map(|t| t[2])
        .ok_or_else(|| format!("{file}: unreadable after it was set"))
}

/// Seconds a TCP connection to `host:port` takes to open (about one
/// round trip); None when it does not.
pub fn connect_seconds(host: &str, port: u16) -> Option<f64> {
    let a: std::net::SocketAddr = format!("{host}:{port}").parse().ok()?;
    let t0 = Instant::now();
    std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)).ok()?;
    Some(t0.elapsed().as_secs_f64())
}

/// Two free ports on loopback (in a fresh namespace every port is free).
pub fn free_ports() -> Result<(u16, u16), String> {
    let a = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let b = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let pa = a.local_addr().map_err(|e| e.to_string())?.port();
    let pb = b.local_addr().map_err(|e| e.to_string())?.port();
    Ok((pa, pb))
}

/// Starts a server (in `cgroup`) and waits until it accepts on `port`.
pub fn start_server(
    argv: &[String],
    netns: Option<&str>,
    hosts_file: Option<&Path>,
    addr: (&str, u16),
    log: &Path,
    cgroup: Option<&Group>,
) -> Result<Owned, String> {
    let (host, port) = addr;
    let argv: Vec<String> = match hosts_file {
        Some(h) => {
            let mut w: Vec<String> = vec![
                "unshare".into(),
                "-m".into(),
                "--propagation".into(),
                "private".into(),
                "sh".into(),
                "-c".into(),
                "mount --bind \"$0\" /etc/hosts && exec \"$@\"".into(),
                h.display().to_string(),
            ];
            w.extend(argv.iter().cloned());
            w
        }
        None => argv.to_vec(),
    };
    // Appended to: a server started again after a failed run keeps the
    // first start's lines.
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut c = command(&argv, netns, cgroup)?;
    c.stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", argv.join(" ")))?;
    let mut s = Owned::new(child).with_grace(GRACE);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(st)) = s.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!(
                "its server exited ({st}): {}",
                text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            ));
        }
        if connects(netns, host, port) {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "its server did not accept on {host}:{port} within 10 s"
    ))
}

/// How one client run ended.
pub struct Ran {
    pub seconds: f64,
    /// CPU seconds of the client and everything it forked, from its
    /// cgroup; None where none could be made.
    pub cpu: Option<f64>,
    pub stdout: String,
    pub stderr: String,
    pub error: Option<String>,
}

/// A client run: its command line, where it runs, and its limits.
pub struct Client<'a> {
    pub argv: &'a [String],
    pub netns: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
    pub timeout: Duration,
    pub stop: &'a AtomicBool,
    pub logdir: &'a Path,
    pub tag: &'a str,
    /// The cgroup of this run's client end.
    pub cgroup: Option<&'a Group>,
}

/// Runs a client to its end (or its timeout, or an interrupt): wall time
/// and its CPU. What it leaves behind in its process group and its cgroup
/// is killed.
pub fn run_client(r: &Client) -> Ran {
    let out = r.logdir.join(format!("{}.out", r.tag));
    let err = r.logdir.join(format!("{}.err", r.tag));
    let _ = std::fs::write(r.logdir.join(format!("{}.cmd", r.tag)), r.argv.join(" "));
    let fail = |m: String| Ran {
        seconds: 0.0,
        cpu: None,
        stdout: String::new(),
        stderr: String::new(),
        error: Some(m),
    };
    let (Ok(o), Ok(e)) = (std::fs::File::create(&out), std::fs::File::create(&err)) else {
        return fail(format!("cannot write logs in {}", r.logdir.display()));
    };
    let mut c = match command(r.argv, r.netns, r.cgroup) {
        Ok(c) => c,
        Err(m) => return fail(m),
    };
    c.stdout(o).stderr(e).envs(r.env);
    let cpu0 = r.cgroup.and_then(Group::usage);
    let t0 = Instant::now();
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return fail(format!("cannot start `{}`: {e}", r.argv[0])),
    };
    let pid = child.id() as i32;
    let mut ended_by: Option<&str> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code().unwrap_or(-1),
            Err(_) => break -1,
            Ok(None) => {}
        }
        if ended_by.is_none() && (t0.elapsed() > r.timeout || r.stop.load(Ordering::SeqCst)) {
            ended_by = Some(if r.stop.load(Ordering::SeqCst) {
                "interrupted"
            } else {
                "timed out"
            });
            longhaul_engine::process::kill_group(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let seconds = t0.elapsed().as_secs_f64();
    // Anything it left in its group and its cgroup.
    longhaul_engine::process::kill_group(pid);
    let cpu = r.cgroup.and_then(|g| {
        g.kill_all();
        Some(g.usage()? - cpu0?)
    });
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let error = if let Some(why) = ended_by {
        Some(format!("{why} after {seconds:.0} s"))
    } else if status == 0 {
        None
    } else {
        Some(format!(
            "exit {status}: {}",
            super::peers::error_text(&stderr)
        ))
    };
    Ran {
        seconds,
        cpu: cpu.map(|c| c.max(0.0)),
        stdout,
        stderr,
        error,
    }
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

/// Makes a workload's data under `dir` (absent before): returns its bytes
/// and files. The tree is `longhaul_proto::data::workload`'s: for the
/// mixed tree, with the edges a copy must keep (an empty directory inside
/// another, a symbolic link to a file, a private directory and files of
/// modes 0600 and 0755 among the 0644 ones).
pub fn make_data(workload: &str, dir: &Path, size: u64, files: u32) -> std::io::Result<(u64, u64)> {
    use longhaul_proto::data::{self, Planned};
    std::fs::create_dir_all(dir)?;
    let plan = data::workload(workload, size, files);
    for entry in &plan {
        match entry {
            Planned::Dir { path, .. } => std::fs::create_dir_all(dir.join(path))?,
            Planned::File {
                path,
                len,
                seed,
                mode,
            } => {
                let f = dir.join(path);
                if let Some(parent) = f.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let mut out =
                    std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&f)?);
                data::write_random(&mut out, *len, *seed)?;
                out.flush()?;
                set_mode(&f, *mode)?;
            }
            Planned::Link { path, target } => {
                std::os::unix::fs::symlink(target, dir.join(path))?;
            }
        }
    }
    for entry in &plan {
        if let Planned::Dir {
            path,
            mode: Some(mode),
        } = entry
        {
            set_mode(&dir.join(path), *mode)?;
        }
    }
    Ok(data::totals(&plan))
}

/// Empties the page cache (`--cold`): what is dirty written out, then the
/// clean pages dropped, so that the next run reads its source from the
/// disk and writes into a cache holding none of it.
pub fn drop_caches() -> Result<(), String> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        format!(
            "--cold: cannot drop the page cache (/proc/sys/vm/drop_caches: {e}); it needs root: \
             run the matrix as root, or without --cold"
        )
    })
}

/// When the files of a `W+changed` sync were last changed: long before any
/// source, so that every tool sees them differ (rsync's size and mtime,
/// GridFTP's `-sync-level 2` and `cp -u`'s older copy alike).
const CHANGED_AT: u64 = 946_684_800;

/// Makes 1% of a copy's files (every hundredth of the source's, at least
/// one) differ from the source: new bytes, one more than before, and an
/// old modification time. Returns how many.
pub fn change_files(
    copy: &Path,
    source: &super::verify::Manifest,
    seed: u64,
) -> std::io::Result<usize> {
    let files = source.iter().filter_map(|(rel, e)| match e {
        super::verify::Entry::File { len, .. } => Some((rel, *len)),
        _ => None,
    });
    let mut changed = 0;
    for (i, (rel, len)) in files.step_by(100).enumerate() {
        let p = copy.join(rel);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &f);
        longhaul_proto::data::write_random(&mut out, len + 1, seed.wrapping_add(i as u64))?;
        out.flush()?;
        drop(out);
        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(CHANGED_AT))?;
        changed += 1;
    }
    Ok(changed)
}

/// The destination's own write rate (bytes per second): `len` bytes
/// written and synced. The bytes are made before the clock starts (a
/// 64 MiB block, written again and again), so that the clock holds only
/// the writing.
pub fn write_rate(dir: &Path, len: u64) -> std::io::Result<f64> {
    std::fs::create_dir_all(dir)?;
    let p = dir.join("write-rate.bin");
    let block = longhaul_proto::data::bytes(1, (64 << 20).min(len.max(1) as usize));
    let mut f = std::fs::File::create(&p)?;
    let t0 = Instant::now();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    let s = t0.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&p);
    Ok(len as f64 / s.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `longhaul wan up` standing in: the script `body` as the program.
    fn fake_wan(body: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("longhaul");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, p)
    }

    /// `wan_up` on the fake, in a thread: its result, or a failure if it
    /// has none within 30 s (a wait with no limit).
    fn up(bin: std::path::PathBuf, limit: Duration) -> Result<Wan, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(wan_up(
                &bin,
                Duration::from_millis(10),
                0.0,
                1_000_000,
                limit,
            ));
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("wan_up has no limit: still waiting after 30 s")
    }

    #[test]
    fn a_wan_up_that_never_says_its_hosts_ends_the_wait_at_the_limit() {
        let (_d, bin) = fake_wan("echo starting >&2; exec sleep 600");
        let t0 = Instant::now();
        let e = up(bin, Duration::from_secs(1)).err().expect("an error");
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        assert!(e.contains("did not come up within 1 s"), "{e}");
        assert!(e.contains("starting"), "{e}");
    }

    /// Its standard error is read while it starts: a chatty emulator (1 MB
    /// before its first line, far past a pipe's 64 KiB) comes up.
    #[test]
    fn a_chatty_wan_up_comes_up_and_a_failed_one_says_why() {
        let (_d, bin) = fake_wan(
            "yes 'wan: some chatter' | head -n 60000 >&2; \
             echo '{\"hosts\":{}}'; exec sleep 600",
        );
        let w = up(bin, Duration::from_secs(20)).expect("up");
        drop(w);
        let (_d, bin) = fake_wan("echo 'wan: error: cannot open /dev/net/tun' >&2; exit 1");
        let e = up(bin, Duration::from_secs(20)).err().expect("an error");
        assert!(e.contains("cannot open /dev/net/tun"), "{e}");
    }

    #[test]
    fn an_emulated_host_autotunes_to_twice_the_paths_bdp() {
        const MIB: u64 = 1 << 20;
        // 1 Gbit/s at 80 ms: 10 MB in flight, so 20 MB of buffer a stream.
        let bdp = 10_000_000;
        assert_eq!(
            dtn_triple("4096\t16384\t4194304\n", bdp),
            Ok([4096, 16384, 20_000_000])
        );
        // A host that already allows more keeps it; min and default stay.
        assert_eq!(
            dtn_triple("4096 131072 33554432", bdp),
            Ok([4096, 131_072, 32 * MIB])
        );
        // A short path: at least Linux's default 4 MiB.
        assert_eq!(dtn_max(MIB, 100_000), 4 * MIB);
        // Never past what the sysctl holds (an int).
        assert_eq!(dtn_max(4 * MIB, u64::MAX / 4), i32::MAX as u64);
        assert!(dtn_triple("4096 16384", bdp).is_err());
        assert!(dtn_triple("a b c", bdp).is_err());
    }

    #[test]
    fn a_namespace_that_is_not_there_is_an_error_that_names_it() {
        let e = tune_hosts(["lhm-no-such-ns", "lhm-no-such-ns"], 1).expect_err("an error");
        assert!(e.contains("/run/netns/lhm-no-such-ns"), "{e}");
    }
}
