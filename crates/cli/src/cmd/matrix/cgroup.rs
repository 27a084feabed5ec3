//! CPU counted one way for every tool: each end of each run in a cgroup
//! of its own (v2, or v1's `cpuacct` where the host has that), its CPU
//! read from the cgroup. Every process a server or a client forks stays in
//! its cgroup whatever it does with its session or process group (an sshd
//! session, a GridFTP transfer process), so its CPU is counted, and when
//! a group ends what is left in it is killed. Where no cgroup can be made
//! here (not root, no delegation) the CPU is unknown: `None`, shown `?`.
//!
//! The groups live under the matrix's own cgroup, in
//! `longhaul-matrix-PID/`, removed at the end.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The matrix's cgroup directory, removed when dropped.
pub struct Accounting {
    dir: PathBuf,
    version: u8,
}

impl Accounting {
    /// Makes `longhaul-matrix-PID` under this process's cgroup; None where
    /// that cannot be done (why, on stderr once).
    pub fn new() -> Option<Accounting> {
        let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let Some((version, own)) = longhaul_proto::cpulimit::accounting_dir(&cg, &mi) else {
            eprintln!("longhaul matrix: no cgroup hierarchy counts CPU here: CPU shows as '?'");
            return None;
        };
        let dir = Path::new(&own).join(format!("longhaul-matrix-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!(
                "longhaul matrix: cannot make a cgroup in {own} ({e}; it needs root or a delegated \
                 cgroup): CPU shows as '?'"
            );
            return None;
        }
        Some(Accounting { dir, version })
    }

    /// A group of its own for one end (`name`: unique while it lives).
    pub fn group(&self, name: &str) -> Option<Group> {
        let dir = self.dir.join(name.replace('/', "_"));
        let _ = std::fs::create_dir(&dir);
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
        let g = Group {
            dir,
            version: self.version,
            procs,
        };
        g.usage().map(|_| g)
    }
}

impl Drop for Accounting {
    fn drop(&mut self) {
        remove(&self.dir);
    }
}

/// One end's cgroup: its CPU, and the processes in it ended when dropped.
pub struct Group {
    dir: PathBuf,
    version: u8,
    /// `cgroup.procs`, made before any fork (a child joins it between
    /// fork and exec, where nothing may allocate).
    procs: CString,
}

impl Group {
    /// CPU seconds its processes used so far (those that ended included).
    pub fn usage(&self) -> Option<f64> {
        let file = if self.version == 1 {
            "cpuacct.usage"
        } else {
            "cpu.stat"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        longhaul_proto::cpulimit::parse_cpu_usage(&text, self.version)
    }

    /// What a child needs to join the group between fork and exec.
    pub fn joiner(&self) -> Joiner {
        Joiner {
            procs: self.procs.clone(),
        }
    }

    /// Ends every process left in the group (SIGKILL, by PID).
    pub fn kill_all(&self) {
        kill_in(&self.dir);
    }
}

/// A group's `cgroup.procs`, for a child to join it.
pub struct Joiner {
    procs: CString,
}

impl Joiner {
    /// The calling process joins the group: for `pre_exec`, between fork
    /// and exec (open and write only; "0" names the writer in v1 and v2).
    pub fn join_self(&self) -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        // A path made before the fork, a static buffer: no allocation.
        let fd = rustix::fs::open(
            self.procs.as_c_str(),
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        match rustix::io::write(&fd, b"0")? {
            1 => Ok(()),
            _ => Err(std::io::ErrorKind::WriteZero.into()),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        remove(&self.dir);
    }
}

fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn kill_in(dir: &Path) {
    for pid in pids(dir) {
        // A process in a cgroup only the matrix makes.
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Kills what is left in `dir` and its child groups, then removes them
/// (a cgroup goes once empty; the kernel takes a moment to reap).
fn remove(dir: &Path) {
    let until = Instant::now() + Duration::from_secs(3);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove(&e.path());
            }
        }
    }
    loop {
        kill_in(dir);
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The far shell's part (far.rs): a function `lh_cg` that prints the
/// directory and version of the shell's own CPU-counting cgroup, as
/// [`longhaul_proto::cpulimit::accounting_dir`] finds it here.
pub const FAR_FIND: &str = "lh_cg() { \
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then \
echo \"/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup) 2\"; return; fi; \
m=$(awk '{for(i=7;i<=NF;i++) if($i==\"-\"){ if($(i+1)==\"cgroup\" && $(i+3) ~ /(^|,)cpuacct(,|$)/) print $5; break}}' /proc/self/mountinfo | head -n 1); \
p=$(awk -F: '$2 ~ /(^|,)cpuacct(,|$)/ {print $3; exit}' /proc/self/cgroup); \
[ -n \"$m\" ] && echo \"$m${p%/} 1\"; }";

#[cfg(test)]
mod tests {
    use super::*;

    /// The far shell finds the same cgroup as this side does, on this host.
    #[test]
    fn the_far_shell_finds_the_cgroup_this_side_finds() {
        let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let here = longhaul_proto::cpulimit::accounting_dir(&cg, &mi);
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{FAR_FIND}; lh_cg"))
            .output()
            .unwrap();
        let far = String::from_utf8_lossy(&o.stdout).trim().to_string();
        match here {
            Some((v, d)) => assert_eq!(far, format!("{} {v}", d.trim_end_matches('/')), "{o:?}"),
            None => assert!(far.is_empty(), "{far}"),
        }
    }
}
