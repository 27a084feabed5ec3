//! `matrix`: the data transfer test matrix (issue 30). Every tool (the
//! templates in [`peers`]) by path (loopback, emulated WANs) by workload,
//! put and get; each cell the median of N runs with its spread, the CPU of
//! both ends and a check of the data. Runs alternate between tools (the
//! order rotates every run) so that a noisy host hurts all alike.

mod archive;
mod cgroup;
mod drive;
mod far;
mod peers;
mod run;
mod sweep;
#[cfg(test)]
mod tests;
mod verify;

#[cfg(test)]
use crate::print::matrix::ratios;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{interrupt_flag, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, MatrixArgs};
use crate::exit;
use longhaul_archive::matrix::{
    self as archived, CellKey, CellRuns as Cell, Document as Doc, Limits, Load, Params, PathSpec,
    Piece, RunResult, ToolRow,
};
use peers::{Kind, Tool};

/// The JSON document's format version (docs/JSON.md, `longhaul-matrix`).
const VERSION: u32 = 2;

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

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

const WORKLOADS: &[&str] = &["mem", "elephant", "smallfiles", "tree"];

/// The steps of a sync into a destination that already holds a copy
/// (made by the same tool before the clock starts): `W+same`, nothing
/// changed; `W+changed`, 1% of the files differ.
const SYNC_STEPS: &[&str] = &["same", "changed"];

/// A workload's data (`smallfiles+changed`'s is `smallfiles`) and, for a
/// sync, its step.
pub(super) fn split_workload(w: &str) -> (&str, Option<&str>) {
    match w.split_once('+') {
        Some((data, step)) => (data, Some(step)),
        None => (w, None),
    }
}

fn known_workload(w: &str) -> bool {
    match split_workload(w) {
        (data, None) => WORKLOADS.contains(&data),
        (data, Some(step)) => {
            data != "mem" && WORKLOADS.contains(&data) && SYNC_STEPS.contains(&step)
        }
    }
}

/// The form the document is printed in (`--json`, `--csv`, `--md`).
fn form(a: &MatrixArgs) -> crate::print::matrix::Form {
    match (a.json, a.csv, a.md) {
        (true, _, _) => crate::print::matrix::Form::Json,
        (_, true, _) => crate::print::matrix::Form::Csv,
        (_, _, true) => crate::print::matrix::Form::Markdown,
        _ => crate::print::matrix::Form::Terminal,
    }
}

/// `longhaul matrix`.
pub fn matrix(a: MatrixArgs, archive_args: &ArchiveArgs, verbose: u8) -> Outcome {
    let bin = std::env::current_exe()
        .map_err(|e| Failure::internal(format!("cannot find this program's path: {e}")))?;
    let quick = a.quick;
    let (paths, params) = paths_and_params(&a)?;
    let tools = known_tools(&a)?;
    let chosen = choose(&tools, &a.tools)?;
    let mut rows = tool_rows(&chosen);
    let (ssh, far_skip) = reach_far(&a, &paths, &chosen, &mut rows)?;
    let remote_path = a.remote_path.clone().unwrap_or_else(|| "longhaul".into());
    let mut plan = plan(&paths, &params.workloads, &chosen, &far_skip);
    if !a.directions.is_empty() {
        plan.retain(|c| a.directions.contains(&c.direction));
    }
    let earlier = kept(&a, &params, &paths)?;
    let todo: Vec<&Cell> = plan
        .iter()
        .filter(|c| !earlier.done.contains_key(&c.key()) && !c.not_run())
        .collect();
    announce(
        &plan,
        &todo,
        &chosen,
        &paths,
        &params,
        &rows,
        a.sweep_rounds,
    );
    if a.dry_run {
        return Ok(exit::OK);
    }
    if a.cold {
        run::drop_caches().map_err(usage)?;
    }

    let (work, _tmp) = work_dir(&a)?;
    versions(&chosen, &bin, &mut rows);
    let stop = interrupt_flag();
    let mut doc = Doc {
        format: "longhaul-matrix".into(),
        format_version: VERSION,
        params: params.clone(),
        tools: rows,
        paths: paths.clone(),
        cells: plan,
        sweeps: earlier.sweeps,
        limits: Limits::default(),
        load: Load {
            start: loadavg(),
            end: String::new(),
        },
        merged: earlier.pieces,
        interrupted: false,
    };
    doc.limits.host_tuning = earlier.tuning;
    if quick {
        remember_winners(archive_args, &mut doc);
    }
    let kept = archive::start(archive_args, &paths, &params);
    let far = ssh.map(|s| (s, remote_path));
    let r = drive::drive(
        &drive::Setup {
            a: &a,
            bin: &bin,
            work: &work,
            chosen: &chosen,
            params: &params,
            stop: &stop,
            far_ssh: far.as_ref(),
            verbose,
        },
        &paths,
        &mut doc,
        &earlier.done,
    );
    doc.interrupted = stop.load(Ordering::SeqCst);
    doc.load.end = loadavg();
    doc.finish_limits();
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
    crate::print::matrix::print(&doc, form(&a), verbose);
    if doc.interrupted {
        return Ok(exit::INTERRUPTED);
    }
    let bad = doc
        .cells
        .iter()
        .any(|c| c.verified == Some(false) || c.error.is_some());
    Ok(if bad { exit::PARTIAL } else { exit::OK })
}

