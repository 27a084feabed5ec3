//! `matrix`: the data transfer test matrix (issue 30). Every tool (the
//! templates in [`peers`]) by path (loopback, emulated WANs) by workload,
//! put and get; each cell the median of N runs with its spread, the CPU of
//! both ends and a check of the data. Runs alternate between tools (the
//! order rotates every run) so that a noisy host hurts all alike.

mod archive;
mod drive;
mod far;
mod peers;
mod ratios;
mod run;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{interrupt_flag, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, MatrixArgs};
use crate::exit;
use longhaul_archive::matrix::{self as archived, CellKey, Cpu, Limits, Rate, ToolRow};
use peers::{Kind, Tool};

/// The JSON document's format version (docs/JSON.md, `longhaul-matrix`).
const VERSION: u32 = 1;

/// One path: loopback or an emulated WAN.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PathSpec {
    name: String,
    rtt_ms: f64,
    loss: f64,
    /// Bits per second; none on loopback and `far`.
    rate_bps: Option<u64>,
    /// `far`: the host (`--far`) the path reaches by ssh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    far: Option<String>,
}

fn path_spec(s: &str, rate: u64, far: Option<&str>) -> Result<PathSpec, String> {
    let named = |rtt_ms: f64, loss: f64| PathSpec {
        name: s.to_string(),
        rtt_ms,
        loss,
        rate_bps: Some(rate),
        far: None,
    };
    Ok(match s {
        "loopback" => PathSpec {
            name: s.into(),
            rtt_ms: 0.0,
            loss: 0.0,
            rate_bps: None,
            far: None,
        },
        "far" => match far {
            // Its RTT is the real network's, not set by the matrix.
            Some(h) => PathSpec {
                name: format!("far:{h}"),
                rtt_ms: 0.0,
                loss: 0.0,
                rate_bps: None,
                far: Some(h.to_string()),
            },
            None => return Err("the path 'far' needs --far HOST".into()),
        },
        "lan" => named(0.2, 0.0),
        "80ms" => named(80.0, 1e-5),
        "100ms" => named(100.0, 0.0),
        "satellite" => named(540.0, 1e-4),
        _ => {
            let parts: Vec<&str> = s.split('/').collect();
            let [rtt, loss, r] = parts[..] else {
                return Err(format!(
                    "unknown path '{s}': loopback, lan, 80ms, 100ms, satellite, RTT/LOSS/RATE \
                     (e.g. 50ms/1e-5/1gbit) or far (with --far HOST)"
                ));
            };
            let rtt = longhaul_proto::units::parse_duration(rtt)
                .map_err(|e| format!("path '{s}': {e}"))?;
            let loss: f64 = loss
                .parse()
                .ok()
                .filter(|l| (0.0..=1.0).contains(l))
                .ok_or_else(|| format!("path '{s}': the loss must be a probability (0 to 1)"))?;
            let r = longhaul_proto::units::parse_rate(r).map_err(|e| format!("path '{s}': {e}"))?;
            PathSpec {
                name: s.into(),
                rtt_ms: rtt.as_secs_f64() * 1e3,
                loss,
                rate_bps: Some(r),
                far: None,
            }
        }
    })
}

/// One run of a cell.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct RunResult {
    bytes_per_second: Option<f64>,
    seconds: f64,
    cpu_client_seconds: f64,
    cpu_server_seconds: f64,
    verified: Option<bool>,
    error: Option<String>,
}

/// One cell: a tool at one settings, on one path, one workload, one
/// direction, as the archive's readers see it, and its runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Cell {
    #[serde(flatten)]
    cell: archived::Cell,
    runs: Vec<RunResult>,
}

impl std::ops::Deref for Cell {
    type Target = archived::Cell;
    fn deref(&self) -> &archived::Cell {
        &self.cell
    }
}

