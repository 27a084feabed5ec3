//! The printer for people: perf's report lines as they come, the outcome
//! of every other command when it ends. Results go to stdout; warnings,
//! status and failures of single files to stderr.

use longhaul_engine::report::Reporter;
use longhaul_engine::results::{CommandReporter, WanHosts};
use longhaul_engine::wan::LinkStats;
use longhaul_proto::msg::{Direction, Mode, Transport};
use longhaul_proto::report::{DirectionReport, IntervalReport, Setup, StreamReport, Summary};
use longhaul_proto::tune::TransferInterval;
use longhaul_proto::units::escaped as esc;
use longhaul_proto::units::{format_bytes, format_rate};
use longhaul_proto::xfer::report::CopyReport;

use super::FormatUnit;
use longhaul_proto::xfer::{Kind, ListEntry};

fn out(line: &str) {
    crate::print::out(format_args!("{line}"));
}

/// The human-readable printer, for any command.
pub struct Human {
    /// perf: streams per direction (a line each when more than one).
    streams: u16,
    /// perf: which way the data goes (`TX`/`RX` tags for both ways).
    mode: Mode,
    /// perf: the column header is printed before the first interval.
    header_done: bool,
    /// sync -n: deletions are what would be deleted.
    dry_run: bool,
    /// cp -q: a transfer's failures only.
    quiet: bool,
    /// perf -f: the unit of every rate.
    unit: Option<FormatUnit>,
    /// perf: TCP or UDP (from the setup), which chooses the columns.
    transport: Option<Transport>,
    /// cp --intervals: a line per interval of the transfer, to stderr.
    intervals: bool,
    /// perf: whether the data streams were encrypted (from the setup), for
    /// the summary line.
    data_encrypted: Option<bool>,
    /// ls: names only, or long lines.
    list_style: ListStyle,
}

/// How `ls` prints entries.
#[derive(Clone, Copy, Default)]
pub struct ListStyle {
    /// `-l`: mode, size, time, name, link target.
    pub long: bool,
    /// `-h`: sizes in IEC units.
    pub human_sizes: bool,
}

impl Human {
    /// For a command that prints its outcome only.
    pub fn new() -> Self {
        Self::perf(1, Mode::Up)
    }

    /// For a perf test of `streams` per direction going `mode`.
    pub fn perf(streams: u16, mode: Mode) -> Self {
        Self {
            streams,
            mode,
            header_done: false,
            dry_run: false,
            quiet: false,
            unit: None,
            transport: None,
            intervals: false,
            data_encrypted: None,
            list_style: ListStyle::default(),
        }
    }

    /// For a perf test printed with `-f`'s unit.
    pub fn perf_in(streams: u16, mode: Mode, unit: Option<FormatUnit>) -> Self {
        Self {
            unit,
            ..Self::perf(streams, mode)
        }
    }

    /// For `ls`.
    pub fn listing(list_style: ListStyle) -> Self {
        Self {
            list_style,
            ..Self::new()
        }
    }

    /// For a transfer: `dry_run` for `cp -n`/`sync -n`; `intervals` prints a
    /// line per interval as it comes; `quiet` (`-q`) prints failures only.
    pub fn transfer(dry_run: bool, intervals: bool, quiet: bool) -> Self {
        Self {
            dry_run,
            intervals,
            quiet,
            ..Self::new()
        }
    }
}

fn dir_tag(d: Direction, mode: Mode) -> &'static str {
    match (mode, d) {
        (Mode::Bidir, Direction::Up) => "TX",
        (Mode::Bidir, Direction::Down) => "RX",
        _ => "",
    }
}

/// A perf rate: in the unit that suits it (bit/s), or in `-f`'s, with
/// iperf3's precision (three figures, no more than two decimals).
pub fn rate_in(bits_per_second: f64, unit: Option<FormatUnit>) -> String {
    let Some(u) = unit else {
        return format_rate(bits_per_second);
    };
    let i = usize::from(u.power.clamp(1, 4)) - 1;
    let (v, name) = if u.bytes {
        (
            bits_per_second / 8.0 / 1024f64.powi(i32::from(u.power)),
            ["KiB/s", "MiB/s", "GiB/s", "TiB/s"][i],
        )
    } else {
        (
            bits_per_second / 1000f64.powi(i32::from(u.power)),
            ["kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"][i],
        )
    };
    let decimals = match v {
        v if v < 9.995 => 2,
        v if v < 99.95 => 1,
        _ => 0,
    };
    format!("{v:.decimals$} {name}")
}

