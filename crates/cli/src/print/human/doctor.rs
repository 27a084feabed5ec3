//! `doctor` and `bench disk` for people (and `show` of their archived
//! reports).

use longhaul_engine::doctor::DoctorReport;
use longhaul_proto::doctor::{Finding, HostSettings, StageCeiling};
use longhaul_proto::units::escaped as esc;
use longhaul_proto::units::{format_bytes, format_rate};

use super::cp::cpu_line;
use super::perf::limit_name;

/// `bench disk`, for people.
pub(crate) fn print_disk(r: &longhaul_proto::disk::DiskReport) {
    use longhaul_proto::units::{format_bytes, format_rate};
    outln!(
        "{} ({}): {}, {} requests, {} thread{}, {} file",
        r.path,
        r.filesystem,
        if r.direct { "O_DIRECT" } else { "buffered" },
        format_bytes(r.block_size),
        r.threads,
        if r.threads == 1 { "" } else { "s" },
        format_bytes(r.file_size)
    );
    let seq = |name: &str, s: &longhaul_proto::disk::SeqResult| {
        outln!(
            "  {name:<18} {:>13}  ({} in {:.2} s)",
            format_rate(s.bytes_per_second * 8.0),
            format_bytes(s.bytes),
            s.seconds
        );
    };
    let files = |name: &str, f: &longhaul_proto::disk::FilesResult| {
        outln!(
            "  {name:<18} {:>8.0} files/s  ({} files of {} in {:.2} s)",
            f.files_per_second,
            f.files,
            format_bytes(f.file_size),
            f.seconds
        );
    };
    if let Some(w) = &r.write {
        seq("sequential write", w);
    }
    if let Some(rd) = &r.read {
        seq("sequential read", rd);
    }
    if let Some(c) = &r.create {
        files("small-file create", c);
    }
    if let Some(c) = &r.small_read {
        files("small-file read", c);
    }
    for w in &r.warnings {
        outln!("warning: {}", esc(w));
    }
}

/// `doctor`, for people.
pub(crate) fn print_doctor(r: &DoctorReport) {
    print_host("local ", &r.local);
    if let Some(h) = &r.remote {
        print_host("remote", h);
    }
    print_measured(r);
    if let (Some(t), Some(p)) = (r.sender_cpu_per_gbps_tls, r.sender_cpu_per_gbps_plain) {
        outln!(
            "sender CPU per Gbit/s: {t:.1}% of a core with TLS, {}{p:.1}% without",
            if r.plain_measured { "" } else { "about " }
        );
    }
    if !r.findings.is_empty() {
        print_findings(&r.findings);
    }
    if !r.stages.is_empty() {
        print_stages(&r.stages);
    }
    for n in &r.notes {
        outln!("note: {n}");
    }
    if let Some(p) = &r.remembered {
        outln!(
            "remembered: {} carries {} ({}): from now on, cp to it sizes its streams and buffers for that rate, for a week while the RTT matches; `longhaul doctor --forget {}` forgets it",
            p.host,
            format_rate(p.bits_per_second),
            match p.direction {
                longhaul_proto::msg::Direction::Up => "upload",
                longhaul_proto::msg::Direction::Down => "download",
            },
            p.host
        );
    }
    match &r.verdict {
        Some(v) => {
            outln!(
                "verdict: {} limits the transfer to {}{}",
                v.stage.label(),
                format_rate(v.ceiling_bps),
                match (v.next, v.next_ceiling_bps) {
                    (Some(n), Some(c)) => format!(" (next: {} at {})", n.label(), format_rate(c)),
                    _ => String::new(),
                }
            );
            outln!("fix: {}", v.fix);
        }
        None => outln!("verdict: none (nothing was measured end to end)"),
    }
}

