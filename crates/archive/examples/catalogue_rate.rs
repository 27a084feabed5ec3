//! How fast the archive's writer puts a transfer's file catalogue on disk:
//! `cargo run --release -p longhaul-archive --example catalogue_rate [FILES] [DIR]`.
//! Writes FILES (default 1,000,000) catalogue rows of a run through the
//! same writer a cp uses, into a new archive in DIR (default: a temporary
//! directory), and prints rows per second from the first row offered to
//! the last committed.

use std::time::Instant;

use longhaul_archive::model::{FileRow, NewRun};
use longhaul_archive::writer::{RunEnd, Writer};
use longhaul_archive::Archive;

fn main() {
    let mut args = std::env::args().skip(1);
    let files: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = args
        .next()
        .map_or_else(|| tmp.path().to_path_buf(), Into::into);
    let path = dir.join("catalogue-rate.db");
    let _ = std::fs::remove_file(&path);
    let a = Archive::open(&path).expect("open the archive");
    let id = a
        .begin_run(&NewRun {
            kind: "cp".into(),
            command: "catalogue_rate".into(),
            ..NewRun::default()
        })
        .expect("begin a run");
    let (w, fin) = Writer::start(a, id);
    let start = Instant::now();
    for i in 0..files {
        let dir = i / 1000;
        w.file_waiting(FileRow {
            path: format!("run7/d{dir:04}/f{i:07}.dat"),
            source: format!("/data/project/run7/d{dir:04}/f{i:07}.dat"),
            dest: format!("dtn2.example.org:scratch/run7/d{dir:04}/f{i:07}.dat"),
            size: 4096 + i % 65536,
            mtime_ns: Some(1_790_000_000_000_000_000 + i as i64),
            digest: Some(format!("{:064x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
            verified: true,
        });
    }
    w.end(RunEnd {
        status: "ok".into(),
        ..RunEnd::default()
    });
    drop(w);
    let loss = fin.finish();
    let secs = start.elapsed().as_secs_f64();
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    println!(
        "catalogue: {files} rows in {secs:.2} s = {:.0} rows/s (lost {}), archive {:.1} MiB",
        files as f64 / secs,
        loss.rows,
        size as f64 / 1048576.0
    );
}
