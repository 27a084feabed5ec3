//! Data at the edges (issue 13): a lone symbolic link, trailing slashes and
//! missing directories, a source that changes while it is read, special
//! mode bits, planted journals and partial files, Ctrl-C and a closed
//! stdout. Each test plays what a user (or an attacker) did and checks that
//! no byte is lost, torn or written where it should not be.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::xfer::storage::Local;

use crate::common;
use common::xfer::*;
use common::{assert_exit, bin, stderr, stdout, TempDir};

fn link(target: &str, at: &Path) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

fn read_link(p: &Path) -> String {
    fs::read_link(p)
        .unwrap_or_else(|e| panic!("{} is not a link: {e}", p.display()))
        .display()
        .to_string()
}

// --------------------------------------------------------- dry runs

/// `sync -n` counts what the real sync does: the files up to date are the
/// ones the real run skips, and a link already pointing the same way is up
/// to date, never "would send" and never made again (issue 41 A5); both
/// ways, push and pull.
#[test]
fn a_dry_run_counts_as_the_real_run_and_an_unchanged_link_is_up_to_date() {
    let t = TempDir::new("dryrun");
    let exp = t.dir("export");
    let tree = t.dir("src").join("tree");
    for (i, name) in ["a.bin", "b.bin", "sub/c.bin"].iter().enumerate() {
        write_random(&tree.join(name), 1000 + i, 60 + i as u64);
    }
    link("a.bin", &tree.join("ln"));
    let s = data_server(&exp, &t.dir("state"));
    let dest = remote(s.addr(), "");
    let src = tree.to_str().unwrap();
    let v = cp_ok(&["-r", src, &dest]);
    assert_eq!(
        (v["files"].as_u64(), v["links"].as_u64()),
        (Some(3), Some(1)),
        "{v}"
    );
    let pulled = t.dir("pulled");
    let back = remote(s.addr(), "tree");
    cp_ok(&["-r", &back, pulled.to_str().unwrap()]);
    for (from, to) in [
        (src.to_string(), dest.clone()),
        (back, pulled.display().to_string()),
    ] {
        let o = longhaul(&["sync", "-n", &from, &to]);
        assert_exit(&o, 0);
        let out = stdout(&o);
        assert!(
            out.contains("would send 0 file(s) and link(s)"),
            "{from}: {out}"
        );
        assert!(out.contains("; 3 up to date"), "{from}: {out}");
        assert!(!out.contains("would send:"), "{from}: {out}");
        let o = longhaul(&["sync", "-n", "--json", &from, &to]);
        let v = json_of(&o);
        assert_eq!(v["skipped"], 3, "{from}: {v}");
        assert_eq!(v["links_up_to_date"], 1, "{from}: {v}");
        assert!(v.get("would_send").is_none(), "{from}: {v}");
        // The real run: nothing sent, the link left alone and not counted as made.
        let o = longhaul(&["sync", "--json", &from, &to]);
        assert_exit(&o, 0);
        let v = json_of(&o);
        assert_eq!(
            (v["files"].as_u64(), v["skipped"].as_u64()),
            (Some(0), Some(3)),
            "{v}"
        );
        assert_eq!(v["links_up_to_date"], 1, "{from}: {v}");
        let o = longhaul(&["sync", &from, &to]);
        assert!(!stdout(&o).contains("link(s)"), "{from}: {}", stdout(&o));
    }
    // One changed file: sent, the two others and the link up to date.
    write_random(&tree.join("b.bin"), 1500, 70);
    let o = longhaul(&["sync", "-n", src, &dest]);
    let out = stdout(&o);
    assert!(out.contains("would send 1 file(s) and link(s)"), "{out}");
    assert!(out.contains("; 2 up to date"), "{out}");
    assert!(
        out.contains("would send: tree/b.bin -> data/tree/b.bin"),
        "{out}"
    );
    s.shutdown();
}

// ----------------------------------------------------------- lone links