impl std::ops::DerefMut for Cell {
    fn deref_mut(&mut self) -> &mut archived::Cell {
        &mut self.cell
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Doc {
    format: String,
    format_version: u32,
    params: Params,
    tools: Vec<ToolRow>,
    paths: Vec<PathSpec>,
    cells: Vec<Cell>,
    limits: Limits,
    interrupted: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Params {
    runs: u32,
    elephant_bytes: u64,
    small_files: u32,
    mem_seconds: f64,
    workloads: Vec<String>,
}

const WORKLOADS: &[&str] = &["mem", "elephant", "smallfiles", "tree"];

/// `longhaul matrix`.
pub fn matrix(a: MatrixArgs, archive_args: &ArchiveArgs) -> Outcome {
    let bin = std::env::current_exe()
        .map_err(|e| Failure::internal(format!("cannot find this program's path: {e}")))?;
    let quick = a.quick;
    let runs = if quick { 1 } else { a.runs.max(1) };
    let size = a.size.unwrap_or(if quick { 64 << 20 } else { 1 << 30 });
    let nfiles = a.files.unwrap_or(if quick { 200 } else { 2000 });
    let seconds = a
        .seconds
        .unwrap_or(Duration::from_secs(if quick { 3 } else { 10 }));
    let paths: Vec<String> = if a.paths.is_empty() {
        if a.far.is_some() {
            vec!["far".into()]
        } else if quick {
            vec!["loopback".into(), "lan".into()]
        } else {
            vec!["loopback".into(), "80ms".into()]
        }
    } else {
        a.paths.clone()
    };
    let paths: Vec<PathSpec> = paths
        .iter()
        .map(|p| path_spec(p, a.rate, a.far.as_deref()))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    let workloads: Vec<String> = if a.workloads.is_empty() {
        WORKLOADS.iter().map(|s| s.to_string()).collect()
    } else {
        a.workloads.clone()
    };
    if let Some(w) = workloads.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
        return Err(usage(format!(
            "unknown workload '{w}': mem, elephant, smallfiles, tree"
        )));
    }
    let mut tools = peers::builtin();
    if let Some(f) = &a.tools_file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| usage(format!("cannot read --tools-file {}: {e}", f.display())))?;
        let more: Vec<Tool> = serde_json::from_str(&text).map_err(|e| {
            usage(format!(
                "--tools-file {}: not a list of tool templates (docs/JSON.md, \"matrix tools\"): {e}",
                f.display()
            ))
        })?;
        tools.extend(more);
    }
    // Which tools, at which settings.
    let mut chosen: Vec<(Tool, Vec<String>)> = Vec::new();
    if a.tools.is_empty() {
        chosen = tools
            .iter()
            .map(|t| {
                (
                    t.clone(),
                    t.settings.iter().map(|s| s.name.clone()).collect(),
                )
            })
            .collect();
    } else {
        for want in &a.tools {
            let (name, set) = want.split_once(':').unwrap_or((want, ""));
            let Some(t) = tools.iter().find(|t| t.name == name) else {
                let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                return Err(usage(format!(
                    "unknown tool '{name}' (known: {})",
                    known.join(", ")
                )));
            };
            let sets: Vec<String> = if set.is_empty() {
                t.settings.iter().map(|s| s.name.clone()).collect()
            } else if t.settings.iter().any(|s| s.name == set) {
                vec![set.to_string()]
            } else {
                return Err(usage(format!("tool '{name}' has no settings '{set}'")));
            };
            match chosen.iter_mut().find(|(c, _)| c.name == t.name) {
                Some((_, s)) => s.extend(sets),
                None => chosen.push((t.clone(), sets)),
            }
        }
    }
    let mut rows: Vec<ToolRow> = chosen
        .iter()
        .map(|(t, s)| ToolRow {
            name: t.name.clone(),
            settings: s.clone(),
            installed: peers::missing(t).is_none(),
            note: peers::missing(t),
        })
        .collect();
    // On the far host: which tools may run there, and which it lacks.
    let far_path = paths
        .iter()
        .find_map(|p| p.far.as_ref().map(|h| (p.name.clone(), h)));
    let mut far_skip: BTreeMap<String, String> = BTreeMap::new();
    let ssh = match (&far_path, &a.far) {
        (Some(_), Some(h)) => Some(far::Ssh::new(h, a.rsh.as_deref()).map_err(usage)?),
        _ => None,
    };
    let remote_path = a.remote_path.clone().unwrap_or_else(|| "longhaul".into());
    if let (Some(ssh), Some((_, host))) = (&ssh, &far_path) {
        // What each tool needs there: its programs, and longhaul (the data
        // goes there and comes back for its check with `longhaul cp`).
        let needs: Vec<Vec<String>> = chosen
            .iter()
            .map(|(t, _)| {
                let mut n = t.needs.clone();
                n.push(remote_path.clone());
                n
            })
            .collect();
        let absent = ssh.missing(&needs).map_err(|e| Failure {
            code: exit::CONNECT,
            message: format!("--far {host}: {e}"),
        })?;
        for ((t, _), gone) in chosen.iter().zip(absent) {
            let why = if t.local {
                continue;
            } else if !t.far {
                "not run on --far: an anonymous server, kept to loopback and emulated paths"
                    .to_string()
            } else if !gone.is_empty() {
                format!(
                    "not installed on {host} ({} not on PATH there){}",
                    gone.join(", "),
                    if t.package.is_empty() {
                        String::new()
                    } else {
                        format!(": apt-get install {}", t.package)
                    }
                )
            } else {
                continue;
            };
            far_skip.insert(t.name.clone(), why.clone());
            if let Some(r) = rows.iter_mut().find(|r| r.name == t.name) {
                r.note = Some(match r.note.take() {
                    Some(n) => format!("{n}; {why}"),
                    None => why,
                });
            }
        }
    }
    let params = Params {
        runs,
        elephant_bytes: size,
        small_files: nfiles,
        mem_seconds: seconds.as_secs_f64(),
        workloads: workloads.clone(),
    };
    // The plan: every cell, in order.
    let mut plan: Vec<Cell> = Vec::new();
    for p in &paths {
        for w in &workloads {
            for (t, sets) in &chosen {
                let fits = (t.kind == Kind::Mem) == (w == "mem");
                if !fits
                    || peers::missing(t).is_some()
                    || (p.far.is_some() && far_skip.contains_key(&t.name))
                {
                    continue;
                }
                for s in sets {
                    for d in ["put", "get"] {
                        if d == "get" && t.get.is_empty() {
                            continue;
                        }
                        plan.push(Cell {
                            cell: archived::Cell {
                                tool: t.name.clone(),
                                settings: s.clone(),
                                path: p.name.clone(),
                                workload: w.clone(),
                                direction: d.into(),
                                ..archived::Cell::default()
                            },
                            runs: vec![],
                        });
                    }
                }
            }
        }
    }
    let mut done: BTreeMap<CellKey, Cell> = BTreeMap::new();
    if let Some(f) = a.resume.as_ref().filter(|f| f.exists()) {
        let text = std::fs::read_to_string(f)
            .map_err(|e| usage(format!("cannot read --resume {}: {e}", f.display())))?;
        let doc: Doc = serde_json::from_str(&text).map_err(|e| {
            usage(format!(
                "--resume {}: not a longhaul-matrix document: {e}",
                f.display()
            ))
        })?;
        for c in doc.cells.into_iter().filter(|c| c.error.is_none()) {
            done.insert(c.key(), c);
        }
    }
    let todo: Vec<&Cell> = plan
        .iter()
        .filter(|c| !done.contains_key(&c.key()))
        .collect();
    let expected: f64 = todo
        .iter()
        .map(|c| expected_seconds(c, &paths, &params))
        .sum::<f64>()
        * f64::from(runs);
    eprintln!(
        "longhaul matrix: {} cells ({} kept from --resume), {} run(s) each: expected about {:.0} min",
        plan.len(),
        plan.len() - todo.len(),
        runs,
        (expected / 60.0).ceil().max(0.0)
    );
    for r in rows.iter().filter(|r| r.note.is_some()) {
        eprintln!(
            "  {}: {}",
            r.name,
            r.note.as_deref().unwrap_or("not installed")
        );
    }
    if a.dry_run {
        return Ok(exit::OK);
    }

