//! `longhaul doctor`: what each stage of a transfer can carry, and which
//! one limits it. The engine measures (host settings, RTT idle and under
//! load, memory-to-memory both ways with the kernel's counters, storage at
//! both ends, CPU per Gbit/s); this module turns measurements into
//! findings and a verdict, without I/O, so the rules are unit-tested.

use serde::{Deserialize, Serialize};

use crate::cpulimit::{CpuLimits, CpuRun, STEAL_ALARM};
use crate::units::{format_bytes, format_rate};
use crate::window::{plan, BufferCaps, PathInput, WindowPlan, RECV_BUFFER_USE, SEND_BUFFER_USE};

/// The stages a transfer goes through, in the vocabulary of the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The path's capacity (a link, a policer, a shaper).
    PathRate,
    /// Socket buffers: the window each stream may have in flight.
    Window,
    /// Packet loss on the path, or congestion with other traffic.
    Loss,
    SenderCpu,
    ReceiverCpu,
    /// TLS: the CPU the sender or receiver spends on the cipher.
    Encryption,
    SourceStorage,
    DestStorage,
    /// Creating files at the destination (many small files).
    Metadata,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::PathRate => "path_rate",
            Stage::Window => "window",
            Stage::Loss => "loss",
            Stage::SenderCpu => "sender_cpu",
            Stage::ReceiverCpu => "receiver_cpu",
            Stage::Encryption => "encryption",
            Stage::SourceStorage => "source_storage",
            Stage::DestStorage => "dest_storage",
            Stage::Metadata => "metadata",
        }
    }

    /// The stage's name for people (the doctor's human report); [`Stage::name`]
    /// is the JSON name.
    pub fn label(self) -> &'static str {
        match self {
            Stage::PathRate => "path rate",
            Stage::Window => "socket buffers",
            Stage::Loss => "packet loss",
            Stage::SenderCpu => "sender CPU",
            Stage::ReceiverCpu => "receiver CPU",
            Stage::Encryption => "encryption CPU",
            Stage::SourceStorage => "source storage",
            Stage::DestStorage => "destination storage",
            Stage::Metadata => "file creation",
        }
    }
}

/// One host's settings that bound throughput, as read from /proc and /sys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSettings {
    pub hostname: String,
    pub kernel: String,
    pub buffers: BufferCaps,
    /// net.ipv4.tcp_congestion_control, and what the kernel offers.
    pub congestion_control: String,
    pub available_congestion_control: Vec<String>,
    /// net.core.default_qdisc.
    pub default_qdisc: String,
    /// net.ipv4.tcp_no_metrics_save: whether a new connection starts afresh
    /// rather than from the ssthresh the last one to that address left;
    /// omitted by older peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_no_metrics_save: Option<bool>,
    /// The interface the peer is reached through, its MTU and qdisc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qdisc: Option<String>,
    /// Link speed of that interface, Mbit/s (unknown for virtual devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_mbps: Option<u64>,
    /// CPUs online, and those this process may run on.
    pub cpus: u32,
    pub cpus_usable: u32,
    /// cpufreq governor of CPU 0 (none on many VMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governor: Option<String>,
    pub numa_nodes: u32,
    /// Bytes/s one core encrypts with AES-256-GCM (TLS's cipher here).
    #[serde(default)]
    pub cipher_bytes_per_core: f64,
    /// The cgroup CPU quota and its throttling counters, steal and load,
    /// read before the other settings; omitted by older peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limits: Option<CpuLimits>,
}

/// A setting too small (or wrong) for the measured path, and its fix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// `local` or `remote`.
    pub host: String,
    pub setting: String,
    pub value: String,
    pub wanted: String,
    /// The command that fixes it now (it does not survive a reboot).
    pub fix: String,
    /// The line that keeps the fix after a reboot, for
    /// [`SYSCTL_D_FILE`] (a sysctl setting only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<String>,
}

/// Where the doctor tells to keep its sysctl fixes (read at boot by
/// systemd-sysctl; `sysctl --system` applies it now).
pub const SYSCTL_D_FILE: &str = "/etc/sysctl.d/90-longhaul.conf";

/// `key = value`, as a sysctl.d file line.
fn sysctl_line(key: &str, value: &str) -> Option<String> {
    Some(format!("{key} = {value}"))
}

/// What a stage can carry, bits/s, and how that was found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageCeiling {
    pub name: Stage,
    pub ceiling_bps: f64,
    /// True when the ceiling was reached in a measurement (the stage was
    /// seen limiting); false when it is a lower bound (the stage carried
    /// this much while something else limited) or a computed estimate.
    pub limiting: bool,
    pub detail: String,
}

/// The verdict: the stage that limits, by how much, and what to change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub stage: Stage,
    pub ceiling_bps: f64,
    /// The next lowest stage: what fixing this one would gain at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Stage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_ceiling_bps: Option<f64>,
    pub fix: String,
}

/// Loss on the path at or above this fraction of segments (after the
/// start-up) is a fault to fix: loss-based TCP over a long path collapses
/// well below it (Mathis: 1e-4 at 80 ms holds a 1500-byte stream near
/// 18 Mbit/s).
pub const LOSS_ALARM: f64 = 1e-4;

/// The rate the Mathis et al. model gives one loss-based TCP stream,
/// bits/s: MSS / RTT * 1.22 / sqrt(p).
pub fn mathis_bps(mss: u32, rtt_us: u32, loss: f64) -> f64 {
    if loss <= 0.0 || rtt_us == 0 {
        return f64::INFINITY;
    }
    f64::from(mss) * 8.0 / (f64::from(rtt_us) / 1e6) * 1.22 / loss.sqrt()
}

/// Chooses the verdict: the stage with the lowest ceiling. The path rate
/// counts only when it was seen limiting (otherwise what the path carried
/// is a lower bound of what it can). A stage seen limiting in a
/// measurement wins over an estimate less than a tenth lower: evidence
/// beats an estimate within its error.
pub fn verdict(stages: &[StageCeiling], fix_for: impl Fn(Stage) -> String) -> Option<Verdict> {
    let mut sorted: Vec<&StageCeiling> = stages
        .iter()
        .filter(|s| s.ceiling_bps.is_finite() && s.ceiling_bps > 0.0)
        .filter(|s| s.limiting || s.name != Stage::PathRate)
        .collect();
    sorted.sort_by(|a, b| a.ceiling_bps.total_cmp(&b.ceiling_bps));
    let lowest = *sorted.first()?;
    let pick = sorted
        .iter()
        .find(|s| s.limiting && s.ceiling_bps <= lowest.ceiling_bps * 1.1)
        .copied()
        .unwrap_or(lowest);
    let next = sorted.iter().find(|s| s.name != pick.name);
    Some(Verdict {
        stage: pick.name,
        ceiling_bps: pick.ceiling_bps,
        next: next.map(|n| n.name),
        next_ceiling_bps: next.map(|n| n.ceiling_bps),
        fix: fix_for(pick.name),
    })
}

/// The largest IPv4 packet (its 16-bit total length): the most a route's
/// MTU reads as (the kernel's `IP_MAX_MTU`), whatever the interface's MTU
/// is (loopback's is 65536).
pub const MAX_IP_PACKET: u32 = 65_535;

/// The path's MTU against the interfaces at its ends: smaller means a hop
/// in between takes less (packets are cut to it, or lost where ICMP is
/// filtered, a black hole); None when it matches or is unknown. An end's
/// MTU counts up to [`MAX_IP_PACKET`]: no packet is larger, so a path of
/// 65535 between loopback's 65536 is no finding.
pub fn audit_path_mtu(path_mtu: Option<u32>, ends: &[Option<u32>]) -> Option<Finding> {
    let path = path_mtu?;
    let ends = ends.iter().flatten().copied().min()?.min(MAX_IP_PACKET);
    (path < ends).then(|| Finding {
        host: "path".into(),
        setting: "path MTU".into(),
        value: path.to_string(),
        wanted: format!("{ends} (the smaller interface MTU at the ends)"),
        fix: format!(
            "a link between the hosts carries {path}-byte packets: find it with `tracepath` to the peer, and raise its MTU to {ends} or lower both ends' to {path}"
        ),
        persist: None,
    })
}

/// The settings of one host that are too small for `bdp` bytes in flight
/// over `streams` streams, or otherwise hold a long path back.
pub fn audit(host: &str, h: &HostSettings, bdp: u64, streams: u16) -> Vec<Finding> {
    let mut out = Vec::new();
    audit_buffers(host, h, bdp, streams, &mut out);
    audit_congestion(host, h, bdp, &mut out);
    audit_qdisc(host, h, &mut out);
    audit_nic_and_cpu(host, h, bdp, &mut out);
    out
}

/// The socket-buffer caps, against what each stream needs for its share
/// of the BDP.
fn audit_buffers(host: &str, h: &HostSettings, bdp: u64, streams: u16, out: &mut Vec<Finding>) {
    let streams = u64::from(streams.max(1));
    // What one stream needs, in buffer bytes, for its share of the BDP.
    let per_stream = bdp / streams;
    let need_snd = (per_stream as f64 / SEND_BUFFER_USE) as u64;
    let need_rcv = (per_stream as f64 / RECV_BUFFER_USE) as u64;
    let round = |b: u64| b.next_power_of_two().max(4 << 20);
    // A sysctl setting below `need`: the fix sets it to `value` now, and the
    // persist line keeps it.
    let mut check = |setting: &str, have: Option<u64>, need: u64, value: String| {
        if let Some(v) = have {
            if v < need {
                out.push(Finding {
                    host: host.into(),
                    setting: setting.into(),
                    value: v.to_string(),
                    wanted: format!(">= {need}"),
                    fix: if value.contains(' ') {
                        format!("sysctl -w {setting}='{value}'")
                    } else {
                        format!("sysctl -w {setting}={value}")
                    },
                    persist: sysctl_line(setting, &value),
                });
            }
        }
    };
    let r = round(need_rcv);
    let w = round(need_snd);
    check(
        "net.core.rmem_max",
        h.buffers.rmem_max,
        need_rcv / 2,
        r.to_string(),
    );
    check(
        "net.core.wmem_max",
        h.buffers.wmem_max,
        need_snd / 2,
        w.to_string(),
    );
    check(
        "net.ipv4.tcp_rmem",
        h.buffers.tcp_rmem_max,
        need_rcv,
        format!("4096 131072 {r}"),
    );
    check(
        "net.ipv4.tcp_wmem",
        h.buffers.tcp_wmem_max,
        need_snd,
        format!("4096 65536 {w}"),
    );
}

/// Congestion control, and the ssthresh Linux carries from one connection
/// to the next.
fn audit_congestion(host: &str, h: &HostSettings, bdp: u64, out: &mut Vec<Finding>) {
    let cc = h.congestion_control.as_str();
    if matches!(cc, "reno" | "cubic" | "htcp") && bdp > 4 << 20 {
        let fix = if h.available_congestion_control.iter().any(|c| c == "bbr") {
            "longhaul uses bbr on its own streams; for other tools: sysctl -w net.ipv4.tcp_congestion_control=bbr".to_string()
        } else {
            "modprobe tcp_bbr && sysctl -w net.ipv4.tcp_congestion_control=bbr".to_string()
        };
        out.push(Finding {
            host: host.into(),
            setting: "net.ipv4.tcp_congestion_control".into(),
            value: cc.into(),
            wanted: "bbr (loss-based control recovers slowly on a long path)".into(),
            fix,
            persist: sysctl_line("net.ipv4.tcp_congestion_control", "bbr"),
        });
    }
    // Linux remembers each destination's last ssthresh and starts the next
    // connection from it: after a short connection (a control connection, a
    // probe) a long path's next stream leaves slow start far too early
    // (BENCHMARKS.md: one stream over 100 ms alternating 33 and 198 Mbit/s).
    if h.tcp_no_metrics_save == Some(false) && bdp > 4 << 20 {
        out.push(Finding {
            host: host.into(),
            setting: "net.ipv4.tcp_no_metrics_save".into(),
            value: "0".into(),
            wanted: "1 (each connection starts afresh, not from the last one's ssthresh)".into(),
            fix: "sysctl -w net.ipv4.tcp_no_metrics_save=1".into(),
            persist: sysctl_line("net.ipv4.tcp_no_metrics_save", "1"),
        });
    }
}

