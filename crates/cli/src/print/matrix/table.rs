//! The matrix as a reader sees it (`--md`, the terminal, `--csv`,
//! `--json`): per workload a table of rates (the median MB/s of the runs
//! that succeeded, their spread, and "n of N" where some failed), a table
//! of CPU seconds per GB at both ends, what each row ran with (41.B9: the
//! settings' arguments, `best`'s from its sweep on each path), what a tool
//! did not keep of the tree, the ratio lines; then the limits and notes.

use longhaul_archive::matrix::{CellRuns as Cell, Document as Doc};

use super::args_text as shown_args;
use super::ratios;

/// How the matrix is printed: `--json`, `--csv`, `--md`, or for the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Json,
    Csv,
    Markdown,
    Terminal,
}

/// A cell's rate: `median (min-max)`, `n of N` when runs failed.
fn rate_text(c: Option<&Cell>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let Some(r) = &c.rate else {
        if c.runs_planned == Some(0) {
            return c
                .note
                .as_deref()
                .map_or("not run", |n| n.split(" (").next().unwrap_or(n))
                .into();
        }
        return match c.error.as_deref() {
            Some(e) if e.contains("timed out") => "timed out",
            Some(_) => "failed",
            None => "-",
        }
        .into();
    };
    let mb = |v: f64| match v / 1e6 {
        v if v < 10.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    };
    let mut s = mb(r.median_bytes_per_second);
    if r.max_bytes_per_second > r.min_bytes_per_second {
        s.push_str(&format!(
            " ({}-{})",
            mb(r.min_bytes_per_second),
            mb(r.max_bytes_per_second)
        ));
    }
    if let (Some(ok), Some(n), false) =
        (c.runs_succeeded, c.runs_planned, c.verified == Some(false))
    {
        if ok != n {
            s.push_str(&format!(" [{ok} of {n}]"));
        }
    }
    if c.verified == Some(false) {
        s.push_str(" NOT VERIFIED");
    }
    if !c.not_kept.is_empty() {
        s.push('*');
    }
    s
}

/// A cell's CPU seconds per GB moved, client + server; `?` for an end
/// that could not be measured.
fn cpu_text(c: Option<&Cell>) -> String {
    let Some(c) = c.filter(|c| c.rate.is_some()) else {
        return "-".into();
    };
    let Some(cpu) = &c.cpu_seconds else {
        return "?".into();
    };
    // The mean bytes of the runs whose CPU is the mean (each run's own
    // rate times its own time: the median rate times the mean time is
    // not what any run moved when the runs' rates differ).
    let ran: Vec<f64> = c
        .runs
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| r.bytes_per_second.map(|b| b * r.seconds))
        .collect();
    let gb = ran.iter().sum::<f64>() / ran.len().max(1) as f64 / 1e9;
    let per = |v: Option<f64>| match v {
        Some(v) if gb > 0.0 => format!("{:.2}", v / gb),
        _ => "?".into(),
    };
    format!("{} + {}", per(cpu.client_seconds), per(cpu.server_seconds))
}

fn what(doc: &Doc, w: &str) -> String {
    if let Some((data, step)) = w.split_once('+') {
        let changed = match step {
            "same" => "nothing changed",
            _ => "1% of the files changed",
        };
        return format!(
            "{}; a sync after the tool's own first copy, {changed}; the data's bytes over the \
             sync's seconds",
            what(doc, data)
        );
    }
    if doc.params.given.iter().any(|g| g == w) {
        return "the tree found in the work directory (its own, not made by the matrix)".into();
    }
    match w {
        "mem" => format!("memory to memory, {} s", doc.params.mem_seconds),
        "elephant" => format!(
            "one file of {}",
            longhaul_proto::units::format_bytes(doc.params.elephant_bytes)
        ),
        "smallfiles" => format!("{} files of 1-64 KiB", doc.params.small_files),
        _ => "a mixed tree: files of 0 to 1/8 of the elephant, an empty directory, a \
              symbolic link, modes 0600, 0700 and 0755"
            .to_string(),
    }
}

/// Prints the matrix in the form asked for.
pub fn print(doc: &Doc, form: Form, verbose: u8) {
    match form {
        Form::Json => crate::print::out_json(
            &serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into()),
        ),
        Form::Csv => print_csv(doc),
        Form::Markdown => tables(doc, true, verbose),
        Form::Terminal => tables(doc, false, verbose),
    }
}

