//! One transfer across many ranks (`cp --rank R --size N`, `--ranks
//! auto`): static shares cut from one manifest and a PostgreSQL work
//! queue, several servers writing into one shared destination (as DTNs
//! onto one parallel file system), ranks killed and run again.

use crate::common;
use common::pg;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use common::launchers;
use common::xfer::*;
use common::*;
use longhaul_fleet::manifest::{Entry, Manifest};
use longhaul_fleet::run::RankResult;
use longhaul_proto::xfer::Kind;

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
    rank_waiting(rank, size, "120s", extra, src, dest)
}

/// [`rank`], waiting up to `wait` for the manifest and the others' results.
fn rank_waiting(rank: u32, size: u32, wait: &str, extra: &[&str], src: &Path, dest: &str) -> Child {
    let src = format!("{}/", src.display());
    bin()
        .args(["cp", "-r", "--chunk", "1M", "--rank"])
        .arg(rank.to_string())
        .args(["--size", &size.to_string(), "--fleet-wait", wait])
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
    // Until it has verified a chunk of a unit: it holds a lease with work done.
    loop {
        if part_journal(&dst.join("out"), "big.bin").is_some_and(|j| journal_records(&j) > 0) {
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
    // A session is fed unit after unit: fewer sessions than units (with a
    // session per lease they would be equal). Not a ratio: on a loaded
    // machine a session's one-minute span ends some sessions early.
    let sum = |k: &str| {
        v["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(
        sum("sessions") < sum("units"),
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

/// The source argument [`rank`] gives, as the manifest records it.
fn source_arg(src: &Path) -> String {
    format!("{}/", src.display())
}

/// The manifest rank 0 would write for [`rank`]'s command.
fn true_manifest(src: &Path) -> Manifest {
    Manifest::walk(&[source_arg(src)], true, Some(1 << 20)).expect("walk the sources")
}

/// A run directory of this user's alone, as a rank makes it.
fn private_run_dir(t: &TempDir) -> std::path::PathBuf {
    let run_dir = t.path().join("run");
    fs::create_dir(&run_dir).unwrap();
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o700)).unwrap();
    run_dir
}

/// No file anywhere under `root` holds `secret`.
#[track_caller]
fn never_landed(root: &Path, secret: &[u8]) {
    for (name, _) in snapshot(root) {
        let p = root.join(&name);
        if p.is_file() && !p.is_symlink() {
            assert_ne!(fs::read(&p).unwrap(), secret, "{name} holds the secret");
        }
    }
}

/// A small tree, and beside it (outside the sources) a file standing in
/// for /etc/shadow, with a link in the tree to its directory.
fn attacked_tree(t: &TempDir) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let src = t.dir("src");
    dataset(&src, 3 << 20, 20);
    let outside = t.dir("outside");
    let secret = b"root:$6$not-for-the-destination:19000:0:99999:7:::\n".to_vec();
    fs::write(outside.join("shadow"), &secret).unwrap();
    symlink(&outside, src.join("esc")).unwrap();
    (src, outside, secret)
}

/// An entry for a file, as the walk makes one, but named and placed by an
/// attacker.
fn planted(rel: &str, path: &Path) -> Entry {
    let m = fs::metadata(path).unwrap();
    Entry {
        rel: rel.into(),
        path: path.to_path_buf(),
        kind: Kind::File,
        size: m.len(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        chunk_size: 1 << 20,
    }
}

fn with_entry(mut m: Manifest, e: Entry) -> Manifest {
    m.entries.retain(|x| !x.rel.starts_with("src/esc"));
    m.entries.push(e);
    m.entries
        .sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
    m
}

#[test]
fn a_planted_manifest_entry_outside_the_sources_is_refused_and_never_lands() {
    let t = TempDir::new("fleet-planted");
    let (src, outside, secret) = attacked_tree(&t);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = private_run_dir(&t);
    let forgeries = [
        // A name beneath the sources, read from a file outside them.
        planted("src/shadow", &outside.join("shadow")),
        // A name that climbs out.
        planted("src/../outside/shadow", &outside.join("shadow")),
        // A name beneath the sources that resolves through a link out of them.
        planted("src/esc/shadow", &src.join("esc/shadow")),
    ];
    for e in forgeries {
        let rel = e.rel.clone();
        let m = with_entry(true_manifest(&src), e);
        fs::write(run_dir.join("manifest.jsonl"), m.encode()).unwrap();
        let o = finished(rank(
            0,
            1,
            &["--run-dir", run_dir.to_str().unwrap()],
            &src,
            &dest,
        ));
        assert!(!o.status.success(), "{rel}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("refusing the manifest's entry {rel:?}")),
            "{rel}: {err}"
        );
        assert!(
            !err.contains(outside.to_str().unwrap()),
            "the error names the entry, not the file: {err}"
        );
        never_landed(&dst, &secret);
    }
    let shadow = outside.join("shadow");
    assert_eq!(fs::read(shadow).unwrap(), secret);
}

#[test]
fn a_planted_entry_in_the_queues_table_is_refused_and_never_lands() {
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("fleet-queue-planted");
    let (src, outside, secret) = attacked_tree(&t);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let url = pg.url();
    let forgeries = [
        (
            "planted-path",
            planted("src/shadow", &outside.join("shadow")),
        ),
        (
            "planted-link",
            planted("src/esc/shadow", &src.join("esc/shadow")),
        ),
    ];
    for (run, e) in forgeries {
        let rel = e.rel.clone();
        // A queue user publishes the run first, its hash made to match.
        let m = with_entry(true_manifest(&src), e);
        let units = longhaul_fleet::shard::queue_units(&m.items(), 4 << 20, 2_000);
        let mut q = longhaul_fleet::queue::Queue::connect(&url, run).unwrap();
        q.publish(&m.hash(), &m.encode(), &units).unwrap();
        let o = finished(rank(0, 1, &["--queue", &url, "--run-id", run], &src, &dest));
        assert!(!o.status.success(), "{run}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(&format!("refusing the manifest's entry {rel:?}")),
            "{run}: {err}"
        );
        never_landed(&dst, &secret);
    }
}

/// Units held by a rank that keeps its leases and finishes nothing: the
/// rank with nothing to lease waits at most `--fleet-wait` without
/// progress, then says what to do, instead of waiting forever.
#[test]
fn a_rank_waits_on_units_others_hold_and_never_finish_at_most_the_fleet_wait() {
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("fleet-queue-held");
    let src = t.dir("src");
    dataset(&src, 1 << 20, 20);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let (url, run) = (pg.url(), "held");
    let m = true_manifest(&src);
    let units = longhaul_fleet::shard::queue_units(&m.items(), 4 << 20, 2_000);
    let mut q = longhaul_fleet::queue::Queue::connect(&url, run).unwrap();
    q.publish(&m.hash(), &m.encode(), &units).unwrap();
    let held = q
        .lease("stuck-rank", 10_000, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(held.len(), units.len());
    let extra = ["--queue", &url, "--run-id", run];
    let mut child = rank_waiting(0, 1, "3s", &extra, &src, &dest);
    let ended = (0..1200).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !ended {
        let _ = child.kill();
    }
    let o = finished(child);
    assert!(ended, "the rank still waited after 120 s: {}", stderr(&o));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{} unit(s) of the queue are held by other ranks",
            units.len()
        )) && err.contains("--fleet-wait")
            && err.contains("--run-id"),
        "{err}"
    );
}

#[test]
fn a_link_planted_at_a_temporary_name_in_the_run_directory_is_not_written_through() {
    let t = TempDir::new("fleet-tmp-link");
    let src = t.dir("src");
    dataset(&src, 2 << 20, 10);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = private_run_dir(&t);
    let run = run_dir.to_str().unwrap();
    let victim = t.path().join("victim");
    fs::write(&victim, b"a file of the rank's user").unwrap();
    // Rank 1 waits for the manifest: nothing of it is written yet when
    // the link is planted at the temporary name it would write through.
    let r1 = rank(1, 2, &["--run-dir", run], &src, &dest);
    symlink(&victim, run_dir.join(format!("rank-00001.tmp.{}", r1.id()))).unwrap();
    let r0 = rank(0, 2, &["--run-dir", run, "--json"], &src, &dest);
    let (o1, o0) = (finished(r1), finished(r0));
    assert_exit(&o1, 0);
    assert_exit(&o0, 0);
    assert_eq!(fs::read(&victim).unwrap(), b"a file of the rank's user");
    let result = run_dir.join("rank-00001.json");
    assert!(!result.is_symlink(), "the result is a file of its own");
    let r: serde_json::Value = serde_json::from_slice(&fs::read(&result).unwrap()).unwrap();
    assert_eq!(r["rank"], 1, "{r}");
    assert_eq!(
        fs::metadata(&result).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(json_of(&o0)["per_rank"].as_array().unwrap().len(), 2);
}

#[test]
fn a_run_directory_writable_by_others_is_refused_with_the_reason() {
    let t = TempDir::new("fleet-open-run-dir");
    let src = t.dir("src");
    dataset(&src, 1 << 20, 5);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = t.path().join("run");
    fs::create_dir(&run_dir).unwrap();
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o777)).unwrap();
    for r in [0, 1] {
        let o = finished(rank(
            r,
            2,
            &["--run-dir", run_dir.to_str().unwrap()],
            &src,
            &dest,
        ));
        assert_exit(&o, 2);
        let err = stderr(&o);
        assert!(
            err.contains("writable by others (mode 0777)") && err.contains("chmod go-w"),
            "rank {r}: {err}"
        );
    }
    assert!(!dst.join("out").exists(), "nothing moved");
}