/// The queueing discipline that paces many streams at once under BBR.
fn audit_qdisc(host: &str, h: &HostSettings, out: &mut Vec<Finding>) {
    let cc = h.congestion_control.as_str();
    let fq = |q: &str| q == "fq" || q.starts_with("fq ");
    if cc == "bbr" || h.available_congestion_control.iter().any(|c| c == "bbr") {
        let q = h.qdisc.as_deref().unwrap_or(&h.default_qdisc);
        if !fq(q) && !q.is_empty() && q != "noqueue" {
            out.push(Finding {
                host: host.into(),
                setting: "qdisc".into(),
                value: q.into(),
                wanted: "fq (pacing for many streams at once)".into(),
                // default_qdisc only reaches interfaces made after it is set:
                // the interface in use needs its own `tc` line now.
                fix: match interface_word(h) {
                    Some(i) => format!("tc qdisc replace dev {i} root fq"),
                    None => "sysctl -w net.core.default_qdisc=fq, then for each interface in use: tc qdisc replace dev IF root fq".into(),
                },
                persist: sysctl_line("net.core.default_qdisc", "fq"),
            });
        }
    }
}

/// The interface's name as it may stand in a command to paste: the remote
/// host's settings come from the server, and a name that is more than a
/// Linux interface name (15 bytes of letters, digits and `-_.@`) would be
/// a command of the server's making in a root shell.
fn interface_word(h: &HostSettings) -> Option<&str> {
    h.interface.as_deref().filter(|i| {
        (1..=15).contains(&i.len())
            && i.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
    })
}

/// The interface's MTU, the CPU frequency governor and NUMA.
fn audit_nic_and_cpu(host: &str, h: &HostSettings, bdp: u64, out: &mut Vec<Finding>) {
    if let (Some(mtu), Some(i)) = (h.mtu, interface_word(h)) {
        if mtu < 9000 && i != "lo" && bdp > 4 << 20 {
            out.push(Finding {
                host: host.into(),
                setting: format!("mtu of {i}"),
                value: mtu.to_string(),
                wanted: "9000 where the whole path takes it (jumbo frames: a sixth of the packets)"
                    .into(),
                fix: format!("ip link set dev {i} mtu 9000"),
                persist: None,
            });
        }
    }
    if let Some(g) = &h.governor {
        if g != "performance" {
            out.push(Finding {
                host: host.into(),
                setting: "cpufreq governor".into(),
                value: g.clone(),
                wanted: "performance".into(),
                fix: "cpupower frequency-set -g performance".into(),
                persist: None,
            });
        }
    }
    if h.numa_nodes > 1 {
        out.push(Finding {
            host: host.into(),
            setting: "numa".into(),
            value: format!("{} nodes", h.numa_nodes),
            wanted: "the transfer on the NIC's node".into(),
            fix: "numactl --cpunodebind=N --membind=N longhaul ... (N: /sys/class/net/IF/device/numa_node)".into(),
            persist: None,
        });
    }
}

/// What limited the memory-to-memory run by its own accounting, in the
/// terms the verdict needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunLimit {
    /// The receive window or the send buffer.
    Window,
    SenderCpu,
    ReceiverCpu,
    /// Anything else, or nothing named.
    #[default]
    Other,
}

/// The memory-to-memory run in the transfer's direction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunMeasured {
    pub streams: u16,
    pub bits_per_second: f64,
    /// Retransmitted segments per segment sent, after the first second.
    pub loss_fraction: f64,
    pub rtt_loaded_us: u32,
    /// Percent of one core, summed over each end's test threads.
    pub cpu_sender_percent: f64,
    pub cpu_receiver_percent: f64,
    pub limit: RunLimit,
    /// How the run described its limit (quoted when it was the window).
    pub limit_detail: String,
    /// Loss a light UDP probe saw, and its datagrams; None when not run.
    pub probe_loss: Option<f64>,
    pub probe_packets: Option<u64>,
}

/// The short real copy: its rate, and its source's and destination's
/// rates over the time each was busy.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CopyMeasured {
    pub bits_per_second: f64,
    pub source_read_bps: f64,
    pub dest_write_bps: f64,
    /// Where each end's CPU went (the copy is a push: this host is its
    /// source).
    pub cpu_stages: crate::xfer::CpuStages,
}

/// Everything the verdict is drawn from. No field is read from the system
/// here: the engine measures and fills them in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    pub local: HostSettings,
    /// The server's settings; None when they could not be read.
    pub remote: Option<HostSettings>,
    /// The transfer is a pull: the server sends.
    pub pull: bool,
    pub rtt_idle_us: Option<u32>,
    /// The path MTU the kernel learnt for the server, bytes.
    pub path_mtu: Option<u32>,
    /// The rate to judge settings against, bits/s, when the user gave one.
    pub target_bps: Option<u64>,
    /// This host's link speed, bits/s, when the interface is a physical
    /// device (virtual ones claim a speed they do not have).
    pub link_bps: Option<f64>,
    pub run: Option<RunMeasured>,
    /// What a short run with plaintext data streams carried the same way,
    /// bits/s; None where it was not run.
    pub plain_bps: Option<f64>,
    /// Sequential reads of the source, bytes/s, and where.
    pub source_read: Option<(f64, String)>,
    /// Sequential writes of a new file at the destination, bytes/s, and
    /// whether they bypassed the page cache.
    pub dest_write: Option<(f64, bool)>,
    /// Files the destination created per second.
    pub dest_creates_per_second: Option<f64>,
    pub mean_file_size: u64,
    /// True when the mean file size was measured on the files to send;
    /// an assumed size leaves metadata out of the verdict.
    pub mean_file_size_measured: bool,
    pub copy: Option<CopyMeasured>,
    /// What each end's CPU went through (throttling, steal) during the
    /// run judged; None where it was not read.
    pub local_cpu: Option<CpuRun>,
    pub remote_cpu: Option<CpuRun>,
}

/// What the rules concluded from a [`Measured`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judgement {
    pub rtt_loaded_us: Option<u32>,
    /// The rate the settings were judged against, and its BDP.
    pub target_bps: f64,
    pub bdp_bytes: u64,
    pub findings: Vec<Finding>,
    pub stages: Vec<StageCeiling>,
    pub verdict: Option<Verdict>,
    /// The sender's CPU per Gbit/s with TLS, and without (the cipher's
    /// share taken off); None when the run carried nothing.
    pub sender_cpu_per_gbps_tls: Option<f64>,
    pub sender_cpu_per_gbps_plain: Option<f64>,
    /// What was measured but left out of the verdict, and why.
    pub notes: Vec<String>,
}

/// How the memory-to-memory run was limited, read from its figures.
#[derive(Debug, Clone, Copy)]
struct RunShape {
    idle_us: f64,
    loaded_us: f64,
    /// The RTT grew under load: a bottleneck's queue filling, whose drops
    /// are congestion, not loss on the path.
    queueing: bool,
    /// Loss on the path, and whether it counts as random (at the alarm).
    path_loss: Option<(f64, bool)>,
    window_limited: bool,
    send_full: bool,
    recv_full: bool,
    /// Cores both ends share when they run on one host.
    shared_cores: Option<u32>,
    shared_full: bool,
    path_is_limit: bool,
    /// What plaintext data streams carried, when it is so far above the
    /// TLS run that the cipher held that run ([`cipher_held`]).
    cipher_held: Option<f64>,
    /// What the run's windows carry at the idle RTT, when the run was held
    /// by a window it carried far less than ([`undrained`]): the receiver
    /// kept the window full by not reading, a host's limit.
    undrained: Option<f64>,
}

/// A plaintext run at least this many times the TLS run's rate shows the
/// TLS run held by the cipher (the work of TLS on these cores), not by
/// the path both crossed.
pub const CIPHER_HELD: f64 = 1.25;

/// What plaintext data streams carried, when it shows the TLS run held by
/// the cipher: at least [`CIPHER_HELD`] times its rate.
fn cipher_held(m: &Measured) -> Option<f64> {
    let tls = m.run.as_ref()?.bits_per_second;
    m.plain_bps
        .filter(|&plain| tls > 0.0 && plain >= tls * CIPHER_HELD)
}

/// What the run's streams carry at the idle RTT with the smallest window
/// they can have had (autotuning's first, or the buffers' most if less),
/// when the run was held by the window and carried under
/// [`crate::tune::UNDRAINED`] of that (the rule a copy's intervals
/// follow): a window too small for the path is filled by the data in
/// flight and carries about all it allows, so one held far below was kept
/// full by a receiver that did not read (its CPU, or cores it shares), not
/// by the path's length. The smallest window, not the buffers' most: on a
/// long path a short run's windows may still be growing.
fn undrained(m: &Measured, send: &End, recv: &End) -> Option<f64> {
    let run = m.run.as_ref().filter(|p| p.limit == RunLimit::Window)?;
    let streams = run.streams.max(1);
    let rtt_us = m.rtt_idle_us?;
    let most = plan(&PathInput {
        rtt_us,
        target_bps: Some(u64::MAX / 2),
        sender: send.host.buffers,
        receiver: recv.host.buffers,
        streams: Some(streams),
    })
    .ceiling_bps;
    let least =
        crate::tune::smallest_windows_bps(usize::from(streams), rtt_us.max(1), None).min(most);
    (least.is_finite() && crate::tune::undrained(run.bits_per_second, least)).then_some(least)
}

impl RunShape {
    fn read(m: &Measured, send: &End, recv: &End) -> Self {
        let run = m.run.as_ref();
        let idle_us = f64::from(m.rtt_idle_us.unwrap_or(0).max(1));
        let loaded_us = run.map_or(0.0, |p| f64::from(p.rtt_loaded_us));
        // More than a fifth of the idle RTT and a millisecond.
        let queueing = loaded_us > idle_us * 1.2 + 1000.0;
        // Random loss: the light probe saw it (the test's own load cannot
        // have caused it); without a probe, TCP's retransmits with no
        // queue growing.
        let path_loss = run.map(|p| match p.probe_loss {
            Some(l) => (l, l >= LOSS_ALARM),
            None => (p.loss_fraction, p.loss_fraction >= LOSS_ALARM && !queueing),
        });
        let lossy = path_loss.is_some_and(|(_, random)| random);
        let held = cipher_held(m);
        let undrained = undrained(m, send, recv).filter(|_| held.is_none());
        // A window the cipher kept full (a receiver slow to decrypt) is
        // not too small: plaintext went faster through the same one; nor
        // is one the receiver did not drain.
        let window_limited = held.is_none()
            && undrained.is_none()
            && run.is_some_and(|p| p.limit == RunLimit::Window);
        // An end whose test threads kept all its usable cores busy (or
        // used up its cgroup's quota) is CPU-bound, whichever of its
        // threads was the busiest.
        let send_full = run.is_some_and(|p| {
            p.limit == RunLimit::SenderCpu || cpu_full(p.cpu_sender_percent, send)
        });
        let recv_full = undrained.is_some()
            || run.is_some_and(|p| {
                p.limit == RunLimit::ReceiverCpu || cpu_full(p.cpu_receiver_percent, recv)
            });
        // Both ends on one host share its cores: all of them busy between
        // the two is the CPU limiting, whichever end spent more.
        let shared_cores = same_host(&m.local, m.remote.as_ref()).then_some(m.local.cpus.max(1));
        let shared_full = match (run, shared_cores) {
            (Some(p), Some(cores)) => {
                p.cpu_sender_percent + p.cpu_receiver_percent >= 90.0 * f64::from(cores)
            }
            _ => false,
        };
        let cpu_limited = send_full || recv_full || shared_full;
        RunShape {
            idle_us,
            loaded_us,
            queueing,
            path_loss,
            window_limited,
            send_full,
            recv_full,
            shared_cores,
            shared_full,
            path_is_limit: run.is_some()
                && held.is_none()
                && !(window_limited || cpu_limited || lossy),
            cipher_held: held,
            undrained,
        }
    }

