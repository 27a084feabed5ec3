//! The ratios a reader of the matrix looks for first, printed under each
//! workload's table: in every column (path and direction), longhaul's
//! fastest settings against the fastest peer, by rate and by CPU per byte
//! (both ends, from their cgroups), and against the same-run limit (on an
//! emulated or far path, the path's: its rate or the measured
//! memory-to-memory best, whichever is lower, beside the storage's, the
//! local copy). Only whole cells count: every planned run succeeded; a
//! faster cell left out says so, with its "n of N".

use longhaul_archive::matrix::{CellRuns as Cell, Document as Doc};

/// A tool of ours: `longhaul` (files), `longhaul-perf` (memory), and
/// another build of either (`longhaul@NAME`, `--build`).
fn ours(tool: &str) -> bool {
    tool == "longhaul" || tool.starts_with("longhaul-") || tool.starts_with("longhaul@")
}

fn rate(c: &Cell) -> Option<f64> {
    c.rate
        .as_ref()
        .map(|r| r.median_bytes_per_second)
        .filter(|r| *r > 0.0)
}

/// The fastest whole cell of `want` tools in a column, and a faster one
/// that is not whole (said, not used).
fn best<'a>(
    cells: &[&'a Cell],
    want: impl Fn(&str) -> bool,
) -> (Option<(&'a Cell, f64)>, Option<&'a Cell>) {
    let mine: Vec<(&Cell, f64)> = cells
        .iter()
        .filter(|c| want(&c.tool))
        .filter_map(|c| rate(c).map(|r| (*c, r)))
        .collect();
    let whole = mine
        .iter()
        .filter(|(c, _)| c.whole())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .copied();
    let partial = mine
        .iter()
        .filter(|(c, r)| !c.whole() && whole.is_none_or(|w| *r > w.1))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| *c);
    (whole, partial)
}

/// `TOOL (SETTINGS)`, and its runs when not whole: `1 of 3 runs`.
fn named(c: &Cell) -> String {
    match (c.runs_succeeded, c.runs_planned) {
        (Some(ok), Some(n)) if ok != n => format!("{} ({}): {ok} of {n} runs", c.tool, c.settings),
        _ if c.verified == Some(false) => format!("{} ({}): not verified", c.tool, c.settings),
        _ => format!("{} ({})", c.tool, c.settings),
    }
}

/// CPU seconds of both ends per GB moved, over the cell's runs; None when
/// one end of one run could not be measured.
fn cpu_per_gb(c: &Cell) -> Option<f64> {
    let (mut bytes, mut cpu) = (0.0, 0.0);
    for r in c.runs.iter().filter(|r| r.ok()) {
        bytes += r.bytes_per_second? * r.seconds;
        cpu += r.cpu_client_seconds? + r.cpu_server_seconds?;
    }
    (bytes > 0.0 && cpu > 0.0).then(|| cpu / (bytes / 1e9))
}

/// Whether two cells' spreads (slowest to fastest run) overlap: a ratio
/// of their medians is then within the noise, whatever it says.
fn overlap(a: &Cell, b: &Cell) -> bool {
    match (&a.rate, &b.rate) {
        (Some(a), Some(b)) => {
            a.min_bytes_per_second <= b.max_bytes_per_second
                && b.min_bytes_per_second <= a.max_bytes_per_second
        }
        _ => false,
    }
}

/// `a / b`, where both are figures and `b` is above zero: a ratio to a zero
/// (a limit or a peer that measured nothing) is not a number to print.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && a >= 0.0 && b > 0.0).then(|| a / b)
}

