//! One transfer across many ranks (`cp --rank R --size N`, `--ranks
//! auto`): static shares cut from one manifest and a PostgreSQL work
//! queue, several servers writing into one shared destination (as DTNs
//! onto one parallel file system), ranks killed and run again.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use common::xfer::*;
use common::*;

/// A tree with what a dataset has at its edges: one file large enough
/// to be split across ranks, many small ones, an empty file, an empty
/// directory, a link, odd names.
fn dataset(src: &Path, big: usize, small: usize) {
    fs::create_dir_all(src.join("deep/er/still")).unwrap();
    fs::create_dir_all(src.join("empty dir")).unwrap();
    write_random(&src.join("big.bin"), big, 7);
    for i in 0..small {
        let d = src.join(format!("many/{:02}", i % 17));
        fs::create_dir_all(&d).unwrap();
        write_random(&d.join(format!("f{i}")), 1 + (i * 7919) % 9000, i as u64);
    }
    fs::write(src.join("empty"), b"").unwrap();
    fs::write(src.join("deep/er/still/na\u{ef}ve name;'x"), b"odd").unwrap();
    symlink("big.bin", src.join("link")).unwrap();
}

/// `cp` as rank `rank` of `size`, started, not waited for.
fn rank(rank: u32, size: u32, extra: &[&str], src: &Path, dest: &str) -> Child {
    let src = format!("{}/", src.display());
    bin()
        .args(["cp", "-r", "--chunk", "1M", "--rank"])
        .arg(rank.to_string())
        .args(["--size", &size.to_string(), "--fleet-wait", "120s"])
        .args(extra)
        .args([src.as_str(), dest])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a rank")
}

fn finished(c: Child) -> Output {
    c.wait_with_output().expect("wait for a rank")
}

/// No partial file, journal or done mark is left in the tree.
#[track_caller]
fn no_leftovers(root: &Path) {
    for (name, _) in snapshot(root) {
        let last = name.rsplit('/').next().unwrap_or("");
        assert!(
            !(last.ends_with(".lhpart")
                || last.ends_with(".lhjournal")
                || last.ends_with(".lhdone")),
            "left over: {name}"
        );
    }
}

#[test]
fn four_ranks_move_one_tree_through_two_servers_each_byte_once() {
    let t = TempDir::new("fleet-static");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 24 << 20, 400);
    // Two servers, one destination: two DTNs onto one file system.
    let a = data_server(&dst, &t.dir("state-a"));
    let b = data_server(&dst, &t.dir("state-b"));
    let run_dir = t.path().join("run");
    let run_dir = run_dir.to_str().unwrap();
    let ranks: Vec<Child> = (0..4)
        .map(|r| {
            let server = if r % 2 == 0 { a.addr() } else { b.addr() };
            rank(
                r,
                4,
                &["--run-dir", run_dir, "--json"],
                &src,
                &remote(server, "out/"),
            )
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(finished).collect();
    for (r, o) in outs.iter().enumerate() {
        assert_exit(o, 0);
        assert!(
            stderr(o).contains(&format!("rank {r} of 4")),
            "rank {r} says who it is: {}",
            stderr(o)
        );
        if r != 0 {
            assert!(
                stdout(o).is_empty(),
                "only rank 0 prints the result: {}",
                stdout(o)
            );
        }
    }
    let v = json_of(&outs[0]);
    assert_eq!(v["format"], "longhaul-fleet", "{v}");
    assert_eq!(v["ranks"], 4);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["per_rank"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(
        v["final_check"]["resent_files"], 0,
        "every rank's share landed: {v}"
    );
    let carried: u64 = v["per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    let total = v["bytes"].as_u64().unwrap();
    assert_eq!(carried, total, "every byte carried exactly once: {v}");
    // The large file was split: more than one rank carried part of it.
    let busy = v["per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["bytes"].as_u64().unwrap() > 0)
        .count();
    assert!(busy >= 3, "the work was shared: {v}");
    assert_same_tree(&src, &dst.join("out"), false);
    no_leftovers(&dst);
}