    fn lossy(&self) -> bool {
        self.path_loss.is_some_and(|(_, random)| random)
    }
}

/// Draws the findings, the stages and the verdict from the measurements.
pub fn judge(m: &Measured) -> Judgement {
    let rtt = m.rtt_idle_us.unwrap_or(0);
    let (send, recv) = ends(m);
    let (sender, receiver) = (send.host, recv.host);
    let measured = m.run.as_ref().map_or(0.0, |p| p.bits_per_second);
    let shape = RunShape::read(m, &send, &recv);
    // The rate to judge settings against: given; else what the path
    // carried if the path was the limit (or plaintext, where TLS was);
    // else the link's speed, else the default target.
    let target = m
        .target_bps
        .map(|t| t as f64)
        .or(shape.path_is_limit.then_some(measured))
        // The path carried at least what plaintext did.
        .or(shape.cipher_held)
        .or(m.link_bps)
        .unwrap_or(crate::window::DEFAULT_TARGET_BPS as f64)
        .max(measured);
    let bdp = (target / 8.0 * f64::from(rtt) / 1e6) as u64;
    // What a transfer's own sizing would give on this path.
    let w = plan(&PathInput {
        rtt_us: rtt,
        target_bps: Some(target as u64),
        sender: sender.buffers,
        receiver: receiver.buffers,
        streams: None,
    });
    let mut findings = audit("local", &m.local, bdp, w.streams);
    if let Some(h) = &m.remote {
        findings.extend(audit("remote", h, bdp, w.streams));
    }
    findings.extend(audit_path_mtu(
        m.path_mtu,
        &[m.local.mtu, m.remote.as_ref().and_then(|h| h.mtu)],
    ));
    findings.extend(cpu_findings("local", &m.local, m.local_cpu.as_ref()));
    if let Some(h) = &m.remote {
        findings.extend(cpu_findings("remote", h, m.remote_cpu.as_ref()));
    }
    let mut j = Judgement {
        rtt_loaded_us: m.run.as_ref().map(|p| p.rtt_loaded_us),
        target_bps: target,
        bdp_bytes: bdp,
        findings,
        ..Default::default()
    };
    if let Some(p) = &m.run {
        run_stages(&mut j, p, &shape, &w, &send, &recv, rtt);
    }
    storage_stages(&mut j, m, sender, receiver);
    // For the window, the sender's send buffers and the receiver's
    // receive buffers.
    let (send_host, recv_host) = if m.pull {
        ("remote", "local")
    } else {
        ("local", "remote")
    };
    let buffers: Vec<Finding> = j
        .findings
        .iter()
        .filter(|f| {
            (f.host == send_host && f.setting.contains("wmem"))
                || (f.host == recv_host && f.setting.contains("rmem"))
        })
        .cloned()
        .collect();
    let rtt_ms = f64::from(rtt) / 1000.0;
    let fix = |s: Stage| match s {
        Stage::PathRate if shape.shared_cores.is_some() => SAME_HOST_PATH.into(),
        _ => cpu_fix(s, &send, &recv).unwrap_or_else(|| fix_for(s, &buffers, w.streams, rtt_ms)),
    };
    j.verdict = verdict(&j.stages, fix);
    if let Some(c) = &m.copy {
        check_with_copy(&mut j, c, fix);
    }
    starved_end_bounds_its_storage(&mut j, &send, &recv, fix);
    if let (Some(v), Some(c)) = (j.verdict.as_mut(), &m.copy) {
        // The copy pushed from this host: its source is the local end.
        let local = match v.stage {
            Stage::SenderCpu => !m.pull,
            Stage::ReceiverCpu => m.pull,
            _ => return j,
        };
        let end = if local {
            c.cpu_stages.source
        } else {
            c.cpu_stages.sink
        };
        if let Some(split) = end.as_ref().and_then(cpu_split) {
            v.fix = format!("{}; {split}", v.fix);
        }
    }
    j
}

/// Where an end's CPU went in the copy, its three largest stages in
/// shares (`decrypt 41%, write 30%, receive 20%`), the cipher named when
/// it took the most. None when nothing was counted.
pub fn cpu_split(c: &crate::xfer::StageCpu) -> Option<String> {
    let total = c.total();
    if total <= 0.0 {
        return None;
    }
    let mut named = c.named();
    named.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = named
        .iter()
        .take(3)
        .filter(|(_, s)| *s > 0.0)
        .map(|(n, s)| format!("{n} {:.0}%", 100.0 * s / total))
        .collect();
    let cipher = matches!(named[0].0, "encrypt" | "decrypt");
    Some(if cipher {
        format!(
            "the cipher took most of its CPU in the copy ({}): a CPU with AES instructions, or --insecure-plaintext on a network you trust, frees it",
            top.join(", ")
        )
    } else {
        format!("its CPU in the copy went to {}", top.join(", "))
    })
}

/// The stages the memory-to-memory run shows: the path, the window, loss
/// and each end's CPU.
fn run_stages(
    j: &mut Judgement,
    p: &RunMeasured,
    shape: &RunShape,
    w: &WindowPlan,
    send: &End,
    recv: &End,
    rtt: u32,
) {
    j.stages.push(path_stage(p, shape));
    j.stages.push(window_stage(p, shape, w));
    j.stages
        .extend(loss_stage(p, shape, send.host, recv.host, rtt));
    j.stages.extend(cpu_stages(p, shape, send, recv));
    cpu_per_gbps(j, p, send.host);
}

fn stage(name: Stage, ceiling_bps: f64, limiting: bool, detail: String) -> StageCeiling {
    StageCeiling {
        name,
        ceiling_bps,
        limiting,
        detail,
    }
}

/// The path's own rate, as the run carried it.
fn path_stage(p: &RunMeasured, shape: &RunShape) -> StageCeiling {
    let measured = p.bits_per_second;
    let path_detail = match shape.cipher_held {
        // The TLS run says what the cipher allows (the encryption stage);
        // the path carried at least what plaintext did.
        Some(plain) => format!(
            "{} memory to memory without TLS over {} streams (a short run: a lower bound), {} with TLS, RTT {:.1} ms idle, {:.1} ms loaded",
            format_rate(plain),
            p.streams,
            format_rate(measured),
            shape.idle_us / 1000.0,
            shape.loaded_us / 1000.0,
        ),
        None => format!(
            "{} memory to memory over {} streams, RTT {:.1} ms idle, {:.1} ms loaded{}",
            format_rate(measured),
            p.streams,
            shape.idle_us / 1000.0,
            shape.loaded_us / 1000.0,
            if shape.path_is_limit {
                ""
            } else {
                " (a lower bound: another stage limited)"
            }
        ),
    };
    stage(
        Stage::PathRate,
        shape.cipher_held.unwrap_or(measured),
        shape.path_is_limit,
        path_detail,
    )
}

/// What the buffers allow over the streams a transfer opens.
fn window_stage(p: &RunMeasured, shape: &RunShape, w: &WindowPlan) -> StageCeiling {
    let measured = p.bits_per_second;
    let win = if shape.window_limited {
        measured.min(w.ceiling_bps)
    } else {
        w.ceiling_bps
    };
    stage(
        Stage::Window,
        win,
        shape.window_limited,
        format!(
            "{} streams x {} window at {:.1} ms{}",
            w.streams,
            format_bytes(w.stream_window),
            shape.idle_us / 1000.0,
            if shape.window_limited {
                format!(
                    "; the memory-to-memory test was window-bound: {}",
                    p.limit_detail
                )
            } else {
                String::new()
            }
        ),
    )
}

/// Random loss at or above the alarm. Drops at a filling queue are the
/// path's rate, not this stage.
fn loss_stage(
    p: &RunMeasured,
    shape: &RunShape,
    sender: &HostSettings,
    receiver: &HostSettings,
    rtt: u32,
) -> Option<StageCeiling> {
    let measured = p.bits_per_second;
    let (loss, _) = shape.path_loss.unwrap_or((0.0, false));
    let seen = loss > 0.0 && (p.probe_loss.is_some() || !shape.queueing);
    if !seen {
        return None;
    }
    let mathis =
        mathis_bps(mss_of(sender, receiver), rtt.max(1), loss) * f64::from(p.streams.max(1));
    // Loss limits where it would hold loss-based TCP near or below
    // what the path carried (BBR, our default, keeps more).
    let limiting = shape.lossy() && mathis < measured * 1.5;
    Some(stage(
        Stage::Loss,
        if limiting { measured } else { mathis },
        limiting,
        format!(
            "{:.2e} lost on the path ({}); {:.2e} of TCP segments retransmitted after start-up; loss-based TCP over {} streams: {}",
            loss,
            match p.probe_packets {
                Some(n) => format!("light UDP probe, {n} datagrams"),
                None => "TCP retransmits, no queue growing".into(),
            },
            p.loss_fraction,
            p.streams,
            format_rate(mathis)
        ),
    ))
}

/// The rate each end could carry with all its usable cores as busy as
/// the test made them per bit: the sender's and the receiver's stages.
fn cpu_stages(p: &RunMeasured, shape: &RunShape, send: &End, recv: &End) -> [StageCeiling; 2] {
    let (sender, receiver) = (send.host, recv.host);
    let measured = p.bits_per_second;
    let cpu_ceiling = |percent: f64, cores: f64| {
        if percent <= 0.0 {
            f64::INFINITY
        } else {
            measured * cores * 100.0 / percent
        }
    };
    // Both ends on one host (loopback, or namespaces of one machine)
    // share its cores: together they can carry no more than all of them
    // busy at the two ends' cost per bit.
    let shared = shape.shared_cores.map(|cores| {
        let both = p.cpu_sender_percent + p.cpu_receiver_percent;
        (
            cpu_ceiling(both, f64::from(cores.max(1))),
            format!(
                "; both ends share this host's {cores} cores: {:.0}% + {:.0}% of {}%",
                p.cpu_sender_percent,
                p.cpu_receiver_percent,
                100 * cores
            ),
        )
    });
    let (shared_ceiling, shared_detail) = shared.unwrap_or((f64::INFINITY, String::new()));
    // An end whose cores TLS kept busy is still CPU-bound; what plaintext
    // carried says how much of that was the cipher.
    let tls_note = shape.cipher_held.map_or(String::new(), |plain| {
        format!(
            "; {} without TLS (the cipher's share: the encryption stage)",
            format_rate(plain)
        )
    });
    let sender_stage = stage(
        Stage::SenderCpu,
        cpu_ceiling(p.cpu_sender_percent, effective_cores(sender)).min(shared_ceiling),
        shape.send_full || shape.shared_full,
        format!(
            "sender {:.0}% CPU of {} usable core(s) at {}{}{shared_detail}{tls_note}",
            p.cpu_sender_percent,
            sender.cpus_usable,
            format_rate(measured),
            cpu_detail(send)
        ),
    );
    // A receiver that kept its window full was seen limiting at the rate
    // it read, whatever share of its cores that took.
    let (recv_ceiling, undrained_note) = match shape.undrained {
        Some(windows) => (
            measured,
            format!(
                "; it kept its receive window full, where the smallest windows carry {} at the RTT: it did not read faster",
                format_rate(windows)
            ),
        ),
        None => (
            cpu_ceiling(p.cpu_receiver_percent, effective_cores(receiver)).min(shared_ceiling),
            String::new(),
        ),
    };
    let receiver_stage = stage(
        Stage::ReceiverCpu,
        recv_ceiling,
        shape.recv_full || shape.shared_full,
        format!(
            "receiver {:.0}% CPU of {} usable core(s){}{shared_detail}{tls_note}{undrained_note}",
            p.cpu_receiver_percent,
            receiver.cpus_usable,
            cpu_detail(recv)
        ),
    );
    [sender_stage, receiver_stage]
}

/// The sender's CPU per Gbit/s with TLS, and without the cipher's share.
fn cpu_per_gbps(j: &mut Judgement, p: &RunMeasured, sender: &HostSettings) {
    let measured = p.bits_per_second;
    if measured > 0.0 {
        let per_gbps = p.cpu_sender_percent / (measured / 1e9);
        j.sender_cpu_per_gbps_tls = Some(per_gbps);
        if sender.cipher_bytes_per_core > 0.0 {
            // A core sealing at C bytes/s spends 100/(C*8/1e9) percent per Gbit/s.
            let cipher = 100.0 / (sender.cipher_bytes_per_core * 8.0 / 1e9);
            j.sender_cpu_per_gbps_plain = Some((per_gbps - cipher).max(0.0));
        }
    }
}

