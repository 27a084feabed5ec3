//! `matrix`: the data transfer test matrix (issue 30). Every tool (the
//! templates in [`peers`]) by path (loopback, emulated WANs) by workload,
//! put and get; each cell the median of N runs with its spread, the CPU of
//! both ends and a check of the data. Runs alternate between tools (the
//! order rotates every run) so that a noisy host hurts all alike.

mod archive;
mod far;
mod peers;
mod ratios;
mod run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{interrupt_flag, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, MatrixArgs};
use crate::exit;
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
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RunResult {
    bytes_per_second: Option<f64>,
    seconds: f64,
    cpu_client_seconds: f64,
    cpu_server_seconds: f64,
    verified: Option<bool>,
    error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Rate {
    median_bytes_per_second: f64,
    min_bytes_per_second: f64,
    max_bytes_per_second: f64,
    median_bits_per_second: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Cpu {
    client_seconds: f64,
    server_seconds: f64,
}

/// One cell: a tool at one settings, on one path, one workload, one direction.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Cell {
    tool: String,
    settings: String,
    path: String,
    workload: String,
    direction: String,
    rate: Option<Rate>,
    cpu_seconds: Option<Cpu>,
    /// true: every run's destination equalled the source; false: one did
    /// not; null: nothing to verify (memory to memory) or nothing ran.
    verified: Option<bool>,
    error: Option<String>,
    note: Option<String>,
    runs: Vec<RunResult>,
}

impl Cell {
    fn key(&self) -> (String, String, String, String, String) {
        (
            self.tool.clone(),
            self.settings.clone(),
            self.path.clone(),
            self.workload.clone(),
            self.direction.clone(),
        )
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Limits {
    /// The best memory-to-memory cell on each path.
    mem_to_mem_bytes_per_second: BTreeMap<String, f64>,
    /// A local copy (`cp -a`) of each file workload, median of the runs.
    local_copy_bytes_per_second: BTreeMap<String, f64>,
    /// Writing the elephant's size to the destination's file system, synced.
    destination_write_bytes_per_second: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct ToolRow {
    name: String,
    settings: Vec<String>,
    installed: bool,
    note: Option<String>,
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
                            tool: t.name.clone(),
                            settings: s.clone(),
                            path: p.name.clone(),
                            workload: w.clone(),
                            direction: d.into(),
                            rate: None,
                            cpu_seconds: None,
                            verified: None,
                            error: None,
                            note: None,
                            runs: vec![],
                        });
                    }
                }
            }
        }
    }
    let mut done: BTreeMap<_, Cell> = BTreeMap::new();
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
    let r = drive(
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

/// Runs every cell not yet done, path by path.
#[allow(clippy::too_many_arguments)]
fn drive(
    a: &MatrixArgs,
    bin: &Path,
    work: &Path,
    chosen: &[(Tool, Vec<String>)],
    paths: &[PathSpec],
    params: &Params,
    doc: &mut Doc,
    done: &BTreeMap<(String, String, String, String, String), Cell>,
    stop: &std::sync::atomic::AtomicBool,
    far_ssh: Option<&(far::Ssh, String)>,
) -> Result<(), String> {
    let mk = |p: &Path| std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()));
    let (data, logs, state) = (work.join("data"), work.join("logs"), work.join("state"));
    for d in [&data, &logs, &state] {
        mk(d)?;
    }
    let hosts = work.join("hosts");
    // The host's own names (gridftp resolves this machine's name) and the two hosts.
    let etc = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    std::fs::write(&hosts, format!("{etc}\n198.18.0.1\ta\n198.18.0.2\tb\n"))
        .map_err(|e| format!("{}: {e}", hosts.display()))?;
    for c in doc.cells.iter_mut() {
        if let Some(d) = done.get(&c.key()) {
            *c = d.clone();
        }
    }
    // The data, and each file workload's manifest, made once.
    let mut manifests = BTreeMap::new();
    let mut sizes = BTreeMap::new();
    for w in params.workloads.iter().filter(|w| *w != "mem") {
        let d = data.join(w);
        if !d.exists() {
            eprintln!("longhaul matrix: making the {w} data in {}", d.display());
            run::make_data(w, &d, params.elephant_bytes, params.small_files)
                .map_err(|e| format!("cannot make the {w} data in {}: {e}", d.display()))?;
        }
        let m = run::manifest(&d).map_err(|e| format!("cannot read {}: {e}", d.display()))?;
        sizes.insert(w.clone(), m.values().map(|(l, _)| l).sum::<u64>());
        manifests.insert(w.clone(), m);
    }
    if params.workloads.iter().any(|w| w != "mem") {
        doc.limits.destination_write_bytes_per_second =
            run::write_rate(&work.join("limits"), params.elephant_bytes.min(1 << 30)).ok();
    }
    // Client environments (tokens, fingerprints), once per tool.
    let mut envs: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut ports: BTreeMap<String, (u16, u16)> = BTreeMap::new();
    let vars0 = |t: &Tool| -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("bin", bin.display().to_string()),
            ("root", work.display().to_string()),
            ("state", state.join(&t.name).display().to_string()),
            ("seconds", format!("{}", params.mem_seconds.ceil() as u64)),
        ])
    };
    let total = doc.cells.iter().filter(|c| c.runs.is_empty()).count() * params.runs as usize;
    let mut step = 0usize;
    for p in paths {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let pending: Vec<usize> = (0..doc.cells.len())
            .filter(|&i| doc.cells[i].path == p.name && doc.cells[i].runs.is_empty())
            .collect();
        if pending.is_empty() {
            continue;
        }
        let wan = match p.rate_bps.filter(|_| p.name != "loopback") {
            None => None,
            Some(r) => match run::wan_up(bin, Duration::from_secs_f64(p.rtt_ms / 1e3), p.loss, r) {
                Ok(w) => Some(w),
                Err(e) => {
                    for &i in &pending {
                        doc.cells[i].error = Some(e.clone());
                    }
                    eprintln!("longhaul matrix: path {}: {e}", p.name);
                    continue;
                }
            },
        };
        // Loopback in a network namespace of its own where we may make one
        // (root): the peers' servers (anonymous GridFTP, an rsync daemon as
        // root) are then out of reach of every other process on the host.
        let private = if wan.is_none() && p.far.is_none() {
            run::PrivateNs::new()
        } else {
            None
        };
        // A real far host: its work directory, and the data there.
        let far = match (&p.far, far_ssh) {
            (Some(_), Some((ssh, rp))) => match open_far(bin, ssh, rp, &data, params) {
                Ok(f) => Some(f),
                Err(e) => {
                    for &i in &pending {
                        doc.cells[i].error = Some(e.clone());
                    }
                    eprintln!("longhaul matrix: path {}: {e}", p.name);
                    continue;
                }
            },
            _ => None,
        };
        let remote_path = far_ssh.map(|(_, rp)| rp.as_str()).unwrap_or("longhaul");
        let (ns_a, ns_b, host) = match (&wan, &private) {
            _ if far.is_some() => (
                None,
                None,
                far.as_ref().map(|f| f.addr.clone()).unwrap_or_default(),
            ),
            (Some(w), _) => (Some(w.ns_a.clone()), Some(w.ns_b.clone()), w.host_b.clone()),
            (None, Some(n)) => (
                Some(n.name.clone()),
                Some(n.name.clone()),
                "127.0.0.1".into(),
            ),
            (None, None) => (None, None, "127.0.0.1".to_string()),
        };
        // What `{rate}` says: the path's bottleneck, or more than loopback carries.
        let path_rate = p.rate_bps.unwrap_or(100_000_000_000);
        // The servers this path needs.
        let mut servers: BTreeMap<String, Served> = BTreeMap::new();
        let mut server_error: BTreeMap<String, String> = BTreeMap::new();
        for (t, _) in chosen {
            let needed = pending.iter().any(|&i| doc.cells[i].tool == t.name);
            let Some(s) = t.server.as_ref().filter(|_| needed) else {
                continue;
            };
            let tstate = state.join(&t.name);
            mk(&tstate)?;
            if let Some(f) = &far {
                if t.over_ssh {
                    // The far host's own sshd, reached with the user's ssh.
                    let w = tstate.join("ssh");
                    write_script(&w, &format!("#!/bin/sh\nexec {} \"$@\"\n", f.ssh.rsh_line))?;
                    continue;
                }
            }
            // The server's side: here, or on the far host.
            let mut vars = match &far {
                Some(f) => far_vars(f, t, remote_path, params),
                None => vars0(t),
            };
            let key = env_key(t, far.is_some());
            if let std::collections::btree_map::Entry::Vacant(slot) = envs.entry(key) {
                let mut env = BTreeMap::new();
                for e in &t.env {
                    let argv: Vec<String> = e.argv.iter().map(|x| peers::fill(x, &vars)).collect();
                    let out = match &far {
                        Some(f) => (|| {
                            let words: Vec<&str> = argv.iter().map(String::as_str).collect();
                            let state = far::join(&[&vars["state"]])?;
                            f.ssh
                                .run(&format!("mkdir -p {state} && {}", far::join(&words)?), None)
                        })(),
                        None => std::process::Command::new(&argv[0])
                            .args(&argv[1..])
                            .stderr(std::process::Stdio::null())
                            .output()
                            .map_err(|e| e.to_string())
                            .and_then(|o| {
                                if o.status.success() {
                                    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
                                } else {
                                    Err(o.status.to_string())
                                }
                            }),
                    };
                    match out {
                        Ok(o) => {
                            env.insert(e.var.clone(), o);
                        }
                        Err(why) => {
                            server_error.insert(
                                t.name.clone(),
                                format!("`{}` failed: {why}", argv.join(" ")),
                            );
                        }
                    }
                }
                slot.insert(env);
            }
            let pp = match ports.get(&t.name) {
                Some(p) if wan.is_some() => *p,
                _ if far.is_some() => far_ports(),
                _ => run::free_ports()?,
            };
            ports.insert(t.name.clone(), pp);
            vars.insert("host", host.clone());
            vars.insert("rate", path_rate.to_string());
            vars.insert("port", pp.0.to_string());
            vars.insert("port1", pp.1.to_string());
            let argv: Vec<String> = s.argv.iter().map(|x| peers::fill(x, &vars)).collect();
            if let Some(f) = &far {
                let started = (|| {
                    for (name, text) in &s.files {
                        f.write(
                            &format!("{}/{name}", vars["state"]),
                            &peers::fill(text, &vars),
                        )?;
                    }
                    f.start_server(&argv, &format!("{}/server.log", vars["state"]), pp.0)
                })();
                match started {
                    Ok(o) => {
                        servers.insert(t.name.clone(), Served::Far(o));
                    }
                    Err(e) => {
                        server_error.insert(t.name.clone(), e);
                    }
                }
                continue;
            }
            for (name, text) in &s.files {
                let f = tstate.join(name);
                std::fs::write(&f, peers::fill(text, &vars))
                    .map_err(|e| format!("{}: {e}", f.display()))?;
            }
            let hf = (s.hosts_file && wan.is_some()).then_some(hosts.as_path());
            let log = logs.join(format!(
                "{}-{}-server.log",
                p.name.replace('/', "_"),
                t.name
            ));
            match run::start_server(&argv, ns_b.as_deref(), hf, &host, pp.0, &log) {
                Ok(o) => {
                    servers.insert(t.name.clone(), Served::Here(o));
                }
                Err(e) => {
                    server_error.insert(t.name.clone(), e);
                }
            }
        }
        for w in &params.workloads {
            let cells: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&i| &doc.cells[i].workload == w)
                .collect();
            for &i in &cells {
                if let Some(e) = server_error.get(&doc.cells[i].tool) {
                    doc.cells[i].error = Some(e.clone());
                }
            }
            let live: Vec<usize> = cells
                .iter()
                .copied()
                .filter(|&i| doc.cells[i].error.is_none())
                .collect();
            for r in 0..params.runs as usize {
                for k in 0..live.len() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let i = live[(k + r) % live.len()];
                    let c = doc.cells[i].clone();
                    let Some((t, _)) = chosen.iter().find(|(t, _)| t.name == c.tool) else {
                        continue;
                    };
                    let Some(s) = t.settings.iter().find(|s| s.name == c.settings) else {
                        continue;
                    };
                    step += 1;
                    let mut vars = vars0(t);
                    let pp = ports.get(&t.name).copied().unwrap_or((0, 0));
                    vars.insert("host", host.clone());
                    vars.insert("rate", path_rate.to_string());
                    vars.insert("port", pp.0.to_string());
                    vars.insert("port1", pp.1.to_string());
                    let tag = format!(
                        "{}-{}-{}-{}-{}-r{r}",
                        p.name.replace('/', "_"),
                        w,
                        t.name,
                        s.name,
                        c.direction
                    );
                    // The far side of a run: the far host's work directory
                    // on --far (the put's destination, the get's source),
                    // else this one's (its servers serve it).
                    let far_here = far.as_ref().filter(|_| !t.local);
                    let put = c.direction == "put";
                    let far_root = far_here.map(|f| PathBuf::from(&f.root));
                    let root = far_root.as_deref().unwrap_or(work);
                    let src = if put {
                        data.join(w)
                    } else {
                        root.join("data").join(w)
                    };
                    let dstdir = if put { root } else { work }.join(&c.direction).join(&tag);
                    let far_dst = far_here.filter(|_| put && w != "mem");
                    if w != "mem" {
                        match far_dst {
                            Some(f) => f.mkdir(&dstdir.display().to_string())?,
                            None => {
                                let _ = std::fs::remove_dir_all(&dstdir);
                                mk(&dstdir)?;
                            }
                        }
                    }
                    let dst = dstdir.join(w);
                    let rel = |x: &Path| {
                        x.strip_prefix(root)
                            .map(|r| r.display().to_string())
                            .unwrap_or_default()
                    };
                    vars.insert("src", src.display().to_string());
                    vars.insert("dst", dst.display().to_string());
                    vars.insert("dstdir", dstdir.display().to_string());
                    vars.insert("name", w.clone());
                    vars.insert("src_rel", rel(&src));
                    vars.insert("dst_rel", rel(&dst));
                    vars.insert("dstdir_rel", rel(&dstdir));
                    vars.insert("ssh", state.join(&t.name).join("ssh").display().to_string());
                    vars.insert(
                        "sshhost",
                        far_here.map_or(host.clone(), |f| f.ssh.dest.clone()),
                    );
                    let template = if put { &t.put } else { &t.get };
                    let argv = peers::argv(template, s, &vars);
                    let cpu0 = servers.get_mut(&t.name).map_or(0.0, Served::cpu);
                    let netns = if t.local { None } else { ns_a.as_deref() };
                    let env = envs
                        .get(&env_key(t, far_here.is_some()))
                        .cloned()
                        .unwrap_or_default();
                    let ran = run::run_client(&argv, netns, &env, a.run_timeout, stop, &logs, &tag);
                    let cpu1 = servers.get_mut(&t.name).map_or(0.0, Served::cpu);
                    let mut res = RunResult {
                        bytes_per_second: None,
                        seconds: ran.seconds,
                        cpu_client_seconds: ran.cpu,
                        cpu_server_seconds: (cpu1 - cpu0).max(0.0),
                        verified: None,
                        error: ran.error,
                    };
                    if res.error.is_none() {
                        if w == "mem" {
                            match peers::read_figure(t.figure, &ran.stdout) {
                                Ok(b) => res.bytes_per_second = Some(b),
                                Err(e) => res.error = Some(e),
                            }
                        } else {
                            let bytes = sizes.get(w).copied().unwrap_or(0);
                            res.bytes_per_second = Some(bytes as f64 / ran.seconds.max(1e-9));
                            // A far copy comes back (the far longhaul reads
                            // it) to be compared here.
                            let check = work.join("check").join(&tag);
                            let got = match far_dst {
                                Some(f) => {
                                    let _ = std::fs::remove_dir_all(&check);
                                    mk(&check)?;
                                    f.pull(bin, remote_path, &dst.display().to_string(), &check)
                                        .map(|()| check.join(w))
                                }
                                None => Ok(dst.clone()),
                            };
                            let bad = match got {
                                Ok(d) => manifests.get(w).and_then(|m| run::verify(m, &d)),
                                Err(e) => Some(format!("cannot read the far copy: {e}")),
                            };
                            let _ = std::fs::remove_dir_all(&check);
                            res.verified = Some(bad.is_none());
                            if let Some(b) = bad {
                                doc.cells[i].note = Some(format!("not verified: {b}"));
                            }
                        }
                    }
                    if w != "mem" {
                        match far_dst {
                            Some(f) => f.remove(&dstdir.display().to_string()),
                            None => {
                                let _ = std::fs::remove_dir_all(&dstdir);
                            }
                        }
                    }
                    eprintln!(
                        "[{step}/{total}] {} {w} {} {}:{}: {}",
                        p.name,
                        c.direction,
                        t.name,
                        s.name,
                        match (&res.error, res.bytes_per_second) {
                            (Some(e), _) => format!("failed: {e}"),
                            (None, Some(b)) => format!(
                                "{:.1} MB/s{}",
                                b / 1e6,
                                match res.verified {
                                    Some(true) => ", verified",
                                    Some(false) => ", NOT VERIFIED",
                                    None => "",
                                }
                            ),
                            (None, None) => "no figure".into(),
                        }
                    );
                    doc.cells[i].runs.push(res);
                }
            }
            for &i in &live {
                // A cell cut short by an interrupt is run again whole by --resume.
                if doc.cells[i].runs.len() < params.runs as usize {
                    doc.cells[i].runs.clear();
                    doc.cells[i].error = None;
                } else {
                    summarise(&mut doc.cells[i]);
                }
            }
            if let Some(f) = &a.resume {
                save(f, doc);
            }
        }
        drop(servers);
        drop(far);
        drop(wan);
        drop(private);
    }
    Ok(())
}