/// The width of perf's rate column: `-f`'s fixed unit takes more digits
/// (400 Gbit/s is `400000000 kbit/s`).
fn rate_width(unit: Option<FormatUnit>) -> usize {
    if unit.is_some() {
        16
    } else {
        13
    }
}

/// How perf's lines are laid out: `-f`'s unit, and whether the test is
/// TCP (its sender's columns) or UDP (the receiver's datagrams).
#[derive(Clone, Copy)]
struct Columns {
    unit: Option<FormatUnit>,
    tcp: bool,
}

impl Columns {
    /// The line above the intervals, its names over their columns.
    fn header(self) -> String {
        let w = rate_width(self.unit);
        format!(
            "[    ID] Interval          Transfer {:>w$}{}",
            "Bitrate",
            if self.tcp {
                "   Retr      RTT       Cwnd  Limited by"
            } else {
                "      Lost/Total datagrams"
            }
        )
    }
}

/// One line of figures: a stream, or a direction's sum.
struct Row<'a> {
    id: &'a str,
    from: f64,
    to: f64,
    bytes: u64,
    bps: f64,
    tcp: Option<&'a longhaul_proto::report::TcpReport>,
    udp: Option<&'a longhaul_proto::report::UdpReport>,
}

fn stream_line(r: &Row, cols: Columns) -> String {
    let mut s = format!(
        "[{:>6}] {:6.2}-{:<6.2} s {:>10} {:>w$}",
        r.id,
        r.from,
        r.to,
        format_bytes(r.bytes),
        rate_in(r.bps, cols.unit),
        w = rate_width(cols.unit)
    );
    match (r.tcp, r.udp) {
        (Some(t), _) => {
            s += &format!(
                " {:>6} {:>8} {:>10}",
                t.retransmits,
                format!("{:.2}ms", f64::from(t.rtt_us) / 1000.0),
                format_bytes(t.cwnd_bytes)
            );
        }
        (None, Some(u)) => {
            s += &format!(
                " {:>9}/{:<9} ({:.3}%) jitter {:.3} ms",
                u.lost_packets,
                u.lost_packets + u.packets_received,
                u.lost_percent,
                u.jitter_us as f64 / 1000.0
            );
        }
        // A TCP sender that reported no counters (a stock iperf3 server).
        (None, None) if cols.tcp => s += &format!(" {:>6} {:>8} {:>10}", "?", "?", "?"),
        (None, None) => {}
    }
    s
}

fn id_of(s: &StreamReport, mode: Mode) -> String {
    format!("{}{}", dir_tag(s.direction, mode), s.stream)
}

fn report_line(s: &StreamReport, mode: Mode, from: f64, to: f64, cols: Columns) -> String {
    stream_line(
        &Row {
            id: &id_of(s, mode),
            from,
            to,
            bytes: s.bytes,
            bps: s.bits_per_second,
            tcp: s.tcp.as_ref(),
            udp: s.udp.as_ref(),
        },
        cols,
    )
}

fn sum_line(d: &DirectionReport, mode: Mode, from: f64, to: f64, cols: Columns) -> String {
    direction_line(
        d,
        &format!("{}SUM", dir_tag(d.direction, mode)),
        from,
        to,
        cols,
    )
}

fn direction_line(d: &DirectionReport, id: &str, from: f64, to: f64, cols: Columns) -> String {
    stream_line(
        &Row {
            id,
            from,
            to,
            bytes: d.bytes,
            bps: d.bits_per_second,
            tcp: d.tcp.as_ref(),
            udp: d.udp.as_ref(),
        },
        cols,
    )
}

