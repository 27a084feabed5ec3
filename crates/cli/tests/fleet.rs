//! One transfer across many ranks (`cp --rank R --size N`, `--ranks
//! auto`): static shares cut from one manifest and a PostgreSQL work
//! queue, several servers writing into one shared destination (as DTNs
//! onto one parallel file system), ranks killed and run again.

mod common;
#[path = "../../fleet/tests/common/pg.rs"]
mod pg;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use common::launchers;
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
    assert_eq!(v["format_version"], 1, "{v}");
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

/// The journal of a part of `name` in `dir` being written now, if any.
fn part_journal(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|d| d.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(&format!(".{name}.")) && n.ends_with(".lhjournal") && n.contains('-')
        })
}

#[test]
fn a_rank_killed_mid_part_resumes_its_share_when_run_again() {
    let t = TempDir::new("fleet-kill");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 32 << 20, 200);
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = t.path().join("run");
    let run = run_dir.to_str().unwrap();
    // Rank 0 first: it writes the manifest, moves its share and waits for
    // the others; then only rank 1 writes parts.
    let r0 = rank(0, 4, &["--run-dir", run, "--json"], &src, &dest);
    let start = std::time::Instant::now();
    while !run_dir.join("rank-00000.json").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 0 never finished its share"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Rank 1, paced so that it can be caught mid-part, killed with SIGKILL.
    let mut r1 = rank(1, 4, &["--run-dir", run, "--rate", "40M"], &src, &dest);
    let journal = loop {
        if let Some(j) = part_journal(&dst.join("out"), "big.bin") {
            break j;
        }
        assert!(
            r1.try_wait().unwrap().is_none(),
            "rank 1 ended before its part began"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 1 never began its part"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    wait_for_records(&journal, 2, &mut r1, Duration::from_secs(60));
    r1.kill().unwrap();
    r1.wait().unwrap();
    assert!(
        !dst.join("out/big.bin").exists(),
        "nothing lands before every part is in"
    );
    // The others, and rank 1 run again under the same index.
    let rest: Vec<Child> = [1, 2, 3]
        .iter()
        .map(|r| rank(*r, 4, &["--run-dir", run], &src, &dest))
        .collect();
    for o in rest.into_iter().map(finished) {
        assert_exit(&o, 0);
    }
    let o = finished(r0);
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["final_check"]["resent_files"], 0, "{v}");
    let again: serde_json::Value =
        serde_json::from_slice(&fs::read(run_dir.join("rank-00001.json")).unwrap()).unwrap();
    assert!(
        again["resumed_bytes"].as_u64().unwrap() > 0,
        "rank 1 resumed its part from its journal: {again}"
    );
    assert_same_tree(&src, &dst.join("out"), false);
    no_leftovers(&dst);
}

#[test]
fn a_rank_without_a_launcher_or_a_run_dir_is_told_what_to_give() {
    let t = TempDir::new("fleet-usage");
    let src = t.dir("src");
    fs::write(src.join("f"), b"x").unwrap();
    let dest = "127.0.0.1:1:data/out/";
    let src_s = src.to_str().unwrap();
    let o = bin()
        .args(["cp", "--ranks", "auto", src_s, dest])
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("SLURM_PROCID"), "{}", stderr(&o));
    let o = bin()
        .args(["cp", "--rank", "0", "--size", "2", src_s, dest])
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("--run-dir"), "{}", stderr(&o));
    let o = bin()
        .args(["cp", "--run-dir", "/tmp/x", src_s, dest])
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("--ranks auto"), "{}", stderr(&o));
    let o = bin()
        .args([
            "cp",
            "--rank",
            "2",
            "--size",
            "2",
            "--run-dir",
            "/tmp/x",
            src_s,
            dest,
        ])
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("rank"), "{}", stderr(&o));
}

