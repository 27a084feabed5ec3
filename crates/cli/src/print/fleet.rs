//! A fleet's results for people: each rank's line, and the one result of
//! all ranks (its JSON document is [`super::json::fleet`]).

use longhaul_fleet::run::{FleetSummary, RankResult};
use longhaul_proto::units::{format_bytes, format_rate};
use longhaul_proto::xfer::report::CopyReport;

/// One rank's result, on stderr (every rank prints one).
pub fn rank_line(r: &RankResult) {
    if r.files == 0 && r.bytes == 0 && r.failed.is_empty() {
        errln!(
            "longhaul: rank {} on {}: nothing to move, its share is at the destination ({:.1} s)",
            r.rank,
            r.host,
            r.seconds
        );
        return;
    }
    errln!(
        "longhaul: rank {} on {}: {} files, {} in {:.1} s ({}){}",
        r.rank,
        r.host,
        r.files,
        format_bytes(r.bytes),
        r.seconds,
        format_rate(r.bits_per_second),
        if r.failed.is_empty() {
            String::new()
        } else {
            format!(", {} failed", r.failed.len())
        }
    );
}

/// A rank's result as the archive records a transfer.
pub fn as_cp_summary(r: &RankResult) -> CopyReport {
    CopyReport {
        files: r.files,
        bytes: r.bytes,
        seconds: r.seconds,
        bits_per_second: r.bits_per_second,
        sent_bytes: r.bytes.saturating_sub(r.resumed_bytes),
        resumed_bytes: r.resumed_bytes,
        failed: r.failed.clone(),
        verified: r.failed.is_empty(),
        ..CopyReport::default()
    }
}

/// The one result, for people.
pub fn human(s: &FleetSummary) {
    if s.up_to_date {
        outln!(
            "up to date: {} files, {} already at the destination, checked by {} ranks ({}) in {:.1} s",
            s.files,
            format_bytes(s.bytes),
            s.ranks,
            s.mode,
            s.seconds
        );
    } else {
        outln!(
            "{} files, {} by {} ranks ({}) in {:.1} s: {}",
            s.files,
            format_bytes(s.bytes),
            s.ranks,
            s.mode,
            s.seconds,
            format_rate(s.bits_per_second)
        );
    }
    for r in &s.per_rank {
        outln!(
            "  rank {:>3} {:<20} {:>10} {:>8.1} s {:>14}{}",
            r.rank,
            r.host,
            format_bytes(r.bytes),
            r.seconds,
            if r.bytes == 0 {
                "nothing to move".to_string()
            } else {
                format_rate(r.bits_per_second)
            },
            if s.stragglers.contains(&r.rank) {
                "  straggler"
            } else {
                ""
            }
        );
    }
    if !s.lost.is_empty() {
        outln!(
            "  lost (no result; their work was finished by others): rank {}",
            join(&s.lost)
        );
    }
    if let Some(c) = &s.final_check {
        outln!(
            "  final check by rank {}: {} entries, {} files resent, {:.1} s",
            c.rank,
            c.entries,
            c.resent_files,
            c.seconds
        );
    }
    for f in &s.failed {
        outln!("  failed: {}: {}", f.path, f.error);
    }
    outln!(
        "  {}",
        if s.verified {
            "verified: every entry is at the destination, every chunk checked"
        } else {
            "NOT verified: see the failures above and run the same command again"
        }
    );
}

fn join(ranks: &[u32]) -> String {
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
