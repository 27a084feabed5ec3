//! `history`, `show`, `where`: the archive, read. Each opens the archive
//! read-only; a missing, damaged or newer archive is an error naming the
//! file, and the file is left as it is.

use std::path::PathBuf;

use longhaul_archive::model::{FileHit, HistoryFilter, RunDetail, RunRow, KINDS};
use longhaul_archive::Archive;
use longhaul_proto::units::{escaped, format_bytes, format_rate};
use serde_json::json;

use super::{usage, Failure, Outcome};
use crate::args::{ArchiveArgs, HistoryArgs, ShowArgs, WhereArgs};
use crate::exit;

/// Version of `history --json` (`longhaul-history`).
pub const HISTORY_JSON_FORMAT_VERSION: u32 = 1;
/// Version of `show --json` (`longhaul-show`).
pub const SHOW_JSON_FORMAT_VERSION: u32 = 1;
/// Version of `where --json` (`longhaul-where`).
pub const WHERE_JSON_FORMAT_VERSION: u32 = 1;

/// The archive file the flags name, or the default one.
pub fn archive_path(a: &ArchiveArgs) -> Result<PathBuf, Failure> {
    a.archive
        .clone()
        .or_else(longhaul_archive::default_path)
        .ok_or_else(|| usage("no archive: HOME is not set; name one with --archive FILE"))
}

/// Opens the archive to read it.
pub fn open(a: &ArchiveArgs) -> Result<Archive, Failure> {
    let path = archive_path(a)?;
    Archive::open_read_only(&path).map_err(archive_failure)
}

