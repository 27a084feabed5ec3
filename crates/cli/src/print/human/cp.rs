//! `cp` and `sync` for people: a transfer's outcome, its intervals, what
//! limited it.

use longhaul_proto::units::escaped as esc;
use longhaul_proto::units::{format_bytes, format_rate};
use longhaul_proto::xfer::report::CopyReport;

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
pub(super) fn limit_shares(intervals: &[longhaul_proto::tune::TransferInterval]) -> Option<String> {
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
        crate::print::plural(s.files),
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
pub(super) fn cpu_line(c: &longhaul_proto::xfer::StageCpu, bytes: u64) -> Option<String> {
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
pub(super) fn print_transfer(s: &CopyReport, dry_run: bool) {
    if dry_run || s.dry_run {
        print_dry_run(s);
        return;
    }
    outln!("{}", files_line(s));
    print_stages(s);
    if let Some(t) = &s.tuning {
        print_tuning(t);
    }
    if let Some(l) = limit_shares(&s.intervals) {
        outln!("limited by: {l}");
    }
    if let Some(v) = s.verdict {
        outln!("verdict: {}", verdict_text(s, v));
    }
    print_connections(s);
    print_paths(s);
    print_files_named(s, dry_run);
    if !s.verified {
        outln!("verified: NO: some files failed");
    } else if s.files == 0 {
        outln!(
            "verified: nothing needed sending (0 files sent, {} up to date)",
            s.skipped
        );
    } else if s.encryption.is_empty() || s.encryption == "none" {
        outln!(
            "verified: every file, chunk by chunk (XXH3-128 against the source's; digests are \
             BLAKE3)"
        );
    } else {
        outln!(
            "verified: every file, chunk by chunk (each chunk's AEAD tag, or XXH3-128 against \
             the source's with a peer that takes no tags; digests are BLAKE3)"
        );
    }
}

/// Each stage's rate on its own, compression, each end's CPU by stage.
fn print_stages(s: &CopyReport) {
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
}

/// What the source's tuner chose: streams, chunks, files in flight, send
/// buffers.
fn print_tuning(t: &longhaul_proto::tune::TuningReport) {
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

/// Which end opened the connections, when it was not this one.
fn print_connections(s: &CopyReport) {
    if let Some(o) = s.connections.as_ref().filter(|o| o.opened_by == "far_end") {
        outln!(
            "connections: opened by the far end ({})",
            esc(o.reason.as_deref().unwrap_or("connect-back"))
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
            esc(o.reason.as_deref().unwrap_or("connect-back"))
        );
    }
}

/// Each path's streams and bytes (`--bind`, `--via`), and how the streams
/// were sized for the path.
fn print_paths(s: &CopyReport) {
    for p in &s.paths {
        outln!(
            "path {} -> {}: {} stream(s), {}",
            esc(&p.local),
            esc(&p.remote),
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
            esc(&p.congestion),
            p.pacing.map_or(String::new(), |r| format!(
                ", paced to {} each",
                format_rate(r as f64 * 8.0)
            )),
        );
    }
}

/// The files named one by one: warnings, what would be sent, files sent
/// again, deletions, failures.
fn print_files_named(s: &CopyReport, dry_run: bool) {
    for w in &s.warnings {
        errln!("longhaul: warning: {}", esc(w));
    }
    for p in &s.would_send {
        outln!("would send: {}", esc(p));
    }
    if s.resent_bytes > 0 {
        outln!(
            "sent again: {} stuck on a stalled stream at the end, sent on another (the first verified copy kept)",
            format_bytes(s.resent_bytes)
        );
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
}
