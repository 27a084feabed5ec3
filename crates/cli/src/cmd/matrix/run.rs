//! What the matrix runs: the emulated path, the peers' servers, one timed
//! client run with the CPU of both ends, the data and its check.
//!
//! Every process started here is ended by its process id (its own process
//! group, SIGTERM then SIGKILL), when its path is done, when the matrix is
//! interrupted, and by the kernel (parent-death signal) should the matrix
//! itself die.

use std::collections::BTreeMap;
use std::io::{BufRead, Read as _, Write as _};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A process of ours, ended (by its process group) when dropped.
pub struct Owned {
    pub child: Child,
}

impl Owned {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let pg = self.pid();
        // SAFETY: kill(2) on our own child's process group; no memory involved.
        unsafe { libc::kill(-pg, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                // Its session children may outlive it.
                // SAFETY: kill(2) on our own child's process group.
                unsafe { libc::kill(-pg, libc::SIGKILL) };
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A command in its own process group, killed if the matrix dies.
fn command(argv: &[String], netns: Option<&str>) -> Result<Command, String> {
    let mut full: Vec<String> = Vec::new();
    if let Some(ns) = netns {
        full.extend(["ip".into(), "netns".into(), "exec".into(), ns.into()]);
    }
    full.extend(argv.iter().cloned());
    let (prog, rest) = full.split_first().ok_or("an empty command")?;
    let mut c = Command::new(prog);
    c.args(rest).stdin(Stdio::null()).process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    Ok(c)
}

/// An emulated path: `longhaul wan up` as our child.
pub struct Wan {
    /// Ends the emulator when dropped.
    pub _proc: Owned,
    pub ns_a: String,
    pub ns_b: String,
    pub host_b: String,
}

pub fn wan_up(bin: &Path, rtt: Duration, loss: f64, rate: u64) -> Result<Wan, String> {
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
    let mut c = command(&argv, None)?;
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start `longhaul wan up`: {e}"))?;
    let mut proc = Owned { child };
    let out = proc.child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    if !line.contains("\"hosts\"") {
        let mut err = String::new();
        if let Some(mut e) = proc.child.stderr.take() {
            let _ = proc.child.wait();
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!(
            "the emulated path did not come up (it needs root and /dev/net/tun): {}",
            err.trim()
        ));
    }
    Ok(Wan {
        _proc: proc,
        ns_a: names.ns_a,
        ns_b: names.ns_b,
        host_b: longhaul_engine::wan::net::ADDR_B.to_string(),
    })
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

/// Connects to `host:port` from inside `netns` (or here): the ready check.
pub fn connects(netns: Option<&str>, host: &str, port: u16) -> bool {
    let addr = format!("{host}:{port}");
    let ns = netns.map(|n| format!("/run/netns/{n}"));
    std::thread::spawn(move || {
        if let Some(ns) = ns {
            let Ok(f) = std::fs::File::open(&ns) else {
                return false;
            };
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with an fd we hold open.
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return false;
            }
        }
        let Ok(a) = addr.parse::<std::net::SocketAddr>() else {
            return false;
        };
        std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok()
    })
    .join()
    .unwrap_or(false)
}

/// Two free ports on loopback (in a fresh namespace every port is free).
pub fn free_ports() -> Result<(u16, u16), String> {
    let a = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let b = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let pa = a.local_addr().map_err(|e| e.to_string())?.port();
    let pb = b.local_addr().map_err(|e| e.to_string())?.port();
    Ok((pa, pb))
}

/// Starts a server and waits until it accepts on `port`.
pub fn start_server(
    argv: &[String],
    netns: Option<&str>,
    hosts_file: Option<&Path>,
    host: &str,
    port: u16,
    log: &Path,
) -> Result<Owned, String> {
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
    let mut c = command(&argv, netns)?;
    c.stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    let child = c
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", argv.join(" ")))?;
    let mut s = Owned { child };
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(st)) = s.child.try_wait() {
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

/// CPU seconds of every process in process group `pg` (children that
/// ended included, through their parent's counts).
pub fn group_cpu(pg: i32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let stats: Vec<String> = dir
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .collect();
    stat_cpu(stats.iter().map(String::as_str), pg) as f64 / tick
}

/// Clock ticks of the processes of group `pg`, from /proc/PID/stat lines.
pub fn stat_cpu<'a>(stats: impl Iterator<Item = &'a str>, pg: i32) -> u64 {
    let mut total = 0u64;
    for stat in stats {
        // After the command's closing parenthesis: state is field 3.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] = field 3; pgrp = field 5, utime..cstime = fields 14..17.
        if f.len() > 14 && f[2].parse::<i32>() == Ok(pg) {
            total += f[11..15]
                .iter()
                .filter_map(|x| x.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    total
}

/// How one client run ended.
pub struct Ran {
    pub seconds: f64,
    pub cpu: f64,
    pub stdout: String,
    pub error: Option<String>,
}

/// Runs a client to its end (or `timeout`, or an interrupt): wall time and
/// its CPU (rusage, its children included).
pub fn run_client(
    argv: &[String],
    netns: Option<&str>,
    env: &BTreeMap<String, String>,
    timeout: Duration,
    stop: &AtomicBool,
    logdir: &Path,
    tag: &str,
) -> Ran {
    let out = logdir.join(format!("{tag}.out"));
    let err = logdir.join(format!("{tag}.err"));
    let _ = std::fs::write(logdir.join(format!("{tag}.cmd")), argv.join(" "));
    let fail = |m: String| Ran {
        seconds: 0.0,
        cpu: 0.0,
        stdout: String::new(),
        error: Some(m),
    };
    let (Ok(o), Ok(e)) = (std::fs::File::create(&out), std::fs::File::create(&err)) else {
        return fail(format!("cannot write logs in {}", logdir.display()));
    };
    let mut c = match command(argv, netns) {
        Ok(c) => c,
        Err(m) => return fail(m),
    };
    c.stdout(o).stderr(e).envs(env);
    let t0 = Instant::now();
    let child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return fail(format!("cannot start `{}`: {e}", argv[0])),
    };
    let pid = child.id() as i32;
    let mut status = 0i32;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut ended_by: Option<&str> = None;
    loop {
        // SAFETY: wait4 on our own child, with valid pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid || r < 0 {
            break;
        }
        if ended_by.is_none() && (t0.elapsed() > timeout || stop.load(Ordering::SeqCst)) {
            ended_by = Some(if stop.load(Ordering::SeqCst) {
                "interrupted"
            } else {
                "timed out"
            });
            // SAFETY: kill(2) on our child's own process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = t0.elapsed().as_secs_f64();
    // Anything it left in its group.
    // SAFETY: kill(2) on the process group of the child we just reaped.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    std::mem::forget(child);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = tv(ru.ru_utime) + tv(ru.ru_stime);
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let error = if let Some(why) = ended_by {
        Some(format!("{why} after {seconds:.0} s"))
    } else if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        None
    } else {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        Some(format!(
            "exit {}: {}",
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            },
            last.iter()
                .rev()
                .take(2)
                .rev()
                .copied()
                .collect::<Vec<_>>()
                .join(" | ")
                .chars()
                .take(300)
                .collect::<String>()
        ))
    };
    Ran {
        seconds,
        cpu,
        stdout,
        error,
    }
}

/// Incompressible bytes: BLAKE3's output stream keyed by `seed`.
fn write_random(path: &Path, len: u64, seed: u64) -> std::io::Result<()> {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    let mut xof = h.finalize_xof();
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// Makes a workload's data under `dir` (absent before): returns its bytes and files.
pub fn make_data(workload: &str, dir: &Path, size: u64, files: u32) -> std::io::Result<(u64, u64)> {
    std::fs::create_dir_all(dir)?;
    let mut seed = 1u64;
    let mut next = || {
        // splitmix64: sizes only, not the bytes.
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (mut bytes, mut n) = (0u64, 0u64);
    match workload {
        "elephant" => {
            write_random(&dir.join("big.bin"), size, 7)?;
            bytes = size;
            n = 1;
        }
        "smallfiles" => {
            let dirs = (files / 100).max(1);
            for i in 0..files {
                let d = dir.join(format!("d{:03}", i % dirs));
                std::fs::create_dir_all(&d)?;
                let len = 1024 + next() % (64 * 1024 - 1024);
                write_random(&d.join(format!("f{i:06}")), len, 1000 + u64::from(i))?;
                bytes += len;
                n += 1;
            }
        }
        _ => {
            // A mixed tree: nested directories, sizes from empty to size/8.
            let count = (files / 10).max(4);
            let big = (size / 8).max(1 << 20);
            for i in 0..count {
                let d = dir.join(format!("a{}/b{}", i % 3, i % 7));
                std::fs::create_dir_all(&d)?;
                let len = match i % 10 {
                    0 => 0,
                    1 => big,
                    2..=4 => next() % (1 << 20),
                    _ => next() % (64 * 1024),
                };
                write_random(&d.join(format!("t{i:05}.dat")), len, 5000 + u64::from(i))?;
                bytes += len;
                n += 1;
            }
            std::fs::create_dir_all(dir.join("empty/dir"))?;
        }
    }
    Ok((bytes, n))
}

/// Every file under `dir`: relative path -> (size, BLAKE3).
pub fn manifest(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, (u64, [u8; 32])>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else {
                let mut h = blake3::Hasher::new();
                h.update_reader(std::fs::File::open(e.path())?)?;
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                out.insert(rel, (e.metadata()?.len(), *h.finalize().as_bytes()));
            }
        }
    }
    Ok(out)
}

/// Compares a destination with the source's manifest: None when equal,
/// else what differs.
pub fn verify(src: &BTreeMap<PathBuf, (u64, [u8; 32])>, dst: &Path) -> Option<String> {
    let got = match manifest(dst) {
        Ok(m) => m,
        Err(e) => {
            return Some(format!(
                "cannot read the destination {}: {e}",
                dst.display()
            ))
        }
    };
    for (p, (len, digest)) in src {
        match got.get(p) {
            None => return Some(format!("{} is missing", p.display())),
            Some((l, _)) if l != len => {
                return Some(format!("{} has {l} bytes, not {len}", p.display()))
            }
            Some((_, d)) if d != digest => {
                return Some(format!("{} differs from the source", p.display()))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = got.keys().find(|p| !src.contains_key(*p)) {
        return Some(format!("{} is not in the source", extra.display()));
    }
    None
}

/// The destination's own write rate (bytes per second): `len` bytes written and synced.
pub fn write_rate(dir: &Path, len: u64) -> std::io::Result<f64> {
    std::fs::create_dir_all(dir)?;
    let p = dir.join("write-rate.bin");
    let t0 = Instant::now();
    write_random(&p, len, 99)?;
    std::fs::File::open(&p)?.sync_all()?;
    let s = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&p);
    Ok(len as f64 / s.max(1e-9))
}
