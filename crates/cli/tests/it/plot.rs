//! `longhaul plot`: runs recorded with the archive crate's own writer,
//! drawn by the binary to SVG and PNG; and what it says to bad input.

use std::path::Path;
use std::process::{Command, Output};

use longhaul_archive::model::{IntervalRow, NewRun};
use longhaul_archive::writer::{RunEnd, RunResult, Writer};
use longhaul_archive::Archive;

/// The binary, with a home of its own (never the user's archive).
fn longhaul(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    c.env_remove("LONGHAUL_ARCHIVE")
        .env_remove("XDG_DATA_HOME")
        .env("HOME", home);
    c
}

fn run(c: &mut Command) -> Output {
    c.output().expect("running longhaul")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "expected exit {code}; stdout: {} stderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

fn row(idx: u32, direction: &str, stream: i32, bps: f64) -> IntervalRow {
    IntervalRow {
        idx,
        direction: direction.into(),
        stream,
        start_s: f64::from(idx),
        end_s: f64::from(idx + 1),
        bytes: (bps / 8.0) as u64,
        bits_per_second: bps,
        retransmits: None,
        rtt_us: None,
        cwnd_bytes: None,
        streams: None,
        limit: None,
        omitted: false,
    }
}

/// Records a finished run of `kind` with these intervals; its id.
fn record(archive: &Path, kind: &str, rows: Vec<IntervalRow>, bps: Option<f64>) -> i64 {
    let a = Archive::open(archive).unwrap();
    let id = a
        .begin_run(&NewRun {
            kind: kind.into(),
            command: format!("longhaul {kind} beta"),
            remote_host: Some("beta.example".into()),
            ..NewRun::default()
        })
        .unwrap();
    let (writer, finisher) = Writer::start(a, id);
    for r in rows {
        writer.interval(r);
    }
    writer.result(RunResult {
        bits_per_second: bps,
        seconds: Some(12.0),
        ..RunResult::default()
    });
    writer.end(RunEnd {
        status: "ok".into(),
        exit_code: Some(0),
        ..RunEnd::default()
    });
    drop(writer);
    let loss = finisher.finish();
    assert_eq!(loss.rows, 0, "{loss:?}");
    id
}

/// perf: 4 streams × 12 intervals up, with totals; the limit changes at 6.
fn perf_rows() -> Vec<IntervalRow> {
    let mut rows = Vec::new();
    for idx in 0..12u32 {
        let limit = if idx < 6 {
            "congestion"
        } else {
            "receiver_window"
        };
        for s in 0..4 {
            rows.push(IntervalRow {
                retransmits: Some(u64::from(idx % 5)),
                rtt_us: Some(30_000 + idx * 100),
                ..row(idx, "up", s, 2.4e9 + f64::from(s) * 1e8)
            });
        }
        rows.push(IntervalRow {
            retransmits: Some(u64::from(idx % 5) * 4),
            rtt_us: Some(30_000 + idx * 100),
            streams: Some(4),
            limit: Some(limit.into()),
            omitted: idx == 0,
            ..row(idx, "up", -1, 1.02e10)
        });
    }
    rows
}

/// cp: totals only, streams coming and going.
fn cp_rows() -> Vec<IntervalRow> {
    (0..8u32)
        .map(|idx| IntervalRow {
            retransmits: Some(0),
            rtt_us: Some(8_000),
            streams: Some(1 + idx % 3),
            limit: Some(if idx < 4 { "storage_read" } else { "window" }.into()),
            ..row(idx, "send", -1, 8e8)
        })
        .collect()
}

fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 1000, "a PNG of {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[test]
fn plot_draws_the_last_run_and_a_run_by_number_to_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("archive.db");
    let cp = record(&db, "cp", cp_rows(), None);
    let perf = record(&db, "perf", perf_rows(), Some(1.02e10));
    assert!(perf > cp);

    let svg = dir.path().join("out.svg");
    let o = run(longhaul(dir.path())
        .arg("--archive")
        .arg(&db)
        .args(["plot", "last", "-o"])
        .arg(&svg));
    assert_exit(&o, 0);
    assert_eq!(
        text(&o.stdout).trim(),
        format!("wrote {} (12 intervals, 4 streams)", svg.display())
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"), "{}", &s[..100.min(s.len())]);
    assert!(s.trim_end().ends_with("</svg>"));
    assert!(s.contains("<polyline"));
    for want in [
        &format!("run {perf}"),
        "perf",
        "beta.example",
        "10.2 Gbit/s",
        "congestion",
        "receiver_window",
        "omitted",
        "RTT (ms)",
    ] {
        assert!(s.contains(want), "no {want} in the SVG");
    }

    let png = dir.path().join("out.png");
    let o = run(longhaul(dir.path())
        .arg("--archive")
        .arg(&db)
        .args(["plot", "last", "-o"])
        .arg(&png));
    assert_exit(&o, 0);
    assert!(text(&o.stdout).contains("(12 intervals, 4 streams)"));
    assert_eq!(png_size(&std::fs::read(&png).unwrap()), (1400, 900));

    // The cp run by its number, and the archive from the environment.
    let cp_png = dir.path().join("cp.png");
    let o = run(longhaul(dir.path())
        .env("LONGHAUL_ARCHIVE", &db)
        .args(["plot", &cp.to_string(), "-o"])
        .arg(&cp_png));
    assert_exit(&o, 0);
    assert_eq!(
        text(&o.stdout).trim(),
        format!("wrote {} (8 intervals, 3 streams)", cp_png.display())
    );
    assert_eq!(png_size(&std::fs::read(&cp_png).unwrap()), (1400, 900));
    let cp_svg = dir.path().join("cp.svg");
    let o = run(longhaul(dir.path())
        .env("LONGHAUL_ARCHIVE", &db)
        .args(["plot", &cp.to_string(), "-o"])
        .arg(&cp_svg));
    assert_exit(&o, 0);
    let s = std::fs::read_to_string(&cp_svg).unwrap();
    for want in ["storage_read", "window", "active streams", "Mbit/s"] {
        assert!(s.contains(want), "no {want} in the cp SVG");
    }
}

#[test]
fn plot_says_plainly_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("archive.db");
    record(&db, "perf", perf_rows(), Some(1.02e10));
    let doctor = record(&db, "doctor", vec![], None);
    let plot = |run_: &str, out: &Path| {
        run(longhaul(dir.path())
            .arg("--archive")
            .arg(&db)
            .args(["plot", run_, "-o"])
            .arg(out))
    };

    // No such run.
    let out = dir.path().join("x.svg");
    let o = plot("99", &out);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("no run 99"), "{}", text(&o.stderr));
    assert!(!out.exists());
    let o = plot("soon", &out);
    assert_exit(&o, 2);
    assert!(
        text(&o.stderr).contains("no run soon"),
        "{}",
        text(&o.stderr)
    );

    // A format plot does not write.
    let jpg = dir.path().join("x.jpg");
    let o = plot("last", &jpg);
    assert_exit(&o, 2);
    let e = text(&o.stderr);
    assert!(e.contains(".jpg") && e.contains(".svg or .png"), "{e}");
    assert!(!jpg.exists());

    // A run that keeps no intervals.
    let o = plot(&doctor.to_string(), &out);
    assert_exit(&o, 2);
    let e = text(&o.stderr);
    assert!(
        e.contains(&format!(
            "run {doctor} has no intervals to plot (a doctor or bench disk run keeps none)"
        )),
        "{e}"
    );
    assert!(!out.exists());

    // A place that cannot be written.
    let o = plot("1", &dir.path().join("no/such/dir/x.png"));
    assert_exit(&o, 2);
    let e = text(&o.stderr);
    assert!(
        e.contains("cannot write") && e.contains("no/such/dir/x.png"),
        "{e}"
    );

    // No archive there.
    let o = run(longhaul(dir.path())
        .arg("--archive")
        .arg(dir.path().join("none.db"))
        .args(["plot", "last", "-o"])
        .arg(&out));
    assert_exit(&o, 2);
    let e = text(&o.stderr);
    assert!(e.contains("no archive at") && e.contains("none.db"), "{e}");

    // Not an archive at all.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let o = run(longhaul(dir.path())
        .arg("--archive")
        .arg(&junk)
        .args(["plot", "last", "-o"])
        .arg(&out));
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("junk.db"), "{}", text(&o.stderr));
    assert!(!out.exists());
}