/// The matrix for people (`md`: as Markdown): per workload its tables,
/// what each row ran with, what a tool did not keep and the ratio lines;
/// then the words under them all.
pub fn tables(doc: &Doc, md: bool, verbose: u8) {
    let bullet = if md { "- " } else { "  " };
    for w in &doc.workloads() {
        workload(doc, w, md, bullet, verbose);
    }
    tail(doc, md);
}

/// One workload's tables and the lines under them.
fn workload(doc: &Doc, w: &str, md: bool, bullet: &str, verbose: u8) {
    let cols: Vec<(String, &str)> = doc
        .paths
        .iter()
        .flat_map(|p| ["put", "get"].map(|d| (p.name.clone(), d)))
        .collect();
    let rows = rows(doc, w, &cols);
    if rows.is_empty() {
        return;
    }
    let mut head = vec!["tool".to_string()];
    head.extend(cols.iter().map(|(p, d)| format!("{p} {d}")));
    outln!(
        "{w} ({}): MB/s, median (slowest-fastest) of {} runs",
        what(doc, w),
        doc.params.runs
    );
    let rates: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, cells)| row(label, cells, rate_text))
        .collect();
    grid(md, &head, &rates);
    outln!("");
    outln!("{w}: CPU seconds per GB moved, client + server (each end's cgroup; ? not measured)");
    let cpus: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, cells)| row(label, cells, cpu_text))
        .collect();
    grid(md, &head, &cpus);
    outln!("");
    let notes = settings_lines(doc, w, verbose)
        .into_iter()
        .chain(not_kept_lines(doc, w))
        .chain(start_up_lines(doc, w))
        .chain(sender_count_lines(doc, w))
        .collect::<Vec<_>>();
    for l in &notes {
        outln!("{bullet}{l}");
    }
    let ratios = ratios::lines(doc, w);
    if !ratios.is_empty() {
        outln!(
            "{}longhaul against the best peer and the limit:",
            if notes.is_empty() { "" } else { "\n" }
        );
        for l in ratios {
            outln!("{bullet}{l}");
        }
    }
    outln!("");
}

type Rows<'a> = Vec<(String, Vec<Option<&'a Cell>>)>;

/// Each tool and settings with a cell in this workload, and its cells by column.
fn rows<'a>(doc: &'a Doc, w: &str, cols: &[(String, &str)]) -> Rows<'a> {
    let mut out = Vec::new();
    for t in &doc.tools {
        for s in &t.settings {
            let cells: Vec<Option<&Cell>> = cols
                .iter()
                .map(|(p, d)| {
                    doc.cells.iter().find(|c| {
                        c.tool == t.name
                            && &c.settings == s
                            && &c.path == p
                            && c.workload == w
                            && c.direction == *d
                    })
                })
                .collect();
            if cells.iter().any(Option::is_some) {
                out.push((format!("{} ({s})", t.name), cells));
            }
        }
    }
    out
}

fn row(label: &str, cells: &[Option<&Cell>], text: fn(Option<&Cell>) -> String) -> Vec<String> {
    let mut r = vec![label.to_string()];
    r.extend(cells.iter().map(|c| text(*c)));
    r
}

fn grid(md: bool, head: &[String], rows: &[Vec<String>]) {
    for l in grid_lines(md, head, rows) {
        outln!("{l}");
    }
}