/// A peer's server: here (or in an emulator's namespace), or on the far host.
enum Served {
    Here(run::Owned),
    Far(far::FarServer),
}

impl Served {
    /// CPU seconds of its process group so far.
    fn cpu(&mut self) -> f64 {
        match self {
            Served::Here(o) => run::group_cpu(o.pid()),
            Served::Far(s) => s.cpu(),
        }
    }
}

/// Which client environment (token, fingerprint): a far server's differs.
fn env_key(t: &Tool, far: bool) -> String {
    if far {
        format!("{}@far", t.name)
    } else {
        t.name.clone()
    }
}

/// A server's placeholders on the far host.
fn far_vars(
    f: &far::Far,
    t: &Tool,
    remote_path: &str,
    params: &Params,
) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("bin", remote_path.to_string()),
        ("root", f.root.clone()),
        ("state", format!("{}/state/{}", f.root, t.name)),
        ("seconds", format!("{}", params.mem_seconds.ceil() as u64)),
    ])
}

/// Two ports for a far server: random, high, outside Linux's ephemeral
/// range (32768-60999), so a far client's socket is unlikely to hold one;
/// one in use is seen before the start (it already accepts) or by the
/// server's failure to bind.
fn far_ports() -> (u16, u16) {
    let mut b = [0u8; 4];
    let _ = getrandom_bytes(&mut b);
    let a = 20000 + u16::from_le_bytes([b[0], b[1]]) % 12000;
    (a, a + 1 + u16::from(b[2] % 100))
}