/// How the test's connections were protected, data streams first (what
/// the rate measured depends on it).
fn encryption_line(s: &Setup) -> String {
    let or_unknown = |e: &str| match e {
        "" => "?".to_string(),
        e => e.to_string(),
    };
    let control = or_unknown(&s.control_encryption);
    match s.data_encrypted {
        Some(true) => format!("data streams encrypted ({control})"),
        Some(false) if s.server_software == "iperf3" => {
            "no encryption (iperf3's protocol has none)".to_string()
        }
        Some(false) if control == "none" => "no encryption (--insecure-plaintext)".to_string(),
        Some(false) => {
            format!("data streams unencrypted (perf --tls encrypts them), control {control}")
        }
        // From a relaying server older than the field.
        None => format!("encryption {}", or_unknown(&s.encryption)),
    }
}

/// A TCP summary's sender figures, each said unknown where no sender
/// counted it (a stock iperf3 server that sent).
fn tcp_summary(s: &Summary) -> String {
    let retransmits = if s.retransmits_unknown {
        "retransmits unknown".to_string()
    } else {
        format!("{} retransmits", s.retransmits)
    };
    let rtt = if s.rtt_unknown {
        "RTT unknown (the sender reported none)".to_string()
    } else {
        format!(
            "RTT {:.3} ms (min {:.3} ms)",
            f64::from(s.rtt_us) / 1000.0,
            f64::from(s.min_rtt_us) / 1000.0
        )
    };
    format!(", {retransmits}, {rtt}")
}

impl Human {
    /// The columns of perf's lines: TCP's or UDP's by the test's
    /// transport (from its setup; else by what the interval carries).
    fn columns(&self, r: &IntervalReport) -> Columns {
        Columns {
            unit: self.unit,
            tcp: match self.transport {
                Some(t) => t == Transport::Tcp,
                None => !r.streams.iter().any(|s| s.udp.is_some()),
            },
        }
    }
}

