//! The ratios a reader of the matrix looks for first, printed under each
//! workload's table: in every column (path and direction), longhaul's best
//! settings against the best peer, by rate and by CPU per byte (both ends),
//! and against the same-run limit. The bench scripts that are thin calls of
//! the matrix rely on these lines for the ratio every comparison prints.

use super::{Cell, Doc};

/// A tool of ours: `longhaul` (files) and `longhaul-perf` (memory).
fn ours(tool: &str) -> bool {
    tool == "longhaul" || tool.starts_with("longhaul-")
}

/// A cell that ran and, for files, verified: the only ones a ratio may use.
fn counts(c: &Cell) -> Option<f64> {
    let r = c.rate.as_ref()?;
    (c.verified != Some(false) && r.median_bytes_per_second > 0.0)
        .then_some(r.median_bytes_per_second)
}

/// The fastest counted cell of `want` tools in one column.
fn best<'a>(cells: &[&'a Cell], want: impl Fn(&str) -> bool) -> Option<(&'a Cell, f64)> {
    cells
        .iter()
        .filter(|c| want(&c.tool))
        .filter_map(|c| counts(c).map(|r| (*c, r)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// CPU seconds of both ends per GB moved, over the cell's runs.
fn cpu_per_gb(c: &Cell) -> Option<f64> {
    let (mut bytes, mut cpu) = (0.0, 0.0);
    for r in &c.runs {
        if let Some(rate) = r.bytes_per_second {
            bytes += rate * r.seconds;
            cpu += r.cpu_client_seconds + r.cpu_server_seconds;
        }
    }
    (bytes > 0.0 && cpu > 0.0).then(|| cpu / (bytes / 1e9))
}

/// One line per column of `workload` with a longhaul cell: its ratio to the
/// best peer (rate, then CPU per byte: above 1 costs more), and to the local
/// copy of the same data for file workloads.
pub(super) fn lines(doc: &Doc, workload: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in &doc.paths {
        for d in ["put", "get"] {
            let col: Vec<&Cell> = doc
                .cells
                .iter()
                .filter(|c| c.path == p.name && c.workload == workload && c.direction == d)
                .collect();
            let Some((lh, lh_rate)) = best(&col, ours) else {
                continue;
            };
            let mut parts = vec![format!("{} ({})", lh.tool, lh.settings)];
            if let Some((peer, peer_rate)) = best(&col, |t| !ours(t) && t != "cp") {
                let mut s = format!(
                    "{:.2}x the rate of {} ({})",
                    lh_rate / peer_rate,
                    peer.tool,
                    peer.settings
                );
                if let (Some(a), Some(b)) = (cpu_per_gb(lh), cpu_per_gb(peer)) {
                    s.push_str(&format!(", {:.2}x its CPU per byte", a / b));
                }
                parts.push(s);
            }
            if workload != "mem" {
                if let Some(l) = doc.limits.local_copy_bytes_per_second.get(workload) {
                    parts.push(format!("{:.2}x the local copy", lh_rate / l));
                }
            }
            if parts.len() > 1 {
                out.push(format!("{} {d}: {}", p.name, parts.join(", ")));
            }
        }
    }
    out
}