fn getrandom_bytes(b: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")?.read_exact(b)
}

/// A small executable script (owner only).
fn write_script(p: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(p, text)
        .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Opens the far host's work directory and copies the file workloads' data there.
fn open_far(
    bin: &Path,
    ssh: &far::Ssh,
    remote_path: &str,
    data: &Path,
    params: &Params,
) -> Result<far::Far, String> {
    let f = far::Far::open(ssh, &data.with_file_name("far-ssh.sock"))?;
    eprintln!(
        "longhaul matrix: work directory on {}: {} (its servers on {})",
        ssh.dest, f.root, f.addr
    );
    let fdata = format!("{}/data", f.root);
    f.mkdir(&fdata)?;
    for w in params.workloads.iter().filter(|w| *w != "mem") {
        eprintln!("longhaul matrix: copying the {w} data to {}", ssh.dest);
        f.push(bin, remote_path, &data.join(w), &fdata)?;
    }
    Ok(f)
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
        println!(
            "{}",
            serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into())
        );
        return;
    }
    if a.csv {
        println!(
            "tool,settings,path,workload,direction,mb_per_s,gbit_per_s,min_mb_per_s,max_mb_per_s,\
             cpu_client_s,cpu_server_s,verified,error"
        );
        for c in &doc.cells {
            let r = c.rate.clone().unwrap_or_default();
            let cpu = c.cpu_seconds.clone().unwrap_or_default();
            println!(
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
        println!("{w} ({what}): MB/s (Gbit/s)");
        if md {
            println!();
            println!("| {} |", head.join(" | "));
            println!("|---|{}", "---:|".repeat(head.len() - 1));
            for r in &rows {
                println!("| {} |", r.join(" | "));
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
                println!("{}", line.trim_end());
            }
        }
        println!();
        let ratios = ratios::lines(doc, w);
        if !ratios.is_empty() {
            println!("longhaul against the best peer and the limit:");
            for l in ratios {
                println!("{}{l}", if md { "- " } else { "  " });
            }
            println!();
        }
    }
    let bullet = if md { "- " } else { "" };
    for t in doc.tools.iter().filter(|t| t.note.is_some()) {
        println!(
            "{bullet}{}: {}",
            t.name,
            t.note.as_deref().unwrap_or("not installed")
        );
    }
    let l = &doc.limits;
    let mut lim = Vec::new();
    for (p, v) in &l.mem_to_mem_bytes_per_second {
        lim.push(format!("memory to memory on {p} {:.0} MB/s", v / 1e6));
    }
    for (w, v) in &l.local_copy_bytes_per_second {
        lim.push(format!("local copy of {w} {:.0} MB/s", v / 1e6));
    }
    if let Some(v) = l.destination_write_bytes_per_second {
        lim.push(format!("destination write {:.0} MB/s", v / 1e6));
    }
    if !lim.is_empty() {
        println!("{bullet}limits in the same run: {}", lim.join("; "));
    }
    for c in doc
        .cells
        .iter()
        .filter(|c| c.note.is_some() || c.error.is_some())
    {
        println!(
            "{bullet}note: {} ({}) {} {} {}: {}",
            c.tool,
            c.settings,
            c.path,
            c.workload,
            c.direction,
            c.note.as_deref().or(c.error.as_deref()).unwrap_or("")
        );
    }
}
