//! What bounds an end's CPU besides its core count: a cgroup CPU quota
//! (containers, Slurm jobs, Kubernetes pods with a CPU limit) and its
//! throttling, the hypervisor's steal time and other runnable work. The
//! engine reads the files (`/proc/self/cgroup`, `/proc/self/mountinfo`,
//! the cgroup's `cpu.max` or `cpu.cfs_quota_us`, `cpu.stat`, `/proc/stat`,
//! `/proc/loadavg`); the functions here parse their contents and compare
//! two readings, without I/O, so every format is unit-tested.

use serde::{Deserialize, Serialize};

/// One end's CPU limits and counters at one moment, as its own process
/// reads them. Counters are cumulative: [`during`] turns two readings into
/// what happened between them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuLimits {
    /// The cgroup version that holds the CPU controller (1 or 2); 0 when
    /// none was found.
    #[serde(default)]
    pub cgroup_version: u8,
    /// The tightest CFS quota on the way from the process's cgroup up to
    /// the hierarchy's root: microseconds of CPU per period. Omitted when
    /// no cgroup on that way has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_us: Option<u64>,
    /// Throttling counters (`cpu.stat`) of the cgroup that sets the quota,
    /// or of the process's own cgroup when none does.
    #[serde(default)]
    pub nr_periods: u64,
    #[serde(default)]
    pub nr_throttled: u64,
    #[serde(default)]
    pub throttled_usec: u64,
    /// `/proc/stat`: ticks of all CPUs, those the hypervisor stole, and the
    /// tasks runnable at the moment of reading.
    #[serde(default)]
    pub cpu_ticks: u64,
    #[serde(default)]
    pub steal_ticks: u64,
    #[serde(default)]
    pub procs_running: u32,
    /// `/proc/loadavg`'s one-minute figure.
    #[serde(default)]
    pub loadavg_1m: f64,
}

impl CpuLimits {
    /// The CPUs the quota allows (quota / period); None without a quota,
    /// or with figures that make no sense.
    pub fn quota_cores(&self) -> Option<f64> {
        match (self.quota_us, self.period_us) {
            (Some(q), Some(p)) if q > 0 && p > 0 => Some(q as f64 / p as f64),
            _ => None,
        }
    }

    /// The setting that sets the quota, as the user finds it in the cgroup
    /// files: `cpu.max 50000 100000` or `cpu.cfs_quota_us 50000 /
    /// cpu.cfs_period_us 100000`. Built from the numbers, never from text
    /// a peer sent.
    pub fn quota_setting(&self) -> Option<String> {
        let (q, p) = (self.quota_us?, self.period_us?);
        self.quota_cores()?;
        Some(if self.cgroup_version == 1 {
            format!("cpu.cfs_quota_us {q} / cpu.cfs_period_us {p}")
        } else {
            format!("cpu.max {q} {p}")
        })
    }
}

/// What an end's CPU went through between two readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuRun {
    /// Enforcement periods in which the cgroup ran, and those in which it
    /// used up its quota and was stopped.
    pub periods: u64,
    pub throttled_periods: u64,
    /// Time the cgroup's tasks were held back by the quota, seconds.
    pub throttled_seconds: f64,
    /// The share of all CPUs' time the hypervisor took (steal), 0 to 1.
    pub steal_fraction: f64,
    /// Tasks runnable before the run, besides the one reading, and the
    /// one-minute load average then: work competing for the cores.
    pub runnable_before: u32,
    pub loadavg_before: f64,
}

impl CpuRun {
    /// The quota stopped the cgroup in at least one period in twenty it
    /// ran: it wanted more CPU than it was allowed.
    pub fn throttled(&self) -> bool {
        self.throttled_periods > 0 && self.throttled_periods * 20 >= self.periods
    }
}

/// The steal share at or above which the hypervisor is named.
pub const STEAL_ALARM: f64 = 0.05;

