//! This process's CPU limits, read from the files the kernel keeps:
//! its cgroup's quota and throttling counters (v1 or v2, wherever the
//! hierarchy is mounted), steal and runnable tasks from `/proc/stat`, the
//! load average. The parsing is [`longhaul_proto::cpulimit`]'s.

use longhaul_proto::cpulimit::{self, CpuLimits};

/// Reads the CPU limits of the calling process now. Files that cannot be
/// read leave their figures at zero (a host without cgroups, a sandbox
/// without /proc).
pub fn cpu_limits() -> CpuLimits {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mut l = cpulimit::read_cgroup(
        &read("/proc/self/cgroup").unwrap_or_default(),
        &read("/proc/self/mountinfo").unwrap_or_default(),
        &read,
    );
    let (ticks, steal, running) =
        cpulimit::parse_proc_stat(&read("/proc/stat").unwrap_or_default());
    l.cpu_ticks = ticks;
    l.steal_ticks = steal;
    l.procs_running = running;
    l.loadavg_1m = cpulimit::parse_loadavg(&read("/proc/loadavg").unwrap_or_default());
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_hosts_cpu_limits_are_read() {
        let l = cpu_limits();
        // Every Linux host has /proc/stat; the cgroup depends on the host.
        assert!(l.cpu_ticks > 0, "{l:?}");
        assert!(l.steal_ticks <= l.cpu_ticks);
        if let Some(q) = l.quota_cores() {
            assert!(q > 0.0 && l.quota_setting().is_some(), "{l:?}");
        }
    }
}