/// One end's settings: the host, its CPUs, congestion control, buffers.
fn print_host(who: &str, h: &HostSettings) {
    outln!(
        "{who} {} (Linux {}): {} of {} CPUs usable, {} NUMA node(s), governor {}; cc {}, qdisc {}{}",
        h.hostname,
        h.kernel,
        h.cpus_usable,
        h.cpus,
        h.numa_nodes,
        h.governor.as_deref().unwrap_or("none"),
        h.congestion_control,
        h.qdisc.as_deref().unwrap_or(&h.default_qdisc),
        match (&h.interface, h.mtu) {
            (Some(i), Some(m)) => format!(", via {i} (MTU {m})"),
            _ => String::new(),
        }
    );
    outln!(
        "    buffers: rmem_max {} wmem_max {} tcp_rmem max {} tcp_wmem max {}; AES-GCM {} a core",
        h.buffers.rmem_max.map_or("?".into(), format_bytes),
        h.buffers.wmem_max.map_or("?".into(), format_bytes),
        h.buffers.tcp_rmem_max.map_or("?".into(), format_bytes),
        h.buffers.tcp_wmem_max.map_or("?".into(), format_bytes),
        format_rate(h.cipher_bytes_per_core * 8.0)
    );
}

/// What the doctor measured: the RTT, each direction memory to memory,
/// the copy file to file.
fn print_measured(r: &DoctorReport) {
    if let Some(rtt) = r.rtt_idle_us {
        outln!(
            "RTT {:.2} ms idle, {} under load{}",
            f64::from(rtt) / 1000.0,
            r.rtt_loaded_us
                .map_or("?".into(), |l| format!("{:.2} ms", f64::from(l) / 1000.0)),
            r.path_mtu
                .map_or(String::new(), |m| format!("; path MTU {m}"))
        );
    }
    for (name, p) in [("upload  ", &r.upload), ("download", &r.download)] {
        if let Some(p) = p {
            outln!(
                "{name} {:>12} over {} streams, {} retransmits ({:.1e} of segments), sender CPU {:.0}%, receiver {:.0}%, limited by {}",
                format_rate(p.bits_per_second),
                p.streams,
                p.retransmits,
                p.loss_fraction,
                p.cpu_sender_percent,
                p.cpu_receiver_percent,
                limit_name(p.limit).replace('_', " ")
            );
        }
    }
    if let Some(c) = &r.copy {
        outln!(
            "copy     {:>12} ({} in {:.1} s, {} streams, file to file, {})",
            format_rate(c.bits_per_second),
            format_bytes(c.bytes),
            c.seconds,
            c.streams,
            if c.generated {
                "generated data: give --source to copy yours"
            } else {
                "from --source"
            }
        );
        for (end, st) in [
            ("source (here)", &c.cpu_stages.source),
            ("sink (server)", &c.cpu_stages.sink),
        ] {
            if let Some(line) = st.as_ref().and_then(|st| cpu_line(st, c.bytes)) {
                outln!("  cpu at the {end}: {line}");
            }
        }
    }
}

/// The settings to change, with the lines that keep them after a reboot.
fn print_findings(findings: &[Finding]) {
    outln!("settings:");
    for f in findings {
        outln!(
            "  {} {} = {} (want {}): {}",
            f.host,
            f.setting,
            f.value,
            f.wanted,
            f.fix
        );
    }
    // The fixes above last until a reboot; these lines keep them.
    let keep: Vec<String> = findings
        .iter()
        .filter_map(|f| f.persist.as_ref().map(|p| format!("{p}  # {}", f.host)))
        .collect();
    if !keep.is_empty() {
        outln!(
            "to keep them after a reboot, write these lines to {} on the host named, then run `sysctl --system`:",
            longhaul_proto::doctor::SYSCTL_D_FILE
        );
        for line in keep {
            outln!("    {line}");
        }
    }
}

/// Each stage's ceiling, the lowest first.
fn print_stages(stages: &[StageCeiling]) {
    outln!("stages (what each can carry):");
    let mut stages = stages.to_vec();
    stages.sort_by(|a, b| a.ceiling_bps.total_cmp(&b.ceiling_bps));
    for s in &stages {
        outln!(
            "  {:<19} {:>12}{}  {}",
            s.name.label(),
            if s.ceiling_bps.is_finite() {
                format_rate(s.ceiling_bps)
            } else {
                "unbounded".into()
            },
            if s.limiting { " *" } else { "  " },
            s.detail
        );
    }
    outln!("  (* seen limiting in a measurement)");
}