/// The built-in tools, the other builds' (`--build`) and `--tools-file`'s.
fn known_tools(a: &MatrixArgs) -> Result<Vec<Tool>, Failure> {
    let mut tools = peers::builtin();
    let builds = peers::builds(&tools, &a.build).map_err(usage)?;
    tools.extend(builds);
    if let Some(f) = &a.tools_file {
        tools.extend(peers::read_tools_file(f).map_err(usage)?);
    }
    Ok(tools)
}

/// Each chosen tool's row: its settings, and whether it is installed here.
fn tool_rows(chosen: &[(Tool, Vec<String>)]) -> Vec<ToolRow> {
    chosen
        .iter()
        .map(|(t, s)| ToolRow {
            name: t.name.clone(),
            settings: s.clone(),
            installed: peers::missing(t).is_none(),
            note: peers::missing(t),
            version: None,
        })
        .collect()
}

/// Each installed tool's version, asked once, before any clock.
fn versions(chosen: &[(Tool, Vec<String>)], bin: &Path, rows: &mut [ToolRow]) {
    for ((t, _), row) in chosen.iter().zip(rows.iter_mut()) {
        if row.installed {
            let bin = t.bin.clone().unwrap_or_else(|| bin.display().to_string());
            row.version = peers::tool_version(t, &bin);
        }
    }
}

/// `--work-dir`, or a temporary directory removed when its guard drops.
fn work_dir(a: &MatrixArgs) -> Result<(PathBuf, Option<tempfile::TempDir>), Failure> {
    Ok(match &a.work_dir {
        Some(d) => (absolute_dir(d)?, None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("longhaul-matrix.")
                .tempdir()
                .map_err(|e| Failure::internal(format!("cannot make a work directory: {e}")))?;
            (t.path().to_path_buf(), Some(t))
        }
    })
}

/// `--work-dir` as an absolute path: the templates put it in URLs
/// (`ftp://{host}:{port}{dst}/`) and remote paths that only an absolute
/// path makes whole.
fn absolute_dir(d: &Path) -> Result<PathBuf, Failure> {
    std::path::absolute(d).map_err(|e| usage(format!("--work-dir {}: {e}", d.display())))
}

/// The paths and the parameters asked for (`--quick`'s smaller ones).
fn paths_and_params(a: &MatrixArgs) -> Result<(Vec<PathSpec>, Params), Failure> {
    let quick = a.quick;
    // --quick keeps 3 runs a cell: a figure is a median with its spread,
    // never one run. 0 runs: the sweeps alone.
    let runs = a.runs;
    let size = a.size.unwrap_or(if quick { 32 << 20 } else { 1 << 30 });
    let nfiles = a.files.unwrap_or(if quick { 100 } else { 2000 });
    let seconds = a
        .seconds
        .unwrap_or(Duration::from_secs(if quick { 2 } else { 10 }));
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
    if let Some(w) = workloads.iter().find(|w| !known_workload(w)) {
        return Err(usage(format!(
            "unknown workload '{w}': mem, elephant, smallfiles, tree, or a sync after a first \
             copy of a file workload: W+same (nothing changed), W+changed (1% of the files)"
        )));
    }
    Ok((
        paths,
        Params {
            runs,
            elephant_bytes: size,
            small_files: nfiles,
            mem_seconds: seconds.as_secs_f64(),
            workloads,
            cold: a.cold,
            given: vec![],
        },
    ))
}