impl Reporter for Human {
    fn setup(&mut self, s: &Setup) {
        let p = &s.params;
        out(&format!(
            "Connected to {} ({}, {}), protocol {}, {}",
            s.server,
            esc(&s.server_host),
            esc(&s.server_software),
            s.protocol_version,
            encryption_line(s)
        ));
        let what = match p.transport {
            Transport::Tcp => "TCP",
            Transport::Udp => "UDP",
        };
        let dir = match p.mode {
            Mode::Up => "client -> server",
            Mode::Down => "server -> client (reverse)",
            Mode::Bidir => "both directions",
        };
        let len = format_bytes(u64::from(p.length));
        // `-P auto`: the engine chose the count.
        self.streams = p.streams;
        self.transport = Some(p.transport);
        self.data_encrypted = s.data_encrypted;
        let cc = s
            .local_streams
            .first()
            .map(|x| x.congestion.as_str())
            .filter(|c| !c.is_empty());
        out(&format!(
            "{what}, {} stream(s), {dir}, {len} buffers{}{}",
            p.streams,
            cc.map(|c| format!(", {c}")).unwrap_or_default(),
            p.window
                .map(|w| format!(", window {} requested", format_bytes(u64::from(w))))
                .unwrap_or_default()
        ));
        if let Some(l) = s.local_streams.first() {
            let r = s.remote_streams.first();
            out(&format!(
                "socket buffers: client snd {} rcv {}, server snd {} rcv {}, MSS {}",
                format_bytes(l.sndbuf),
                format_bytes(l.rcvbuf),
                r.map_or("?".into(), |r| format_bytes(r.sndbuf)),
                r.map_or("?".into(), |r| format_bytes(r.rcvbuf)),
                l.mss
            ));
        }
    }
    fn interval(&mut self, r: &IntervalReport) {
        let cols = self.columns(r);
        if !self.header_done {
            self.header_done = true;
            out(&cols.header());
        }
        let tag = if r.omitted { "  (omitted)" } else { "" };
        let per_stream = self.streams > 1 || self.mode == Mode::Bidir;
        if per_stream {
            for s in &r.streams {
                out(&report_line(s, self.mode, r.start_s, r.end_s, cols));
            }
        }
        for d in &r.directions {
            let line = if per_stream {
                sum_line(d, self.mode, r.start_s, r.end_s, cols)
            } else {
                // One stream: its line is the direction's total, under the stream's id.
                let id = id_of(&r.streams[0], self.mode);
                direction_line(d, &id, r.start_s, r.end_s, cols)
            };
            // What held this direction back over the interval.
            let limit = if d.tcp.is_some() {
                format!("  {}", limit_name(d.limit.kind))
            } else {
                String::new()
            };
            out(&format!("{line}{limit}{tag}"));
        }
    }
    fn summary(&mut self, s: &Summary) {
        out("- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -");
        let cols = Columns {
            unit: self.unit,
            tcp: s.transport == Transport::Tcp,
        };
        for st in s.streams.iter().filter(|_| self.streams > 1) {
            out(&report_line(st, self.mode, 0.0, s.seconds, cols));
        }
        for d in &s.directions {
            out(&sum_line(d, self.mode, 0.0, s.seconds, cols));
        }
        let mut line = format!(
            "Summary: {} in {:.2} s = {}",
            format_bytes(s.bytes),
            s.seconds,
            rate_in(s.bits_per_second, self.unit)
        );
        if s.transport == Transport::Tcp {
            line += &tcp_summary(s);
        }
        if let (Some(l), Some(j)) = (s.lost_percent, s.jitter_us) {
            line += &format!(", lost {l:.4}%, jitter {:.3} ms", j as f64 / 1000.0);
        }
        match self.data_encrypted {
            Some(true) => line += ", data encrypted (TLS)",
            Some(false) => line += ", data unencrypted",
            None => {}
        }
        out(&line);
        out(&format!(
            "CPU: local {:.1}%, remote {:.1}% (percent of one core)",
            s.cpu_local_percent, s.cpu_remote_percent
        ));
        if let Some(o) = s.connections.as_ref().filter(|o| o.opened_by == "far_end") {
            out(&format!(
                "connections: opened by the far end ({})",
                o.reason.as_deref().unwrap_or("connect-back")
            ));
        }
        for d in s.directions.iter().filter(|_| s.directions.len() > 1) {
            out(&format!(
                "{:?}: limited by {:?}: {}",
                d.direction, d.limit.kind, d.limit.detail
            ));
        }
        out(&format!("Limited by: {}", limit_text(s)));
        for t in s.tuning.iter().chain(&s.tuning_reverse) {
            out(&format!(
                "Tuning{}: {} of {} streams sending at the end (online, {} step(s))",
                t.direction.map_or(String::new(), |d| format!(
                    " ({})",
                    format!("{d:?}").to_lowercase()
                )),
                t.final_streams,
                t.initial_streams,
                t.steps.len()
            ));
        }
        if let Some(e) = &s.error {
            out(&format!("Ended early: {e}"));
        }
    }
    fn warning(&mut self, message: &str) {
        if !self.quiet {
            errln!("longhaul: warning: {message}");
        }
    }
    fn status(&mut self, message: &str) {
        if !self.quiet {
            errln!("{message}");
        }
    }
    fn transfer_interval(&mut self, i: &TransferInterval) {
        if self.intervals {
            errln!("{}", transfer_interval_line(i));
        }
    }
}