/// The stages measured apart from the run: the cipher, the storage at
/// both ends and file creation (only for a measured mean file size).
fn storage_stages(j: &mut Judgement, m: &Measured, sender: &HostSettings, receiver: &HostSettings) {
    // Encryption: the cipher alone on every usable core of the slower end
    // (as many as its cgroup's quota allows).
    let cipher = |h: &HostSettings| h.cipher_bytes_per_core * 8.0 * effective_cores(h);
    let enc = cipher(sender).min(cipher(receiver));
    let per_core = format!(
        "AES-GCM at {} a core (sender), {} (receiver)",
        format_rate(sender.cipher_bytes_per_core * 8.0),
        format_rate(receiver.cipher_bytes_per_core * 8.0)
    );
    match (cipher_held(m), m.run.as_ref()) {
        // Seen: TLS carried this much where plaintext carried far more.
        (Some(plain), Some(run)) => j.stages.push(StageCeiling {
            name: Stage::Encryption,
            ceiling_bps: run.bits_per_second,
            limiting: true,
            detail: format!(
                "memory to memory with TLS {}, without it {} over the same streams: TLS's work on these cores holds a transfer, not the path ({per_core} alone)",
                format_rate(run.bits_per_second),
                format_rate(plain)
            ),
        }),
        _ if enc > 0.0 => j.stages.push(StageCeiling {
            name: Stage::Encryption,
            ceiling_bps: enc,
            limiting: false,
            detail: per_core,
        }),
        _ => {}
    }
    let mut add = |name: Stage, ceiling_bps: f64, detail: String| {
        j.stages.push(StageCeiling {
            name,
            ceiling_bps,
            limiting: false,
            detail,
        });
    };
    if let Some((bytes_per_second, path)) = &m.source_read {
        add(
            Stage::SourceStorage,
            bytes_per_second * 8.0,
            format!(
                "sequential read {} ({path})",
                format_rate(bytes_per_second * 8.0),
            ),
        );
    }
    if let Some((bytes_per_second, direct)) = m.dest_write {
        add(
            Stage::DestStorage,
            bytes_per_second * 8.0,
            format!(
                "sequential write of a new file {} ({}, synced, as a transfer writes)",
                format_rate(bytes_per_second * 8.0),
                if direct { "O_DIRECT" } else { "buffered" }
            ),
        );
    }
    if let Some(files_per_second) = m.dest_creates_per_second {
        let carries = files_per_second * m.mean_file_size as f64 * 8.0;
        if m.mean_file_size_measured {
            add(
                Stage::Metadata,
                carries,
                format!(
                    "{files_per_second:.0} files/s created, files of {} on average",
                    format_bytes(m.mean_file_size)
                ),
            );
        } else {
            j.notes.push(format!(
                "metadata not judged: the destination creates {files_per_second:.0} files/s ({} for files of {}); give --source PATH to judge it against the files you will send",
                format_rate(carries),
                format_bytes(m.mean_file_size)
            ));
        }
    }
}

/// How far a real copy must outrun a storage stage's figure before that
/// figure is taken as disproven (storage that varies run to run, such as a
/// virtual disk, reads 2-3x apart; a quarter above is past any rounding).
const COPY_OUTRAN: f64 = 1.25;

/// A copy that moved more than the storage stage the verdict named proves
/// that stage carries at least the copy's rate: its figure apart was low
/// this time. The stage takes the copy's rate and the verdict is drawn
/// again; a stage that is not storage (the path, a CPU) keeps its figure.
fn copy_outran_a_storage_stage(
    j: &mut Judgement,
    c: &CopyMeasured,
    v: &Verdict,
    fix: impl Fn(Stage) -> String,
) {
    if !matches!(v.stage, Stage::DestStorage | Stage::SourceStorage) {
        return;
    }
    let Some(stage) = j.stages.iter_mut().find(|s| s.name == v.stage) else {
        return;
    };
    stage.detail = format!(
        "at least {}: the short copy moved that much, above the {} measured apart ({})",
        format_rate(c.bits_per_second),
        format_rate(stage.ceiling_bps),
        stage.detail
    );
    stage.ceiling_bps = c.bits_per_second;
    stage.limiting = false;
    j.verdict = verdict(&j.stages, fix);
    j.notes.push(format!(
        "the short copy moved {}, above the {} measured apart for {}: that figure was low this time (storage that varies from run to run, or a cache), so the copy's rate stands for it",
        format_rate(c.bits_per_second),
        format_rate(v.ceiling_bps),
        v.stage.name(),
    ));
}

/// The real copy is the check on the stages: far below the verdict's
/// ceiling, what its own stages show wins over what each stage did apart,
/// and the verdict follows it.
fn check_with_copy(j: &mut Judgement, c: &CopyMeasured, fix: impl Fn(Stage) -> String) {
    let Some(v) = j.verdict.clone() else {
        return;
    };
    if c.bits_per_second > v.ceiling_bps * COPY_OUTRAN {
        copy_outran_a_storage_stage(j, c, &v, fix);
        return;
    }
    if c.bits_per_second >= v.ceiling_bps * 0.5 {
        return;
    }
    let what = match copy_stage(c) {
        Some((stage, rate, busy)) => {
            let detail = format!(
                "the short copy's {} ran at {} while busy, {:.0}% of the copy",
                if stage == Stage::DestStorage {
                    "destination writes"
                } else {
                    "source reads"
                },
                format_rate(rate),
                busy * 100.0
            );
            let seen = StageCeiling {
                name: stage,
                ceiling_bps: rate,
                limiting: true,
                detail,
            };
            match j.stages.iter().position(|s| s.name == stage) {
                Some(i) if j.stages[i].ceiling_bps <= rate => {}
                Some(i) => j.stages[i] = seen,
                None => j.stages.push(seen),
            }
            j.verdict = verdict(&j.stages, fix);
            format!("its own stages show {}", stage.name())
        }
        None => format!(
            "neither its source nor its destination was busy most of the time: the CPU both ends spend per byte, or a copy too short for the steady rate (at least {} would show it)",
            format_bytes((v.ceiling_bps / 8.0 * 10.0) as u64)
        ),
    };
    j.notes.push(format!(
        "the short copy moved {}, well below the {} the stages measured apart allow ({}): {what}",
        format_rate(c.bits_per_second),
        format_rate(v.ceiling_bps),
        v.stage.name(),
    ));
}

/// True when the server runs on this very host (loopback, or a network
/// namespace of it): the two ends then share its cores.
pub fn same_host(local: &HostSettings, remote: Option<&HostSettings>) -> bool {
    remote.is_some_and(|h| {
        h.hostname == local.hostname && h.kernel == local.kernel && h.cpus == local.cpus
    })
}

/// The storage stage a copy's own figures show limiting it: the end that
/// was busy for most of the copy (its rate while busy is then what it can
/// carry), with that rate and the share of the copy it was busy; None
/// when neither was.
pub fn copy_stage(c: &CopyMeasured) -> Option<(Stage, f64, f64)> {
    let busy = |rate: f64| {
        if rate > 0.0 {
            (c.bits_per_second / rate).min(1.0)
        } else {
            0.0
        }
    };
    [
        (Stage::DestStorage, c.dest_write_bps),
        (Stage::SourceStorage, c.source_read_bps),
    ]
    .into_iter()
    .map(|(s, rate)| (s, rate, busy(rate)))
    .filter(|&(_, _, b)| b >= 0.6)
    .max_by(|a, b| a.2.total_cmp(&b.2))
}

/// The TCP payload of a segment on the smaller MTU of the two ends (1500
/// when neither is known), less IP and TCP headers with timestamps.
fn mss_of(a: &HostSettings, b: &HostSettings) -> u32 {
    a.mtu
        .into_iter()
        .chain(b.mtu)
        .min()
        .unwrap_or(1500)
        .saturating_sub(52)
}

/// One end of the transfer as the CPU rules see it.
#[derive(Debug, Clone, Copy)]
struct End<'a> {
    host: &'a HostSettings,
    /// What its CPU went through during the run judged.
    run: Option<&'a CpuRun>,
    /// How a fix names it.
    who: &'static str,
}

/// The sender and the receiver of the transfer judged (both this host
/// when the server's settings are unknown).
fn ends(m: &Measured) -> (End<'_>, End<'_>) {
    let local = End {
        host: &m.local,
        run: m.local_cpu.as_ref(),
        who: "this host",
    };
    let Some(h) = &m.remote else {
        return (local, local);
    };
    let remote = End {
        host: h,
        run: m.remote_cpu.as_ref(),
        who: "the server",
    };
    if m.pull {
        (remote, local)
    } else {
        (local, remote)
    }
}

/// The cores an end can keep busy: those it may run on (affinity,
/// cpusets), or fewer where its cgroup's CPU quota allows less.
pub fn effective_cores(h: &HostSettings) -> f64 {
    let usable = f64::from(h.cpus_usable.max(1));
    h.cpu_limits
        .as_ref()
        .and_then(CpuLimits::quota_cores)
        .map_or(usable, |q| q.min(usable))
}

/// The quota, in CPUs, and the setting that sets it, when it allows fewer
/// cores than the end may run on.
fn binding_quota(h: &HostSettings) -> Option<(f64, String)> {
    let c = h.cpu_limits.as_ref()?;
    let q = c.quota_cores()?;
    if q >= f64::from(h.cpus_usable.max(1)) {
        return None;
    }
    Some((q, c.quota_setting()?))
}

/// A CPU count as people write it: 0.2, 1.5, 2.
fn cores_text(q: f64) -> String {
    format!("{}", (q * 100.0).round() / 100.0)
}

/// An end used all the CPU it may: its test threads kept 90% of its
/// effective cores busy, or its cgroup's quota throttled it during the run.
fn cpu_full(percent: f64, e: &End) -> bool {
    percent >= 90.0 * effective_cores(e.host) || e.run.is_some_and(CpuRun::throttled)
}

/// What the CPU stage's detail adds for an end: its quota, throttling and
/// steal during the run.
fn cpu_detail(e: &End) -> String {
    let mut out = String::new();
    if let Some((q, setting)) = binding_quota(e.host) {
        out += &format!("; cgroup quota {} CPU ({setting})", cores_text(q));
    }
    if let Some(r) = e.run {
        if r.throttled_periods > 0 {
            out += &format!(
                "; throttled in {} of {} periods ({:.1} s)",
                r.throttled_periods, r.periods, r.throttled_seconds
            );
        }
        if r.steal_fraction >= STEAL_ALARM {
            out += &format!("; steal {:.0}%", r.steal_fraction * 100.0);
        }
    }
    out
}

const RAISE_QUOTA: &str = "raise the CPU limit of its container, Slurm job or pod (docker --cpus, --cpus-per-task, the pod's resources.limits.cpu) or run longhaul outside that cgroup";

/// An end's CPU limits as findings: a quota below its usable cores,
/// throttling and steal during the run, and other work runnable on its
/// cores before it. `host` is `local` or `remote`.
pub fn cpu_findings(host: &str, h: &HostSettings, run: Option<&CpuRun>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut add = |setting: &str, value: String, wanted: String, fix: &str| {
        out.push(Finding {
            host: host.into(),
            setting: setting.into(),
            value,
            wanted,
            fix: fix.into(),
            persist: None,
        });
    };
    if let Some((q, setting)) = binding_quota(h) {
        add(
            "cgroup cpu quota",
            format!("{} CPU ({setting})", cores_text(q)),
            format!("the {} usable cores, or no quota", h.cpus_usable),
            RAISE_QUOTA,
        );
    }
    let Some(r) = run else {
        return out;
    };
    if r.throttled_periods > 0 {
        add(
            "cgroup cpu throttling",
            format!(
                "{} of {} periods, {:.1} s held back during the test",
                r.throttled_periods, r.periods, r.throttled_seconds
            ),
            "none".into(),
            RAISE_QUOTA,
        );
    }
    if r.steal_fraction >= STEAL_ALARM {
        add(
            "cpu steal",
            format!(
                "{:.0}% of CPU time during the test",
                r.steal_fraction * 100.0
            ),
            format!("under {:.0}%", STEAL_ALARM * 100.0),
            "the hypervisor runs other guests on these cores: a VM with dedicated cores, or on a less loaded host",
        );
    }
    let cores = effective_cores(h);
    if f64::from(r.runnable_before) > cores {
        add(
            "competing load",
            format!(
                "{} other tasks runnable on {} usable core(s) before the test (load {:.1})",
                r.runnable_before,
                cores_text(cores),
                r.loadavg_before
            ),
            format!("at most {}", cores_text(cores)),
            "other work shares these cores: measure and transfer when it is done, or give longhaul more cores",
        );
    }
    out
}