#[test]
fn a_forged_rank_result_is_not_taken_into_the_fleets_result() {
    let t = TempDir::new("fleet-forged-result");
    let src = t.dir("src");
    // No file split across the two ranks: rank 1's share is whole files,
    // which the final check sends.
    dataset(&src, 512 << 10, 10);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = private_run_dir(&t);
    let m = true_manifest(&src);
    fs::write(run_dir.join("manifest.jsonl"), m.encode()).unwrap();
    // Rank 1 never runs; a result in its name claims its share and more.
    let forged = RankResult {
        rank: 1,
        host: "forged-host".into(),
        launcher: "flags".into(),
        manifest: m.hash(),
        started_unix_ms: 1,
        ended_unix_ms: 2,
        files: 1,
        bytes: 1 << 40,
        seconds: 0.001,
        bits_per_second: 8e15,
        units: 1,
        sessions: 1,
        ..RankResult::default()
    };
    fs::write(
        run_dir.join("rank-00001.json"),
        serde_json::to_vec(&forged).unwrap(),
    )
    .unwrap();
    let o = finished(rank_waiting(
        0,
        2,
        "3s",
        &["--run-dir", run_dir.to_str().unwrap(), "--json"],
        &src,
        &dest,
    ));
    assert_exit(&o, 0);
    let v = json_of(&o);
    assert_eq!(v["per_rank"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["lost"], serde_json::json!([1]), "{v}");
    assert!(!stdout(&o).contains("forged-host"), "{v}");
    assert!(
        stderr(&o).contains("rank-00001.json: not a result of this run's plan"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        v["verified"], true,
        "the final check sent rank 1's share: {v}"
    );
    assert_same_tree(&src, &dst.join("out"), false);
}

#[test]
fn a_fleet_run_again_over_a_finished_tree_says_it_is_up_to_date() {
    let t = TempDir::new("fleet-again");
    let src = t.dir("src");
    dataset(&src, 3 << 20, 30);
    let dst = t.dir("dst");
    let server = data_server(&dst, &t.dir("state"));
    let dest = remote(server.addr(), "out/");
    let run_dir = t.path().join("run");
    let run = run_dir.to_str().unwrap();
    // Rank 1 first, then rank 0: rank 0 reads this run's result of rank 1.
    let both = |json: bool| {
        let extra: &[&str] = if json {
            &["--run-dir", run, "--json"]
        } else {
            &["--run-dir", run]
        };
        let o1 = finished(rank(1, 2, &["--run-dir", run], &src, &dest));
        assert_exit(&o1, 0);
        let o0 = finished(rank(0, 2, extra, &src, &dest));
        assert_exit(&o0, 0);
        (o0, o1)
    };
    // Rank 1 waits for the manifest rank 0 writes: start rank 0 first.
    let r0 = rank(0, 2, &["--run-dir", run, "--json"], &src, &dest);
    let o1 = finished(rank(1, 2, &["--run-dir", run], &src, &dest));
    assert_exit(&o1, 0);
    let first = json_of(&finished(r0));
    assert_eq!(first["verified"], true, "{first}");
    assert_eq!(first["up_to_date"], false, "{first}");
    let (o0, o1) = both(true);
    let again = json_of(&o0);
    assert_eq!(again["verified"], true, "{again}");
    assert_eq!(again["up_to_date"], true, "{again}");
    assert!(stderr(&o1).contains("nothing to move"), "{}", stderr(&o1));
    let (o0, _) = both(false);
    let out = stdout(&o0);
    assert!(out.starts_with("up to date: "), "{out}");
    assert!(!out.contains("bit/s"), "no rate of nothing moved: {out}");
    assert_same_tree(&src, &dst.join("out"), false);
}

/// A fleet of third-party copies on the queue: each rank leases units and
/// orders the source server to push each straight to the destination; the
/// ranks carry control only.
#[test]
fn two_ranks_drain_a_queue_of_third_party_copies_from_one_server_to_another() {
    let Some(pg) = pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("fleet-3rd-queue");
    let (ra, rb) = (t.dir("a"), t.dir("b"));
    dataset(&ra.join("tree"), 6 << 20, 40);
    let server = |root: &Path, state: &str| {
        spawn_server(longhaul_engine::server::ServeConfig {
            third_party_copies: true,
            ..data_config(root, &t.dir(state), false)
        })
    };
    let (a, b) = (server(&ra, "state-a"), server(&rb, "state-b"));
    let url = pg.url();
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            bin()
                .args([
                    "cp",
                    "-r",
                    "--chunk",
                    "1M",
                    "--rank",
                    &r.to_string(),
                    "--ranks",
                    "2",
                ])
                .args(["--queue", &url, "--unit", "2M", "--lease", "10s", "--json"])
                .args(["--fleet-wait", "60s"])
                .args(tokens_for(&[
                    &remote(a.addr(), "tree"),
                    &remote(b.addr(), ""),
                ]))
                .args([remote(a.addr(), "tree"), remote(b.addr(), "")])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(finished).collect();
    let mut results = Vec::new();
    for o in &outs {
        assert_exit(o, 0);
        if !o.stdout.is_empty() {
            results.push(json_of(o));
        }
    }
    assert_eq!(results.len(), 1, "one rank prints the result: {results:?}");
    let v = &results[0];
    assert_eq!(v["mode"], "queue", "{v}");
    assert_eq!(v["verified"], true, "{v}");
    let carried: u64 = v["per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let (bytes, control) = (
                r["bytes"].as_u64().unwrap(),
                r["control_bytes"].as_u64().unwrap_or(0),
            );
            assert!(control < 1 << 20, "the ranks carry control only: {r}");
            bytes
        })
        .sum();
    assert!(carried >= 6 << 20, "{v}");
    assert_same_tree(&ra.join("tree"), &rb.join("tree"), false);
    no_leftovers(&rb);
    a.shutdown();
    b.shutdown();
}
