//! The sink's own files (issue 26, A5 and B1): partial files
//! (`.NAME.lhpart`), journals and a fleet's done marks (`.NAME.F-E.lhdone`)
//! are out of every client's reach, a planted mark cannot make a server
//! land bytes nobody wrote, stale ones are cleared, a failed file leaves
//! none, and a tree pushed onto a file is refused in one line that names
//! no absolute server path. Each test plays the attacker or the mistake.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::AtomicU64;

use longhaul_engine::xfer::storage::Faults;
use longhaul_proto::xfer::{journal_record, JournalHeader};

use crate::common;
use common::xfer::*;
use common::{assert_exit, bin, stderr, stdout, TempDir};

const MIB: usize = 1 << 20;

/// A done mark (or journal) for `src` in chunks of `chunk`, listing the
/// true hashes of `chunks`: what an attacker who has the file can write.
fn forged_mark(src: &Path, chunk: usize, chunks: std::ops::Range<u32>) -> Vec<u8> {
    let data = fs::read(src).unwrap();
    let m = fs::metadata(src).unwrap();
    let header = JournalHeader {
        size: data.len() as u64,
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        chunk_size: chunk as u64,
    };
    let mut out = header.encode().to_vec();
    for i in chunks {
        let at = i as usize * chunk;
        let piece = &data[at..(at + chunk).min(data.len())];
        let value = longhaul_proto::digest::chunk_value(piece, at as u64, data.len() <= chunk);
        out.extend_from_slice(&journal_record(i, &value));
    }
    out
}

/// Every name beneath `root` that is one of the sink's own files.
fn reserved_names(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_keys()
        .filter(|n| {
            let last = n.rsplit('/').next().unwrap_or("");
            longhaul_proto::xfer::is_reserved_name(last)
        })
        .collect()
}

#[test]
fn a_planted_done_mark_cannot_make_a_fleet_land_unwritten_chunks() {
    let t = TempDir::new("plant-mark");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let big = src.join("big.bin");
    write_random(&big, 16 * MIB, 11);
    // A co-tenant who can write the destination plants a done mark that
    // lists every chunk with its true hash (the file is public, say).
    fs::create_dir_all(dst.join("out")).unwrap();
    fs::write(
        dst.join("out/.big.bin.0-16.lhdone"),
        forged_mark(&big, MIB, 0..16),
    )
    .unwrap();
    let server = data_server(&dst, &t.dir("state"));
    let run = t.path().join("run");
    // Rank 0 of 2 alone: it carries its part of big.bin, then (rank 1
    // lost) runs the final check.
    let o = bin()
        .args(["cp", "-r", "--chunk", "1M", "--rank", "0", "--size", "2"])
        .args(["--fleet-wait", "2s", "--json", "--run-dir"])
        .arg(&run)
        .arg(format!("{}/", src.display()))
        .arg(remote(server.addr(), "out/"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let landed = dst.join("out/big.bin");
    assert!(
        landed.exists(),
        "the final check lands the file: {} {}",
        stdout(&o),
        stderr(&o)
    );
    // Today's main landed rank 0's half and zeros for the rest, and the
    // final check (size and mtime) called it verified.
    assert_same_file(&big, &landed);
    assert!(
        !dst.join("out/.big.bin.0-16.lhdone").exists(),
        "the forged mark is dropped"
    );
    server.shutdown();
}

#[test]
fn a_client_cannot_plant_a_partial_or_a_mark_through_the_protocol() {
    let t = TempDir::new("plant-push");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    write_random(&src.join("big.bin"), 3 * MIB, 12);
    let mark = src.join(".big.bin.0-3.lhdone");
    fs::write(&mark, forged_mark(&src.join("big.bin"), MIB, 0..3)).unwrap();
    fs::write(src.join(".big.bin.lhpart"), vec![0u8; 3 * MIB]).unwrap();
    let s = data_server(&exp, &t.dir("state"));
    // By name, as a file of its own, and as a destination name.
    for (from, to) in [
        (mark.clone(), "out/"),
        (src.join("big.bin"), "out/.big.bin.lhpart"),
        (src.join("big.bin"), ".big.bin.0-3.lhjournal"),
    ] {
        let o = bin()
            .args(["cp", "--mkpath", "--chunk", "1M"])
            .arg(&from)
            .arg(remote(s.addr(), to))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{to}: {}", stdout(&o));
        assert!(
            stderr(&o).contains("partial files"),
            "the refusal says why: {}",
            stderr(&o)
        );
    }
    // Inside a tree: never sent at all.
    let v = cp_ok(&[
        "-r",
        "--chunk",
        "1M",
        src.to_str().unwrap(),
        &remote(s.addr(), ""),
    ]);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(reserved_names(&exp), Vec::<String>::new());
    assert_same_file(&src.join("big.bin"), &exp.join("src/big.bin"));
    s.shutdown();
}

#[test]
fn a_client_cannot_list_or_pull_a_partial() {
    let t = TempDir::new("pull-partial");
    let exp = t.dir("export");
    fs::create_dir_all(exp.join("d")).unwrap();
    write_random(&exp.join("d/f"), 1000, 13);
    for name in [
        ".f.lhpart",
        ".f.lhjournal",
        ".f.0-2.lhdone",
        ".f.0-2.lhjournal",
    ] {
        fs::write(exp.join("d").join(name), b"half written").unwrap();
    }
    let s = data_server(&exp, &t.dir("state"));
    let o = bin().args(["ls", &remote(s.addr(), "d")]).output().unwrap();
    assert_exit(&o, 0);
    assert!(stdout(&o).contains('f'), "{}", stdout(&o));
    assert!(!stdout(&o).contains(".lh"), "listed: {}", stdout(&o));
    let o = bin()
        .args(["ls", &remote(s.addr(), "d/.f.lhpart")])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stdout(&o));
    let local = t.dir("local");
    let o = bin()
        .arg("cp")
        .arg(remote(s.addr(), "d/.f.lhpart"))
        .arg(&local)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stdout(&o));
    let v = cp_ok(&["-r", &remote(s.addr(), "d"), local.to_str().unwrap()]);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(reserved_names(&local), Vec::<String>::new());
    s.shutdown();
}