/// The fix for a CPU stage (or the cipher's) when something other than
/// the core count bounds that end's CPU: its cgroup's quota, throttling,
/// steal or competing work; None to keep the general fix.
fn cpu_fix(s: Stage, send: &End, recv: &End) -> Option<String> {
    let (e, role) = match s {
        Stage::SenderCpu => (send, "sender"),
        Stage::ReceiverCpu => (recv, "receiver"),
        Stage::Encryption => {
            let cipher = |e: &End| e.host.cipher_bytes_per_core * effective_cores(e.host);
            if cipher(recv) < cipher(send) {
                (recv, "receiver")
            } else {
                (send, "sender")
            }
        }
        _ => return None,
    };
    let who = e.who;
    let mut why = Vec::new();
    let mut remedy = Vec::new();
    let throttling = e.run.filter(|r| r.throttled_periods > 0).map(|r| {
        format!(
            "throttled it in {} of {} periods ({:.1} s held back)",
            r.throttled_periods, r.periods, r.throttled_seconds
        )
    });
    match (binding_quota(e.host), &throttling) {
        (Some((q, setting)), t) => {
            why.push(format!(
                "{who}'s cgroup limits it to {} CPU ({setting}){}",
                cores_text(q),
                t.as_ref().map_or(String::new(), |t| format!(", which {t}"))
            ));
            remedy.push(RAISE_QUOTA.to_string());
        }
        (None, Some(t)) => {
            why.push(format!("{who}'s cgroup CPU quota {t}"));
            remedy.push(RAISE_QUOTA.to_string());
        }
        (None, None) => {}
    }
    if let Some(r) = e.run {
        if r.steal_fraction >= STEAL_ALARM {
            why.push(format!(
                "the hypervisor took {:.0}% of {who}'s CPU time (steal)",
                r.steal_fraction * 100.0
            ));
            remedy.push("a VM with dedicated cores or on a less loaded host".into());
        }
        let cores = effective_cores(e.host);
        if why.is_empty() && f64::from(r.runnable_before) > cores {
            why.push(format!(
                "{} other tasks were runnable on {who}'s {} usable core(s) (load {:.1})",
                r.runnable_before,
                cores_text(cores),
                r.loadavg_before
            ));
            remedy.push("transfer when that work is done, or give longhaul more cores".into());
        }
    }
    if why.is_empty() {
        return None;
    }
    let (why, remedy) = (why.join("; "), remedy.join("; "));
    Some(if s == Stage::Encryption {
        format!(
            "TLS costs more CPU than the {role} has: {why}: {remedy}; or a CPU with AES instructions, or --insecure-plaintext on a network you trust"
        )
    } else {
        format!("the {role}'s CPU is the limit: {why}: {remedy}")
    })
}

/// An end whose CPU quota starved it in the run had everything it did
/// measured under that quota: a storage (or file-creation) verdict at that
/// end is that CPU's figure, and so is a window or path verdict when the
/// starved end is the receiver (it drained its sockets too slowly, which
/// the sender saw as a full window) or either end (path). The verdict then
/// names the CPU, with the stage first named as the next.
fn starved_end_bounds_its_storage(
    j: &mut Judgement,
    send: &End,
    recv: &End,
    fix: impl Fn(Stage) -> String,
) {
    let Some(v) = j.verdict.clone() else {
        return;
    };
    let candidates: &[(Stage, &End)] = match v.stage {
        Stage::SourceStorage => &[(Stage::SenderCpu, send)],
        Stage::DestStorage | Stage::Metadata | Stage::Window => &[(Stage::ReceiverCpu, recv)],
        Stage::PathRate => &[(Stage::ReceiverCpu, recv), (Stage::SenderCpu, send)],
        _ => return,
    };
    let starved = |(cpu, e): &&(Stage, &End)| {
        e.host
            .cpu_limits
            .as_ref()
            .and_then(CpuLimits::quota_cores)
            .is_some()
            && j.stages.iter().any(|s| s.name == *cpu && s.limiting)
    };
    let Some(&(cpu, e)) = candidates.iter().find(starved) else {
        return;
    };
    let cpu_ceiling = j
        .stages
        .iter()
        .find(|s| s.name == cpu)
        .map_or(v.ceiling_bps, |s| s.ceiling_bps);
    j.notes.push(format!(
        "{} was measured at {} on {} while its CPU quota held it back: that figure is its CPU's, so {} is named",
        v.stage.name(),
        format_rate(v.ceiling_bps),
        e.who,
        cpu.name()
    ));
    j.verdict = Some(Verdict {
        stage: cpu,
        ceiling_bps: cpu_ceiling.min(v.ceiling_bps),
        next: Some(v.stage),
        next_ceiling_bps: Some(v.ceiling_bps),
        fix: fix(cpu),
    });
}

/// The path's fix when both ends are one host (loopback, or namespaces of
/// one machine): no link is crossed, so what it carried is this host's
/// memory and CPU, which the hosts' settings do raise.
const SAME_HOST_PATH: &str = "both ends are on this host: the path is its own memory and CPU, not a link (more usable cores or a faster CPU raise it); run the doctor against the real peer to judge a network";