/// What happened between two readings of one end (counters that went
/// back, as when the cgroup changed, count as nothing).
pub fn during(before: &CpuLimits, after: &CpuLimits) -> CpuRun {
    let ticks = after.cpu_ticks.saturating_sub(before.cpu_ticks);
    let steal = after.steal_ticks.saturating_sub(before.steal_ticks);
    CpuRun {
        periods: after.nr_periods.saturating_sub(before.nr_periods),
        throttled_periods: after.nr_throttled.saturating_sub(before.nr_throttled),
        throttled_seconds: after.throttled_usec.saturating_sub(before.throttled_usec) as f64 / 1e6,
        steal_fraction: if ticks == 0 {
            0.0
        } else {
            (steal as f64 / ticks as f64).min(1.0)
        },
        runnable_before: before.procs_running.saturating_sub(1),
        loadavg_before: before.loadavg_1m,
    }
}

/// The cgroup part of [`CpuLimits`]: finds the CPU controller's hierarchy
/// through `proc_self_cgroup` and `mountinfo` (cgroup v1's `cpu`
/// controller first, as hybrid hosts mount it, else the unified cgroup
/// v2 hierarchy), then reads the quota of every cgroup from the process's
/// own up to the mount's root with `read` (a path to the file's contents,
/// None when absent) and keeps the tightest, with its `cpu.stat`.
pub fn read_cgroup(
    proc_self_cgroup: &str,
    mountinfo: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> CpuLimits {
    let mut out = CpuLimits::default();
    let Some((version, dir, top)) = cpu_cgroup_dir(proc_self_cgroup, mountinfo) else {
        return out;
    };
    out.cgroup_version = version;
    let quota_at = |d: &str| -> Option<(u64, u64)> {
        if version == 1 {
            let q: i64 = read(&format!("{d}/cpu.cfs_quota_us"))?
                .trim()
                .parse()
                .ok()?;
            let p: u64 = read(&format!("{d}/cpu.cfs_period_us"))?
                .trim()
                .parse()
                .ok()?;
            (q > 0 && p > 0).then_some((q as u64, p))
        } else {
            parse_cpu_max(&read(&format!("{d}/cpu.max"))?)
        }
    };
    let mut tightest: Option<(f64, u64, u64, String)> = None;
    let mut d = dir.clone();
    loop {
        if let Some((q, p)) = quota_at(&d) {
            let cores = q as f64 / p as f64;
            if tightest.as_ref().is_none_or(|t| cores < t.0) {
                tightest = Some((cores, q, p, d.clone()));
            }
        }
        if d.len() <= top.len() {
            break;
        }
        match d.rfind('/') {
            Some(i) if i >= top.len() => d.truncate(i),
            _ => break,
        }
    }
    let stat_dir = match tightest {
        Some((_, q, p, at)) => {
            out.quota_us = Some(q);
            out.period_us = Some(p);
            at
        }
        None => dir,
    };
    if let Some(s) = read(&format!("{stat_dir}/cpu.stat")) {
        let (periods, throttled, usec) = parse_cpu_stat(&s, version);
        out.nr_periods = periods;
        out.nr_throttled = throttled;
        out.throttled_usec = usec;
    }
    out
}

/// Where CPU time is counted for the process's cgroup and its children:
/// the cgroup's directory and its version, for a caller that makes child
/// cgroups there and reads their use ([`parse_cpu_usage`]). A host whose
/// only hierarchy is cgroup v2 gives that; otherwise cgroup v1's `cpuacct`
/// controller (hybrid hosts), else the unified v2 hierarchy mounted beside.
pub fn accounting_dir(proc_self_cgroup: &str, mountinfo: &str) -> Option<(u8, String)> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = mounts
                .iter()
                .find(|m| m.fstype == "cgroup2")
                .map(|m| (2, m.dir_of(path)));
        } else if controllers.split(',').any(|c| c == "cpuacct") {
            let m = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "cpuacct"));
            if let Some(m) = m {
                return Some((1, m.dir_of(path)));
            }
        }
    }
    v2
}

/// CPU seconds a cgroup's tasks used: v1 `cpuacct.usage` (nanoseconds),
/// v2 `cpu.stat`'s `usage_usec`.
pub fn parse_cpu_usage(s: &str, version: u8) -> Option<f64> {
    if version == 1 {
        return s.trim().parse::<u64>().ok().map(|ns| ns as f64 / 1e9);
    }
    s.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us as f64 / 1e6)
}