    let (work, _tmp) = match &a.work_dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("longhaul-matrix.")
                .tempdir()
                .map_err(|e| Failure::internal(format!("cannot make a work directory: {e}")))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let stop = interrupt_flag();
    let mut doc = Doc {
        format: "longhaul-matrix".into(),
        format_version: VERSION,
        params: params.clone(),
        tools: rows,
        paths: paths.clone(),
        cells: plan.clone(),
        limits: Limits::default(),
        interrupted: false,
    };
    let kept = archive::start(archive_args, &paths, &params);
    let far = ssh.map(|s| (s, remote_path));
    let r = drive::drive(
        &a,
        &bin,
        &work,
        &chosen,
        &paths,
        &params,
        &mut doc,
        &done,
        &stop,
        far.as_ref(),
    );
    doc.interrupted = stop.load(Ordering::SeqCst);
    finish_limits(&mut doc);
    if let Some(f) = &a.resume {
        save(f, &doc);
    }
    archive::finish(kept, &doc, r.as_ref().err());
    if let Err(e) = r {
        return Err(Failure {
            code: exit::FAILED,
            message: e,
        });
    }
    print(&a, &doc);
    if doc.interrupted {
        return Ok(exit::INTERRUPTED);
    }
    let bad = doc
        .cells
        .iter()
        .any(|c| c.verified == Some(false) || c.error.is_some());
    Ok(if bad { exit::PARTIAL } else { exit::OK })
}