impl CommandReporter for Human {
    fn transfer_summary(&mut self, s: &CopyReport) {
        if self.quiet {
            for f in &s.failed {
                errln!("longhaul: failed: {}: {}", esc(&f.path), esc(&f.error));
            }
            return;
        }
        print_transfer(s, self.dry_run);
    }
    fn listing(&mut self, entries: &[ListEntry]) {
        let style = self.list_style;
        let size = |e: &ListEntry| match style.human_sizes {
            true => format_bytes(e.size),
            false => e.size.to_string(),
        };
        let width = entries.iter().map(|e| size(e).len()).max().unwrap_or(0);
        for e in entries {
            let name = longhaul_proto::units::escaped(&e.name);
            if !style.long {
                outln!("{name}");
                continue;
            }
            let when = longhaul_archive::when::utc(e.mtime_ns as f64 / 1e9)
                .map(|t| t[..16].to_string())
                .unwrap_or_else(|| "????-??-?? ??:??".into());
            let link = match &e.target {
                Some(t) => format!(" -> {}", longhaul_proto::units::escaped(t)),
                None => String::new(),
            };
            outln!(
                "{} {:>width$} {when} {name}{link}",
                mode_string(e.kind, e.mode),
                size(e)
            );
        }
    }
    fn doctor(&mut self, r: &longhaul_engine::doctor::DoctorReport) {
        // The far end's settings (host name, kernel, notes) are its words:
        // printed with no byte a terminal acts on, as `show` prints them.
        let mut v = serde_json::to_value(r).unwrap_or_default();
        printable(&mut v);
        match serde_json::from_value(v) {
            Ok(safe) => print_doctor(&safe),
            Err(e) => errln!("longhaul: cannot print the doctor's report: {e}; see --json"),
        }
    }
    fn disk(&mut self, r: &longhaul_proto::disk::DiskReport) {
        print_disk(r);
    }
    fn identity(&mut self, fingerprint: &str) {
        outln!("{fingerprint}");
    }
    fn trusted(&mut self, host: &str, fingerprint: &str) {
        outln!("{host} {fingerprint}");
    }
    fn token_created(&mut self, token: &str) {
        outln!("{token}");
    }
    fn grants(&mut self, grants: &[longhaul_engine::server::auth::Grant]) {
        for g in grants {
            let exports: Vec<String> = g
                .exports
                .iter()
                .map(|e| format!("{}:{}", e.name, if e.write { "rw" } else { "ro" }))
                .collect();
            let how = match &g.client_cert {
                Some(fp) => format!("client-cert {fp}"),
                None => "token".to_string(),
            };
            outln!("{} {how} {} {}", g.id, exports.join(","), g.note);
        }
    }
    fn section(&mut self, title: &str) {
        outln!("{title}");
    }
    fn wan_up(&mut self, h: &WanHosts) {
        outln!(
            "host a {} (netns {}), host b {} (netns {}); `longhaul wan exec a -- CMD` runs CMD in a; Ctrl-C ends",
            h.a, h.ns_a, h.b, h.ns_b
        );
    }
    fn wan_down(&mut self, ab: &LinkStats, ba: &LinkStats) {
        print_wan_down(ab, ba);
    }
}

/// `wan up` ending: what the link carried each way, to stderr.
pub fn print_wan_down(ab: &LinkStats, ba: &LinkStats) {
    errln!(
        "longhaul: link down. a->b: {} packets, {} lost, {} queue drops, {} outage drops; b->a: {} packets, {} lost, {} queue drops, {} outage drops",
        ab.packets, ab.lost, ab.queue_drops, ab.outage_drops,
        ba.packets, ba.lost, ba.queue_drops, ba.outage_drops
    );
}

fn limit_name(k: longhaul_proto::report::LimitKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn limit_text(s: &Summary) -> String {
    let name = serde_json::to_value(s.limit.kind)
        .ok()
        .and_then(|v| v.as_str().map(|x| x.replace('_', " ")))
        .unwrap_or_default();
    format!("{name} ({})", s.limit.detail)
}

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

/// Every string in `v` escaped ([`longhaul_proto::units::escaped`]): a
/// report whose text came from a peer or a file, made safe to print.
pub(crate) fn printable(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => *s = longhaul_proto::units::escaped(s).to_string(),
        Value::Array(a) => a.iter_mut().for_each(printable),
        Value::Object(m) => m.values_mut().for_each(printable),
        _ => {}
    }
}