/// The directory of the process's cgroup that holds the CPU controller,
/// its version, and the mount point it is under (the top of the walk).
fn cpu_cgroup_dir(proc_self_cgroup: &str, mountinfo: &str) -> Option<(u8, String, String)> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let mut v2_path = None;
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path);
        } else if controllers.split(',').any(|c| c == "cpu") {
            let m = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "cpu"));
            if let Some(m) = m {
                return Some((1, m.dir_of(path), m.point.clone()));
            }
        }
    }
    let path = v2_path?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    Some((2, m.dir_of(path), m.point.clone()))
}

/// One line of /proc/self/mountinfo, the fields needed here.
struct Mount {
    root: String,
    point: String,
    fstype: String,
    super_opts: String,
}

impl Mount {
    /// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw`
    fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ');
        let root = l.nth(3)?;
        let point = l.next()?;
        let mut r = right.split(' ');
        let fstype = r.next()?;
        let super_opts = r.nth(1).unwrap_or("");
        Some(Mount {
            root: unescape(root),
            point: unescape(point),
            fstype: fstype.into(),
            super_opts: super_opts.into(),
        })
    }

    /// Where the cgroup `path` (as /proc/self/cgroup names it) is under
    /// this mount: the mount shows the hierarchy from its root down.
    fn dir_of(&self, path: &str) -> String {
        let root = self.root.trim_end_matches('/');
        let rel = path.strip_prefix(root).unwrap_or(path);
        let rel = if rel.starts_with('/') || rel.is_empty() {
            rel
        } else {
            // Not under the mount's root (another cgroup namespace): the
            // mount's root is all that can be read.
            ""
        };
        let rel = rel.trim_end_matches('/');
        format!("{}{rel}", self.point.trim_end_matches('/'))
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// cgroup v2 `cpu.max`: `QUOTA PERIOD`, or `max PERIOD` for none.
pub fn parse_cpu_max(s: &str) -> Option<(u64, u64)> {
    let mut f = s.split_whitespace();
    let q = f.next()?;
    let p: u64 = f.next().map_or(Some(100_000), |p| p.parse().ok())?;
    let q: u64 = q.parse().ok()?;
    (q > 0 && p > 0).then_some((q, p))
}

/// `cpu.stat`: periods, throttled periods and throttled microseconds
/// (v2 `throttled_usec`; v1 `throttled_time` in nanoseconds).
pub fn parse_cpu_stat(s: &str, version: u8) -> (u64, u64, u64) {
    let (mut periods, mut throttled, mut usec) = (0, 0, 0);
    for line in s.lines() {
        let Some((k, v)) = line.split_once(' ') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k {
            "nr_periods" => periods = v,
            "nr_throttled" => throttled = v,
            "throttled_usec" if version != 1 => usec = v,
            "throttled_time" if version == 1 => usec = v / 1000,
            _ => {}
        }
    }
    (periods, throttled, usec)
}

/// `/proc/stat`: ticks of all CPUs (user to steal; guest time is already
/// in user), the stolen ones, and `procs_running`.
pub fn parse_proc_stat(s: &str) -> (u64, u64, u32) {
    let mut ticks = (0, 0);
    let mut running = 0;
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix("cpu ") {
            let f: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            ticks = (f.iter().take(8).sum(), f.get(7).copied().unwrap_or(0));
        } else if let Some(n) = line.strip_prefix("procs_running ") {
            running = n.trim().parse().unwrap_or(0);
        }
    }
    (ticks.0, ticks.1, running)
}