fn expected_seconds(c: &Cell, paths: &[PathSpec], p: &Params) -> f64 {
    let path = paths.iter().find(|x| x.name == c.path);
    let rtt = path.map_or(0.0, |x| x.rtt_ms / 1e3);
    let rate = path
        .and_then(|x| x.rate_bps)
        .map_or(300e6, |r| (r as f64 / 8.0).min(300e6));
    let bytes = match c.workload.as_str() {
        "mem" => return p.mem_seconds + 1.0 + 4.0 * rtt,
        "elephant" => p.elephant_bytes as f64,
        "smallfiles" => f64::from(p.small_files) * 33e3,
        _ => p.elephant_bytes as f64 / 4.0,
    };
    1.0 + 20.0 * rtt + bytes / rate
}

fn save(f: &Path, doc: &Doc) {
    let tmp = f.with_extension("tmp");
    if let Ok(text) = serde_json::to_string_pretty(doc) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
}

/// A cell's median, spread, CPU and verdict from its runs.
fn summarise(c: &mut Cell) {
    let mut rates: Vec<f64> = c.runs.iter().filter_map(|r| r.bytes_per_second).collect();
    rates.sort_by(f64::total_cmp);
    if let Some(e) = c.runs.iter().find_map(|r| r.error.clone()) {
        c.error = Some(e);
    }
    if !rates.is_empty() {
        let n = rates.len();
        let med = if n % 2 == 1 {
            rates[n / 2]
        } else {
            (rates[n / 2 - 1] + rates[n / 2]) / 2.0
        };
        c.rate = Some(Rate {
            median_bytes_per_second: med,
            min_bytes_per_second: rates[0],
            max_bytes_per_second: rates[n - 1],
            median_bits_per_second: med * 8.0,
        });
        let k = c.runs.len() as f64;
        c.cpu_seconds = Some(Cpu {
            client_seconds: c.runs.iter().map(|r| r.cpu_client_seconds).sum::<f64>() / k,
            server_seconds: c.runs.iter().map(|r| r.cpu_server_seconds).sum::<f64>() / k,
        });
    }
    let v: Vec<bool> = c.runs.iter().filter_map(|r| r.verified).collect();
    c.verified = (!v.is_empty()).then(|| v.iter().all(|&x| x));
}

fn finish_limits(doc: &mut Doc) {
    for c in &doc.cells {
        let Some(r) = &c.rate else { continue };
        if c.workload == "mem" {
            let e = doc
                .limits
                .mem_to_mem_bytes_per_second
                .entry(c.path.clone())
                .or_insert(0.0);
            *e = e.max(r.median_bytes_per_second);
        } else if c.tool == "cp" && c.direction == "put" && c.verified == Some(true) {
            doc.limits
                .local_copy_bytes_per_second
                .entry(c.workload.clone())
                .or_insert(r.median_bytes_per_second);
        }
    }
}

fn cell_text(c: Option<&Cell>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let Some(r) = &c.rate else {
        return if c.error.is_some() { "failed" } else { "-" }.into();
    };
    let mut s = format!(
        "{:.0} ({:.2})",
        r.median_bytes_per_second / 1e6,
        r.median_bits_per_second / 1e9
    );
    if c.verified == Some(false) {
        s.push_str(" NOT VERIFIED");
    } else if c.error.is_some() {
        s.push_str(" some runs failed");
    }
    s
}