#[test]
fn sync_delete_clears_stale_partials() {
    let t = TempDir::new("stale");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    write_random(&src.join("kept"), 5000, 14);
    fs::create_dir_all(exp.join("out/sub")).unwrap();
    for name in [
        "out/.gone.lhpart",
        "out/.gone.lhjournal",
        "out/.gone.0-2.lhdone",
        "out/.gone.0-2.lhjournal",
        "out/sub/.old.lhpart",
    ] {
        fs::write(exp.join(name), vec![7u8; 4096]).unwrap();
    }
    let s = data_server(&exp, &t.dir("state"));
    let o = bin()
        .args(["sync", "--delete", &format!("{}/", src.display())])
        .arg(remote(s.addr(), "out/"))
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert_same_file(&src.join("kept"), &exp.join("out/kept"));
    assert_eq!(reserved_names(&exp), Vec::<String>::new());
    s.shutdown();
}

#[test]
fn an_unreadable_source_file_leaves_no_partial() {
    let t = TempDir::new("unreadable");
    let exp = t.dir("export");
    write_random(&exp.join("bad.bin"), 3 * MIB, 15);
    write_random(&exp.join("good.bin"), 3 * MIB, 16);
    let s = server_with(
        vec![export("data", &exp, false)],
        faulty(Faults {
            fail_reads_of: Some("bad.bin".into()),
            ..Faults::default()
        }),
        &t.dir("state"),
    );
    let local = t.dir("local");
    let o = bin()
        .args(["cp", "--chunk", "1M"])
        .arg(remote(s.addr(), "bad.bin"))
        .arg(remote(s.addr(), "good.bin"))
        .arg(&local)
        .output()
        .unwrap();
    s.shutdown();
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("bad.bin"), "{}", stderr(&o));
    assert_same_file(&exp.join("good.bin"), &local.join("good.bin"));
    assert!(!local.join("bad.bin").exists());
    assert_eq!(reserved_names(&local), Vec::<String>::new());
}

#[test]
fn a_full_disk_leaves_no_partial_and_frees_its_space() {
    let t = TempDir::new("full-clean");
    let srcd = t.dir("src");
    let exp = t.dir("export");
    let file = srcd.join("fill.bin");
    write_random(&file, 16 * MIB, 17);
    let full = server_with(
        vec![export("data", &exp, false)],
        faulty(Faults {
            space_left: Some(AtomicU64::new(5 * MIB as u64)),
            ..Faults::default()
        }),
        &t.dir("state"),
    );
    let o = bin()
        .args(["cp", "--chunk", "1M"])
        .arg(&file)
        .arg(remote(full.addr(), ""))
        .output()
        .unwrap();
    full.shutdown();
    // It does not fit even alone: it fails, the transfer ends (exit 6).
    assert_exit(&o, 6);
    assert!(stderr(&o).contains("destination full"), "{}", stderr(&o));
    assert!(!exp.join("fill.bin").exists());
    assert_eq!(reserved_names(&exp), Vec::<String>::new());
}

#[test]
fn a_tree_onto_an_existing_file_is_refused_in_one_line() {
    let t = TempDir::new("tree-onto-file");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    let tree = src.join("tree");
    for i in 0..50 {
        write_random(&tree.join(format!("d{}/f{i}", i % 5)), 100, i);
    }
    fs::write(exp.join("existingfile"), b"keep me").unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let before = snapshot(&exp);
    let o = bin()
        .args(["cp", "-r", tree.to_str().unwrap()])
        .arg(remote(s.addr(), "existingfile"))
        .output()
        .unwrap();
    assert_exit(&o, 4);
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("data/existingfile"), "{err}");
    let root = exp.canonicalize().unwrap();
    assert!(!err.contains(root.to_str().unwrap()), "{err}");
    assert_eq!(snapshot(&exp), before, "nothing moved");
    s.shutdown();
}

#[test]
fn sink_errors_name_export_paths_never_the_servers() {
    let t = TempDir::new("no-abs");
    let (src, exp) = (t.dir("src"), t.dir("export"));
    write_random(&src.join("tree/sub/f"), 100, 1);
    write_random(&src.join("tree/g"), 100, 2);
    // In the way: a file where the tree has a directory, and a directory
    // where it has a file.
    fs::create_dir_all(exp.join("tree/g")).unwrap();
    fs::write(exp.join("tree/g/x"), b"x").unwrap();
    fs::write(exp.join("tree/sub"), b"a file").unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let o = bin()
        .args(["cp", "-r", src.join("tree").to_str().unwrap()])
        .arg(remote(s.addr(), ""))
        .output()
        .unwrap();
    s.shutdown();
    assert!(!o.status.success());
    let all = format!("{}{}", stdout(&o), stderr(&o));
    let root = exp.canonicalize().unwrap();
    assert!(!all.contains(root.to_str().unwrap()), "{all}");
    assert!(all.contains("data/tree/sub"), "{all}");
    assert!(all.contains("data/tree/g"), "{all}");
}