/// What to change when `s` limits. `buffers` are the socket buffer caps
/// found too small for the path, `streams` those a transfer would open.
fn fix_for(s: Stage, buffers: &[Finding], streams: u16, rtt_ms: f64) -> String {
    let sysctls: Vec<String> = buffers
        .iter()
        .filter(|f| f.setting.contains("mem"))
        .map(|f| format!("{} ({})", f.fix, f.host))
        .collect();
    match s {
        Stage::PathRate => "the path itself is the limit: a faster link or a less shared path; nothing on the hosts will raise it".into(),
        Stage::Window => {
            if sysctls.is_empty() {
                format!(
                    "the socket buffers hold too little for {rtt_ms:.0} ms: use more streams (-P, {streams} now)"
                )
            } else {
                format!("raise the socket buffer caps: {}", sysctls.join("; "))
            }
        }
        Stage::Loss => "packet loss on the path: find the lossy hop (errors on an interface, a dirty optic, a policer; perfSONAR or `perf -u` per segment); meanwhile keep BBR (longhaul's default) and more streams (-P)".into(),
        Stage::SenderCpu => "the sender's CPU is the limit: more usable cores (check taskset/cgroup cpusets), a faster CPU, or the performance governor".into(),
        Stage::ReceiverCpu => "the receiver's CPU is the limit: more usable cores on the server, a faster CPU, or the performance governor".into(),
        Stage::Encryption => "TLS costs more CPU than the path allows: a CPU with AES instructions, more cores, or --insecure-plaintext on a network you trust".into(),
        Stage::SourceStorage => "the source storage reads slower than the path: faster or striped storage, or read from a copy on faster disks".into(),
        Stage::DestStorage => "the destination storage writes slower than the path: faster or striped storage at the destination (check its throttles and RAID)".into(),
        Stage::Metadata => "creating files at the destination is the limit: bundle small files (tar) before sending, or a file system with faster creates (local, not NFS)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_mtu_below_the_ends_is_a_finding() {
        let f = audit_path_mtu(Some(1500), &[Some(9000), Some(9000)]).unwrap();
        assert_eq!((f.host.as_str(), f.value.as_str()), ("path", "1500"));
        assert!(f.fix.contains("tracepath"), "{}", f.fix);
        assert!(f.wanted.starts_with("9000"));
        assert_eq!(audit_path_mtu(Some(9000), &[Some(9000), Some(9000)]), None);
        // The smaller end decides what the path can be asked for.
        assert_eq!(audit_path_mtu(Some(1500), &[Some(9000), Some(1500)]), None);
        assert_eq!(audit_path_mtu(None, &[Some(9000)]), None);
        assert_eq!(audit_path_mtu(Some(1500), &[None, None]), None);
    }

    #[test]
    fn loopback_mtu_65536_is_no_path_mtu_finding() {
        // Loopback's interfaces say 65536; IPv4's route reads 65535, the
        // largest packet there is.
        assert_eq!(
            audit_path_mtu(Some(65_535), &[Some(65_536), Some(65_536)]),
            None
        );
        assert_eq!(
            audit_path_mtu(Some(65_536), &[Some(65_536), Some(65_536)]),
            None
        );
        // A hop that carries less is still found, on big MTUs too.
        let f = audit_path_mtu(Some(1500), &[Some(65_536), Some(65_536)]).unwrap();
        assert_eq!(f.value, "1500");
        assert!(f.wanted.starts_with("65535"), "{}", f.wanted);
        let f = audit_path_mtu(Some(65_000), &[Some(65_536), None]).unwrap();
        assert_eq!(f.value, "65000");
    }

    fn stage(name: Stage, gbps: f64, limiting: bool) -> StageCeiling {
        StageCeiling {
            name,
            ceiling_bps: gbps * 1e9,
            limiting,
            detail: String::new(),
        }
    }

    #[test]
    fn the_lowest_stage_wins_and_evidence_breaks_near_ties() {
        let s = [
            stage(Stage::PathRate, 2.0, false),
            stage(Stage::Window, 0.4, true),
            stage(Stage::DestStorage, 0.3, false),
            stage(Stage::SenderCpu, 0.35, true),
        ];
        let v = verdict(&s, |st| st.name().into()).unwrap();
        assert_eq!(v.stage, Stage::DestStorage);
        assert_eq!(v.next, Some(Stage::SenderCpu));
        assert_eq!(v.fix, "dest_storage");
        // A stage seen limiting within a tenth of a lower estimate wins.
        let s = [
            stage(Stage::Metadata, 0.95, false),
            stage(Stage::Loss, 1.0, true),
            stage(Stage::SenderCpu, 3.0, false),
        ];
        assert_eq!(verdict(&s, |_| String::new()).unwrap().stage, Stage::Loss);
        // The path's rate counts only when it was seen limiting.
        let s = [
            stage(Stage::PathRate, 0.5, false),
            stage(Stage::Metadata, 1.0, false),
        ];
        assert_eq!(
            verdict(&s, |_| String::new()).unwrap().stage,
            Stage::Metadata
        );
        let s = [
            stage(Stage::PathRate, 0.5, true),
            stage(Stage::Metadata, 1.0, false),
        ];
        assert_eq!(
            verdict(&s, |_| String::new()).unwrap().stage,
            Stage::PathRate
        );
        // Unknown ceilings are left out; nothing at all gives no verdict.
        assert!(
            verdict(&[stage(Stage::Loss, f64::INFINITY, true)], |_| String::new(
            ))
            .is_none()
        );
    }

    #[test]
    fn mathis_matches_the_textbook_figure() {
        // 1460-byte MSS, 100 ms, 1e-4 loss: about 14 Mbit/s.
        let r = mathis_bps(1460, 100_000, 1e-4);
        assert!((r - 14.25e6).abs() < 0.1e6, "{r}");
        assert!(mathis_bps(1460, 100_000, 0.0).is_infinite());
    }

    #[test]
    fn a_long_path_asks_each_connection_to_start_afresh() {
        let mut h = HostSettings {
            tcp_no_metrics_save: Some(false),
            ..Default::default()
        };
        let named = |h: &HostSettings, bdp| {
            audit("local", h, bdp, 1)
                .into_iter()
                .find(|f| f.setting == "net.ipv4.tcp_no_metrics_save")
        };
        // 1 Gbit/s at 100 ms: 12.5 MB in flight.
        let f = named(&h, 12_500_000).expect("the metrics cache named on a long path");
        assert_eq!(f.fix, "sysctl -w net.ipv4.tcp_no_metrics_save=1");
        assert_eq!(
            f.persist.as_deref(),
            Some("net.ipv4.tcp_no_metrics_save = 1")
        );
        // A short path, a host already set, or a peer that did not say: nothing.
        assert!(named(&h, 1 << 20).is_none());
        h.tcp_no_metrics_save = Some(true);
        assert!(named(&h, 12_500_000).is_none());
        h.tcp_no_metrics_save = None;
        assert!(named(&h, 12_500_000).is_none());
    }

    #[test]
    fn a_peers_interface_name_never_makes_a_command_of_its_own() {
        let h = HostSettings {
            congestion_control: "bbr".into(),
            default_qdisc: "fq_codel".into(),
            interface: Some("eth0;curl x|sh".into()),
            mtu: Some(1500),
            ..Default::default()
        };
        let f = audit("remote", &h, 10_000_000, 1);
        let qdisc = f.iter().find(|f| f.setting == "qdisc").unwrap();
        assert!(qdisc.fix.contains("dev IF root fq"), "{}", qdisc.fix);
        assert!(f.iter().all(|f| !f.fix.contains("curl")), "{f:?}");
    }

    #[test]
    fn audit_names_small_buffers_with_the_sysctl_to_fix_them() {
        let h = HostSettings {
            buffers: BufferCaps {
                rmem_max: Some(212_992),
                wmem_max: Some(4 << 20),
                tcp_rmem_max: Some(6 << 20),
                tcp_wmem_max: Some(4 << 20),
            },
            congestion_control: "cubic".into(),
            available_congestion_control: vec!["reno".into(), "cubic".into(), "bbr".into()],
            default_qdisc: "fq_codel".into(),
            interface: Some("eth0".into()),
            mtu: Some(1500),
            ..Default::default()
        };
        // 1 Gbit/s at 80 ms over one stream: 10 MB in flight.
        let f = audit("remote", &h, 10_000_000, 1);
        let names: Vec<&str> = f.iter().map(|f| f.setting.as_str()).collect();
        for want in [
            "net.core.rmem_max",
            "net.core.wmem_max",
            "net.ipv4.tcp_rmem",
            "net.ipv4.tcp_wmem",
            "net.ipv4.tcp_congestion_control",
            "qdisc",
            "mtu of eth0",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let rmem = f.iter().find(|f| f.setting == "net.core.rmem_max").unwrap();
        assert_eq!(rmem.fix, "sysctl -w net.core.rmem_max=33554432");
        assert_eq!(rmem.host, "remote");
        // Each sysctl fix has its line for the sysctl.d file, so that it
        // survives a reboot; the qdisc's fix touches the interface in use.
        assert_eq!(
            rmem.persist.as_deref(),
            Some("net.core.rmem_max = 33554432")
        );
        let tcp_rmem = f.iter().find(|f| f.setting == "net.ipv4.tcp_rmem").unwrap();
        assert_eq!(
            tcp_rmem.fix,
            "sysctl -w net.ipv4.tcp_rmem='4096 131072 33554432'"
        );
        assert_eq!(
            tcp_rmem.persist.as_deref(),
            Some("net.ipv4.tcp_rmem = 4096 131072 33554432")
        );
        let qdisc = f.iter().find(|f| f.setting == "qdisc").unwrap();
        assert_eq!(qdisc.fix, "tc qdisc replace dev eth0 root fq");
        assert_eq!(
            qdisc.persist.as_deref(),
            Some("net.core.default_qdisc = fq")
        );
        let mtu = f.iter().find(|f| f.setting == "mtu of eth0").unwrap();
        assert_eq!(mtu.persist, None);
        // Spread over 32 streams the same path needs nothing more of the
        // buffers (312 KB a stream).
        let f = audit("remote", &h, 10_000_000, 32);
        assert!(
            !f.iter()
                .any(|f| f.setting.ends_with("mem") && f.setting.starts_with("net.ipv4")),
            "{f:?}"
        );
        assert!(f.iter().any(|f| f.setting == "net.core.rmem_max"));
    }

    fn host(name: &str, cpus: u32) -> HostSettings {
        HostSettings {
            hostname: name.into(),
            kernel: "6.1".into(),
            cpus,
            cpus_usable: cpus,
            buffers: BufferCaps {
                rmem_max: Some(64 << 20),
                wmem_max: Some(64 << 20),
                tcp_rmem_max: Some(64 << 20),
                tcp_wmem_max: Some(64 << 20),
            },
            ..Default::default()
        }
    }

    /// A push between two 8-core hosts 1 ms apart whose memory-to-memory
    /// run carried 10 Gbit/s with a core busy at each end: the path limits.
    fn push() -> Measured {
        Measured {
            local: host("a", 8),
            remote: Some(host("b", 8)),
            rtt_idle_us: Some(1000),
            run: Some(RunMeasured {
                streams: 4,
                bits_per_second: 1e10,
                rtt_loaded_us: 1100,
                cpu_sender_percent: 100.0,
                cpu_receiver_percent: 100.0,
                ..Default::default()
            }),
            mean_file_size: 1 << 20,
            ..Default::default()
        }
    }

    fn stage_of(j: &Judgement, s: Stage) -> &StageCeiling {
        j.stages
            .iter()
            .find(|x| x.name == s)
            .unwrap_or_else(|| panic!("no {} in {:?}", s.name(), j.stages))
    }

    fn verdict_of(m: &Measured) -> (Verdict, Judgement) {
        let j = judge(m);
        let v = j
            .verdict
            .clone()
            .unwrap_or_else(|| panic!("no verdict: {j:?}"));
        (v, j)
    }

    #[test]
    fn a_run_no_other_stage_held_back_makes_the_path_the_verdict() {
        let (v, j) = verdict_of(&push());
        assert_eq!(v.stage, Stage::PathRate, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 1e10);
        assert!(stage_of(&j, Stage::PathRate).limiting);
        assert!(v.fix.starts_with("the path itself"), "{}", v.fix);
        // The settings are judged against what the path carried.
        assert_eq!(j.target_bps, 1e10);
        assert_eq!(j.bdp_bytes, 1_250_000);
        assert_eq!(j.rtt_loaded_us, Some(1100));
        assert_eq!(j.sender_cpu_per_gbps_tls, Some(10.0));
        assert!(j.findings.is_empty(), "{:?}", j.findings);
    }

    #[test]
    fn a_window_bound_run_names_the_receivers_buffer_cap() {
        let mut m = push();
        m.rtt_idle_us = Some(80_000);
        let small = BufferCaps {
            rmem_max: Some(212_992),
            wmem_max: Some(212_992),
            tcp_rmem_max: Some(6 << 20),
            tcp_wmem_max: Some(4 << 20),
        };
        m.remote.as_mut().unwrap().buffers = small;
        let run = m.run.as_mut().unwrap();
        run.bits_per_second = 1e9;
        run.rtt_loaded_us = 80_500;
        run.limit = RunLimit::Window;
        run.limit_detail = "receive window full".into();
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Window, "{:?}", j.stages);
        let window = stage_of(&j, Stage::Window);
        assert!(window.limiting);
        assert!(
            window.detail.ends_with("receive window full"),
            "{}",
            window.detail
        );
        assert!(!stage_of(&j, Stage::PathRate).limiting);
        // On a push the server receives: its receive caps are the fix,
        // not its send caps, and not this host's.
        assert!(
            v.fix.starts_with("raise the socket buffer caps"),
            "{}",
            v.fix
        );
        assert!(v.fix.contains("net.core.rmem_max"), "{}", v.fix);
        assert!(v.fix.contains("(remote)"), "{}", v.fix);
        assert!(!v.fix.contains("wmem"), "{}", v.fix);
        assert!(!v.fix.contains("(local)"), "{}", v.fix);
        // On a pull the server sends: its send caps are the fix.
        m.pull = true;
        m.remote.as_mut().unwrap().buffers = small;
        let (v, _) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Window);
        assert!(v.fix.contains("net.core.wmem_max"), "{}", v.fix);
        assert!(!v.fix.contains("rmem"), "{}", v.fix);
        // Caps large enough: more streams is the fix.
        m.remote.as_mut().unwrap().buffers = host("b", 8).buffers;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Window, "{:?}", j.stages);
        assert!(v.fix.contains("use more streams (-P"), "{}", v.fix);
        assert!(v.fix.contains("80 ms"), "{}", v.fix);
    }

    #[test]
    fn random_loss_limits_and_light_loss_does_not() {
        let mut m = push();
        m.rtt_idle_us = Some(50_000);
        let run = m.run.as_mut().unwrap();
        run.bits_per_second = 1e9;
        run.rtt_loaded_us = 50_200;
        run.probe_loss = Some(1e-3);
        run.probe_packets = Some(10_000);
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Loss, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 1e9);
        assert!(stage_of(&j, Stage::Loss).limiting);
        assert!(!stage_of(&j, Stage::PathRate).limiting);
        assert!(v.fix.starts_with("packet loss on the path"), "{}", v.fix);
        // Below the alarm: a stage with Mathis's figure, not limiting.
        m.run.as_mut().unwrap().probe_loss = Some(1e-6);
        let (v, j) = verdict_of(&m);
        let loss = stage_of(&j, Stage::Loss);
        assert!(!loss.limiting);
        let mathis = mathis_bps(1448, 50_000, 1e-6) * 4.0;
        assert_eq!(loss.ceiling_bps, mathis);
        assert_eq!(v.stage, Stage::PathRate, "{:?}", j.stages);
    }

    #[test]
    fn retransmits_at_a_filling_queue_are_congestion_not_loss() {
        let mut m = push();
        let run = m.run.as_mut().unwrap();
        run.loss_fraction = 1e-2;
        // Loaded RTT 5 ms over 1 ms idle: a queue filled.
        run.rtt_loaded_us = 5000;
        let (v, j) = verdict_of(&m);
        assert!(
            j.stages.iter().all(|s| s.name != Stage::Loss),
            "{:?}",
            j.stages
        );
        assert_eq!(v.stage, Stage::PathRate);
        // The same retransmits with no queue growing are loss.
        m.run.as_mut().unwrap().rtt_loaded_us = 1100;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Loss, "{:?}", j.stages);
    }

    #[test]
    fn a_busy_end_is_the_cpu_verdict() {
        let mut m = push();
        // 780% of 8 cores is over 90% of them: the sender limits.
        m.run.as_mut().unwrap().cpu_sender_percent = 780.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SenderCpu, "{:?}", j.stages);
        assert!(stage_of(&j, Stage::SenderCpu).limiting);
        assert!(!stage_of(&j, Stage::ReceiverCpu).limiting);
        assert!(v.fix.starts_with("the sender's CPU"), "{}", v.fix);
        let mut m = push();
        m.run.as_mut().unwrap().cpu_receiver_percent = 780.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        assert!(v.fix.starts_with("the receiver's CPU"), "{}", v.fix);
        // The run's own accounting naming the CPU is enough.
        let mut m = push();
        m.run.as_mut().unwrap().limit = RunLimit::ReceiverCpu;
        assert_eq!(verdict_of(&m).0.stage, Stage::ReceiverCpu);
        // On a pull the server sends: its cores are the sender's.
        let mut m = push();
        m.pull = true;
        m.remote.as_mut().unwrap().cpus_usable = 1;
        m.run.as_mut().unwrap().cpu_sender_percent = 95.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SenderCpu, "{:?}", j.stages);
        assert_eq!(
            stage_of(&j, Stage::SenderCpu).ceiling_bps,
            1e10 * 100.0 / 95.0
        );
    }

    /// A host whose cgroup allows `quota_us` of CPU per 100 ms (cgroup v2).
    fn quota(h: &mut HostSettings, quota_us: u64) {
        h.cpu_limits = Some(CpuLimits {
            cgroup_version: 2,
            quota_us: Some(quota_us),
            period_us: Some(100_000),
            ..Default::default()
        });
    }

    fn throttled() -> CpuRun {
        CpuRun {
            periods: 30,
            throttled_periods: 28,
            throttled_seconds: 2.4,
            ..Default::default()
        }
    }

    /// A push at 1 Gbit/s whose destination wrote at 0.4 Gbit/s in its
    /// probe, with the server (the receiver) under a 0.2-CPU quota.
    fn push_to_a_starved_server() -> Measured {
        let mut m = push();
        quota(m.remote.as_mut().unwrap(), 20_000);
        m.remote_cpu = Some(throttled());
        let run = m.run.as_mut().unwrap();
        run.bits_per_second = 1e9;
        run.cpu_receiver_percent = 19.0;
        run.cpu_sender_percent = 40.0;
        m.dest_write = Some((0.05e9, false));
        m
    }

    #[test]
    fn a_server_under_a_cpu_quota_is_the_receivers_cpu_and_the_fix_names_the_quota() {
        let m = push_to_a_starved_server();
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        let recv = stage_of(&j, Stage::ReceiverCpu);
        assert!(recv.limiting);
        // 19% of the 0.2 CPU allowed carried 1 Gbit/s.
        assert!((recv.ceiling_bps - 1e9 * 20.0 / 19.0).abs() < 1.0);
        assert!(recv
            .detail
            .contains("cgroup quota 0.2 CPU (cpu.max 20000 100000)"));
        assert!(!stage_of(&j, Stage::PathRate).limiting);
        // The storage was measured under the same quota: it is the next.
        assert_eq!(v.next, Some(Stage::DestStorage));
        assert_eq!(v.ceiling_bps, 0.4e9);
        assert!(
            j.notes
                .iter()
                .any(|n| n.contains("dest_storage was measured") && n.contains("the server")),
            "{:?}",
            j.notes
        );
        assert!(
            v.fix.starts_with(
                "the receiver's CPU is the limit: the server's cgroup limits it to 0.2 CPU (cpu.max 20000 100000), which throttled it in 28 of 30 periods"
            ),
            "{}",
            v.fix
        );
        assert!(v.fix.contains("--cpus-per-task"), "{}", v.fix);
        assert!(!v.fix.contains("nothing on the hosts"), "{}", v.fix);
        let f: Vec<(&str, &str)> = j
            .findings
            .iter()
            .map(|f| (f.host.as_str(), f.setting.as_str()))
            .collect();
        assert!(f.contains(&("remote", "cgroup cpu quota")), "{f:?}");
        assert!(f.contains(&("remote", "cgroup cpu throttling")), "{f:?}");
        assert!(!f.iter().any(|(h, _)| *h == "local"), "{f:?}");
        // Today's rules without the quota (an older server): the storage
        // measured under the quota was named, not the CPU.
        let mut old = push_to_a_starved_server();
        old.remote.as_mut().unwrap().cpu_limits = None;
        old.remote_cpu = None;
        assert_eq!(verdict_of(&old).0.stage, Stage::DestStorage);
    }

    #[test]
    fn a_starved_end_says_where_its_cpu_went_in_the_copy_and_names_the_cipher() {
        let mut m = push_to_a_starved_server();
        let sink = crate::xfer::StageCpu {
            receive: 0.2,
            decrypt: 0.5,
            verify: 0.1,
            write: 0.2,
            ..Default::default()
        };
        m.copy = Some(CopyMeasured {
            bits_per_second: 1e9,
            source_read_bps: 40e9,
            dest_write_bps: 20e9,
            cpu_stages: crate::xfer::CpuStages {
                source: Some(crate::xfer::StageCpu {
                    read: 1.0,
                    ..Default::default()
                }),
                sink: Some(sink),
            },
        });
        let (v, _) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu);
        assert!(
            v.fix.contains(
                "the cipher took most of its CPU in the copy (decrypt 50%, receive 20%, write 20%)"
            ),
            "{}",
            v.fix
        );
        // Another stage first: named without the cipher's remedy.
        let mut m2 = m.clone();
        m2.copy.as_mut().unwrap().cpu_stages.sink = Some(crate::xfer::StageCpu {
            write: 0.6,
            decrypt: 0.4,
            ..Default::default()
        });
        let (v, _) = verdict_of(&m2);
        assert!(
            v.fix
                .contains("its CPU in the copy went to write 60%, decrypt 40%"),
            "{}",
            v.fix
        );
        assert!(!v.fix.contains("cipher"), "{}", v.fix);
    }

    #[test]
    fn a_window_filled_by_a_starved_receiver_is_that_receivers_cpu() {
        // The receiver drained its sockets too slowly under its quota: the
        // sender saw a full window. Its CPU is named, the window next.
        let mut m = push_to_a_starved_server();
        m.dest_write = None;
        m.run.as_mut().unwrap().limit = RunLimit::Window;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        assert!(!v.fix.contains("nothing on the hosts"), "{}", v.fix);
        // Without a quota the window stays the verdict.
        let mut free = m.clone();
        free.remote.as_mut().unwrap().cpu_limits = None;
        free.remote_cpu = None;
        free.run.as_mut().unwrap().cpu_receiver_percent = 5.0;
        // A path long enough for 1 Gbit/s to fill the smallest windows.
        free.rtt_idle_us = Some(20_000);
        assert_ne!(verdict_of(&free).0.stage, Stage::ReceiverCpu);
    }

    #[test]
    fn throttling_alone_shows_a_starved_end_and_the_path_is_not_blamed() {
        // The receiver's threads used only 10% (the rest of its quota went
        // elsewhere in the process), but the quota throttled it.
        let mut m = push_to_a_starved_server();
        m.dest_write = None;
        m.run.as_mut().unwrap().cpu_receiver_percent = 10.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        assert!(!v.fix.contains("nothing on the hosts"), "{}", v.fix);
        // No throttling and the threads well below the quota: not starved,
        // the path is the limit.
        m.remote_cpu = Some(CpuRun {
            periods: 30,
            ..Default::default()
        });
        let (v, j) = verdict_of(&m);
        assert!(!stage_of(&j, Stage::ReceiverCpu).limiting);
        assert_eq!(v.stage, Stage::PathRate, "{:?}", j.stages);
    }

    #[test]
    fn a_client_under_a_quota_is_the_senders_cpu_on_a_push_and_the_receivers_on_a_pull() {
        let mut m = push();
        quota(&mut m.local, 50_000);
        m.local_cpu = Some(throttled());
        m.run.as_mut().unwrap().cpu_sender_percent = 49.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SenderCpu, "{:?}", j.stages);
        assert!(
            v.fix.starts_with("the sender's CPU is the limit: this host's cgroup limits it to 0.5 CPU (cpu.max 50000 100000)"),
            "{}",
            v.fix
        );
        assert!(j
            .findings
            .iter()
            .any(|f| f.host == "local" && f.value == "0.5 CPU (cpu.max 50000 100000)"));
        // On a pull this host receives.
        m.pull = true;
        let run = m.run.as_mut().unwrap();
        run.cpu_sender_percent = 100.0;
        run.cpu_receiver_percent = 49.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        assert!(v.fix.contains("this host's cgroup"), "{}", v.fix);
        // The server under the quota on a pull is the sender.
        let mut m = push();
        m.pull = true;
        quota(m.remote.as_mut().unwrap(), 50_000);
        m.remote_cpu = Some(throttled());
        m.run.as_mut().unwrap().cpu_sender_percent = 49.0;
        m.source_read = Some((0.01e9, "/x".into()));
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SenderCpu, "{:?}", j.stages);
        assert_eq!(v.next, Some(Stage::SourceStorage));
        assert!(
            v.fix.contains("the server's cgroup limits it to 0.5 CPU"),
            "{}",
            v.fix
        );
    }

    #[test]
    fn a_quota_shrinks_the_ciphers_cores_and_the_encryption_fix_names_it() {
        let mut m = push();
        // 1 GB/s a core on 0.5 CPU: 4 Gbit/s, below the 10 carried.
        m.remote.as_mut().unwrap().cipher_bytes_per_core = 1e9;
        m.local.cipher_bytes_per_core = 2e9;
        quota(m.remote.as_mut().unwrap(), 50_000);
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Encryption, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 4e9);
        assert!(
            v.fix.starts_with("TLS costs more CPU than the receiver has: the server's cgroup limits it to 0.5 CPU"),
            "{}",
            v.fix
        );
        assert!(v.fix.contains("--insecure-plaintext"), "{}", v.fix);
        // A quota above the usable cores binds nothing.
        quota(m.remote.as_mut().unwrap(), 1_600_000);
        m.remote.as_mut().unwrap().cipher_bytes_per_core = 0.1e9;
        assert_eq!(effective_cores(m.remote.as_ref().unwrap()), 8.0);
        let j = judge(&m);
        assert!(j.findings.is_empty(), "{:?}", j.findings);
        assert!(j
            .verdict
            .unwrap()
            .fix
            .starts_with("TLS costs more CPU than the path allows"));
    }

    #[test]
    fn steal_and_competing_load_are_findings_and_reasons() {
        let mut m = push();
        m.local_cpu = Some(CpuRun {
            steal_fraction: 0.25,
            runnable_before: 12,
            loadavg_before: 11.5,
            ..Default::default()
        });
        m.run.as_mut().unwrap().cpu_sender_percent = 780.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SenderCpu);
        assert!(
            v.fix
                .contains("the hypervisor took 25% of this host's CPU time (steal)"),
            "{}",
            v.fix
        );
        assert!(stage_of(&j, Stage::SenderCpu).detail.contains("steal 25%"));
        let settings: Vec<&str> = j.findings.iter().map(|f| f.setting.as_str()).collect();
        assert_eq!(
            settings,
            ["cpu steal", "competing load"],
            "{:?}",
            j.findings
        );
        // Competing work alone is the reason when nothing else is.
        m.local_cpu.as_mut().unwrap().steal_fraction = 0.0;
        let (v, _) = verdict_of(&m);
        assert!(
            v.fix
                .contains("12 other tasks were runnable on this host's 8 usable core(s)"),
            "{}",
            v.fix
        );
        // Nothing of the kind: the general fix.
        m.local_cpu = Some(CpuRun::default());
        assert!(verdict_of(&m)
            .0
            .fix
            .starts_with("the sender's CPU is the limit: more usable cores"));
    }

    #[test]
    fn both_ends_on_one_host_count_their_cpu_together() {
        let mut m = push();
        m.local = host("a", 2);
        m.remote = Some(host("b", 2));
        let run = m.run.as_mut().unwrap();
        run.cpu_sender_percent = 80.0;
        run.cpu_receiver_percent = 80.0;
        // Apart, each end alone could carry 25 Gbit/s.
        let j = judge(&m);
        assert_eq!(stage_of(&j, Stage::SenderCpu).ceiling_bps, 2.5e10);
        assert!(!stage_of(&j, Stage::SenderCpu).detail.contains("share"));
        // On one host (loopback) the two together carry only 12.5.
        m.remote = Some(host("a", 2));
        let j = judge(&m);
        assert_eq!(stage_of(&j, Stage::SenderCpu).ceiling_bps, 1.25e10);
        assert_eq!(stage_of(&j, Stage::ReceiverCpu).ceiling_bps, 1.25e10);
        assert!(
            stage_of(&j, Stage::SenderCpu)
                .detail
                .contains("both ends share this host's 2 cores: 80% + 80% of 200%"),
            "{}",
            stage_of(&j, Stage::SenderCpu).detail
        );
        assert!(!stage_of(&j, Stage::SenderCpu).limiting);
        // The path on one host is its memory and CPU: the hosts do raise
        // it (issue 41).
        let v = j.verdict.unwrap();
        assert_eq!(v.stage, Stage::PathRate);
        assert!(!v.fix.contains("nothing on the hosts"), "{}", v.fix);
        assert!(v.fix.starts_with("both ends are on this host"), "{}", v.fix);
        // 95% + 95%: both cores busy, neither end alone: the CPU limits.
        let run = m.run.as_mut().unwrap();
        run.cpu_sender_percent = 95.0;
        run.cpu_receiver_percent = 95.0;
        let (v, j) = verdict_of(&m);
        assert!(stage_of(&j, Stage::SenderCpu).limiting);
        assert!(stage_of(&j, Stage::ReceiverCpu).limiting);
        assert!(!stage_of(&j, Stage::PathRate).limiting);
        assert_eq!(v.stage, Stage::SenderCpu, "{:?}", j.stages);
        // A different kernel is a different host.
        m.remote.as_mut().unwrap().kernel = "6.2".into();
        assert!(!same_host(&m.local, m.remote.as_ref()));
    }

    /// A run held by the receive window at a small part of what the
    /// buffers' windows carry at the RTT: the receiver kept the window full
    /// by not reading (issue 41), so neither the window (no buffer to
    /// raise) nor the path is the verdict, but the receiver at the rate it
    /// read. A run that carried about what its windows allow stays the
    /// window's.
    #[test]
    fn a_window_the_receiver_did_not_drain_is_the_receivers() {
        // Loopback as measured: 4.4 Gbit/s at 10 us idle, the window full;
        // the first windows of 4 streams carry 21 Gbit/s there.
        let mut m = push();
        m.rtt_idle_us = Some(10);
        let run = m.run.as_mut().unwrap();
        run.limit = RunLimit::Window;
        run.bits_per_second = 4.4e9;
        run.rtt_loaded_us = 2080;
        run.cpu_receiver_percent = 30.0;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::ReceiverCpu, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 4.4e9);
        let recv = stage_of(&j, Stage::ReceiverCpu);
        assert!(recv.limiting);
        assert!(
            recv.detail.contains("it kept its receive window full"),
            "{}",
            recv.detail
        );
        assert!(!stage_of(&j, Stage::Window).limiting);
        assert!(!stage_of(&j, Stage::PathRate).limiting);
        assert!(
            v.fix.starts_with("the receiver's CPU is the limit"),
            "{}",
            v.fix
        );
        // At 80 ms a short run's windows may still be growing: 4.4 Gbit/s
        // held by them is no proof of a receiver that did not read.
        m.rtt_idle_us = Some(80_000);
        m.run.as_mut().unwrap().rtt_loaded_us = 80_500;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Window, "{:?}", j.stages);
        assert!(!stage_of(&j, Stage::ReceiverCpu).limiting);
    }

    #[test]
    fn a_slow_cipher_is_the_encryption_verdict() {
        let mut m = push();
        m.local.cipher_bytes_per_core = 2e9;
        m.remote.as_mut().unwrap().cipher_bytes_per_core = 0.1e9;
        let (v, j) = verdict_of(&m);
        // The slower end's 8 cores: 6.4 Gbit/s, below the 10 carried.
        assert_eq!(v.stage, Stage::Encryption, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 6.4e9);
        assert!(!stage_of(&j, Stage::Encryption).limiting);
        assert!(v.fix.contains("--insecure-plaintext"), "{}", v.fix);
        // 100 / (2 GB/s * 8 / 1e9) = 6.25% a Gbit/s is the cipher's.
        assert_eq!(j.sender_cpu_per_gbps_plain, Some(10.0 - 6.25));
    }

    /// Plaintext data streams far faster than TLS the same way: the TLS
    /// run measured TLS's work on these cores, not the path (issue 41).
    /// The path is a lower bound at the plaintext figure, never the
    /// verdict; encryption is seen limiting at the TLS figure; a window the
    /// slow decryption kept full is not the window's fault.
    #[test]
    fn a_tls_run_far_below_plaintext_is_the_ciphers_not_the_paths() {
        let mut m = push();
        m.local.cipher_bytes_per_core = 8e9;
        m.remote.as_mut().unwrap().cipher_bytes_per_core = 8e9;
        assert_eq!(verdict_of(&m).0.stage, Stage::PathRate);
        m.plain_bps = Some(55e9);
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Encryption, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 1e10);
        assert!(stage_of(&j, Stage::Encryption).limiting);
        let path = stage_of(&j, Stage::PathRate);
        assert!(!path.limiting, "{path:?}");
        assert_eq!(path.ceiling_bps, 55e9);
        assert!(path.detail.contains("without TLS"), "{}", path.detail);
        // Settings are not judged against a rate that was the cipher's.
        assert!(j.target_bps > 1e10);
        m.run.as_mut().unwrap().limit = RunLimit::Window;
        assert_eq!(verdict_of(&m).0.stage, Stage::Encryption);
        // Plaintext about as fast: the path it is.
        m.run.as_mut().unwrap().limit = RunLimit::Other;
        m.plain_bps = Some(1.1e10);
        assert_eq!(verdict_of(&m).0.stage, Stage::PathRate);
    }

    #[test]
    fn slow_storage_at_either_end_is_the_verdict() {
        let mut m = push();
        m.source_read = Some((0.5e9, "/data".into()));
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SourceStorage, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 4e9);
        assert!(stage_of(&j, Stage::SourceStorage)
            .detail
            .contains("(/data)"));
        assert!(v.fix.starts_with("the source storage"), "{}", v.fix);
        let mut m = push();
        m.dest_write = Some((0.25e9, true));
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::DestStorage, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 2e9);
        assert!(stage_of(&j, Stage::DestStorage).detail.contains("O_DIRECT"));
        assert!(v.fix.starts_with("the destination storage"), "{}", v.fix);
    }

    #[test]
    fn unmeasured_stages_take_no_part() {
        // No source given: no source stage, and the verdict stands on the rest.
        let mut m = push();
        m.dest_write = Some((2e9, false));
        let j = judge(&m);
        assert!(j.stages.iter().all(|s| s.name != Stage::SourceStorage));
        assert_eq!(j.verdict.unwrap().stage, Stage::PathRate);
        // No run (it failed): no path, window, loss or CPU stages, and the
        // storage measured alone is the verdict.
        m.run = None;
        let (v, j) = verdict_of(&m);
        let names: Vec<Stage> = j.stages.iter().map(|s| s.name).collect();
        assert_eq!(names, [Stage::DestStorage]);
        assert_eq!(v.stage, Stage::DestStorage);
        assert_eq!(j.rtt_loaded_us, None);
        assert_eq!(j.sender_cpu_per_gbps_tls, None);
        // Nothing measured at all: no verdict.
        m.dest_write = None;
        assert_eq!(judge(&m).verdict, None);
    }

    #[test]
    fn metadata_is_judged_only_for_a_measured_file_size() {
        let mut m = push();
        // 100 files/s of 1 MiB: 839 Mbit/s.
        m.dest_creates_per_second = Some(100.0);
        let j = judge(&m);
        assert!(j.stages.iter().all(|s| s.name != Stage::Metadata));
        assert_eq!(j.verdict.unwrap().stage, Stage::PathRate);
        assert!(
            j.notes[0].starts_with("metadata not judged: the destination creates 100 files/s"),
            "{:?}",
            j.notes
        );
        m.mean_file_size_measured = true;
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::Metadata, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 100.0 * 8.0 * f64::from(1 << 20));
        assert!(j.notes.is_empty());
        assert!(v.fix.contains("bundle small files"), "{}", v.fix);
    }

    #[test]
    fn ties_go_to_evidence_then_to_the_stage_order() {
        // Source and destination storage equal, neither seen limiting:
        // the first in stage order is the verdict, the other is next.
        let mut m = push();
        m.source_read = Some((0.5e9, "/data".into()));
        m.dest_write = Some((0.5e9, false));
        let (v, _) = verdict_of(&m);
        assert_eq!(v.stage, Stage::SourceStorage);
        assert_eq!(v.next, Some(Stage::DestStorage));
        assert_eq!(v.next_ceiling_bps, Some(4e9));
        // The path seen limiting at 10 Gbit/s beats storage estimated at
        // 9.5: within a tenth, evidence wins.
        let mut m = push();
        m.dest_write = Some((9.5e9 / 8.0, false));
        let (v, _) = verdict_of(&m);
        assert_eq!(v.stage, Stage::PathRate);
        assert_eq!(v.next, Some(Stage::DestStorage));
        // At 8 the estimate is more than a tenth lower: it wins.
        m.dest_write = Some((1e9, false));
        assert_eq!(verdict_of(&m).0.stage, Stage::DestStorage);
    }

    #[test]
    fn the_target_is_given_else_the_path_else_the_link_else_the_default() {
        let mut m = push();
        m.target_bps = Some(40_000_000_000);
        assert_eq!(judge(&m).target_bps, 4e10);
        // Never below what was carried.
        m.target_bps = Some(1_000_000);
        assert_eq!(judge(&m).target_bps, 1e10);
        // The CPU limited: the link's speed, then the default.
        let mut m = push();
        m.run.as_mut().unwrap().cpu_sender_percent = 780.0;
        m.link_bps = Some(25e9);
        assert_eq!(judge(&m).target_bps, 25e9);
        m.link_bps = None;
        assert_eq!(
            judge(&m).target_bps,
            crate::window::DEFAULT_TARGET_BPS as f64
        );
    }

    #[test]
    fn a_copy_far_below_the_verdict_names_the_stage_its_own_figures_show() {
        // The probe said 24 Gbit/s of writes; the copy moved 2.18 Gbit/s
        // with its destination writing at 2.5 Gbit/s while busy (87%).
        let mut m = push();
        m.dest_write = Some((3e9, false));
        m.copy = Some(CopyMeasured {
            bits_per_second: 2.18e9,
            source_read_bps: 40e9,
            dest_write_bps: 2.5e9,
            ..Default::default()
        });
        let (v, j) = verdict_of(&m);
        assert_eq!(v.stage, Stage::DestStorage, "{:?}", j.stages);
        assert_eq!(v.ceiling_bps, 2.5e9);
        assert!(stage_of(&j, Stage::DestStorage).limiting);
        assert!(
            j.notes
                .iter()
                .any(|n| n.contains("its own stages show dest_storage")),
            "{:?}",
            j.notes
        );
        // A copy that kept up says nothing.
        m.copy.as_mut().unwrap().bits_per_second = 9e9;
        let j = judge(&m);
        assert!(j.notes.is_empty(), "{:?}", j.notes);
        assert_eq!(j.verdict.unwrap().stage, Stage::PathRate);
    }

    /// Seen on a virtual disk: doctor named the destination's writes at
    /// 1.31 Gbit/s while its own copy ran at 3.19. The copy proves more.
    #[test]
    fn a_copy_that_outruns_the_storage_verdict_takes_that_stages_place() {
        let mut m = push();
        m.dest_write = Some((1.31e9 / 8.0, false));
        m.copy = Some(CopyMeasured {
            bits_per_second: 3.19e9,
            source_read_bps: 40e9,
            dest_write_bps: 4e9,
            ..Default::default()
        });
        let (v, j) = verdict_of(&m);
        assert!(
            v.stage != Stage::DestStorage || v.ceiling_bps >= 3.19e9,
            "{v:?}"
        );
        assert_eq!(stage_of(&j, Stage::DestStorage).ceiling_bps, 3.19e9);
        assert!(
            j.notes.iter().any(|n| n.contains("above the")),
            "{:?}",
            j.notes
        );
        // A copy within a quarter of the figure leaves it standing.
        m.copy.as_mut().unwrap().bits_per_second = 1.5e9;
        let (v, _) = verdict_of(&m);
        assert_eq!(v.stage, Stage::DestStorage);
        assert!((v.ceiling_bps - 1.31e9).abs() < 1e3);
    }

    #[test]
    fn a_copy_with_no_busy_end_is_said_to_be_below_without_a_stage() {
        let mut m = push();
        m.dest_write = Some((3e9, false));
        m.copy = Some(CopyMeasured {
            bits_per_second: 1e9,
            source_read_bps: 20e9,
            dest_write_bps: 20e9,
            ..Default::default()
        });
        let (v, j) = verdict_of(&m);
        assert!(
            j.notes.iter().any(|n| n.contains("well below")
                && n.contains("neither its source nor its destination")),
            "{:?}",
            j.notes
        );
        assert_eq!(v.stage, Stage::PathRate);
        assert_eq!(
            copy_stage(&CopyMeasured {
                bits_per_second: 1e9,
                source_read_bps: 1.2e9,
                dest_write_bps: 1.5e9,
                ..Default::default()
            }),
            Some((Stage::SourceStorage, 1.2e9, 1.0 / 1.2))
        );
    }
}