fn print(a: &MatrixArgs, doc: &Doc) {
    if a.json {
        crate::print::out_json(&serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into()));
        return;
    }
    if a.csv {
        outln!(
            "tool,settings,path,workload,direction,mb_per_s,gbit_per_s,min_mb_per_s,max_mb_per_s,\
             cpu_client_s,cpu_server_s,verified,error"
        );
        for c in &doc.cells {
            let r = c.rate.clone().unwrap_or_default();
            let cpu = c.cpu_seconds.clone().unwrap_or_default();
            outln!(
                "{},{},{},{},{},{:.1},{:.3},{:.1},{:.1},{:.2},{:.2},{},{}",
                c.tool,
                c.settings,
                c.path,
                c.workload,
                c.direction,
                r.median_bytes_per_second / 1e6,
                r.median_bits_per_second / 1e9,
                r.min_bytes_per_second / 1e6,
                r.max_bytes_per_second / 1e6,
                cpu.client_seconds,
                cpu.server_seconds,
                c.verified.map_or(String::new(), |v| v.to_string()),
                c.error.as_deref().unwrap_or("").replace([',', '\n'], ";")
            );
        }
        return;
    }
    let md = a.md;
    // The seed's layout: one table per workload, a row per tool and
    // settings, a column per path and direction; MB/s with Gbit/s beside.
    for w in &doc.params.workloads {
        let cols: Vec<(String, &str)> = doc
            .paths
            .iter()
            .flat_map(|p| ["put", "get"].map(|d| (p.name.clone(), d)))
            .collect();
        let mut rows: Vec<Vec<String>> = Vec::new();
        for t in &doc.tools {
            for s in &t.settings {
                let cells: Vec<Option<&Cell>> = cols
                    .iter()
                    .map(|(p, d)| {
                        doc.cells.iter().find(|c| {
                            c.tool == t.name
                                && &c.settings == s
                                && &c.path == p
                                && &c.workload == w
                                && c.direction == *d
                        })
                    })
                    .collect();
                if cells.iter().all(Option::is_none) {
                    continue;
                }
                let mut row = vec![format!("{} ({s})", t.name)];
                row.extend(cells.into_iter().map(cell_text));
                rows.push(row);
            }
        }
        if rows.is_empty() {
            continue;
        }
        let what = match w.as_str() {
            "mem" => format!("memory to memory, {} s", doc.params.mem_seconds),
            "elephant" => format!(
                "one file of {}",
                longhaul_proto::units::format_bytes(doc.params.elephant_bytes)
            ),
            "smallfiles" => format!("{} files of 1-64 KiB", doc.params.small_files),
            _ => "a mixed tree".to_string(),
        };
        let mut head = vec!["tool".to_string()];
        head.extend(cols.iter().map(|(p, d)| format!("{p} {d}")));
        outln!("{w} ({what}): MB/s (Gbit/s)");
        if md {
            outln!("");
            outln!("| {} |", head.join(" | "));
            outln!("|---|{}", "---:|".repeat(head.len() - 1));
            for r in &rows {
                outln!("| {} |", r.join(" | "));
            }
        } else {
            let widths: Vec<usize> = (0..head.len())
                .map(|j| {
                    rows.iter()
                        .map(|r| r[j].len())
                        .chain([head[j].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for r in std::iter::once(&head).chain(&rows) {
                let mut line = format!("{:w$}", r[0], w = widths[0]);
                for (x, w) in r.iter().zip(&widths).skip(1) {
                    line.push_str(&format!("  {x:>w$}"));
                }
                outln!("{}", line.trim_end());
            }
        }
        outln!("");
        let ratios = ratios::lines(doc, w);
        if !ratios.is_empty() {
            outln!("longhaul against the best peer and the limit:");
            for l in ratios {
                outln!("{}{l}", if md { "- " } else { "  " });
            }
            outln!("");
        }
    }
    let bullet = if md { "- " } else { "" };
    for t in doc.tools.iter().filter(|t| t.note.is_some()) {
        outln!(
            "{bullet}{}: {}",
            t.name,
            t.note.as_deref().unwrap_or("not installed")
        );
    }
    let mb = |v: f64| format!("{:.0} MB/s", v / 1e6);
    if let Some(l) = crate::print::matrix::limits_line(&doc.limits, mb) {
        outln!("{bullet}{l}");
    }
    for l in doc
        .cells
        .iter()
        .filter_map(|c| crate::print::matrix::note_line(c))
    {
        outln!("{bullet}{l}");
    }
}
