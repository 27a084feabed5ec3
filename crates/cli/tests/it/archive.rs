//! The archive end to end: runs of the real binary recorded with their
//! files, read back by `history`, `show` and `where`; `--no-archive`; an
//! archive that is damaged, from a newer longhaul or on a full disk never
//! stops a transfer and is never overwritten.

use std::fs;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

use crate::common;
use common::xfer::*;
use common::{assert_exit, bin, stderr, stdout, SmallDisk, TempDir};

#[test]
fn a_push_and_a_pull_are_archived_with_every_file() {
    let t = TempDir::new("archive-cp");
    let archive = t.path().join("a/archive.db");
    let src = t.path().join("src/odd name");
    fs::create_dir_all(src.join("sub")).unwrap();
    write_random(&src.join("sub/one"), 300_000, 1);
    write_random(&src.join("two words"), 1000, 2);
    fs::write(src.join("empty"), b"").unwrap();
    let exp = t.dir("export");
    let s = data_server(&exp, &t.dir("state"));
    let digests = t.path().join("digests.txt");
    let o = with_archive(
        &archive,
        &[
            "cp",
            "-r",
            "--json",
            "--digests",
            digests.to_str().unwrap(),
            src.to_str().unwrap(),
            &remote(s.addr(), ""),
        ],
    );
    assert_exit(&o, 0);

    let h = json_ok(&archive, &["history", "--json"]);
    assert_eq!(h["format"], "longhaul-history");
    assert_eq!(h["format_version"], 1);
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{h}");
    let run = &runs[0];
    assert_eq!(run["kind"], "cp");
    assert_eq!(run["status"], "ok");
    assert_eq!(run["export"], "data");
    assert_eq!(run["bytes"], 301_000);
    assert_eq!(run["files"], 3);
    assert_eq!(run["verified"], true);

    let show = json_ok(&archive, &["show", "last", "--json", "--all-files"]);
    assert_eq!(show["format"], "longhaul-show");
    let files = show["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{show}");
    let one = files
        .iter()
        .find(|f| f["path"] == "odd name/sub/one")
        .unwrap_or_else(|| panic!("{show}"));
    let src_one = src.join("sub/one");
    assert_eq!(one["source"], src_one.to_str().unwrap());
    let dest_one = format!(
        "{}:{}:data/odd name/sub/one",
        s.addr().ip(),
        s.addr().port()
    );
    assert_eq!(one["dest"], dest_one);
    assert_eq!(one["size"], 300_000);
    // The digest is the one --digests wrote.
    let listed = fs::read_to_string(&digests).unwrap();
    let digest = one["digest"].as_str().unwrap();
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(digest) && l.ends_with("sub/one")),
        "{digest} not in {listed}"
    );

    // Pull it back: the destination is this host's absolute path.
    let pulled = t.dir("pulled");
    let o = with_archive(
        &archive,
        &[
            "cp",
            "-r",
            &remote(s.addr(), "odd name"),
            pulled.to_str().unwrap(),
        ],
    );
    assert_exit(&o, 0);
    let local = pulled.join("odd name/sub/one");
    let w = json_ok(&archive, &["where", "--json", local.to_str().unwrap()]);
    let hits = w["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{w}");
    assert_eq!(hits[0]["source"], dest_one);
    assert_eq!(hits[0]["verified"], true);
    // By digest: both runs moved these bytes.
    let w = json_ok(&archive, &["where", "--json", digest]);
    assert_eq!(w["hits"].as_array().unwrap().len(), 2, "{w}");
    // By the source path, as a person types it (relative works too).
    let o = with_archive(&archive, &["where", src_one.to_str().unwrap()]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("verified"), "{}", stdout(&o));

    // Which way each went: the newest first.
    let h = json_ok(&archive, &["history", "--json"]);
    let ways: Vec<&str> = h["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["direction"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ways, ["pull", "push"], "{h}");
    let o = with_archive(&archive, &["history"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert!(lines[0].contains(" cp pull "), "{out}");
    assert!(lines[1].contains(" cp push "), "{out}");
    let o = with_archive(&archive, &["show", "1"]);
    assert!(
        stdout(&o).starts_with("run 1: cp push (ok)"),
        "{}",
        stdout(&o)
    );
    let show = json_ok(&archive, &["show", "2", "--json"]);
    assert_eq!(show["run"]["direction"], "pull", "{show}");

    // Filters and the human forms.
    let h = json_ok(&archive, &["history", "--json", "--kind", "perf"]);
    assert!(h["runs"].as_array().unwrap().is_empty());
    // `--since` reads the one duration grammar (docs/GUIDE.md "Durations").
    for since in ["1h", "1h30m", "1.5h", "2d", "90m 30s"] {
        let o = with_archive(&archive, &["history", "--since", since]);
        assert_exit(&o, 0);
        assert_eq!(stdout(&o).lines().count(), 3, "{since}: {}", stdout(&o));
    }
    let o = with_archive(&archive, &["history", "--since", "3600"]);
    assert_exit(&o, 2);
    let o = with_archive(&archive, &["show", "1"]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("verified"), "{}", stdout(&o));
    let o = with_archive(&archive, &["history", "--kind", "nonsense"]);
    assert_exit(&o, 2);
    let o = with_archive(&archive, &["show", "77"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("no run 77"), "{}", stderr(&o));
    let o = with_archive(&archive, &["history", "--since", "yesterday-ish"]);
    assert_exit(&o, 2);
}

#[test]
fn no_archive_records_nothing() {
    let t = TempDir::new("archive-none");
    let archive = t.path().join("archive.db");
    let src = t.path().join("f");
    write_random(&src, 1000, 3);
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let o = with_archive(
        &archive,
        &[
            "cp",
            "--no-archive",
            src.to_str().unwrap(),
            &remote(s.addr(), ""),
        ],
    );
    assert_exit(&o, 0);
    assert!(!archive.exists());
    let o = with_archive(&archive, &["history"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("no archive at"), "{}", stderr(&o));
}

fn assert_transfer_goes_on(archive: &Path, says: &str) {
    let before = fs::read(archive).unwrap();
    let err = push_archived(archive, 100_000);
    assert!(err.contains("not archiving this run"), "{err}");
    assert!(err.contains(&archive.display().to_string()), "{err}");
    assert!(err.contains(says), "{err}");
    assert_eq!(
        fs::read(archive).unwrap(),
        before,
        "the archive was changed"
    );
    let o = with_archive(archive, &["history"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains(says), "{}", stderr(&o));
    assert_eq!(
        fs::read(archive).unwrap(),
        before,
        "the archive was changed"
    );
}

#[test]
fn a_damaged_archive_never_stops_a_transfer_and_is_left_alone() {
    let t = TempDir::new("archive-damaged");
    let archive = t.path().join("archive.db");
    fs::write(&archive, vec![0x5a; 4096]).unwrap();
    assert_transfer_goes_on(&archive, "damaged");
}

#[test]
fn a_newer_archive_never_stops_a_transfer_and_is_left_alone() {
    let t = TempDir::new("archive-newer");
    let archive = t.path().join("archive.db");
    let c = rusqlite::Connection::open(&archive).unwrap();
    c.execute_batch("CREATE TABLE runs (id INTEGER PRIMARY KEY); PRAGMA user_version = 7;")
        .unwrap();
    drop(c);
    assert_transfer_goes_on(&archive, "newer");
}

#[test]
fn a_perf_run_keeps_every_stream_and_its_verdict() {
    let t = TempDir::new("archive-perf");
    let archive = t.path().join("archive.db");
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let o = with_archive(
        &archive,
        &[
            "perf",
            &s.addr().to_string(),
            "-t",
            "2",
            "-i",
            "0.5",
            "-P",
            "2",
            "--json-stream",
        ],
    );
    assert_exit(&o, 0);
    for line in stdout(&o).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["format_version"], 2, "{line}");
    }
    let show = json_ok(&archive, &["show", "last", "--json"]);
    let run = &show["run"];
    assert_eq!(run["kind"], "perf");
    assert_eq!(run["status"], "ok");
    assert!(run["verdict"].is_string(), "{run}");
    let intervals = run["intervals"].as_array().unwrap();
    let streams: std::collections::BTreeSet<i64> = intervals
        .iter()
        .map(|i| i["stream"].as_i64().unwrap())
        .collect();
    assert_eq!(
        streams.into_iter().collect::<Vec<_>>(),
        vec![-1, 0, 1],
        "{intervals:?}"
    );
    assert!(run["params"].is_object(), "the setup is kept: {run}");
}

/// Waits until the newest run in `archive` has `n` intervals committed.
fn wait_for_intervals(archive: &Path, n: usize) {
    let start = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let o = with_archive(archive, &["show", "last", "--json"]);
        if o.status.success()
            && json_of(&o)["run"]["intervals"]
                .as_array()
                .is_some_and(|i| i.len() >= n)
        {
            return;
        }
        assert!(
            start.elapsed().as_secs() < 40,
            "no intervals archived: {}",
            stderr(&o)
        );
    }
}

/// A perf of 60 s against `s`, archived into `archive`.
fn long_perf(archive: &Path, addr: std::net::SocketAddr) -> std::process::Child {
    bin()
        .arg("--archive")
        .arg(archive)
        .args(["perf", &addr.to_string(), "-t", "60", "-i", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_run_keeps_what_it_recorded() {
    let t = TempDir::new("archive-killed");
    let archive = t.path().join("archive.db");
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let mut child = long_perf(&archive, s.addr());
    // Wait for some intervals to be committed, then kill -9.
    wait_for_intervals(&archive, 3);
    child.kill().unwrap();
    child.wait().unwrap();
    let show = json_ok(&archive, &["show", "last", "--json"]);
    assert_eq!(show["run"]["status"], "interrupted", "{show}");
    assert!(show["run"]["intervals"].as_array().unwrap().len() >= 3);
}

#[test]
fn a_full_disk_under_the_archive_loses_rows_not_the_transfer() {
    let t = TempDir::new("archive-full");
    let Some(disk) = SmallDisk::mount(&t.path().join("small"), 512) else {
        return;
    };
    let archive = disk.path().join("archive.db");
    // An archive with a run in it, then the disk filled to the brim.
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let seed = t.path().join("seed");
    write_random(&seed, 10, 5);
    let o = with_archive(
        &archive,
        &["cp", seed.to_str().unwrap(), &remote(s.addr(), "")],
    );
    assert_exit(&o, 0);
    let mut n: u64 = 0;
    while fs::write(disk.path().join(format!("fill{n}")), vec![0u8; 4096]).is_ok() {
        n += 1;
    }
    // Room to start the run, not to keep its files.
    for i in n.saturating_sub(16)..n {
        let _ = fs::remove_file(disk.path().join(format!("fill{i}")));
    }
    // Many files: their catalogue rows need room the disk does not have.
    let src = t.path().join("many");
    fs::create_dir_all(&src).unwrap();
    for i in 0..2000 {
        fs::write(
            src.join(format!("file-with-a-long-name-{i:05}")),
            i.to_string(),
        )
        .unwrap();
    }
    let exp = t.dir("export2");
    let s2 = data_server(&exp, &t.dir("state2"));
    let o = with_archive(
        &archive,
        &["cp", "-r", src.to_str().unwrap(), &remote(s2.addr(), "")],
    );
    assert_exit(&o, 0);
    assert_same_tree(&src, &exp.join("many"), false);
    let err = stderr(&o);
    assert!(
        err.contains("kept this run without"),
        "the loss is said: {err}"
    );
    assert!(err.contains(&archive.display().to_string()), "{err}");
    drop(disk);
}

#[test]
fn a_run_ended_by_ctrl_c_is_archived_as_interrupted() {
    let t = TempDir::new("archive-int");
    let archive = t.path().join("archive.db");
    let s = data_server(&t.dir("export"), &t.dir("state"));
    let mut child = long_perf(&archive, s.addr());
    wait_for_intervals(&archive, 1);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130));
    let show = json_ok(&archive, &["show", "last", "--json"]);
    assert_eq!(show["run"]["status"], "interrupted", "{show}");
    assert_eq!(show["run"]["exit_code"], 130, "{show}");
    assert!(
        show["run"]["summary"].is_object(),
        "its summary is kept: {show}"
    );
}

#[test]
fn doctor_and_bench_disk_runs_are_archived_with_their_reports() {
    let t = TempDir::new("archive-doctor");
    let archive = t.path().join("archive.db");
    let dir = t.dir("d");
    let o = with_archive(
        &archive,
        &[
            "bench",
            "disk",
            dir.to_str().unwrap(),
            "--size",
            "8M",
            "--files",
            "50",
        ],
    );
    assert_exit(&o, 0);
    let o = with_archive(&archive, &["doctor"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let h = json_ok(&archive, &["history", "--json"]);
    let runs = h["runs"].as_array().unwrap();
    let kinds: Vec<&str> = runs.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["doctor", "bench-disk"], "{h}");
    let disk = json_ok(&archive, &["show", "1", "--json"]);
    assert_eq!(disk["run"]["dest"], dir.to_str().unwrap());
    assert_eq!(disk["run"]["summary"]["write"]["bytes"], 8 << 20, "{disk}");
    assert!(disk["run"]["bits_per_second"].as_f64().unwrap() > 0.0);
    let doctor = json_ok(&archive, &["show", "2", "--json"]);
    assert!(doctor["run"]["summary"]["findings"].is_array(), "{doctor}");
}

#[test]
fn show_prints_a_doctors_stages_and_a_bench_disks_figures() {
    let t = TempDir::new("archive-show-reports");
    let archive = t.path().join("archive.db");
    let dir = t.dir("d");
    let o = with_archive(
        &archive,
        &[
            "bench",
            "disk",
            dir.to_str().unwrap(),
            "--size",
            "8M",
            "--files",
            "50",
        ],
    );
    assert_exit(&o, 0);
    let exp = t.dir("export");
    let s = data_server(&exp, &t.dir("state"));
    let o = with_archive(
        &archive,
        &[
            "doctor",
            &remote(s.addr(), ""),
            "--time",
            "1s",
            "--no-copy",
            "--no-remember",
        ],
    );
    assert_exit(&o, 0);
    s.shutdown();

    let o = with_archive(&archive, &["show", "1"]);
    assert_exit(&o, 0);
    let disk = stdout(&o);
    for want in [
        "bench-disk report:",
        "sequential write",
        "sequential read",
        "small-file create",
        "bit/s",
        "files/s",
    ] {
        assert!(disk.contains(want), "no '{want}' in: {disk}");
    }
    let o = with_archive(&archive, &["show", "2"]);
    assert_exit(&o, 0);
    let doctor = stdout(&o);
    for want in [
        "doctor report:",
        "stages (what each can carry):",
        "path rate",
        "destination storage",
        "verdict: ",
    ] {
        assert!(doctor.contains(want), "no '{want}' in: {doctor}");
    }
}

/// An archived report whose text carries terminal controls (a hostile
/// server's host name, or a forged archive row): `show` prints them
/// escaped, never raw.
#[test]
fn show_escapes_what_an_archived_report_says() {
    let t = TempDir::new("archive-show-escapes");
    let archive = t.path().join("archive.db");
    let dir = t.dir("d");
    let o = with_archive(
        &archive,
        &[
            "bench",
            "disk",
            dir.to_str().unwrap(),
            "--size",
            "4M",
            "--files",
            "10",
        ],
    );
    assert_exit(&o, 0);
    let c = rusqlite::Connection::open(&archive).unwrap();
    let summary: String = c
        .query_row("SELECT summary FROM runs WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    let mut v: Value = serde_json::from_str(&summary).unwrap();
    v["filesystem"] = "ext4\u{1b}]0;owned\u{7}\n\u{1b}[2J".into();
    v["warnings"] = serde_json::json!(["\u{1b}[31mred\u{9b}"]);
    c.execute("UPDATE runs SET summary = ?1 WHERE id = 1", [v.to_string()])
        .unwrap();
    drop(c);
    let o = with_archive(&archive, &["show", "1"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{9b}'),
        "{out:?}"
    );
    assert!(out.contains("ext4\\u{1b}]0;owned\\u{7}\\n"), "{out}");
    assert!(out.contains("\\u{1b}[31mred"), "{out}");
}

/// A matrix run of the binary that runs nothing: every cell of `tools`
/// (memory to memory on loopback, put and get) is already done in its
/// `--resume` document, at `gbit` Gbit/s, so `longhaul matrix` only plans,
/// keeps them, prints and archives, in well under a second. The tools come
/// from a `--tools-file`, as a user's would (names and settings as given).
pub(crate) fn archived_matrix(
    archive: &Path,
    dir: &Path,
    tools: &[(&str, &str)],
    gbit: f64,
    extra: &[&str],
) -> std::process::Output {
    use serde_json::json;
    fs::create_dir_all(dir).unwrap();
    let file: Vec<Value> = tools
        .iter()
        .map(|(name, settings)| {
            json!({"name": name, "kind": "mem", "put": ["true"], "get": ["true"],
                   "settings": [{"name": settings, "args": []}]})
        })
        .collect();
    let tools_file = dir.join("tools.json");
    fs::write(&tools_file, serde_json::to_string(&file).unwrap()).unwrap();
    let bytes = gbit * 1e9 / 8.0;
    let cells: Vec<Value> = tools
        .iter()
        .flat_map(|(name, settings)| {
            ["put", "get"].map(|d| {
                json!({"tool": name, "settings": settings, "path": "loopback", "workload": "mem",
                    "direction": d,
                    "rate": {"median_bytes_per_second": bytes, "min_bytes_per_second": bytes * 0.9,
                             "max_bytes_per_second": bytes * 1.1, "median_bits_per_second": bytes * 8.0},
                    "cpu_seconds": {"client_seconds": 0.4, "server_seconds": 0.3},
                    "verified": null, "error": null, "note": null,
                    "runs": [{"bytes_per_second": bytes, "seconds": 1.0, "cpu_client_seconds": 0.4,
                              "cpu_server_seconds": 0.3, "verified": null, "error": null}]})
            })
        })
        .collect();
    let resume = dir.join("resume.json");
    let doc = json!({
        "format": "longhaul-matrix", "format_version": 1,
        "params": {"runs": 1, "elephant_bytes": 1048576, "small_files": 20, "mem_seconds": 1.0,
                   "workloads": ["mem"]},
        "tools": [], "paths": [{"name": "loopback", "rtt_ms": 0.0, "loss": 0.0, "rate_bps": null}],
        "cells": cells,
        "limits": {"mem_to_mem_bytes_per_second": {}, "local_copy_bytes_per_second": {}},
        "interrupted": false
    });
    fs::write(&resume, serde_json::to_string(&doc).unwrap()).unwrap();
    let names: Vec<&str> = tools.iter().map(|(n, _)| *n).collect();
    bin()
        .arg("--archive")
        .arg(archive)
        .args(["matrix", "--tools", &names.join(","), "--tools-file"])
        .arg(&tools_file)
        .args(["--paths", "loopback", "--workloads", "mem", "--runs", "1"])
        // The kept cells' own data (their mem_seconds): others would be run again.
        .args(["--seconds", "1s"])
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--resume")
        .arg(&resume)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run longhaul matrix")
}

/// `show` of an archived matrix prints what the command printed, with
/// one printer: the same tables, the ratio lines and the limits.
#[test]
fn show_prints_an_archived_matrix_as_the_command_did_ratio_lines_included() {
    let t = TempDir::new("archive-matrix-show");
    let archive = t.path().join("archive.db");
    let tools = [("longhaul-x", "best"), ("peer", "defaults")];
    let o = archived_matrix(&archive, &t.path().join("m"), &tools, 4.0, &[]);
    assert_exit(&o, 0);
    let printed = stdout(&o);
    assert!(
        printed.contains("longhaul against the best peer and the limit:"),
        "{printed}"
    );
    assert!(
        printed.contains("loopback put: longhaul-x (best), 1.00x the rate of peer (defaults)"),
        "{printed}"
    );
    let o = with_archive(&archive, &["show", "last"]);
    assert_exit(&o, 0);
    let shown = stdout(&o);
    assert!(
        shown.contains(&printed),
        "show:\n{shown}\nmatrix:\n{printed}"
    );
}

/// A matrix is one run with its cells: `history` lists it, `show` prints
/// its cells (and never a byte a terminal acts on, whatever a tool in the
/// user's `--tools-file` is named), `show --json` gives its document;
/// `--no-archive` keeps nothing.
#[test]
fn a_matrix_is_archived_as_one_run_and_shown_with_its_cells() {
    let t = TempDir::new("archive-matrix");
    let archive = t.path().join("archive.db");
    let odd = "red\u{1b}[31m<script>alert(1)</script>";
    let tools = [("quick", "best"), (odd, "defaults")];
    let o = archived_matrix(&archive, &t.path().join("m1"), &tools, 4.0, &["--json"]);
    assert_exit(&o, 0);
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["cells"].as_array().unwrap().len(), 4, "{doc}");
    assert!(
        !stderr(&o).contains("[1/"),
        "a kept cell ran: {}",
        stderr(&o)
    );
    let o = archived_matrix(&archive, &t.path().join("m2"), &tools, 5.0, &[]);
    assert_exit(&o, 0);

    let h = json_ok(&archive, &["history", "--json", "--kind", "matrix"]);
    let runs = h["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{h}");
    assert_eq!(runs[0]["kind"], "matrix");
    assert_eq!(runs[0]["status"], "ok");
    assert_eq!(runs[0]["remote_host"], "loopback");
    let o = with_archive(&archive, &["history"]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("matrix"), "{}", stdout(&o));

    let show = json_ok(&archive, &["show", "last", "--json"]);
    let summary = &show["run"]["summary"];
    assert_eq!(summary["format"], "longhaul-matrix");
    let cells = summary["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    assert_eq!(cells[0]["rate"]["median_bits_per_second"], 5e9);
    assert_eq!(cells[0]["cpu_seconds"]["server_seconds"], 0.3);
    assert!(cells.iter().any(|c| c["tool"] == odd));
    assert_eq!(show["run"]["params"]["workloads"][0], "mem");

    let o = with_archive(&archive, &["show", "last"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains("matrix: 4 cells, 2 tool(s) on loopback"),
        "{out}"
    );
    // The command's own tables, read back from the archive.
    assert!(out.contains("quick (best)"), "{out}");
    assert!(out.contains("mem (memory to memory, "), "{out}");
    assert!(out.contains("625 ("), "the median in MB/s: {out}");
    assert!(out.contains("-688)"), "the spread: {out}");
    assert!(out.contains("0.64 + 0.48"), "CPU seconds per GB: {out}");
    assert!(
        out.contains("limits in the same run: memory to memory on loopback 625 MB/s"),
        "{out}"
    );
    assert!(
        !out.contains('\u{1b}'),
        "a terminal escape from a tool name: {out:?}"
    );

    let o = archived_matrix(
        &archive,
        &t.path().join("m3"),
        &tools,
        6.0,
        &["--no-archive"],
    );
    assert_exit(&o, 0);
    let h = json_ok(&archive, &["history", "--json", "--kind", "matrix"]);
    assert_eq!(
        h["runs"].as_array().unwrap().len(),
        2,
        "--no-archive kept a run"
    );
}