/// A column's limit: the path's (its rate, the best memory-to-memory cell)
/// and, for files, the storage's (the local copy); the lowest above zero
/// (None: none is), and all of them named, a zero one said to be no limit.
fn limit(doc: &Doc, path: &str, workload: &str) -> Option<(Option<f64>, String)> {
    let l = &doc.limits;
    let mb = |v: f64| format!("{:.0} MB/s", v / 1e6);
    let mut parts: Vec<(f64, String)> = Vec::new();
    if let Some(v) = l.path_bytes_per_second.get(path) {
        parts.push((*v, format!("the path's rate {}", mb(*v))));
    }
    let emulated = doc
        .paths
        .iter()
        .any(|p| p.name == path && (p.far.is_some() || p.name != "loopback"));
    if emulated && workload != "mem" {
        if let Some(v) = l.mem_to_mem_bytes_per_second.get(path) {
            parts.push((*v, format!("memory to memory {}", mb(*v))));
        }
    }
    if workload != "mem" {
        if let Some(v) = l.local_copy_bytes_per_second.get(workload) {
            parts.push((*v, format!("the local copy at its fastest {}", mb(*v))));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let usable = |v: f64| v.is_finite() && v > 0.0;
    let low = parts
        .iter()
        .map(|p| p.0)
        .filter(|v| usable(*v))
        .min_by(f64::total_cmp);
    let said: Vec<String> = parts
        .into_iter()
        .map(|(v, what)| {
            if usable(v) {
                what
            } else {
                format!("{what}: nothing measured, no limit")
            }
        })
        .collect();
    Some((low, said.join(", ")))
}

/// One line per column of `workload` with a longhaul cell.
pub(crate) fn lines(doc: &Doc, workload: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in &doc.paths {
        for d in ["put", "get"] {
            let col: Vec<&Cell> = doc
                .cells
                .iter()
                .filter(|c| c.path == p.name && c.workload == workload && c.direction == d)
                .collect();
            let (lh, lh_partial) = best(&col, ours);
            let Some((lh, lh_rate)) = lh else {
                if let Some(c) = lh_partial {
                    out.push(format!(
                        "{} {d}: no whole longhaul cell ({})",
                        p.name,
                        named(c)
                    ));
                }
                continue;
            };
            let mut parts = vec![named(lh)];
            let (peer, peer_partial) = best(&col, |t| !ours(t) && t != "cp");
            if let Some((peer, peer_rate)) = peer {
                let mut s = match ratio(lh_rate, peer_rate) {
                    Some(r) => format!("{r:.2}x the rate of {}", named(peer)),
                    None => format!("the rate of {} n/a (not a figure)", named(peer)),
                };
                if overlap(lh, peer) {
                    s.push_str(" (spreads overlap: not a finding)");
                }
                match (cpu_per_gb(lh), cpu_per_gb(peer)) {
                    (Some(a), Some(b)) => match ratio(a, b) {
                        Some(r) => s.push_str(&format!(", {r:.2}x its CPU per byte")),
                        None => s.push_str(", CPU per byte n/a (none measured)"),
                    },
                    _ => s.push_str(", CPU per byte ? (not measured at both ends)"),
                }
                parts.push(s);
            }
            match limit(doc, &p.name, workload) {
                Some((Some(v), what)) => match ratio(lh_rate, v) {
                    Some(r) => parts.push(format!("{r:.2}x the limit ({what})")),
                    None => parts.push(format!("the limit n/a ({what})")),
                },
                Some((None, what)) => parts.push(format!("the limit n/a ({what})")),
                None => {}
            }
            let mut line = format!("{} {d}: {}", p.name, parts.join(", "));
            for c in [lh_partial, peer_partial].into_iter().flatten() {
                line.push_str(&format!("; not compared: {}", named(c)));
            }
            out.push(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::matrix::{
        self as archived, Limits, Load, Params, PathSpec, Rate, RunResult,
    };

    fn cell(tool: &str, path: &str, rates: &[Option<f64>], planned: u32) -> Cell {
        let runs: Vec<RunResult> = rates
            .iter()
            .map(|r| RunResult {
                bytes_per_second: *r,
                seconds: 1.0,
                cpu_client_seconds: Some(0.5),
                cpu_server_seconds: Some(0.5),
                error: r.is_none().then(|| "exit 1: failed".to_string()),
                ..RunResult::default()
            })
            .collect();
        let mut c = Cell {
            cell: archived::Cell {
                tool: tool.into(),
                settings: "best".into(),
                path: path.into(),
                workload: "mem".into(),
                direction: "put".into(),
                ..archived::Cell::default()
            },
            runs,
        };
        c.summarise(planned);
        c
    }

    fn doc(cells: Vec<Cell>) -> Doc {
        let path = |n: &str, rate: Option<u64>| PathSpec {
            name: n.into(),
            rtt_ms: 0.0,
            loss: 0.0,
            rate_bps: rate,
            far: None,
        };
        let mut d = Doc {
            format: "longhaul-matrix".into(),
            format_version: 2,
            params: Params {
                runs: 3,
                elephant_bytes: 0,
                small_files: 0,
                mem_seconds: 1.0,
                workloads: vec!["mem".into()],
                cold: false,
                given: vec![],
            },
            tools: vec![],
            paths: vec![path("loopback", None), path("80ms", Some(800_000_000))],
            cells,
            sweeps: vec![],
            limits: Limits::default(),
            load: Load::default(),
            merged: vec![],
            interrupted: false,
        };
        d.finish_limits();
        d
    }

    /// "0.96x iperf2" resting on one good run of three: such a cell is
    /// said, not compared, and it sets no limit.
    #[test]
    fn ratios_use_only_cells_whose_every_run_succeeded() {
        let d = doc(vec![
            cell(
                "longhaul-perf",
                "loopback",
                &[Some(8.0), Some(8.0), Some(8.0)],
                3,
            ),
            cell("iperf2", "loopback", &[Some(9.0), None, None], 3),
            cell("iperf3", "loopback", &[Some(4.0), Some(4.0), Some(4.0)], 3),
        ]);
        let l = lines(&d, "mem");
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(l[0].contains("2.00x the rate of iperf3 (best)"), "{}", l[0]);
        assert!(
            l[0].contains("not compared: iperf2 (best): 1 of 3 runs"),
            "{}",
            l[0]
        );
        assert_eq!(d.limits.mem_to_mem_bytes_per_second["loopback"], 8.0);
        let Rate {
            median_bytes_per_second,
            ..
        } = d.cells[1].rate.clone().unwrap();
        assert_eq!(median_bytes_per_second, 9.0);
        assert!(!d.cells[1].whole());
    }

    /// A limit (or a peer's figure) of zero is no ratio: "n/a" and why,
    /// never "infx" or "NaN".
    #[test]
    fn a_limit_of_zero_gives_no_ratio_but_says_why() {
        let mut d = doc(vec![
            cell(
                "longhaul-perf",
                "80ms",
                &[Some(9e7), Some(9e7), Some(9e7)],
                3,
            ),
            cell("iperf3", "80ms", &[Some(1e8), Some(1e8), Some(1e8)], 3),
        ]);
        d.paths[1].rate_bps = Some(0);
        d.limits = Limits::default();
        d.finish_limits();
        let l = lines(&d, "mem");
        assert!(!l[0].contains("inf") && !l[0].contains("NaN"), "{}", l[0]);
        assert!(
            l[0].contains("the limit n/a (the path's rate 0 MB/s: nothing measured, no limit)"),
            "{}",
            l[0]
        );
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::INFINITY, 1.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
    }

    /// Medians 1.10x apart whose runs overlap are no finding, and the line
    /// says so; spreads apart are a finding, said as before.
    #[test]
    fn a_ratio_of_cells_whose_spreads_overlap_says_it_is_not_a_finding() {
        let line = |ours: [f64; 3]| {
            let runs = |r: [f64; 3]| r.map(Some);
            let d = doc(vec![
                cell("longhaul-perf", "loopback", &runs(ours), 3),
                cell("iperf3", "loopback", &runs([8.0, 10.0, 12.0]), 3),
            ]);
            lines(&d, "mem").remove(0)
        };
        let close = line([9.0, 11.0, 14.0]);
        assert!(
            close.contains("1.10x the rate of iperf3 (best) (spreads overlap: not a finding)"),
            "{close}"
        );
        let apart = line([20.0, 21.0, 22.0]);
        assert!(
            apart.contains("2.10x the rate of iperf3 (best),"),
            "{apart}"
        );
        assert!(!apart.contains("overlap"), "{apart}");
    }

    #[test]
    fn on_an_emulated_path_the_limit_is_the_paths_rate() {
        let d = doc(vec![
            cell(
                "longhaul-perf",
                "80ms",
                &[Some(9e7), Some(9e7), Some(9e7)],
                3,
            ),
            cell("iperf3", "80ms", &[Some(1e8), Some(1e8), Some(1e8)], 3),
        ]);
        let l = lines(&d, "mem");
        assert!(l[0].contains("0.90x the rate of iperf3"), "{}", l[0]);
        assert!(
            l[0].contains("0.90x the limit (the path's rate 100 MB/s)"),
            "{}",
            l[0]
        );
        // One end unmeasured: its CPU per byte is not a number.
        let mut c = cell("iperf3", "80ms", &[Some(1e8)], 1);
        c.runs[0].cpu_server_seconds = None;
        assert_eq!(cpu_per_gb(&c), None);
    }
}
