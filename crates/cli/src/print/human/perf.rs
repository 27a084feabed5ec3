//! `perf` (and `demo`) for people: the setup, a line per interval as it
//! comes, the summary with what limited each direction.

use longhaul_proto::msg::{Direction, Mode, Transport};
use longhaul_proto::report::{DirectionReport, IntervalReport, Setup, StreamReport, Summary};
use longhaul_proto::units::escaped as esc;
use longhaul_proto::units::{format_bytes, format_rate};

use super::{out, Human};
use crate::print::FormatUnit;

fn dir_tag(d: Direction, mode: Mode) -> &'static str {
    match (mode, d) {
        (Mode::Bidir, Direction::Up) => "TX",
        (Mode::Bidir, Direction::Down) => "RX",
        _ => "",
    }
}

/// A perf rate: in the unit that suits it (bit/s), or in `-f`'s, with
/// iperf3's precision (three figures, no more than two decimals).
pub(super) fn rate_in(bits_per_second: f64, unit: Option<FormatUnit>) -> String {
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
    let control = esc(&or_unknown(&s.control_encryption)).to_string();
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
        None => format!("encryption {}", esc(&or_unknown(&s.encryption))),
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

    /// perf's setup: the server, the test, the socket buffers.
    pub(super) fn perf_setup(&mut self, s: &Setup) {
        let p = &s.params;
        out(&format!(
            "Connected to {} ({}, {}), protocol {}, {}",
            esc(&s.server),
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
            cc.map(|c| format!(", {}", esc(c))).unwrap_or_default(),
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

    /// perf's interval: a line per stream (when several) and direction.
    pub(super) fn perf_interval(&mut self, r: &IntervalReport) {
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
                // One stream: its line is the direction's total, under the
                // stream's id (a relayed report may list none).
                let id = r.streams.first().map_or_else(
                    || format!("{}SUM", dir_tag(d.direction, self.mode)),
                    |s| id_of(s, self.mode),
                );
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

    /// perf's summary: the totals, CPU, what limited each direction.
    pub(super) fn perf_summary(&mut self, s: &Summary) {
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
                esc(o.reason.as_deref().unwrap_or("connect-back"))
            ));
        }
        for d in s.directions.iter().filter(|_| s.directions.len() > 1) {
            out(&format!(
                "{:?}: limited by {:?}: {}",
                d.direction,
                d.limit.kind,
                esc(&d.limit.detail)
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
            out(&format!("Ended early: {}", esc(e)));
        }
    }
}

pub(super) fn limit_name(k: longhaul_proto::report::LimitKind) -> String {
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
    format!("{name} ({})", esc(&s.limit.detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_interval_that_lists_no_stream_is_printed_not_a_panic() {
        // A third-party test's intervals come from the server as it wrote them.
        let r = IntervalReport {
            index: 0,
            start_s: 0.0,
            end_s: 1.0,
            omitted: false,
            streams: Vec::new(),
            directions: vec![DirectionReport::default()],
            cpu_local_percent: 0.0,
            cpu_remote_percent: 0.0,
        };
        Human::perf(1, Mode::Up).perf_interval(&r);
    }

    /// iperf3's `-f` sets the unit of the rate only: its Transfer column
    /// is always in the size that suits it (`unit_snprintf(..., 'A')` in
    /// its iperf_api.c; iperf3 3.12 prints `2.54 GBytes  2662142
    /// KBytes/sec` for `-f K`), and so is perf's.
    #[test]
    fn f_sets_the_rate_s_unit_and_the_transfer_stays_in_the_size_that_suits_it() {
        let bytes = 2_727_000_000;
        let row = Row {
            id: "5",
            from: 0.0,
            to: 1.0,
            bytes,
            bps: 21.8e9,
            tcp: None,
            udp: None,
        };
        for (bytes_unit, power, rate_unit) in [
            (true, 1, "KiB/s"),
            (true, 2, "MiB/s"),
            (false, 3, "Gbit/s"),
            (false, 2, "Mbit/s"),
        ] {
            let unit = FormatUnit {
                bytes: bytes_unit,
                power,
            };
            let line = stream_line(
                &row,
                Columns {
                    unit: Some(unit),
                    tcp: false,
                },
            );
            let transfer = line.split(" s ").nth(1).unwrap().trim_start();
            assert!(
                transfer.starts_with(&format_bytes(bytes)),
                "{unit:?}: {line}"
            );
            assert!(
                format_bytes(bytes).ends_with("GiB"),
                "{}",
                format_bytes(bytes)
            );
            assert!(line.trim_end().ends_with(rate_unit), "{unit:?}: {line}");
        }
    }
}