/// `/proc/loadavg`'s first figure.
pub fn parse_loadavg(s: &str) -> f64 {
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const HYBRID_MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn files(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = list
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |p: &str| m.get(p).cloned()
    }

    #[test]
    fn cpu_is_counted_under_cpuacct_on_hybrid_hosts_and_under_v2_on_unified_ones() {
        let cg = "9:name=systemd:/\n3:cpuset:/\n2:cpuacct:/user/7\n1:cpu:/x\n0::/u\n";
        assert_eq!(
            accounting_dir(cg, HYBRID_MOUNTINFO),
            Some((1, "/sys/fs/cgroup/cpuacct/user/7".into()))
        );
        let mi = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            accounting_dir("0::/user.slice/s.scope\n", mi),
            Some((2, "/sys/fs/cgroup/user.slice/s.scope".into()))
        );
        // A cgroup namespace shows its own root: the mount's root is kept.
        let mi = "29 23 0:26 /ns /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            accounting_dir("0::/ns/job\n", mi),
            Some((2, "/sys/fs/cgroup/job".into()))
        );
        assert_eq!(accounting_dir("", ""), None);
        assert_eq!(accounting_dir("2:cpuacct:/a\n", ""), None);
        assert_eq!(parse_cpu_usage("1500000000\n", 1), Some(1.5));
        assert_eq!(
            parse_cpu_usage("usage_usec 2500000\nuser_usec 1\n", 2),
            Some(2.5)
        );
        assert_eq!(parse_cpu_usage("nr_periods 1\n", 2), None);
        assert_eq!(parse_cpu_usage("x", 1), None);
    }

    #[test]
    fn cgroup_v1_quota_and_throttling_are_read_under_the_cpu_mount() {
        let cg = "9:name=systemd:/\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/slurm/uid_0/job_7\n0::/\n";
        let d = "/sys/fs/cgroup/cpu/slurm/uid_0/job_7";
        let f = files(&[
            (&format!("{d}/cpu.cfs_quota_us"), "20000\n"),
            (&format!("{d}/cpu.cfs_period_us"), "100000\n"),
            (
                &format!("{d}/cpu.stat"),
                "nr_periods 120\nnr_throttled 100\nthrottled_time 3000000000\nnr_bursts 0\n",
            ),
            ("/sys/fs/cgroup/cpu/slurm/uid_0/cpu.cfs_quota_us", "-1\n"),
            (
                "/sys/fs/cgroup/cpu/slurm/uid_0/cpu.cfs_period_us",
                "100000\n",
            ),
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        let l = read_cgroup(cg, HYBRID_MOUNTINFO, &f);
        assert_eq!(l.cgroup_version, 1);
        assert_eq!(l.quota_cores(), Some(0.2));
        assert_eq!(
            l.quota_setting().unwrap(),
            "cpu.cfs_quota_us 20000 / cpu.cfs_period_us 100000"
        );
        assert_eq!((l.nr_periods, l.nr_throttled), (120, 100));
        // throttled_time is in nanoseconds.
        assert_eq!(l.throttled_usec, 3_000_000);
    }

    #[test]
    fn cgroup_v2_takes_the_tightest_quota_on_the_way_up_and_its_counters() {
        // A pod limited to 1.5 CPU, its container to "max": the pod's
        // quota binds, and its counters tell the throttling.
        let mi = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let cg = "0::/kubepods/burstable/pod1/ctr9\n";
        let base = "/sys/fs/cgroup/kubepods/burstable";
        let f = files(&[
            (&format!("{base}/pod1/ctr9/cpu.max"), "max 100000\n"),
            (
                &format!("{base}/pod1/ctr9/cpu.stat"),
                "usage_usec 5\nnr_periods 1\nnr_throttled 0\nthrottled_usec 0\n",
            ),
            (&format!("{base}/pod1/cpu.max"), "150000 100000\n"),
            (
                &format!("{base}/pod1/cpu.stat"),
                "usage_usec 9\nnr_periods 50\nnr_throttled 10\nthrottled_usec 700000\n",
            ),
            (&format!("{base}/cpu.max"), "400000 100000\n"),
            (&format!("{base}/cpu.stat"), "nr_periods 1\n"),
        ]);
        let l = read_cgroup(cg, mi, &f);
        assert_eq!(l.cgroup_version, 2);
        assert_eq!((l.quota_us, l.period_us), (Some(150_000), Some(100_000)));
        assert_eq!(l.quota_setting().unwrap(), "cpu.max 150000 100000");
        assert_eq!(
            (l.nr_periods, l.nr_throttled, l.throttled_usec),
            (50, 10, 700_000)
        );
        // No quota anywhere: none, and the own cgroup's counters.
        let f = files(&[
            (&format!("{base}/pod1/ctr9/cpu.max"), "max 100000\n"),
            (
                &format!("{base}/pod1/ctr9/cpu.stat"),
                "nr_periods 3\nnr_throttled 0\nthrottled_usec 0\n",
            ),
        ]);
        let l = read_cgroup(cg, mi, &f);
        assert_eq!(l.quota_cores(), None);
        assert_eq!(l.quota_setting(), None);
        assert_eq!(l.nr_periods, 3);
    }

    #[test]
    fn a_mount_of_a_subtree_and_a_cgroup_namespace_are_followed() {
        // A container sees the hierarchy from its own cgroup down, under
        // a mount whose root is that cgroup.
        let mi =
            "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n";
        let cg = "4:cpu,cpuacct:/docker/abc\n";
        let f = files(&[
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000"),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000"),
        ]);
        let l = read_cgroup(cg, mi, &f);
        assert_eq!(l.quota_cores(), Some(0.5));
        // The walk stops at the mount: nothing above it is read.
        let mi = "40 31 0:29 / /sys/fs/cgroup/cpu\\040x rw - cgroup cgroup rw,cpu\n";
        let cg = "4:cpu:/\n";
        let f = files(&[
            ("/sys/fs/cgroup/cpu x/cpu.cfs_quota_us", "200000"),
            ("/sys/fs/cgroup/cpu x/cpu.cfs_period_us", "100000"),
        ]);
        assert_eq!(read_cgroup(cg, mi, &f).quota_cores(), Some(2.0));
        // No CPU controller mounted at all: nothing known.
        let l = read_cgroup("0::/\n", "", &files(&[]));
        assert_eq!(l, CpuLimits::default());
        // Garbage in the files: no quota, no panic.
        let f = files(&[
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "lots"),
            (
                "/sys/fs/cgroup/cpu/cpu.stat",
                "nr_periods x\nnr_throttled\n",
            ),
        ]);
        let l = read_cgroup("1:cpu:/", HYBRID_MOUNTINFO, &f);
        assert_eq!((l.cgroup_version, l.quota_cores()), (1, None));
    }

    #[test]
    fn cpu_max_stat_and_loadavg_parse_what_the_kernel_writes() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some((50_000, 100_000)));
        assert_eq!(parse_cpu_max("50000\n"), Some((50_000, 100_000)));
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("0 100000"), None);
        let stat = "cpu  52680 0 7249 7431 246 0 74 131 9 9\ncpu0 1 2 3\nprocs_running 5\nprocs_blocked 0\n";
        assert_eq!(
            parse_proc_stat(stat),
            (52680 + 7249 + 7431 + 246 + 74 + 131, 131, 5)
        );
        assert_eq!(parse_loadavg("2.53 1.32 0.53 3/126 13250\n"), 2.53);
        assert_eq!(parse_loadavg("nan 1 1"), 0.0);
    }

    #[test]
    fn two_readings_give_the_throttling_and_steal_between_them() {
        let before = CpuLimits {
            cgroup_version: 2,
            quota_us: Some(20_000),
            period_us: Some(100_000),
            nr_periods: 10,
            nr_throttled: 2,
            throttled_usec: 100_000,
            cpu_ticks: 1000,
            steal_ticks: 10,
            procs_running: 4,
            loadavg_1m: 3.5,
        };
        let after = CpuLimits {
            nr_periods: 40,
            nr_throttled: 30,
            throttled_usec: 2_500_000,
            cpu_ticks: 1400,
            steal_ticks: 90,
            procs_running: 1,
            ..before.clone()
        };
        let r = during(&before, &after);
        assert_eq!((r.periods, r.throttled_periods), (30, 28));
        assert_eq!(r.throttled_seconds, 2.4);
        assert_eq!(r.steal_fraction, 0.2);
        assert_eq!((r.runnable_before, r.loadavg_before), (3, 3.5));
        assert!(r.throttled());
        // One throttled period in a hundred is not starving.
        let r = CpuRun {
            periods: 100,
            throttled_periods: 1,
            ..Default::default()
        };
        assert!(!r.throttled());
        // Counters that went back count as nothing.
        let r = during(&after, &before);
        assert_eq!(
            (r.periods, r.throttled_periods, r.steal_fraction),
            (0, 0, 0.0)
        );
        assert!(!r.throttled());
    }
}
