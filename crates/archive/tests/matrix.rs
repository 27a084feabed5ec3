//! A test matrix in the archive: one run of kind `matrix` whose summary is
//! its `longhaul-matrix` document; read back as cells, and each cell's
//! history over the runs. An archive without a matrix (all an older build
//! ever wrote) opens and reads as no matrix; the archive's schema is
//! unchanged, so older builds read an archive with matrices.

use longhaul_archive::matrix::{cell_history, matrix_runs, Document, Recorder, KIND};
use longhaul_archive::model::{HistoryFilter, NewRun};
use longhaul_archive::schema::SCHEMA_VERSION;
use longhaul_archive::writer::{RunEnd, RunResult, Writer};
use longhaul_archive::Archive;
use serde_json::{json, Value};

fn cell(
    tool: &str,
    path: &str,
    workload: &str,
    dir: &str,
    bps: f64,
    verified: Option<bool>,
) -> Value {
    json!({
        "tool": tool, "settings": "defaults", "path": path, "workload": workload,
        "direction": dir,
        "rate": {"median_bytes_per_second": bps / 8.0, "min_bytes_per_second": bps / 10.0,
                 "max_bytes_per_second": bps / 6.0, "median_bits_per_second": bps},
        "cpu_seconds": {"client_seconds": 0.5, "server_seconds": 0.25},
        "verified": verified, "error": null, "note": null,
        "runs": [{"bytes_per_second": bps / 8.0, "seconds": 1.0, "cpu_client_seconds": 0.5,
                  "cpu_server_seconds": 0.25, "verified": verified, "error": null}]
    })
}

fn doc(scale: f64) -> Value {
    json!({
        "format": "longhaul-matrix", "format_version": 1,
        "params": {"runs": 1, "elephant_bytes": 1048576, "small_files": 20, "mem_seconds": 1.0,
                   "workloads": ["mem", "elephant"]},
        "tools": [{"name": "longhaul", "settings": ["defaults"], "installed": true, "note": null}],
        "paths": [{"name": "loopback", "rtt_ms": 0.0, "loss": 0.0, "rate_bps": null}],
        "cells": [
            cell("longhaul", "loopback", "mem", "put", 9e9 * scale, None),
            cell("longhaul", "loopback", "elephant", "put", 4e9 * scale, Some(true)),
            cell("longhaul", "loopback", "elephant", "get", 3e9 * scale, Some(true)),
        ],
        "limits": {"mem_to_mem_bytes_per_second": {"loopback": 1.2e9},
                   "local_copy_bytes_per_second": {}, "destination_write_bytes_per_second": 5e8},
        "interrupted": false
    })
}

fn record(path: &std::path::Path, scale: f64) -> i64 {
    let r = Recorder::start(
        path,
        &NewRun {
            kind: "ignored: always matrix".into(),
            command: "longhaul matrix --tools longhaul --token-file /x PASSWORD=hunter2".into(),
            remote_host: Some("loopback".into()),
            ..NewRun::default()
        },
    )
    .unwrap();
    let id = r.run();
    // Running until it finishes.
    let a = Archive::open_read_only(path).unwrap();
    assert_eq!(a.run(id).unwrap().run.status, "running");
    let loss = r.finish(
        Some(doc(scale)),
        RunEnd {
            status: "ok".into(),
            exit_code: Some(0),
            ..RunEnd::default()
        },
    );
    assert_eq!(loss.rows, 0, "{loss:?}");
    id
}

#[test]
fn a_matrix_is_one_run_with_its_cells_and_each_cell_has_a_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let first = record(&path, 1.0);
    let second = record(&path, 2.0);
    let a = Archive::open_read_only(&path).unwrap();

    let runs = a
        .history(&HistoryFilter {
            kind: Some(KIND.into()),
            ..HistoryFilter::default()
        })
        .unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].kind, "matrix");
    assert_eq!(runs[0].status, "ok");
    assert_eq!(runs[0].verified, Some(true));
    assert!(runs[0].seconds.is_some());
    assert!(!runs[0].command.contains("hunter2"), "{}", runs[0].command);

    let d = a.run(second).unwrap();
    let m = Document::of(&d).unwrap();
    assert_eq!(m.cells.len(), 3);
    assert_eq!(m.workloads(), ["mem", "elephant"]);
    assert_eq!(m.path_names(), ["loopback"]);
    assert_eq!(
        m.cells[1].rate.as_ref().unwrap().median_bits_per_second,
        8e9
    );
    assert_eq!(
        m.cells[1].cpu_seconds.as_ref().unwrap().server_seconds,
        Some(0.25)
    );
    assert_eq!(m.limits.destination_write_bytes_per_second, Some(5e8));
    assert_eq!(m.limits.mem_to_mem_bytes_per_second["loopback"], 1.2e9);
    // The document itself, as `show --json` gives it.
    assert_eq!(d.summary.as_ref().unwrap()["format"], "longhaul-matrix");

    let ms = matrix_runs(&a, 10).unwrap();
    assert_eq!(
        ms.iter().map(|m| m.run.id).collect::<Vec<_>>(),
        [second, first]
    );
    let h = cell_history(&ms);
    assert_eq!(h.len(), 3);
    let get = h
        .iter()
        .find(|c| c.key.workload == "elephant" && c.key.direction == "get")
        .unwrap();
    let values: Vec<_> = get.points.iter().map(|p| p.bits_per_second).collect();
    assert_eq!(values, [Some(3e9), Some(6e9)], "oldest first");
    assert_eq!(get.points[0].run, first);
}

#[test]
fn an_archive_without_a_matrix_opens_and_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    // What any build before the matrix wrote: a perf run.
    let a = Archive::open(&path).unwrap();
    let id = a
        .begin_run(&NewRun {
            kind: "perf".into(),
            command: "longhaul perf beta".into(),
            ..NewRun::default()
        })
        .unwrap();
    let (w, fin) = Writer::start(a, id);
    w.result(RunResult {
        summary: Some(json!({"bits_per_second": 1e9})),
        ..RunResult::default()
    });
    w.end(RunEnd {
        status: "ok".into(),
        ..RunEnd::default()
    });
    drop(w);
    fin.finish();

    let a = Archive::open_read_only(&path).unwrap();
    assert!(matrix_runs(&a, 10).unwrap().is_empty());
    assert!(Document::of(&a.run(id).unwrap()).is_none());
    // A matrix is written into the same schema: nothing to migrate, so an
    // older longhaul reads the archive afterwards.
    record(&path, 1.0);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(
        SCHEMA_VERSION, 1,
        "a new schema: test that older archives still open"
    );
    let a = Archive::open_read_only(&path).unwrap();
    assert_eq!(matrix_runs(&a, 10).unwrap().len(), 1);
    assert_eq!(a.history(&HistoryFilter::default()).unwrap().len(), 2);
}

#[test]
fn a_matrix_that_ended_without_a_document_is_no_matrix_but_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    let r = Recorder::start(&path, &NewRun::default()).unwrap();
    let id = r.run();
    r.finish(
        None,
        RunEnd {
            status: "failed".into(),
            error: Some("cannot make a work directory".into()),
            exit_code: Some(5),
            ..RunEnd::default()
        },
    );
    let a = Archive::open_read_only(&path).unwrap();
    let d = a.run(id).unwrap();
    assert_eq!(d.run.kind, "matrix");
    assert_eq!(d.run.status, "failed");
    assert!(matrix_runs(&a, 10).unwrap().is_empty());
}