/// A matrix run (recorded as `longhaul matrix` records one): tools by
/// paths, a panel per workload, to PNG and SVG of sensible size; a tool
/// named like markup is text in the SVG.
#[test]
fn plot_draws_a_matrix_run_to_png_and_svg() {
    use longhaul_archive::matrix::Recorder;
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let archive = dir.path().join("archive.db");
    let cell = |tool: &str, path: &str, w: &str, d: &str, gbit: f64, verified: Option<bool>| {
        let b = gbit * 1e9 / 8.0;
        json!({"tool": tool, "settings": "defaults", "path": path, "workload": w, "direction": d,
               "verified": verified, "cpu_seconds": {"client_seconds": 1.0, "server_seconds": 0.5},
               "rate": {"median_bytes_per_second": b, "min_bytes_per_second": b * 0.8,
                        "max_bytes_per_second": b * 1.2, "median_bits_per_second": gbit * 1e9}})
    };
    let mut cells = Vec::new();
    for (tool, k) in [
        ("longhaul", 1.0),
        ("<script>alert(1)</script>", 0.5),
        ("rsync", 0.3),
    ] {
        for path in ["loopback", "80ms"] {
            cells.push(cell(tool, path, "mem", "put", 9.0 * k, None));
            cells.push(cell(tool, path, "mem", "get", 8.0 * k, None));
            cells.push(cell(tool, path, "elephant", "put", 3.0 * k, Some(k > 0.4)));
            cells.push(cell(tool, path, "elephant", "get", 2.0 * k, Some(true)));
        }
    }
    let doc = json!({"format": "longhaul-matrix", "format_version": 1,
        "params": {"workloads": ["mem", "elephant"]},
        "paths": [{"name": "loopback"}, {"name": "80ms"}], "cells": cells,
        "limits": {"local_copy_bytes_per_second": {"elephant": 5e8},
                   "destination_write_bytes_per_second": 4e8}});
    let r = Recorder::start(&archive, &NewRun::default()).unwrap();
    let id = r.run();
    r.finish(
        Some(doc),
        RunEnd {
            status: "partial".into(),
            ..RunEnd::default()
        },
    );
    let png_out = dir.path().join("matrix.png");
    let o = run(longhaul(&home)
        .arg("--archive")
        .arg(&archive)
        .args(["plot", &id.to_string(), "-o"])
        .arg(&png_out));
    assert_exit(&o, 0);
    assert_eq!(
        text(&o.stdout).trim(),
        format!("wrote {} (24 cells, 2 workload panels)", png_out.display())
    );
    let png_bytes = std::fs::read(&png_out).unwrap();
    // Two panels under the title and legend.
    assert_eq!(png_size(&png_bytes), (1400, 110 + 2 * 340));
    assert!(
        (10_000..2_000_000).contains(&png_bytes.len()),
        "{} bytes",
        png_bytes.len()
    );
    let svg_out = dir.path().join("matrix.svg");
    let o = run(longhaul(&home)
        .arg("--archive")
        .arg(&archive)
        .args(["plot", "last", "-o"])
        .arg(&svg_out));
    assert_exit(&o, 0);
    let s = std::fs::read_to_string(&svg_out).unwrap();
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    assert!((5_000..2_000_000).contains(&s.len()), "{} bytes", s.len());
    assert!(s.contains("Gbit/s") && s.contains("elephant: one large file"));
    assert!(!s.contains("<script"), "a tool's name became markup");
    // Every bar: 24 cells, each a rectangle (a get's two), and more.
    assert!(
        s.matches("<rect").count() >= 24,
        "{}",
        s.matches("<rect").count()
    );

    // A matrix that ended before its first cell has nothing to draw.
    let r = Recorder::start(&archive, &NewRun::default()).unwrap();
    let empty = r.run();
    r.finish(
        None,
        RunEnd {
            status: "failed".into(),
            ..RunEnd::default()
        },
    );
    let o = run(longhaul(&home)
        .arg("--archive")
        .arg(&archive)
        .args(["plot", &empty.to_string(), "-o"])
        .arg(dir.path().join("none.svg")));
    assert_exit(&o, 2);
    assert!(
        text(&o.stderr).contains("kept no cells"),
        "{}",
        text(&o.stderr)
    );
}