#[test]
fn a_lone_link_is_copied_as_itself_and_never_over_another_file() {
    let t = TempDir::new("lonelink");
    let exp = t.dir("export");
    let run7 = exp.join("run7");
    fs::create_dir(&run7).unwrap();
    fs::write(run7.join("f1.dat"), b"server data").unwrap();
    link("f1.dat", &run7.join("link"));
    link("no/such/target", &run7.join("dangling"));
    link("/etc/passwd", &run7.join("outside"));
    let s = data_server(&exp, &t.dir("state"));

    // Pull: the link lands under its own name; the file named like its
    // target is the user's and stays.
    let lt3 = t.dir("lt3");
    fs::write(lt3.join("f1.dat"), b"precious").unwrap();
    let v = cp_ok(&[&remote(s.addr(), "run7/link"), lt3.to_str().unwrap()]);
    assert_eq!(fs::read(lt3.join("f1.dat")).unwrap(), b"precious");
    assert_eq!(read_link(&lt3.join("link")), "f1.dat");
    assert_eq!(v["links"], 1, "{v}");
    assert_eq!(v["files"], 0, "{v}");
    // A dangling link, and one leading out of the export: copied as links,
    // never followed.
    let v = cp_ok(&[&remote(s.addr(), "run7/dangling"), lt3.to_str().unwrap()]);
    assert_eq!(read_link(&lt3.join("dangling")), "no/such/target");
    assert_eq!(v["links"], 1, "{v}");
    cp_ok(&[&remote(s.addr(), "run7/outside"), lt3.to_str().unwrap()]);
    assert_eq!(read_link(&lt3.join("outside")), "/etc/passwd");
    // The human summary counts the link it made; one already there,
    // pointing the same way, is up to date: left alone, not made again.
    let o = bin()
        .args(["cp", &remote(s.addr(), "run7/link"), lt3.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert!(!stdout(&o).contains("link(s)"), "{}", stdout(&o));
    fs::remove_file(lt3.join("link")).unwrap();
    let o = bin()
        .args(["cp", &remote(s.addr(), "run7/link"), lt3.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("1 link(s)"), "{}", stdout(&o));

    // Push: the same, on the server.
    let local = t.dir("local");
    fs::write(local.join("f1.dat"), b"local data").unwrap();
    link("f1.dat", &local.join("link"));
    link("gone", &local.join("dangling"));
    let dst = exp.join("dst");
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("f1.dat"), b"precious on the server").unwrap();
    for name in ["link", "dangling"] {
        let v = cp_ok(&[
            local.join(name).to_str().unwrap(),
            &format!("{}:{}:data/dst/", s.addr().ip(), s.addr().port()),
        ]);
        assert_eq!(v["links"], 1, "{v}");
    }
    assert_eq!(
        fs::read(dst.join("f1.dat")).unwrap(),
        b"precious on the server"
    );
    assert_eq!(read_link(&dst.join("link")), "f1.dat");
    assert_eq!(read_link(&dst.join("dangling")), "gone");
    // Named as the destination, a link replaces what was there (rsync).
    cp_ok(&[
        local.join("link").to_str().unwrap(),
        &remote(s.addr(), "dst/renamed-link"),
    ]);
    assert_eq!(read_link(&dst.join("renamed-link")), "f1.dat");
    assert_no_leftovers(&exp);
    assert_no_leftovers(&lt3);
    s.shutdown();
}

// ------------------------------------------------- where files land

/// Every path beneath `root`, relative and sorted.
fn names(root: &Path) -> Vec<String> {
    snapshot(root).into_keys().collect()
}

#[test]
fn destinations_follow_one_rule_and_missing_directories_need_mkpath() {
    let t = TempDir::new("landing");
    let exp = t.dir("export");
    let src = t.dir("src");
    let a = src.join("a.bin");
    write_random(&a, 70_000, 1);
    let tree = src.join("tree");
    write_random(&tree.join("x.bin"), 1000, 2);
    write_random(&tree.join("sub/y.bin"), 2000, 3);
    fs::write(exp.join("afile"), b"keep").unwrap();
    fs::create_dir(exp.join("existing")).unwrap();
    let s = data_server(&exp, &t.dir("state"));
    let r = |p: &str| format!("{}:{}:data/{p}", s.addr().ip(), s.addr().port());
    let before = names(&exp);

    // A trailing slash names a directory: refused when it does not exist,
    // with nothing created (today's main wrote the file as `dir`).
    let o = bin()
        .args(["cp", a.to_str().unwrap(), &r("no/such/dir/")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    assert!(
        stderr(&o).contains("does not exist") && stderr(&o).contains("--mkpath"),
        "{}",
        stderr(&o)
    );
    let o = bin()
        .args(["cp", a.to_str().unwrap(), &r("newdir/")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    // ...and never a file.
    let o = bin()
        .args(["cp", a.to_str().unwrap(), &r("afile/")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    // A new name whose directory is missing: refused too.
    let o = bin()
        .args(["cp", a.to_str().unwrap(), &r("no/such/name.bin")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    // Several sources need an existing directory.
    let o = bin()
        .args(["cp", a.to_str().unwrap(), a.to_str().unwrap(), &r("many")])
        .output()
        .unwrap();
    assert_exit(&o, 4);
    assert_eq!(names(&exp), before, "a refused copy created something");
    // The dry run says where each file would land, and creates nothing.
    let o = bin()
        .args(["sync", "-n", &format!("{}/", tree.display()), &r("mirror")])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.contains("would send: tree/x.bin -> data/mirror/x.bin"),
        "{out}"
    );
    assert!(
        out.contains("would send: tree/sub/y.bin -> data/mirror/sub/y.bin"),
        "{out}"
    );
    let o = bin()
        .args(["sync", "-n", tree.to_str().unwrap(), &r("existing/")])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains("would send: tree/x.bin -> data/existing/tree/x.bin"),
        "{}",
        stdout(&o)
    );
    assert_eq!(names(&exp), before, "a dry run created something");

    // --mkpath creates what the destination names.
    cp_ok(&["--mkpath", a.to_str().unwrap(), &r("no/such/dir/")]);
    assert_same_file(&a, &exp.join("no/such/dir/a.bin"));
    cp_ok(&["--mkpath", a.to_str().unwrap(), &r("p/q/name.bin")]);
    assert_same_file(&a, &exp.join("p/q/name.bin"));
    // One file onto a new name in an existing directory; onto a file.
    cp_ok(&[a.to_str().unwrap(), &r("new.bin")]);
    assert_same_file(&a, &exp.join("new.bin"));
    cp_ok(&[a.to_str().unwrap(), &r("afile")]);
    assert_same_file(&a, &exp.join("afile"));
    // A tree by name into a directory, and SRC/ (its contents) onto a new
    // name, then onto it again (merged).
    cp_ok(&["-r", tree.to_str().unwrap(), &r("existing/")]);
    assert_same_file(
        &tree.join("sub/y.bin"),
        &exp.join("existing/tree/sub/y.bin"),
    );
    cp_ok(&["-r", &format!("{}/", tree.display()), &r("mirror")]);
    assert_same_file(&tree.join("sub/y.bin"), &exp.join("mirror/sub/y.bin"));
    assert!(!exp.join("mirror/tree").exists());
    cp_ok(&["-r", &format!("{}/", tree.display()), &r("mirror/")]);
    assert!(!exp.join("mirror/tree").exists());
    // A mix of SRC/ and SRC is refused before anything moves.
    let o = bin()
        .args([
            "cp",
            "-r",
            &format!("{}/", tree.display()),
            a.to_str().unwrap(),
            &r("existing"),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 2);

    // Pulls follow the same rule on the local side.
    let local = t.dir("local");
    let before = names(&local);
    let o = bin()
        .args([
            "cp",
            &r("new.bin"),
            &format!("{}/missing/", local.display()),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("--mkpath"), "{}", stderr(&o));
    let o = bin()
        .args([
            "cp",
            &r("new.bin"),
            &format!("{}/no/such/name", local.display()),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 2);
    assert_eq!(names(&local), before);
    cp_ok(&[
        "--mkpath",
        &r("new.bin"),
        &format!("{}/missing/", local.display()),
    ]);
    assert_same_file(&a, &local.join("missing/new.bin"));
    cp_ok(&["-r", &r("mirror/"), &format!("{}/m", local.display())]);
    assert_same_file(&tree.join("x.bin"), &local.join("m/x.bin"));
    let o = bin()
        .args([
            "sync",
            "-n",
            &r("mirror/"),
            &format!("{}/m2", local.display()),
        ])
        .output()
        .unwrap();
    assert_exit(&o, 0);
    assert!(
        stdout(&o).contains(&format!("-> {}/m2/sub/y.bin", local.display())),
        "{}",
        stdout(&o)
    );
    assert!(!local.join("m2").exists());
    assert_no_leftovers(&exp);
    s.shutdown();
}

// ------------------------------------------ a source that changes

/// Overwrites `len` bytes of `path` at each offset, in place (the same
/// inode: a program writing into its output file).
fn overwrite(path: &Path, offsets: &[u64], len: usize, seed: u64) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    let bytes = Rng::new(seed).bytes(len);
    for &o in offsets {
        f.write_all_at(&bytes, o).unwrap();
    }
}

/// Waits until the destination has verified `chunks` chunks of `target`
/// (its journal says so): the copy is under way, and not near its end.
fn wait_until_under_way(target: &Path, chunks: u64, child: &mut std::process::Child) {
    wait_for_records(
        &side(target, "lhjournal"),
        chunks,
        child,
        Duration::from_secs(60),
    );
}

fn changed_mid_copy(pull: bool) {
    let t = TempDir::new(if pull { "changed-pull" } else { "changed-push" });
    let exp = t.dir("export");
    let local = t.dir("local");
    let (src_dir, dst_dir) = if pull { (&exp, &local) } else { (&local, &exp) };
    let file = src_dir.join("big.bin");
    let size = 48 * MIB;
    write_random(&file, size as usize, 21);
    let s = data_server(&exp, &t.dir("state"));
    let (from, to) = if pull {
        (
            remote(s.addr(), "big.bin"),
            local.to_str().unwrap().to_string(),
        )
    } else {
        (file.to_str().unwrap().to_string(), remote(s.addr(), ""))
    };
    // Paced so that it is still being read when it changes (about 5 s).
    let mut child = bin()
        .args([
            "cp", "--json", "--chunk", "1M", "--rate", "80mbit", "-P", "2", &from, &to,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_under_way(&dst_dir.join("big.bin"), 4, &mut child);
    // Its head (read already) and its tail (not yet), as the issue did.
    overwrite(&file, &[0, size - 2 * MIB], MIB as usize, 99);
    let o = child.wait_with_output().unwrap();
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verified"], true, "{v}");
    assert!(v["resent_changed"].as_u64().unwrap() >= 1, "{v}");
    // Never the old head with the new tail: what arrived is the file as it
    // is now, read again whole.
    assert_same_file(&file, &dst_dir.join("big.bin"));
    assert_no_leftovers(dst_dir);
    s.shutdown();
}

#[test]
fn a_file_changed_during_a_push_is_sent_again_never_torn() {
    changed_mid_copy(false);
}

#[test]
fn a_file_changed_during_a_pull_is_sent_again_never_torn() {
    changed_mid_copy(true);
}

#[test]
fn a_file_that_keeps_changing_fails_as_changed_and_lands_nowhere() {
    let t = TempDir::new("changing");
    let exp = t.dir("export");
    let local = t.dir("local");
    let file = local.join("log.bin");
    // Larger than the streams' socket buffers together (4 x 4 MiB), so
    // that the paced copy reads it over seconds, not in one burst.
    write_random(&file, 48 * MIB as usize, 5);
    fs::write(exp.join("log.bin"), b"the old version").unwrap();
    let s = data_server(&exp, &t.dir("state"));
    // A writer that never stops while the copy reads: every read of the
    // file, however the machine is loaded, sees it change.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, file) = (stop.clone(), file.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                overwrite(&file, &[(i * 4096) % (47 * MIB)], 4096, i);
                i += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let o = bin()
        .args([
            "cp",
            "--json",
            "--rate",
            "400mbit",
            file.to_str().unwrap(),
            &remote(s.addr(), ""),
        ])
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_exit(&o, 6);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verified"], false, "{v}");
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("changed while it was read"),
        "{v}"
    );
    // The destination's old version is untouched; nothing torn, nothing left.
    assert_eq!(fs::read(exp.join("log.bin")).unwrap(), b"the old version");
    assert_no_leftovers(&exp);
    s.shutdown();
}

// ---------------------------------------------------------- modes

#[test]
fn setuid_setgid_sticky_and_open_directories_are_stripped_unless_kept() {
    let t = TempDir::new("modes");
    let src = t.dir("src/tree");
    let tool = src.join("tool");
    fs::write(&tool, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o6755)).unwrap();
    let open = src.join("drop");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;

    let exp = t.dir("export");
    let s = data_server(&exp, &t.dir("state"));
    cp_ok(&["-r", "-p", src.to_str().unwrap(), &remote(s.addr(), "")]);
    assert_eq!(mode(&exp.join("tree/tool")), 0o755);
    assert_eq!(mode(&exp.join("tree/drop")), 0o775);
    // Pulled back with -p: stripped on this side too, unless asked.
    let local = t.dir("local");
    cp_ok(&[
        "-r",
        "-p",
        &remote(s.addr(), "tree"),
        local.to_str().unwrap(),
    ]);
    assert_eq!(mode(&local.join("tree/tool")), 0o755);
    s.shutdown();
    fs::set_permissions(exp.join("tree/tool"), fs::Permissions::from_mode(0o4750)).unwrap();
    let keep = t.dir("keep");
    let kept = Server::bind(
        &["127.0.0.1:0".parse().unwrap()],
        ServeConfig {
            exports: vec![longhaul_engine::xfer::Export {
                name: "data".into(),
                root: exp.canonicalize().unwrap(),
                read_only: false,
                public: false,
            }],
            storage: Arc::new(Local),
            sync_files: false,
            keep_special_modes: true,
            state_dir: common::prepare_state(&t.dir("state2")),
            ..ServeConfig::default()
        },
    )
    .unwrap()
    .spawn();
    cp_ok(&[
        "-r",
        "-p",
        "--keep-special-modes",
        &remote(kept.addr(), "tree/tool"),
        keep.to_str().unwrap(),
    ]);
    assert_eq!(mode(&keep.join("tool")), 0o4750);
    fs::create_dir(exp.join("kept")).unwrap();
    cp_ok(&[
        "-r",
        "-p",
        src.to_str().unwrap(),
        &remote(kept.addr(), "kept"),
    ]);
    assert_eq!(mode(&exp.join("kept/tree/tool")), 0o6755);
    assert_eq!(mode(&exp.join("kept/tree/drop")), 0o1777);
    kept.shutdown();
}

// ------------------------------------------- planted partial files

#[test]
fn planted_journals_and_partial_files_are_never_followed() {
    let t = TempDir::new("planted");
    let exp = t.dir("export");
    let src = t.dir("src");
    let outside = t.dir("outside");
    let victim = outside.join("victim");
    fs::write(&victim, b"must stay as it is").unwrap();
    let s = data_server(&exp, &t.dir("state"));
    // Each plants something under the journal's or the partial file's name.
    type Plant<'a> = &'a dyn Fn(&Path, &Path);
    let cases: [(&str, Plant); 4] = [
        // A journal that reads without end, and one that blocks on open.
        ("zero", &|j, _| link("/dev/zero", j)),
        ("fifo", &|j, _| {
            let mode = rustix::fs::Mode::from_raw_mode(0o600);
            rustix::fs::mkfifoat(rustix::fs::CWD, j, mode).unwrap();
        }),
        // A partial file that is a hard link to a file elsewhere, with a
        // journal that claims it is almost done.
        ("hardlink", &|_, p| fs::hard_link(&victim, p).unwrap()),
        // A partial file that is a symlink.
        ("symlink", &|_, p| link(victim.to_str().unwrap(), p)),
    ];
    for (name, plant) in cases {
        let file = src.join(format!("{name}.bin"));
        write_random(&file, 5 * MIB as usize, 7);
        plant(
            &exp.join(format!(".{name}.bin.lhjournal")),
            &exp.join(format!(".{name}.bin.lhpart")),
        );
        let started = Instant::now();
        cp_ok(&[
            "--chunk",
            "1M",
            file.to_str().unwrap(),
            &remote(s.addr(), ""),
        ]);
        assert!(started.elapsed() < Duration::from_secs(60), "{name}: hung");
        assert_same_file(&file, &exp.join(format!("{name}.bin")));
    }
    assert_eq!(fs::read(&victim).unwrap(), b"must stay as it is");
    assert_no_leftovers(&exp);
    s.shutdown();
}

// ------------------------------------------ Ctrl-C and a closed stdout

#[test]
fn ctrl_c_on_cp_and_sync_exits_130_and_the_rerun_resumes() {
    let t = TempDir::new("sigint");
    let exp = t.dir("export");
    let src = t.dir("src");
    let file = src.join("big.bin");
    write_random(&file, 32 * MIB as usize, 3);
    let s = data_server(&exp, &t.dir("state"));
    for cmd in ["cp", "sync"] {
        let mut child = bin()
            .args([
                cmd,
                "--chunk",
                "1M",
                "--rate",
                "40mbit",
                file.to_str().unwrap(),
                &remote(s.addr(), ""),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Past what an earlier round left: this run is moving data.
        let journal = side(&exp.join("big.bin"), "lhjournal");
        let before = journal_records(&journal);
        wait_until_under_way(&exp.join("big.bin"), before + 2, &mut child);
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(130), "{cmd}: {}", stderr(&o));
        assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
        assert!(
            !exp.join("big.bin").exists(),
            "{cmd}: a final name after Ctrl-C"
        );
    }
    cp_ok(&[file.to_str().unwrap(), &remote(s.addr(), "")]);
    assert_same_file(&file, &exp.join("big.bin"));
    s.shutdown();
}

#[test]
fn ls_into_a_closed_pipe_ends_quietly() {
    let t = TempDir::new("epipe");
    let exp = t.dir("export");
    for i in 0..4000 {
        fs::write(exp.join(format!("file-with-a-long-name-{i:05}.dat")), b"x").unwrap();
    }
    let s = data_server(&exp, &t.dir("state"));
    let mut child = bin()
        .args(["ls", &remote(s.addr(), "")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: one line read, then the reader goes away.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("file-with-a-long-name"), "{first}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(st.code(), Some(0), "{err}");
    s.shutdown();
}

// ------------------------------------------------------- holes and sizes

/// Files whose size comes from somewhere else than their data: a file of
/// one chunk that is all hole (sent as a zero chunk, which the sink does
/// not write, so its size must still be set), one with a hole between
/// data, a short file, an empty one. Each lands with its size and bytes,
/// pushed and pulled.
#[test]
fn holes_and_one_chunk_files_land_with_their_size() {
    let t = TempDir::new("holes");
    let exp = t.dir("export");
    let s = data_server(&exp, &t.dir("state"));
    let src = t.dir("src").join("h");
    fs::create_dir(&src).unwrap();
    let sparse = |name: &str, size: u64, data: &[(u64, &[u8])]| {
        let f = fs::File::create(src.join(name)).unwrap();
        f.set_len(size).unwrap();
        for (off, bytes) in data {
            std::os::unix::fs::FileExt::write_all_at(&f, bytes, *off).unwrap();
        }
    };
    sparse("all_hole", 200 << 10, &[]);
    sparse(
        "middle_hole",
        3 << 20,
        &[(0, b"head"), ((3 << 20) - 4, b"tail")],
    );
    sparse("short", 5, &[(0, b"12345")]);
    sparse("empty", 0, &[]);
    let same = |a: &Path, b: &Path| {
        for name in ["all_hole", "middle_hole", "short", "empty"] {
            let (x, y) = (a.join(name), b.join(name));
            assert_eq!(
                fs::metadata(&x).unwrap().len(),
                fs::metadata(&y).unwrap().len(),
                "{name}"
            );
            assert!(fs::read(&x).unwrap() == fs::read(&y).unwrap(), "{name}");
        }
    };
    let v = cp_ok(&["-r", src.to_str().unwrap(), &remote(s.addr(), "")]);
    assert_eq!(v["files"], 4, "{v}");
    same(&src, &exp.join("h"));
    let back = t.dir("back");
    let v = cp_ok(&["-r", &remote(s.addr(), "h"), back.to_str().unwrap()]);
    assert_eq!(v["files"], 4, "{v}");
    same(&src, &back.join("h"));
}
