//! `longhaul doctor`: what each stage of a transfer can carry, and which
//! one limits it. The engine measures (host settings, RTT idle and under
//! load, memory-to-memory both ways with the kernel's counters, storage at
//! both ends, CPU per Gbit/s); this module turns measurements into
//! findings and a verdict, without I/O, so the rules are unit-tested.

use serde::{Deserialize, Serialize};

use crate::window::{BufferCaps, RECV_BUFFER_USE, SEND_BUFFER_USE};

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
}

/// A setting too small (or wrong) for the measured path, and its fix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// `local` or `remote`.
    pub host: String,
    pub setting: String,
    pub value: String,
    pub wanted: String,
    pub fix: String,
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

/// The settings of one host that are too small for `bdp` bytes in flight
/// over `streams` streams, or otherwise hold a long path back.
/// The path's MTU against the interfaces at its ends: smaller means a hop
/// in between takes less (packets are cut to it, or lost where ICMP is
/// filtered, a black hole); None when it matches or is unknown.
pub fn audit_path_mtu(path_mtu: Option<u32>, ends: &[Option<u32>]) -> Option<Finding> {
    let path = path_mtu?;
    let ends = ends.iter().flatten().copied().min()?;
    (path < ends).then(|| Finding {
        host: "path".into(),
        setting: "path MTU".into(),
        value: path.to_string(),
        wanted: format!("{ends} (the smaller interface MTU at the ends)"),
        fix: format!(
            "a link between the hosts carries {path}-byte packets: find it with `tracepath` to the peer, and raise its MTU to {ends} or lower both ends' to {path}"
        ),
    })
}

pub fn audit(host: &str, h: &HostSettings, bdp: u64, streams: u16) -> Vec<Finding> {
    let mut out = Vec::new();
    let streams = u64::from(streams.max(1));
    // What one stream needs, in buffer bytes, for its share of the BDP.
    let per_stream = bdp / streams;
    let need_snd = (per_stream as f64 / SEND_BUFFER_USE) as u64;
    let need_rcv = (per_stream as f64 / RECV_BUFFER_USE) as u64;
    let round = |b: u64| b.next_power_of_two().max(4 << 20);
    let mut check = |setting: &str, have: Option<u64>, need: u64, fix: String| {
        if let Some(v) = have {
            if v < need {
                out.push(Finding {
                    host: host.into(),
                    setting: setting.into(),
                    value: v.to_string(),
                    wanted: format!(">= {need}"),
                    fix,
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
        format!("sysctl -w net.core.rmem_max={r}"),
    );
    check(
        "net.core.wmem_max",
        h.buffers.wmem_max,
        need_snd / 2,
        format!("sysctl -w net.core.wmem_max={w}"),
    );
    check(
        "net.ipv4.tcp_rmem",
        h.buffers.tcp_rmem_max,
        need_rcv,
        format!("sysctl -w net.ipv4.tcp_rmem='4096 131072 {r}'"),
    );
    check(
        "net.ipv4.tcp_wmem",
        h.buffers.tcp_wmem_max,
        need_snd,
        format!("sysctl -w net.ipv4.tcp_wmem='4096 65536 {w}'"),
    );
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
        });
    }
    let fq = |q: &str| q == "fq" || q.starts_with("fq ");
    if cc == "bbr" || h.available_congestion_control.iter().any(|c| c == "bbr") {
        let q = h.qdisc.as_deref().unwrap_or(&h.default_qdisc);
        if !fq(q) && !q.is_empty() && q != "noqueue" {
            out.push(Finding {
                host: host.into(),
                setting: "qdisc".into(),
                value: q.into(),
                wanted: "fq (pacing for many streams at once)".into(),
                fix: match &h.interface {
                    Some(i) => format!("tc qdisc replace dev {i} root fq"),
                    None => "sysctl -w net.core.default_qdisc=fq".into(),
                },
            });
        }
    }
    if let (Some(mtu), Some(i)) = (h.mtu, &h.interface) {
        if mtu < 9000 && i != "lo" && bdp > 4 << 20 {
            out.push(Finding {
                host: host.into(),
                setting: format!("mtu of {i}"),
                value: mtu.to_string(),
                wanted: "9000 where the whole path takes it (jumbo frames: a sixth of the packets)"
                    .into(),
                fix: format!("ip link set dev {i} mtu 9000"),
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
        });
    }
    out
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
}