/// `doctor`, for people.
pub(crate) fn print_doctor(r: &longhaul_engine::doctor::DoctorReport) {
    use longhaul_proto::units::{format_bytes, format_rate};
    let host = |who: &str, h: &longhaul_proto::doctor::HostSettings| {
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
    };
    host("local ", &r.local);
    if let Some(h) = &r.remote {
        host("remote", h);
    }
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
    if let (Some(t), Some(p)) = (r.sender_cpu_per_gbps_tls, r.sender_cpu_per_gbps_plain) {
        outln!(
            "sender CPU per Gbit/s: {t:.1}% of a core with TLS, {}{p:.1}% without",
            if r.plain_measured { "" } else { "about " }
        );
    }
    if !r.findings.is_empty() {
        outln!("settings:");
        for f in &r.findings {
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
        let keep: Vec<String> = r
            .findings
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
    if !r.stages.is_empty() {
        outln!("stages (what each can carry):");
        let mut stages = r.stages.clone();
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

/// One interval of a transfer, for people.
pub fn transfer_interval_line(i: &longhaul_proto::tune::TransferInterval) -> String {
    format!(
        "[{:6.1}-{:6.1} s] {:>12}  {:>2} stream(s)  {:>6} retr  RTT {:>7.2} ms  limited by {}",
        i.start_s,
        i.end_s,
        longhaul_proto::units::format_rate(i.bits_per_second),
        i.active_streams,
        i.retransmits,
        f64::from(i.rtt_us) / 1000.0,
        i.limit.label()
    )
}

/// "the path (congestion control) 70%, destination (storage or CPU) 30%": what limited a transfer, by share of its intervals.
pub fn limit_shares(intervals: &[longhaul_proto::tune::TransferInterval]) -> Option<String> {
    let counted: Vec<_> = intervals
        .iter()
        .filter(|i| i.limit != longhaul_proto::tune::TransferLimit::Idle)
        .collect();
    if counted.is_empty() {
        return None;
    }
    let mut by: Vec<(longhaul_proto::tune::TransferLimit, usize)> = Vec::new();
    for i in &counted {
        match by.iter_mut().find(|(l, _)| *l == i.limit) {
            Some((_, n)) => *n += 1,
            None => by.push((i.limit, 1)),
        }
    }
    by.sort_by_key(|b| std::cmp::Reverse(b.1));
    Some(
        by.iter()
            .map(|(l, n)| {
                format!(
                    "{} {:.0}%",
                    l.label(),
                    *n as f64 * 100.0 / counted.len() as f64
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// A transfer's verdict for people: the user's own `--rate` is named as
/// such, not as the path's congestion; a destination that did not keep up
/// by where its CPU went (its writes, say), which the end's own figures
/// show.
fn verdict_text(s: &CopyReport, v: longhaul_proto::tune::TransferLimit) -> String {
    use longhaul_proto::tune::TransferLimit;
    match (v, &s.path) {
        (TransferLimit::RateCap, Some(p)) if p.pacing.is_some() => {
            // The cap is a ceiling over any second: say what was achieved
            // under it, and the fastest second.
            let fastest = s
                .intervals
                .iter()
                .map(|i| i.bits_per_second)
                .fold(0.0, f64::max);
            format!(
                "limited by your cap of {} (--rate, --bwlimit): {} achieved, at most {} in any second",
                format_rate(p.window.target_bps as f64),
                format_rate(s.bits_per_second),
                format_rate(fastest)
            )
        }
        (TransferLimit::StorageWrite, _) => match s.cpu_stages.sink.filter(|c| c.total() > 0.0) {
            Some(c) => {
                let (stage, secs) = c.heaviest();
                format!(
                    "the destination did not keep up: {stage} took {secs:.2} of its {:.2} CPU-s",
                    c.total()
                )
            }
            None => v.label().to_string(),
        },
        _ => v.label().to_string(),
    }
}

/// What this run sent, over how long, at what rate: a resumed copy's
/// rate is over the bytes it sent, and says so.
fn sent_line(s: &CopyReport) -> String {
    if s.resumed_bytes == 0 {
        return format!(
            " in {:.2} s = {}",
            s.seconds,
            format_rate(s.bits_per_second)
        );
    }
    format!(
        ": {} sent this run in {:.2} s = {}, {} resumed from an earlier run",
        format_bytes(s.sent_bytes),
        s.seconds,
        format_rate(s.bits_per_second),
        format_bytes(s.resumed_bytes)
    )
}

/// A transfer's first line: what it moved, over how long, at what rate.
fn files_line(s: &CopyReport) -> String {
    format!(
        "{} file{}{}, {}{} ({} skipped as up to date, {} stream(s), {} attempt(s))",
        s.files,
        super::plural(s.files),
        // Links already in place were not made: up to date, as files are.
        match s.links.saturating_sub(s.links_up_to_date) {
            0 => String::new(),
            n => format!(" and {n} link(s)"),
        },
        format_bytes(s.bytes),
        sent_line(s),
        s.skipped,
        s.streams,
        s.attempts,
    )
}

/// A dry run's outcome: what would be sent and deleted, nothing else.
fn print_dry_run(s: &CopyReport) {
    let sending = s.would_send.len() as u64;
    // Files the destination has, as the real run counts them (`skipped`
    // holds the files a dry run would send too; links are not files).
    let links = s.links.saturating_sub(s.links_up_to_date);
    let up_to_date = s.skipped.saturating_sub(sending.saturating_sub(links));
    outln!(
        "dry run: nothing was sent, written or deleted; would send {} file(s) and link(s), {}, and delete {}; {} up to date",
        sending,
        format_bytes(s.would_send_bytes),
        s.deleted.len(),
        up_to_date
    );
    for w in &s.warnings {
        errln!("longhaul: warning: {}", esc(w));
    }
    for p in &s.would_send {
        outln!("would send: {}", esc(p));
    }
    for p in &s.deleted {
        outln!("would delete: {}", esc(p));
    }
    for f in &s.failed {
        errln!("longhaul: failed: {}: {}", esc(&f.path), esc(&f.error));
    }
}

/// An end's CPU by stage: `1.62 s (1.51 s/GiB): read 0.10, hash 0.17, ...`,
/// the stages that took nothing left out. None when the end spent less
/// than the 0.01 s the line shows. The cost per GiB only from
/// [`PER_GIB_FROM`] on: over a few kilobytes it is the fixed cost of a
/// transfer spread thin, thousands of seconds a GiB that nothing costs.
fn cpu_line(c: &longhaul_proto::xfer::StageCpu, bytes: u64) -> Option<String> {
    if c.total() < 0.005 {
        return None;
    }
    let parts: Vec<String> = c
        .named()
        .iter()
        .filter(|(_, s)| *s >= 0.005)
        .map(|(n, s)| format!("{n} {s:.2}"))
        .collect();
    let per_gib = if bytes >= PER_GIB_FROM {
        format!(
            " ({:.2} s/GiB)",
            c.total() / (bytes as f64 / f64::from(1u32 << 30))
        )
    } else {
        String::new()
    };
    let stages = if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    };
    Some(format!("{:.2} s{per_gib}{stages}", c.total()))
}

/// The least a transfer moves for its CPU to be given per GiB.
const PER_GIB_FROM: u64 = 64 << 20;

/// What `-z` did: chunk bytes raw against on the wire, and whether (and
/// why) it was turned off.
fn compression_line(c: &longhaul_proto::xfer::compress::CompressReport) -> String {
    let state = match c.off_reason {
        None => "on throughout".to_string(),
        Some(why) if c.off_at_end => format!("off at the end: {}", why.describe()),
        Some(why) => format!(
            "on at the end; turned off {} time(s), the last because {}",
            c.times_off,
            why.describe()
        ),
    };
    format!(
        "compression: zstd level {}, {} of chunks took {} on the wire ({:.1}x); {state}",
        c.level,
        format_bytes(c.raw_bytes),
        format_bytes(c.wire_bytes),
        c.raw_bytes as f64 / c.wire_bytes.max(1) as f64,
    )
}

/// A transfer's outcome: figures, stages, tuning, path, then what was
/// deleted or would be sent, failures (stderr) and the verification.
fn print_transfer(s: &CopyReport, dry_run: bool) {
    if dry_run || s.dry_run {
        print_dry_run(s);
        return;
    }
    outln!("{}", files_line(s));
    outln!(
        "stages: source read {}, network {}, destination write {}",
        format_rate(s.source_read_bps),
        format_rate(s.network_bps),
        format_rate(s.dest_write_bps)
    );
    if let Some(c) = &s.compression {
        outln!("{}", compression_line(c));
    }
    for (end, c) in [
        ("source", &s.cpu_stages.source),
        ("destination", &s.cpu_stages.sink),
    ] {
        if let Some(line) = c.as_ref().and_then(|c| cpu_line(c, s.sent_bytes)) {
            outln!("cpu at the {end}: {line}");
        }
    }
    if let Some(t) = &s.tuning {
        outln!(
            "tuning: {} stream(s){}; chunks of {}; up to {} files in flight{}",
            t.final_streams,
            if t.online {
                format!(
                    " carrying chunks of {} open (online, {} step(s))",
                    t.initial_streams,
                    t.steps.len()
                )
            } else {
                " (fixed)".into()
            },
            format_bytes(t.chunk_size),
            t.files_in_flight,
            if t.files_in_flight > t.initial_files_in_flight && t.initial_files_in_flight > 0 {
                format!(" (grown online from {})", t.initial_files_in_flight)
            } else {
                String::new()
            },
        );
        if t.send_buffer > 0 {
            outln!(
                "send buffers: {} a stream{}",
                format_bytes(t.send_buffer),
                match t.send_buffer_raises {
                    0 => String::new(),
                    n => format!(" (raised online {n} time(s))"),
                }
            );
        }
    }
    if let Some(l) = limit_shares(&s.intervals) {
        outln!("limited by: {l}");
    }
    if let Some(v) = s.verdict {
        outln!("verdict: {}", verdict_text(s, v));
    }
    if let Some(o) = s.connections.as_ref().filter(|o| o.opened_by == "far_end") {
        outln!(
            "connections: opened by the far end ({})",
            o.reason.as_deref().unwrap_or("connect-back")
        );
    }
    if let Some(o) = s
        .third_party
        .as_ref()
        .and_then(|t| t.data_connections.as_ref())
        .filter(|o| o.opened_by == "dest")
    {
        outln!(
            "data connections: opened by the destination ({})",
            o.reason.as_deref().unwrap_or("connect-back")
        );
    }
    for p in &s.paths {
        outln!(
            "path {} -> {}: {} stream(s), {}",
            p.local,
            p.remote,
            p.streams,
            format_bytes(p.bytes)
        );
    }
    if let Some(p) = &s.path {
        let w = &p.window;
        outln!(
            "path: RTT {:.1} ms; {} stream(s){}, {} in flight each (up to {} per stream), {}{}",
            f64::from(w.rtt_us) / 1e3,
            w.streams,
            match (&p.remembered, w.auto_streams) {
                (Some(r), _) => format!(
                    " sized for {} (doctor measured {})",
                    format_rate(w.target_bps as f64),
                    format_rate(r.bits_per_second)
                ),
                (None, true) => " sized for it".into(),
                (None, false) => String::new(),
            },
            format_bytes(w.stream_window),
            format_rate(w.stream_ceiling_bps),
            p.congestion,
            p.pacing.map_or(String::new(), |r| format!(
                ", paced to {} each",
                format_rate(r as f64 * 8.0)
            )),
        );
    }
    for w in &s.warnings {
        errln!("longhaul: warning: {}", esc(w));
    }
    for p in &s.would_send {
        outln!("would send: {}", esc(p));
    }
    if s.resent_changed > 0 {
        errln!(
            "longhaul: warning: {} file(s) changed while they were read and were sent again",
            s.resent_changed
        );
    }
    for p in &s.deleted {
        outln!(
            "{}: {}",
            if dry_run { "would delete" } else { "deleted" },
            esc(p)
        );
    }
    for f in &s.failed {
        errln!("longhaul: failed: {}: {}", esc(&f.path), esc(&f.error));
    }
    outln!(
        "verified: {}",
        if s.verified {
            "every file, chunk by chunk (XXH3-128 against the source's; digests are BLAKE3)"
        } else {
            "NO: some files failed"
        }
    );
}

/// `drwxr-xr-x`, as `ls -l` shows a type and mode (setuid and setgid as
/// `s`/`S`, sticky as `t`/`T`).
fn mode_string(kind: Kind, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::File | Kind::DirEnd => '-',
    });
    // (read, write, execute bits, the special bit over this triple, its letter)
    let triples = [
        (0o400, 0o200, 0o100, 0o4000, 's'),
        (0o040, 0o020, 0o010, 0o2000, 's'),
        (0o004, 0o002, 0o001, 0o1000, 't'),
    ];
    for (r, w, x, special, letter) in triples {
        out.push(if mode & r != 0 { 'r' } else { '-' });
        out.push(if mode & w != 0 { 'w' } else { '-' });
        out.push(match (mode & x != 0, mode & special != 0) {
            (true, true) => letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    out
}

#[cfg(test)]
mod list_tests {
    use super::*;

    #[test]
    fn modes_read_as_ls_shows_them() {
        assert_eq!(mode_string(Kind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(Kind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(Kind::Symlink, 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(Kind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(Kind::File, 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_string(Kind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(Kind::Dir, 0o1770), "drwxrwx--T");
        assert_eq!(mode_string(Kind::File, 0), "----------");
    }
}