/// An archive error as the command's failure: bad input (a missing run, a
/// damaged file) is the user's to fix.
pub fn archive_failure(e: longhaul_archive::ArchiveError) -> Failure {
    use longhaul_archive::ArchiveError as E;
    let code = match e {
        E::Io { .. } => exit::FAILED,
        _ => exit::USAGE,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

/// `--since`: [`longhaul_archive::when::parse_since`], the dashboard's grammar too.
fn parse_since(s: &str) -> Result<f64, Failure> {
    longhaul_archive::when::parse_since(s, longhaul_archive::store::unix_now())
        .map_err(|e| usage(format!("--since {e}")))
}

/// Unix seconds as `2026-11-23 20:15:07` (UTC).
fn when(t: f64) -> String {
    longhaul_archive::when::utc(t).unwrap_or_else(|| "date unknown".into())
}

/// `longhaul history`.
pub fn history(a: HistoryArgs, archive: &ArchiveArgs) -> Outcome {
    if let Some(k) = &a.kind {
        if !KINDS.contains(&k.as_str()) {
            return Err(usage(format!(
                "--kind {k}: expected one of {}",
                KINDS.join(", ")
            )));
        }
    }
    let filter = HistoryFilter {
        kind: a.kind.clone(),
        host: a.host.clone(),
        since: a.since.as_deref().map(parse_since).transpose()?,
        export: a.export.clone(),
        status: None,
        limit: a.limit,
    };
    let db = open(archive)?;
    let runs = db.history(&filter).map_err(archive_failure)?;
    if a.json {
        let runs: Vec<serde_json::Value> = runs.iter().map(|r| run_json(r, r)).collect();
        let doc = json!({
            "format": "longhaul-history",
            "format_version": HISTORY_JSON_FORMAT_VERSION,
            "archive": db.path(),
            "runs": runs,
        });
        crate::print::out_json(&doc.to_string());
        return Ok(exit::OK);
    }
    if runs.is_empty() {
        outln!("no runs in {} match", db.path().display());
        return Ok(exit::OK);
    }
    outln!(
        "{:>5}  {:<19}  {:<10}  {:<11}  {:<28}  {:>10}  {:>14}  verdict",
        "run",
        "started (UTC)",
        "kind",
        "status",
        "host / path",
        "bytes",
        "rate"
    );
    for r in &runs {
        outln!("{}", history_line(r));
    }
    Ok(exit::OK)
}

/// cp and sync: `push` when the destination is a server's, `pull` when a
/// source is (the run's `remote_host` is then the server it came from).
fn direction(r: &RunRow) -> Option<&'static str> {
    if !matches!(r.kind.as_str(), "cp" | "sync") {
        return None;
    }
    if r.dest
        .as_deref()
        .and_then(longhaul_proto::xfer::parse_remote)
        .is_some()
    {
        Some("push")
    } else if r.remote_host.is_some() {
        Some("pull")
    } else {
        None
    }
}

/// A run for `--json` (`row`: the run, or more of it), with `direction`
/// for a cp or sync.
fn run_json<T: serde::Serialize>(r: &RunRow, row: &T) -> serde_json::Value {
    let mut v = serde_json::to_value(row).unwrap_or_default();
    if let (Some(d), serde_json::Value::Object(m)) = (direction(r), &mut v) {
        m.insert("direction".into(), d.into());
    }
    v
}

/// `cp push`, `sync pull`, `perf`: the kind, and which way a transfer went.
fn kind_of(r: &RunRow) -> String {
    match direction(r) {
        Some(d) => format!("{} {d}", r.kind),
        None => r.kind.clone(),
    }
}

fn history_line(r: &RunRow) -> String {
    let what = r
        .remote_host
        .clone()
        .or_else(|| r.dest.clone())
        .unwrap_or_else(|| r.local_host.clone());
    let what = match &r.export {
        Some(e) => format!("{what} ({e})"),
        None => what,
    };
    let what = escaped(&what).to_string();
    let bytes = r.bytes.unwrap_or(r.live_bytes);
    let rate = r.bits_per_second.or(r.live_bps);
    format!(
        "{:>5}  {:<19}  {:<10}  {:<11}  {:<28}  {:>10}  {:>14}  {}",
        r.id,
        when(r.started_at),
        kind_of(r),
        if r.dry_run {
            format!("{} (dry)", r.status)
        } else {
            r.status.clone()
        },
        shorten(&what, 28),
        if bytes > 0 {
            format_bytes(bytes)
        } else {
            "-".into()
        },
        rate.map_or_else(|| "-".into(), format_rate),
        r.verdict.as_deref().unwrap_or("-")
    )
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let tail: String = s
        .chars()
        .rev()
        .take(n - 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}

/// Files `show` lists without `--all-files`.
const SHOWN_FILES: usize = 20;

/// `longhaul show`.
pub fn show(a: ShowArgs, archive: &ArchiveArgs) -> Outcome {
    let db = open(archive)?;
    let id = db.resolve(&a.run).map_err(archive_failure)?;
    let detail = db.run(id).map_err(archive_failure)?;
    let files = db
        .files(id, if a.all_files { 0 } else { SHOWN_FILES })
        .map_err(archive_failure)?;
    if a.json {
        let doc = json!({
            "format": "longhaul-show",
            "format_version": SHOW_JSON_FORMAT_VERSION,
            "run": run_json(&detail.run, &detail),
            "files": files,
            "files_complete": a.all_files || detail.file_count as usize <= files.len(),
        });
        crate::print::out_json(&doc.to_string());
        return Ok(exit::OK);
    }
    print_run(&detail);
    if !files.is_empty() {
        outln!("files ({} in the catalogue):", detail.file_count);
        for f in &files {
            outln!(
                "  {}  {:>10}  {} -> {}",
                f.digest
                    .as_deref()
                    .map_or("-", |d| d.get(..16).unwrap_or(d)),
                format_bytes(f.size),
                escaped(&f.source),
                escaped(&f.dest)
            );
        }
        if (files.len() as u64) < detail.file_count {
            outln!(
                "  ... {} more (--all-files)",
                detail.file_count - files.len() as u64
            );
        }
    }
    Ok(exit::OK)
}

fn print_run(d: &RunDetail) {
    print_run_head(&d.run);
    print_moved(d);
    if let Some(s) = &d.summary {
        report(&d.run.kind, s);
    }
    if d.run.lost > 0 {
        outln!(
            "  lost      {} rows the archive could not keep (disk full?)",
            d.run.lost
        );
    }
    for w in &d.warnings {
        outln!("  warning   {w}");
    }
    print_intervals(d);
}

/// What ran, when and where, and how it ended.
fn print_run_head(r: &RunRow) {
    outln!(
        "run {}: {} ({}){}",
        r.id,
        kind_of(r),
        r.status,
        if r.dry_run {
            ", a dry run: nothing was sent, written or deleted"
        } else {
            ""
        }
    );
    // The command line may hold anything its caller typed (a matrix's tool
    // names from a --tools-file): no byte a terminal acts on.
    outln!("  command   {}", escaped(&r.command));
    outln!(
        "  started   {} UTC on {}{}",
        when(r.started_at),
        r.local_host,
        r.ended_at
            .map(|e| format!(", ended {} UTC", when(e)))
            .unwrap_or_default()
    );
    for (k, v) in [
        ("remote", &r.remote_host),
        ("export", &r.export),
        ("grant", &r.grant),
        ("source", &r.source),
        ("dest", &r.dest),
        ("verdict", &r.verdict),
        ("error", &r.error),
    ] {
        if let Some(v) = v {
            outln!("  {k:<9} {}", escaped(v));
        }
    }
}

/// What the run moved (or, dry, would have), and each stage's rate.
fn print_moved(d: &RunDetail) {
    let r = &d.run;
    if let (true, Some(s)) = (r.dry_run, &d.summary) {
        let count = |k: &str| {
            s.get(k)
                .and_then(serde_json::Value::as_array)
                .map_or(0, Vec::len)
        };
        outln!(
            "  would     send {} file(s) and link(s), {}; delete {}",
            count("would_send"),
            format_bytes(
                s.get("would_send_bytes")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            ),
            count("deleted")
        );
    } else if let Some(b) = r.bytes {
        let resumed = d
            .summary
            .as_ref()
            .and_then(|s| s.get("resumed_bytes"))
            .and_then(serde_json::Value::as_u64)
            .filter(|&n| n > 0);
        outln!(
            "  moved     {}{}{} in {:.1} s, {}{}",
            format_bytes(b),
            r.files.map(|f| format!(" ({f} files)")).unwrap_or_default(),
            resumed.map_or_else(String::new, |n| format!(
                ": {} sent, {} resumed from an earlier run;",
                format_bytes(b.saturating_sub(n)),
                format_bytes(n)
            )),
            r.seconds.unwrap_or(0.0),
            r.bits_per_second.map_or_else(|| "-".into(), format_rate),
            match r.verified {
                Some(true) => ", verified",
                Some(false) => ", NOT all verified",
                None => "",
            }
        );
    }
    if let Some(s) = &d.summary {
        let stage = |k: &str| s.get(k).and_then(serde_json::Value::as_f64);
        if let (Some(rd), Some(net), Some(wr)) = (
            stage("source_read_bps"),
            stage("network_bps"),
            stage("dest_write_bps"),
        ) {
            outln!(
                "  stages    read {}, network {}, write {}",
                format_rate(rd),
                format_rate(net),
                format_rate(wr)
            );
        }
    }
}

/// The intervals of all streams together.
fn print_intervals(d: &RunDetail) {
    let totals: Vec<_> = d.intervals.iter().filter(|i| i.stream < 0).collect();
    if !totals.is_empty() {
        outln!("intervals (all streams):");
        for i in totals {
            outln!(
                "  {:>7.1}-{:<7.1} {:<5} {:>14}{}{}{}",
                i.start_s,
                i.end_s,
                i.direction,
                format_rate(i.bits_per_second),
                i.retransmits
                    .map(|r| format!("  {r:>6} retr"))
                    .unwrap_or_default(),
                i.rtt_us
                    .map(|r| format!("  rtt {:.2} ms", f64::from(r) / 1000.0))
                    .unwrap_or_default(),
                i.limit
                    .as_deref()
                    .map(|l| format!("  {l}"))
                    .unwrap_or_default()
            );
        }
    }
}

/// A doctor's or a bench disk's report, as the command printed it: its
/// stages and verdict, its figures.
fn report(kind: &str, summary: &serde_json::Value) {
    if matches!(kind, "doctor" | "bench-disk") {
        outln!("{kind} report:");
    }
    // Its text came from a peer (a server's host name, notes) or from the
    // archive file: printed on one line each, no byte a terminal acts on.
    let mut summary = summary.clone();
    crate::print::human::printable(&mut summary);
    let printed = match kind {
        "doctor" => serde_json::from_value(summary.clone())
            .map(|r| crate::print::human::print_doctor(&r))
            .is_ok(),
        "bench-disk" => serde_json::from_value(summary)
            .map(|r| crate::print::human::print_disk(&r))
            .is_ok(),
        longhaul_archive::matrix::KIND => longhaul_archive::matrix::Document::from_doc(&summary)
            .map(|m| print_matrix(&m))
            .is_some(),
        _ => true,
    };
    if !printed {
        outln!("  (this longhaul cannot read the {kind} report: see show --json)");
    }
}

/// A matrix as the command printed it (`print::matrix`'s tables, ratio
/// lines and limits), under a line that counts its cells.
fn print_matrix(m: &longhaul_archive::matrix::Document) {
    outln!(
        "matrix: {} cells, {} tool(s) on {}{}",
        m.cells.len(),
        m.rows().len(),
        m.path_names().join(", "),
        if m.interrupted { ", interrupted" } else { "" }
    );
    crate::print::matrix::tables(m, false, 0);
}

/// `longhaul where`.
pub fn where_(a: WhereArgs, archive: &ArchiveArgs) -> Outcome {
    let db = open(archive)?;
    // A local path is recorded absolute: look it up that way too.
    let absolute = || {
        std::path::absolute(&a.what).map_or_else(|_| a.what.clone(), |p| p.display().to_string())
    };
    let (what, hits) = if longhaul_archive::store::is_digest_prefix(&a.what) {
        // A digest or a prefix of one; else a file named in hex digits.
        let hits = db.find(&a.what).map_err(archive_failure)?;
        if hits.is_empty() {
            let what = absolute();
            let hits = db.find(&what).map_err(archive_failure)?;
            (
                if hits.is_empty() {
                    a.what.clone()
                } else {
                    what
                },
                hits,
            )
        } else {
            (a.what.clone(), hits)
        }
    } else if longhaul_proto::xfer::parse_remote(&a.what).is_none() {
        let what = absolute();
        let hits = db.find(&what).map_err(archive_failure)?;
        (what, hits)
    } else {
        let hits = db.find(&a.what).map_err(archive_failure)?;
        (a.what.clone(), hits)
    };
    if a.json {
        let doc = json!({
            "format": "longhaul-where",
            "format_version": WHERE_JSON_FORMAT_VERSION,
            "query": what,
            "hits": hits,
        });
        crate::print::out_json(&doc.to_string());
        return Ok(exit::OK);
    }
    if hits.is_empty() {
        outln!("no archived run moved {what}");
        return Ok(exit::OK);
    }
    for h in &hits {
        outln!("{}", where_line(h));
    }
    Ok(exit::OK)
}

fn where_line(h: &FileHit) -> String {
    format!(
        "run {} ({}, {} UTC, {}): {} -> {}  {}  {}{}",
        h.run,
        h.kind,
        when(h.started_at),
        h.status,
        h.file.source,
        h.file.dest,
        format_bytes(h.file.size),
        h.file.digest.as_deref().unwrap_or("-"),
        if h.file.verified { "  verified" } else { "" }
    )
}