#[test]
fn four_ranks_drain_a_queue_and_a_killed_ranks_units_are_finished_by_the_others() {
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("fleet-queue");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 40 << 20, 300);
    let a = data_server(&dst, &t.dir("state-a"));
    let b = data_server(&dst, &t.dir("state-b"));
    let url = pg.url();
    // Small units and a short lease: many units, a quick take-over.
    let queue = |r: u32, extra: &[&str]| {
        let server = if r % 2 == 0 { a.addr() } else { b.addr() };
        let mut args = vec!["--queue", &url, "--unit", "4M", "--lease", "3s", "--json"];
        args.extend_from_slice(extra);
        rank(r, 4, &args, &src, &remote(server, "out/"))
    };
    // Rank 3 goes first, paced, and is killed holding leases.
    let mut doomed = queue(3, &["--rate", "40M"]);
    let start = std::time::Instant::now();
    loop {
        if part_journal(&dst.join("out"), "big.bin").is_some() {
            break;
        }
        assert!(
            doomed.try_wait().unwrap().is_none(),
            "rank 3 ended before it held a unit"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 3 never began"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let outs: Vec<Output> = (0..3)
        .map(|r| queue(r, &[]))
        .collect::<Vec<_>>()
        .into_iter()
        .map(finished)
        .collect();
    let mut results = Vec::new();
    for o in &outs {
        assert_exit(o, 0);
        if !o.stdout.is_empty() {
            results.push(json_of(o));
        }
    }
    assert_eq!(
        results.len(),
        1,
        "exactly one rank prints the result: {results:?}"
    );
    let v = &results[0];
    assert_eq!(v["mode"], "queue", "{v}");
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(
        v["lost"],
        serde_json::json!([3]),
        "rank 3 never reported: {v}"
    );
    assert_eq!(
        v["final_check"]["resent_files"], 0,
        "the queue finished rank 3's units: {v}"
    );
    // A session is fed unit after unit: far fewer sessions than units.
    let sum = |k: &str| {
        v["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(
        sum("sessions") * 2 <= sum("units"),
        "{} sessions carried {} units: {v}",
        sum("sessions"),
        sum("units")
    );
    assert_same_tree(&src, &dst.join("out"), false);
    no_leftovers(&dst);
    // The same command again: the run is done, nothing moves.
    let again: Vec<Output> = (0..2)
        .map(|r| {
            let server = a.addr();
            rank(
                r,
                2,
                &["--queue", &url, "--json"],
                &src,
                &remote(server, "out/"),
            )
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(finished)
        .collect();
    for o in &again {
        assert_exit(o, 0);
    }
}

/// The one JSON document among the ranks' merged stdout.
fn one_result(o: &Output) -> serde_json::Value {
    let docs: Vec<&str> = std::str::from_utf8(&o.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('{'))
        .collect();
    assert_eq!(
        docs.len(),
        1,
        "one result of all ranks: {}\n{}",
        stdout(o),
        stderr(o)
    );
    serde_json::from_str(docs[0]).unwrap()
}

#[test]
fn srun_starts_four_ranks_that_share_a_tree_over_two_servers() {
    let Some(slurm) = launchers::Slurm::start() else {
        return;
    };
    let t = TempDir::new("fleet-srun");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 24 << 20, 200);
    let a = data_server(&dst, &t.dir("state-a"));
    let b = data_server(&dst, &t.dir("state-b"));
    let run_dir = t.path().join("run");
    let servers = format!("{},{}", a.addr(), b.addr());
    let src_arg = format!("{}/", src.display());
    let dest = remote(a.addr(), "out/");
    let o = slurm.srun(
        4,
        Path::new(env!("CARGO_BIN_EXE_longhaul")),
        &[
            "cp",
            "-r",
            "--chunk",
            "1M",
            "--ranks",
            "auto",
            "--json",
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--servers",
            &servers,
            &src_arg,
            &dest,
        ],
        &client_env(),
    );
    assert!(o.status.success(), "srun: {}\n{}", stdout(&o), stderr(&o));
    let v = one_result(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["ranks"], 4);
    for r in v["per_rank"].as_array().unwrap() {
        assert!(
            r["launcher"].as_str().unwrap().contains("SLURM_PROCID"),
            "{r}"
        );
    }
    assert_eq!(v["final_check"]["resent_files"], 0, "{v}");
    assert_same_tree(&src, &dst.join("out"), false);
    no_leftovers(&dst);
}

#[test]
fn mpirun_starts_four_ranks_that_drain_a_queue() {
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("fleet-mpirun");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 24 << 20, 200);
    let a = data_server(&dst, &t.dir("state-a"));
    let b = data_server(&dst, &t.dir("state-b"));
    let servers = format!("{},{}", a.addr(), b.addr());
    let src_arg = format!("{}/", src.display());
    let dest = remote(a.addr(), "out/");
    let url = pg.url();
    let Some(o) = launchers::mpirun(
        4,
        Path::new(env!("CARGO_BIN_EXE_longhaul")),
        &[
            "cp",
            "-r",
            "--chunk",
            "1M",
            "--ranks",
            "auto",
            "--json",
            "--queue",
            &url,
            "--unit",
            "4M",
            "--servers",
            &servers,
            &src_arg,
            &dest,
        ],
        &client_env(),
    ) else {
        return;
    };
    assert!(o.status.success(), "mpirun: {}\n{}", stdout(&o), stderr(&o));
    let v = one_result(&o);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["mode"], "queue");
    for r in v["per_rank"].as_array().unwrap() {
        assert!(
            r["launcher"]
                .as_str()
                .unwrap()
                .contains("OMPI_COMM_WORLD_RANK"),
            "{r}"
        );
    }
    assert_same_tree(&src, &dst.join("out"), false);
    no_leftovers(&dst);
}

#[test]
fn an_indexed_jobs_pods_take_their_rank_from_the_completion_index() {
    let t = TempDir::new("fleet-k8s");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    dataset(&src, 8 << 20, 50);
    let a = data_server(&dst, &t.dir("state"));
    let run_dir = t.path().join("run");
    let src_arg = format!("{}/", src.display());
    let dest = remote(a.addr(), "out/");
    let outs = launchers::indexed_job(
        3,
        Path::new(env!("CARGO_BIN_EXE_longhaul")),
        &[
            "cp",
            "-r",
            "--chunk",
            "1M",
            "--ranks",
            "auto",
            "--size",
            "3",
            "--json",
            "--run-dir",
            run_dir.to_str().unwrap(),
            &src_arg,
            &dest,
        ],
        &client_env(),
    );
    for o in &outs {
        assert_exit(o, 0);
        assert!(stderr(o).contains("JOB_COMPLETION_INDEX"), "{}", stderr(o));
    }
    let v = json_of(&outs[0]);
    assert_eq!(v["verified"], true, "{v}");
    assert_same_tree(&src, &dst.join("out"), false);
}