/// A table's lines: Markdown (each cell [`md_cell`]) or aligned columns
/// for the terminal (each cell on one line, [`escaped`]).
///
/// [`escaped`]: longhaul_proto::units::escaped
fn grid_lines(md: bool, head: &[String], rows: &[Vec<String>]) -> Vec<String> {
    let cells = |r: &[String]| -> Vec<String> {
        r.iter()
            .map(|x| {
                if md {
                    md_cell(x)
                } else {
                    longhaul_proto::units::escaped(x).to_string()
                }
            })
            .collect()
    };
    let head = cells(head);
    let rows: Vec<Vec<String>> = rows.iter().map(|r| cells(r)).collect();
    if md {
        let mut out = vec![
            String::new(),
            format!("| {} |", head.join(" | ")),
            format!("|---|{}", "---:|".repeat(head.len() - 1)),
        ];
        out.extend(rows.iter().map(|r| format!("| {} |", r.join(" | "))));
        return out;
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|j| {
            rows.iter()
                .map(|r| r[j].chars().count())
                .chain([head[j].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = Vec::new();
    for r in std::iter::once(&head).chain(rows.iter()) {
        let mut line = format!("{:w$}", r[0], w = widths[0]);
        for (x, w) in r.iter().zip(&widths).skip(1) {
            line.push_str(&format!("  {x:>w$}"));
        }
        out.push(line.trim_end().to_string());
    }
    out
}

/// A Markdown table cell: on one line (a line break is a space), its
/// pipes escaped (a `|` would end the cell), and the backslash, `<` and
/// the backtick too, so that a tool's or a peer's words make no HTML, no
/// code span and no escape of their own.
fn md_cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            '\\' | '|' | '<' | '`' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// A CSV field (RFC 4180): in double quotes, its own doubled, when it holds
/// a comma, a double quote or a line break; as it is otherwise.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// What each row ran with: a settings' arguments when it has any, and
/// `best`'s winner on each path (with `-v`, every candidate's figure).
fn settings_lines(doc: &Doc, w: &str, verbose: u8) -> Vec<String> {
    let mut out = Vec::new();
    let mut bare: Vec<&str> = Vec::new();
    for t in &doc.tools {
        for s in &t.settings {
            let mut by_path: Vec<(String, String)> = Vec::new();
            for p in &doc.paths {
                let swept = doc.sweeps.iter().find(|x| {
                    x.tool == t.name && x.path == p.name && x.workload == w && s == "best"
                });
                // A sweep alone (`--runs 0`): its cells have not run; its winner is said.
                let args = doc
                    .cells
                    .iter()
                    .find(|c| {
                        c.tool == t.name && &c.settings == s && c.path == p.name && c.workload == w
                    })
                    .and_then(|c| c.args.clone())
                    .or_else(|| swept.and_then(|x| x.winner.clone()));
                let Some(args) = args else { continue };
                let mut said = shown_args(&args);
                if let Some(sw) = swept {
                    said.push_str(&format!(", {}", sw.summary()));
                    if let Some(when) = &sw.remembered {
                        said.push_str(&format!(", remembered from {when}"));
                    }
                }
                by_path.push((p.name.clone(), said));
            }
            let all_same = by_path.windows(2).all(|x| x[0].1 == x[1].1);
            if by_path.is_empty() {
                continue;
            }
            if s == "defaults" && all_same && by_path[0].1 == shown_args(&[]) {
                bare.push(&t.name);
                continue;
            }
            let text = if all_same && s != "best" {
                by_path[0].1.clone()
            } else {
                by_path
                    .iter()
                    .map(|(p, a)| format!("{p}: {a}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            // Sweeps run puts; a get cell runs with the put's winner.
            let by_puts = if s == "best" { " (swept by puts)" } else { "" };
            out.push(format!("{} ({s}) ran with {text}{by_puts}", t.name));
            if verbose > 0 && s == "best" {
                out.extend(sweep_lines(doc, &t.name, w));
            }
        }
    }
    if !bare.is_empty() {
        out.insert(
            0,
            format!(
                "(defaults) ran with no options beyond the template's (the tool as installed): {}",
                bare.join(", ")
            ),
        );
    }
    out.extend(best_below_defaults(doc, w));
    out
}

/// Where a tool's `best` came out slower than its `defaults` in the cells'
/// runs, beyond their spread (below the slowest `defaults` run): said, with
/// the spreads, since its sweep's rounds were puts.
fn best_below_defaults(doc: &Doc, w: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in doc
        .cells
        .iter()
        .filter(|c| c.workload == w && c.settings == "best")
    {
        let d = doc.cells.iter().find(|c| {
            c.settings == "defaults"
                && c.tool == b.tool
                && c.path == b.path
                && c.workload == w
                && c.direction == b.direction
        });
        let (Some(d), Some(br), Some(dr)) = (d, &b.rate, d.and_then(|d| d.rate.as_ref())) else {
            continue;
        };
        if br.median_bytes_per_second < dr.min_bytes_per_second {
            out.push(format!(
                "{} (best) came out below its defaults on {} {}: {} against {} MB/s (its sweep's \
                 rounds were puts; -v lists them)",
                b.tool,
                b.path,
                b.direction,
                rate_text(Some(b)),
                rate_text(Some(d))
            ));
        }
    }
    out
}

/// `-v`: every candidate of a tool's sweeps on this workload.
fn sweep_lines(doc: &Doc, tool: &str, w: &str) -> Vec<String> {
    let mut out = Vec::new();
    for sw in doc
        .sweeps
        .iter()
        .filter(|x| x.tool == tool && x.workload == w)
    {
        for c in &sw.candidates {
            let fig = c.said();
            let won = sw.winner.as_ref() == Some(&c.args);
            out.push(format!(
                "  swept on {}: {}: {fig}{}",
                sw.path,
                shown_args(&c.args),
                if won { " (best)" } else { "" }
            ));
        }
    }
    out
}

/// A run on a long path this short measures TCP's start-up, not the
/// path: memory to memory for fewer than this many round trips...
const START_UP_ROUND_TRIPS: f64 = 20.0;

/// Where a workload's figures on a path measure start-up (said, not
/// changed): memory-to-memory runs shorter than [`START_UP_ROUND_TRIPS`]
/// round trips of the path, an elephant smaller than its bandwidth-delay
/// product (its rate times its round trip).
fn start_up_lines(doc: &Doc, w: &str) -> Vec<String> {
    let mut out = Vec::new();
    let data = w.split('+').next().unwrap_or(w);
    for p in doc.paths.iter().filter(|p| p.rtt_ms > 0.0) {
        if !doc
            .cells
            .iter()
            .any(|c| c.path == p.name && c.workload == w)
        {
            continue;
        }
        let rtt = p.rtt_ms / 1e3;
        let trips = doc.params.mem_seconds / rtt;
        if data == "mem" && trips < START_UP_ROUND_TRIPS {
            out.push(format!(
                "{}: {} s is {trips:.0} round trips of this path ({} ms): start-up dominates its \
                 memory-to-memory figures (--seconds)",
                p.name, doc.params.mem_seconds, p.rtt_ms
            ));
        }
        let given = doc.params.given.iter().any(|g| g == data);
        let bdp = p.rate_bps.map(|r| r as f64 / 8.0 * rtt);
        if let Some(bdp) =
            bdp.filter(|b| data == "elephant" && !given && (doc.params.elephant_bytes as f64) < *b)
        {
            out.push(format!(
                "{}: the elephant ({}) is smaller than this path's bandwidth-delay product ({}, \
                 its rate times its round trip): start-up dominates (--size)",
                p.name,
                longhaul_proto::units::format_bytes(doc.params.elephant_bytes),
                longhaul_proto::units::format_bytes(bdp as u64)
            ));
        }
    }
    out
}

/// iperf2's put figure is its client's report: the bytes the sender wrote,
/// not those the receiver read (its server's report, which the matrix
/// does not read).
fn sender_count_lines(doc: &Doc, w: &str) -> Vec<String> {
    let put = doc
        .cells
        .iter()
        .any(|c| c.tool == "iperf2" && c.workload == w && c.direction == "put");
    if !put {
        return Vec::new();
    }
    vec![
        "iperf2's put figure is the sender's count (the bytes its client wrote, as its client \
         reports them; the other tools' are the receiver's)"
            .to_string(),
    ]
}

/// `*`: what a tool did not keep of the tree (and does not claim to).
fn not_kept_lines(doc: &Doc, w: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in doc
        .cells
        .iter()
        .filter(|c| c.workload == w && !c.not_kept.is_empty())
    {
        let l = format!(
            "* {} ({}) does not keep {} (nor claims to; the copy is marked, not failed)",
            c.tool,
            c.settings,
            c.not_kept.join(", ")
        );
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// Under the tables: tools not run, the same-run limits, notes, the load.
fn tail(doc: &Doc, md: bool) {
    let bullet = if md { "- " } else { "" };
    for t in doc.tools.iter().filter(|t| t.note.is_some()) {
        outln!(
            "{bullet}{}: {}",
            t.name,
            t.note.as_deref().unwrap_or("not installed")
        );
    }
    if let Some(l) = versions_line(doc, md) {
        outln!("{bullet}{l}");
    }
    let mb = |v: f64| format!("{:.0} MB/s", v / 1e6);
    if let Some(l) = super::limits_line(doc, mb) {
        outln!("{bullet}{l}");
    }
    if let Some(l) = super::hosts_line(doc) {
        outln!("{bullet}{l}");
    }
    for l in doc
        .cells
        .iter()
        .filter(|c| c.runs_planned != Some(0))
        .filter_map(|c| super::note_line(c))
    {
        outln!("{bullet}{l}");
    }
    if doc.params.cold {
        outln!("{bullet}cold: the page cache was dropped before every timed run (--cold)");
    }
    for l in load_lines(doc) {
        outln!("{bullet}{l}");
    }
}

/// The load average as the matrix ran: of each merged piece (whose cells
/// these are), then of this run.
fn load_lines(doc: &Doc) -> Vec<String> {
    let span = |l: &longhaul_archive::matrix::Load| {
        let end = if l.end.is_empty() { "?" } else { &l.end };
        format!("{} at the start, {end} at the end", l.start)
    };
    let mut out: Vec<String> = doc
        .merged
        .iter()
        .map(|p| {
            format!(
                "load average (1, 5, 15 min) of the merged piece {}: {}",
                p.file,
                span(&p.load)
            )
        })
        .collect();
    if !doc.load.start.is_empty() {
        let whose = if doc.merged.is_empty() {
            ""
        } else {
            " of this run (the merge)"
        };
        out.push(format!(
            "load average (1, 5, 15 min){whose}: {}",
            span(&doc.load)
        ));
    }
    out
}

/// `versions: TOOL: WHAT IT SAID; ...`, each as its version command said
/// it (kept escaped; in Markdown its own characters escaped too), and where
/// merged pieces ran another version of it, which pieces and what they
/// said; None when no tool said one.
fn versions_line(doc: &Doc, md: bool) -> Option<String> {
    let said: Vec<String> = doc
        .tools
        .iter()
        .filter_map(|t| {
            let v = t.version.as_deref()?;
            let mut other: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
            for p in &doc.merged {
                if let Some(pv) = p.versions.get(&t.name).filter(|pv| *pv != v) {
                    other.entry(pv).or_default().push(&p.file);
                }
            }
            let mut line = format!("{}: {v}", t.name);
            for (pv, files) in other {
                line.push_str(&format!(" (the merged {}: {pv})", files.join(", ")));
            }
            Some(if md { md_cell(&line) } else { line })
        })
        .collect();
    (!said.is_empty()).then(|| {
        format!(
            "versions (each tool's programs on this host): {}",
            said.join("; ")
        )
    })
}

fn print_csv(doc: &Doc) {
    for l in csv_lines(doc) {
        outln!("{l}");
    }
}

/// The matrix as CSV: a header, then a record per cell, every text field
/// quoted as RFC 4180 asks ([`csv_field`]).
fn csv_lines(doc: &Doc) -> Vec<String> {
    let mut out = vec![
        "tool,settings,path,workload,direction,mb_per_s,gbit_per_s,min_mb_per_s,max_mb_per_s,\
         cpu_client_s,cpu_server_s,runs_succeeded,runs_planned,verified,not_kept,args,error"
            .to_string(),
    ];
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
    for c in &doc.cells {
        let r = c.rate.clone().unwrap_or_default();
        let cpu = c.cpu_seconds.clone().unwrap_or_default();
        let text = [&c.tool, &c.settings, &c.path, &c.workload, &c.direction]
            .map(|f| csv_field(f))
            .join(",");
        out.push(format!(
            "{text},{:.1},{:.3},{:.1},{:.1},{},{},{},{},{},{},{},{}",
            r.median_bytes_per_second / 1e6,
            r.median_bits_per_second / 1e9,
            r.min_bytes_per_second / 1e6,
            r.max_bytes_per_second / 1e6,
            opt(cpu.client_seconds),
            opt(cpu.server_seconds),
            c.runs_succeeded.map_or(String::new(), |n| n.to_string()),
            c.runs_planned.map_or(String::new(), |n| n.to_string()),
            c.verified.map_or(String::new(), |v| v.to_string()),
            csv_field(&c.not_kept.join(" ")),
            csv_field(&c.args.as_ref().map(|a| shown_args(a)).unwrap_or_default()),
            csv_field(c.error.as_deref().unwrap_or(""))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::matrix::{
        self as archived, Limits, Load, Params, PathSpec, RunResult, Swept, ToolRow, Tried,
    };

    fn cell(tool: &str, settings: &str, args: &[&str], rates: &[f64]) -> Cell {
        let mut c = Cell {
            cell: archived::Cell {
                tool: tool.into(),
                settings: settings.into(),
                path: "loopback".into(),
                workload: "mem".into(),
                direction: "put".into(),
                args: Some(args.iter().map(|a| a.to_string()).collect()),
                ..archived::Cell::default()
            },
            runs: rates
                .iter()
                .map(|r| RunResult {
                    bytes_per_second: Some(*r),
                    seconds: 1.0,
                    ..RunResult::default()
                })
                .collect(),
        };
        c.summarise(rates.len() as u32);
        c
    }

    fn doc(cells: Vec<Cell>, sweeps: Vec<Swept>) -> Doc {
        let row = |name: &str| ToolRow {
            name: name.into(),
            settings: vec!["defaults".into(), "best".into()],
            installed: true,
            note: None,
            version: None,
        };
        Doc {
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
            tools: vec![row("iperf3"), row("nuttcp")],
            paths: vec![PathSpec {
                name: "loopback".into(),
                ..PathSpec::default()
            }],
            cells,
            sweeps,
            limits: Limits::default(),
            load: Load::default(),
            merged: vec![],
            interrupted: false,
        }
    }

    /// A tool name, settings or a peer's error holding `|`, `,`, `"` or a
    /// line break: each CSV record is one record of 17 fields (RFC 4180),
    /// each Markdown row one row of its columns.
    #[test]
    fn csv_and_markdown_fields_are_escaped_per_format() {
        let mut c = cell("evil|tool, \"x\"", "a|b\nc", &["-w", "4M"], &[1e9]);
        c.cell.error = Some("line one\nline \"two\", | three".into());
        let mut d = doc(vec![c], vec![]);
        d.tools[0].name = "evil|tool, \"x\"".into();
        d.tools[0].settings = vec!["a|b\nc".into()];
        let csv = csv_lines(&d).join("\n");
        let mut reader = csv_records(&csv);
        assert_eq!(reader.len(), 2, "{csv}");
        let rec = reader.remove(1);
        assert_eq!(rec.len(), 17, "{rec:?}");
        assert_eq!(rec[0], "evil|tool, \"x\"");
        assert_eq!(rec[1], "a|b\nc");
        assert_eq!(rec[16], "line one\nline \"two\", | three");
        let head = ["tool".to_string(), "loopback put".to_string()];
        let rows = rows(&d, "mem", &[("loopback".into(), "put")]);
        let grid: Vec<Vec<String>> = rows
            .iter()
            .map(|(label, cells)| row(label, cells, rate_text))
            .collect();
        let md = grid_lines(true, &head, &grid);
        assert_eq!(md.len(), 4, "{md:#?}");
        assert_eq!(md[3], r#"| evil\|tool, "x" (a\|b c) | 1000 |"#, "{md:#?}");
        let terminal = grid_lines(false, &head, &grid);
        assert_eq!(terminal.len(), 2, "{terminal:#?}");
        assert!(
            terminal[1].starts_with(r#"evil|tool, "x" (a|b\nc)"#),
            "{terminal:#?}"
        );
    }

    /// Each tool's version, as it said it, in the notes: in Markdown its
    /// pipes, backticks and `<` escaped (no table cell ended, no code span
    /// or HTML made); a tool that said none is left out.
    #[test]
    fn the_notes_say_each_tools_version_escaped_per_format() {
        let mut d = doc(vec![], vec![]);
        d.tools[0].version = Some("iperf 3.12 (cJSON 1.7.15)".into());
        d.tools[1].version = Some("nuttcp-6.1.2 |`<b>`".into());
        let md = versions_line(&d, true).unwrap();
        assert_eq!(
            md,
            "versions (each tool's programs on this host): iperf3: iperf 3.12 (cJSON 1.7.15); \
             nuttcp: nuttcp-6.1.2 \\|\\`\\<b>\\`"
        );
        let term = versions_line(&d, false).unwrap();
        assert!(term.ends_with("nuttcp: nuttcp-6.1.2 |`<b>`"), "{term}");
        d.tools[1].version = None;
        assert!(!versions_line(&d, false).unwrap().contains("nuttcp"));
        d.tools[0].version = None;
        assert_eq!(versions_line(&d, false), None);
    }

    /// Pieces merged from another build say so: which pieces, and what
    /// the tool said there; a piece of the same version adds nothing.
    #[test]
    fn merged_pieces_of_another_version_are_named_with_it() {
        use longhaul_archive::matrix::Piece;
        let mut d = doc(vec![], vec![]);
        d.tools[0].version = Some("iperf 3.12".into());
        let piece = |file: &str, v: &str| Piece {
            file: file.into(),
            versions: [("iperf3".to_string(), v.to_string())].into(),
            ..Piece::default()
        };
        d.merged = vec![
            piece("a.json", "iperf 3.9"),
            piece("b.json", "iperf 3.12"),
            piece("c.json", "iperf 3.9"),
        ];
        assert_eq!(
            versions_line(&d, false).unwrap(),
            "versions (each tool's programs on this host): iperf3: iperf 3.12 \
             (the merged a.json, c.json: iperf 3.9)"
        );
    }

    /// A merged document's limits and loads are its pieces': said so, each
    /// piece's load, and the memory-to-memory limit with its runs' length.
    #[test]
    fn a_merged_documents_limits_and_loads_are_said_to_be_its_pieces() {
        use longhaul_archive::matrix::Piece;
        let mut d = doc(vec![cell("iperf3", "best", &[], &[1e9, 1e9, 1e9])], vec![]);
        d.load = Load {
            start: "0.10 0.20 0.30".into(),
            end: "0.40 0.50 0.60".into(),
        };
        d.finish_limits();
        let mb = |v: f64| format!("{:.0} MB/s", v / 1e6);
        let whole = super::super::limits_line(&d, mb).unwrap();
        assert_eq!(
            whole,
            "limits in the same run: memory to memory on loopback 1000 MB/s (runs of 1 s, --seconds)"
        );
        assert_eq!(
            load_lines(&d),
            ["load average (1, 5, 15 min): 0.10 0.20 0.30 at the start, 0.40 0.50 0.60 at the end"]
        );
        d.merged = ["a.json", "b.json"]
            .iter()
            .enumerate()
            .map(|(i, f)| Piece {
                file: f.to_string(),
                load: Load {
                    start: format!("{i}.00 1 1"),
                    end: String::new(),
                },
                ..Piece::default()
            })
            .collect();
        let merged = super::super::limits_line(&d, mb).unwrap();
        assert!(
            merged.starts_with("limits measured by the merged pieces: memory to memory"),
            "{merged}"
        );
        assert_eq!(
            load_lines(&d),
            [
                "load average (1, 5, 15 min) of the merged piece a.json: 0.00 1 1 at the start, ? at the end",
                "load average (1, 5, 15 min) of the merged piece b.json: 1.00 1 1 at the start, ? at the end",
                "load average (1, 5, 15 min) of this run (the merge): 0.10 0.20 0.30 at the start, 0.40 0.50 0.60 at the end",
            ]
        );
    }

    /// A memory-to-memory run of fewer than 20 round trips, or an elephant
    /// smaller than the path's bandwidth-delay product, measures start-up:
    /// said under the workload, on that path only; iperf2's put figure is
    /// said to be the sender's count.
    #[test]
    fn figures_that_measure_start_up_or_the_senders_count_are_said() {
        let path = |name: &str, rtt_ms: f64, rate_bps: Option<u64>| PathSpec {
            name: name.into(),
            rtt_ms,
            rate_bps,
            ..PathSpec::default()
        };
        let on = |c: Cell, p: &str, w: &str| {
            let mut c = c;
            c.cell.path = p.into();
            c.cell.workload = w.into();
            c
        };
        let mut cells = Vec::new();
        for p in ["loopback", "80ms", "satellite"] {
            for w in ["mem", "elephant"] {
                cells.push(on(cell("iperf2", "best", &[], &[1e9]), p, w));
            }
        }
        let mut d = doc(cells, vec![]);
        d.paths = vec![
            path("loopback", 0.0, None),
            path("80ms", 80.0, Some(1_000_000_000)),
            path("satellite", 540.0, Some(1_000_000_000)),
        ];
        d.params.mem_seconds = 10.0;
        d.params.elephant_bytes = 64 << 20;
        let mem = start_up_lines(&d, "mem");
        assert_eq!(
            mem,
            [
                "satellite: 10 s is 19 round trips of this path (540 ms): start-up dominates its \
              memory-to-memory figures (--seconds)"
            ],
            "{mem:#?}"
        );
        let el = start_up_lines(&d, "elephant");
        assert_eq!(el.len(), 1, "{el:#?}");
        assert!(
            el[0].starts_with(
                "satellite: the elephant (64.0 MiB) is smaller than this path's \
                 bandwidth-delay product (64.4 MiB"
            ),
            "{el:#?}"
        );
        d.params.mem_seconds = 30.0;
        d.params.elephant_bytes = 1 << 30;
        assert!(start_up_lines(&d, "mem").is_empty());
        assert!(start_up_lines(&d, "elephant").is_empty());
        assert_eq!(sender_count_lines(&d, "mem").len(), 1);
        d.cells
            .retain(|c| c.tool != "iperf2" || c.direction != "put");
        assert!(sender_count_lines(&d, "mem").is_empty());
    }

    /// CSV records as RFC 4180 reads them (quoted fields, doubled quotes,
    /// line breaks inside quotes).
    fn csv_records(text: &str) -> Vec<Vec<String>> {
        let (mut recs, mut rec, mut field) = (Vec::new(), Vec::new(), String::new());
        let (mut quoted, mut chars) = (false, text.chars().peekable());
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => field.push(c),
                (false, '"') => quoted = true,
                (false, ',') => rec.push(std::mem::take(&mut field)),
                (false, '\n') => {
                    rec.push(std::mem::take(&mut field));
                    recs.push(std::mem::take(&mut rec));
                }
                (false, c) => field.push(c),
            }
        }
        rec.push(field);
        recs.push(rec);
        recs
    }

    #[test]
    fn cpu_per_gb_divides_by_what_the_runs_moved() {
        // One GB in each run, at 1, 2 and 4 GB/s: 3 CPU seconds a run is
        // 3 s per GB (the median rate times the mean time says 1.5 GB).
        let mut c = cell("iperf3", "defaults", &[], &[1e9, 2e9, 4e9]);
        for (r, s) in c.runs.iter_mut().zip([1.0, 0.5, 0.25]) {
            r.seconds = s;
            r.cpu_client_seconds = Some(3.0);
            r.cpu_server_seconds = Some(3.0);
        }
        c.summarise(3);
        assert_eq!(cpu_text(Some(&c)), "3.00 + 3.00");
    }

    /// 41.B9: what `defaults` and `best` ran with is said under the table,
    /// `best`'s with its sweep, which ran puts (its gets take the put's
    /// winner); a `best` slower than `defaults` is said.
    #[test]
    fn the_table_says_what_defaults_and_best_ran_with_and_a_best_below_defaults() {
        let swept = |tool: &str, winner: &[&str]| Swept {
            tool: tool.into(),
            path: "loopback".into(),
            workload: "mem".into(),
            winner: Some(winner.iter().map(|a| a.to_string()).collect()),
            candidates: vec![Tried::default(); 6],
            remembered: None,
        };
        let d = doc(
            vec![
                // Below the defaults' median but within their spread: noise, not said.
                cell("iperf3", "defaults", &[], &[9e8, 2e9, 21e8]),
                cell("iperf3", "best", &["-P", "4"], &[1e9, 19e8, 2e9]),
                cell("nuttcp", "defaults", &["-l", "1M"], &[3e9, 3e9, 3e9]),
                cell("nuttcp", "best", &["-N", "1"], &[1e9, 2e9, 15e8]),
            ],
            vec![swept("iperf3", &["-P", "4"]), swept("nuttcp", &["-N", "1"])],
        );
        let l = settings_lines(&d, "mem", 0);
        let want = [
            "(defaults) ran with no options beyond the template's (the tool as installed): iperf3",
            "iperf3 (best) ran with loopback: -P 4, of 6 swept, one run each (swept by puts)",
            "nuttcp (defaults) ran with -l 1M",
            "nuttcp (best) ran with loopback: -N 1, of 6 swept, one run each (swept by puts)",
            "nuttcp (best) came out below its defaults on loopback put: 1500 (1000-2000) against \
             3000 MB/s (its sweep's rounds were puts; -v lists them)",
        ];
        assert_eq!(l, want, "{l:#?}");
        // A run of the sweeps alone (`--runs 0`): no cell ran, the winners are said.
        let d = doc(
            vec![cell("iperf3", "best", &[], &[])]
                .into_iter()
                .map(|mut c| {
                    c.cell.args = None;
                    c
                })
                .collect(),
            vec![swept("iperf3", &["-P", "4"])],
        );
        let l = settings_lines(&d, "mem", 0);
        assert_eq!(
            l,
            ["iperf3 (best) ran with loopback: -P 4, of 6 swept, one run each (swept by puts)"],
            "{l:#?}"
        );
    }
}