/// The plan, how long it should take, and the tools that will not run.
fn announce(
    plan: &[Cell],
    todo: &[&Cell],
    chosen: &[(Tool, Vec<String>)],
    paths: &[PathSpec],
    params: &Params,
    rows: &[ToolRow],
    sweep_rounds: u32,
) {
    let runs = params.runs;
    let expected: f64 = todo
        .iter()
        .map(|c| {
            let once = expected_seconds(c, paths, params);
            let swept = if c.settings == peers::BEST && c.direction == "put" {
                sweep::expected_runs(sweep_size(chosen, c, paths), sweep_rounds)
            } else {
                0
            };
            once * (f64::from(runs) + swept as f64)
        })
        .sum::<f64>();
    if runs == 0 {
        eprintln!("longhaul matrix: --runs 0: only the sweeps of `best`, no cell runs");
    }
    eprintln!(
        "longhaul matrix: {} cells ({} kept from --resume), {} run(s) each, and the sweeps of \
         `best`: expected about {:.0} min (a sweep's losers are cut short)",
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
}

/// Which tools, at which settings: every tool at its settings (all but
/// those run on request, and `best`) unless `--tools` names them (`NAME`
/// for those, `NAME:SETTINGS` for one, such as one run on request).
fn choose(tools: &[Tool], want: &[String]) -> Result<Vec<(Tool, Vec<String>)>, Failure> {
    if want.is_empty() {
        return Ok(tools
            .iter()
            .map(|t| (t.clone(), t.default_settings()))
            .collect());
    }
    let mut chosen: Vec<(Tool, Vec<String>)> = Vec::new();
    for w in want {
        let (name, set) = w.split_once(':').unwrap_or((w, ""));
        let Some(t) = tools.iter().find(|t| t.name == name) else {
            let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            return Err(usage(format!(
                "unknown tool '{name}' (known: {})",
                known.join(", ")
            )));
        };
        let sets: Vec<String> = if set.is_empty() {
            t.default_settings()
        } else if t.setting_names().iter().any(|s| s == set) {
            vec![set.to_string()]
        } else {
            return Err(usage(format!(
                "tool '{name}' has no settings '{set}' (it has: {})",
                t.setting_names().join(", ")
            )));
        };
        match chosen.iter_mut().find(|(c, _)| c.name == t.name) {
            Some((_, s)) => s.extend(
                sets.into_iter()
                    .filter(|x| !s.contains(x))
                    .collect::<Vec<_>>(),
            ),
            None => chosen.push((t.clone(), sets)),
        }
    }
    Ok(chosen)
}

/// With a `far` path: the ssh that reaches it, and the tools that may not
/// run there (and why), each noted in its row.
#[allow(clippy::type_complexity)]
fn reach_far(
    a: &MatrixArgs,
    paths: &[PathSpec],
    chosen: &[(Tool, Vec<String>)],
    rows: &mut [ToolRow],
) -> Result<(Option<far::Ssh>, BTreeMap<String, String>), Failure> {
    let Some(host) = paths.iter().find_map(|p| p.far.as_ref()) else {
        return Ok((None, BTreeMap::new()));
    };
    let ssh = far::ssh(host, a.rsh.as_deref()).map_err(usage)?;
    let remote_path = a.remote_path.as_deref().unwrap_or("longhaul");
    let skip = far_lacks(&ssh, host, remote_path, chosen, rows, a.run_timeout)?;
    Ok((Some(ssh), skip))
}

/// On the far host: which tools may not run there (and why), each noted
/// in its row.
fn far_lacks(
    ssh: &far::Ssh,
    host: &str,
    remote_path: &str,
    chosen: &[(Tool, Vec<String>)],
    rows: &mut [ToolRow],
    a_limit: std::time::Duration,
) -> Result<BTreeMap<String, String>, Failure> {
    // What each tool needs there: its programs, and longhaul (the data
    // goes there and comes back for its check with `longhaul cp`).
    let needs: Vec<Vec<String>> = chosen
        .iter()
        .map(|(t, _)| {
            let mut n = t.needs.clone();
            n.push(remote_path.to_string());
            n
        })
        .collect();
    let absent = far::missing(ssh, &needs, a_limit).map_err(|e| Failure {
        code: exit::CONNECT,
        message: format!("--far {host}: {e}"),
    })?;
    let mut skip = BTreeMap::new();
    for ((t, _), gone) in chosen.iter().zip(absent) {
        let why = if t.local {
            continue;
        } else if t.bin.is_some() {
            "not run on --far: another build is a file on this host".to_string()
        } else if !t.far {
            "not run on --far: an anonymous server, kept to loopback and emulated paths".to_string()
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
        skip.insert(t.name.clone(), why.clone());
        if let Some(r) = rows.iter_mut().find(|r| r.name == t.name) {
            r.note = Some(match r.note.take() {
                Some(n) => format!("{n}; {why}"),
                None => why,
            });
        }
    }
    Ok(skip)
}

/// Every cell, in order: path, workload, tool, settings, direction. A
/// tool that cannot run on a path (not installed here, or not run on
/// --far) has its cells all the same, [`Cell::not_run`], with the reason.
fn plan(
    paths: &[PathSpec],
    workloads: &[String],
    chosen: &[(Tool, Vec<String>)],
    far_skip: &BTreeMap<String, String>,
) -> Vec<Cell> {
    let mut plan: Vec<Cell> = Vec::new();
    for p in paths {
        for w in workloads {
            for (t, sets) in chosen {
                let fits = (t.kind == Kind::Mem) == (w == "mem");
                if !fits {
                    continue;
                }
                let why = match far_skip.get(&t.name).filter(|_| p.far.is_some()) {
                    _ if peers::missing(t).is_some() => Some("not installed"),
                    Some(w) => w.split([':', '(']).next().map(str::trim),
                    None => None,
                };
                let sync = split_workload(w).1.is_some();
                if sync && t.sync.is_empty() {
                    continue;
                }
                for s in sets {
                    for d in ["put", "get"] {
                        if d == "get" && (t.get.is_empty() || sync) {
                            continue;
                        }
                        plan.push(Cell {
                            cell: archived::Cell {
                                tool: t.name.clone(),
                                settings: s.clone(),
                                path: p.name.clone(),
                                workload: w.clone(),
                                direction: d.into(),
                                note: why.map(|w| format!("{w} (see the tool's line)")),
                                runs_planned: why.map(|_| 0),
                                runs_succeeded: why.map(|_| 0),
                                ..archived::Cell::default()
                            },
                            runs: vec![],
                        });
                    }
                }
            }
        }
    }
    plan
}

/// What earlier runs' documents give a run.
#[derive(Default)]
struct Kept {
    /// Their finished cells.
    done: BTreeMap<CellKey, Cell>,
    /// Their sweeps with a winner.
    sweeps: Vec<sweep::Swept>,
    /// The `--merge` pieces, each with its load (a piece merged from
    /// pieces gives those).
    pieces: Vec<Piece>,
    /// How the emulated paths' hosts were tuned, by path name.
    tuning: BTreeMap<String, archived::HostTuning>,
}

/// What `--merge` and `--resume` kept ([`resumed`]) for these `paths`; a
/// `--merge` file must be there.
fn kept(a: &MatrixArgs, params: &Params, paths: &[PathSpec]) -> Result<Kept, Failure> {
    if let Some(m) = a.merge.iter().find(|m| !m.is_file()) {
        return Err(usage(format!("--merge {}: no such file", m.display())));
    }
    let files: Vec<&Path> = a
        .merge
        .iter()
        .map(PathBuf::as_path)
        .chain(a.resume.as_deref())
        .collect();
    let mut k = resumed(&files, a.merge.len(), params)?;
    k.tuning.retain(|p, _| paths.iter().any(|s| &s.name == p));
    Ok(k)
}

/// The cells, sweeps and emulated paths' host tuning kept by the `--merge`
/// files, then by the `--resume` file (a later file's cell, winner or
/// tuning replaces an earlier's): cells that ended without an error and
/// sweeps with a winner, of this run's data only (a cell of another size
/// is left out, and said). The first `merged` files are pieces merged:
/// their loads are kept.
fn resumed(files: &[&Path], merged: usize, params: &Params) -> Result<Kept, Failure> {
    let mut kept = Kept::default();
    let mut sweeps = BTreeMap::new();
    for (i, f) in files.iter().enumerate().filter(|(_, f)| f.exists()) {
        let text = std::fs::read_to_string(f)
            .map_err(|e| usage(format!("cannot read {}: {e}", f.display())))?;
        let doc = Doc::from_text(&text).map_err(|e| {
            usage(format!(
                "{}: not a longhaul-matrix document (a --resume file): {e}",
                f.display()
            ))
        })?;
        if i < merged {
            kept.pieces.extend(piece(f, &doc));
        }
        kept.tuning.extend(doc.limits.host_tuning);
        let fits = |w: &str| same_data(&doc.params, params, w);
        let planned = |w: &str| params.workloads.iter().any(|p| p == w);
        let mut other = 0;
        for c in doc
            .cells
            .into_iter()
            .filter(|c| c.error.is_none() && c.rate.is_some())
        {
            if fits(&c.workload) {
                kept.done.insert(c.key(), c);
            } else if planned(&c.workload) {
                other += 1;
            }
        }
        for s in doc.sweeps.into_iter().filter(|s| s.winner.is_some()) {
            if fits(&s.workload) {
                sweeps.insert((s.tool.clone(), s.path.clone(), s.workload.clone()), s);
            } else if planned(&s.workload) {
                other += 1;
            }
        }
        if other > 0 {
            eprintln!(
                "longhaul matrix: {}: {other} cells and sweeps of other data left out (its --size, \
                 --files, --seconds or --cold differ from this run's)",
                f.display()
            );
        }
    }
    kept.sweeps = sweeps.into_values().collect();
    Ok(kept)
}

/// A merged file as pieces: itself with its load, or the pieces it was
/// merged from.
fn piece(f: &Path, doc: &Doc) -> Vec<Piece> {
    if !doc.merged.is_empty() {
        return doc.merged.clone();
    }
    let file = f.file_name().unwrap_or(f.as_os_str());
    vec![Piece {
        file: file.to_string_lossy().into_owned(),
        load: doc.load.clone(),
        versions: doc
            .tools
            .iter()
            .filter_map(|t| Some((t.name.clone(), t.version.clone()?)))
            .collect(),
    }]
}

/// Whether a cell of `workload` kept under `kept` measured this run's data:
/// memory to memory for as long, files of the same sizes, as cold.
fn same_data(kept: &Params, now: &Params, workload: &str) -> bool {
    if split_workload(workload).0 == "mem" {
        return kept.mem_seconds == now.mem_seconds;
    }
    (kept.elephant_bytes, kept.small_files, kept.cold)
        == (now.elephant_bytes, now.small_files, now.cold)
}

/// `--quick`: the winners of the last archived matrix that swept each
/// tool on a path and workload, instead of sweeping again.
fn remember_winners(args: &ArchiveArgs, doc: &mut Doc) {
    let Some(path) = crate::cmd::archive_file(args).filter(|p| p.exists()) else {
        return;
    };
    let Ok(a) = longhaul_archive::store::Archive::open(&path) else {
        return;
    };
    let Ok(runs) = archived::matrix_runs(&a, 20) else {
        return;
    };
    for r in runs {
        let Ok(detail) = a.run(r.run.id) else {
            continue;
        };
        let Some(old) = detail
            .summary
            .and_then(|s| serde_json::from_value::<Doc>(s).ok())
        else {
            continue;
        };
        let when = longhaul_archive::when::utc(r.run.started_at).unwrap_or_default();
        for mut s in old.sweeps.into_iter().filter(|s| s.winner.is_some()) {
            let known = doc
                .sweeps
                .iter()
                .any(|k| (&k.tool, &k.path, &k.workload) == (&s.tool, &s.path, &s.workload));
            if !known {
                s.remembered
                    .get_or_insert_with(|| format!("run {} of {when}", r.run.id));
                doc.sweeps.push(s);
            }
        }
    }
}

/// How many candidates a cell's sweep runs, at most.
fn sweep_size(chosen: &[(Tool, Vec<String>)], c: &Cell, paths: &[PathSpec]) -> usize {
    let Some(s) = chosen
        .iter()
        .find(|(t, _)| t.name == c.tool)
        .and_then(|(t, _)| t.sweep.as_ref())
    else {
        return 0;
    };
    let facts = paths.iter().find(|p| p.name == c.path).map_or(
        sweep::PathFacts {
            rate_bps: 100_000_000_000,
            rtt_s: 0.0,
            socket_cap: 4 << 20,
        },
        |p| drive::facts(p, p.rate_bps.unwrap_or(100_000_000_000)),
    );
    sweep::candidates(s, &facts).len()
}

fn expected_seconds(c: &Cell, paths: &[PathSpec], p: &Params) -> f64 {
    let path = paths.iter().find(|x| x.name == c.path);
    let rtt = path.map_or(0.0, |x| x.rtt_ms / 1e3);
    let rate = path
        .and_then(|x| x.rate_bps)
        .map_or(300e6, |r| (r as f64 / 8.0).min(300e6));
    let (data, step) = split_workload(&c.workload);
    // A sync's first copy runs before its clock, as long as a put.
    let copies = if step.is_some() { 2.0 } else { 1.0 };
    let bytes = copies
        * match data {
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
