//! What users of rsync, scp and iperf3 reach for first (issue 32): the
//! version with its commit and features, shell completions and manual
//! pages made from the same definitions as `--help`, and help that groups
//! each command's own options apart from the shared ones.

use crate::common;

use common::xfer::*;
use common::*;

fn run(args: &[&str]) -> std::process::Output {
    bin().args(args).output().expect("longhaul runs")
}

#[test]
fn the_version_names_its_commit_and_features() {
    let o = run(&["--version"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    let commit = text
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line: {text}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{text}"
    );
    // This test's build is the default one: everything in.
    assert!(
        text.contains("features: dashboard metrics plot queue"),
        "{text}"
    );
    // -V: one line, the commit in it.
    let o = run(&["-V"]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    assert!(stdout(&o).contains(commit), "{}", stdout(&o));
}

#[test]
fn completions_cover_every_command_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = run(&["completions", shell]);
        assert_exit(&o, 0);
        let script = stdout(&o);
        for word in [
            "longhaul",
            "sync",
            "recursive",
            "human-readable",
            "completions",
        ] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    let o = run(&["completions", "tcsh"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("bash"), "{}", stderr(&o));
}

#[test]
fn the_manual_has_a_page_for_every_command() {
    let o = run(&["man"]);
    assert_exit(&o, 0);
    let page = stdout(&o);
    assert!(page.contains(".TH longhaul 1"), "{page}");
    assert!(
        page.contains("longhaul\\-cp(1)") || page.contains("cp"),
        "{page}"
    );

    let dir = TempDir::new("man");
    let out = dir.path().join("man1");
    let o = run(&["man", "--out", out.to_str().unwrap()]);
    assert_exit(&o, 0);
    for page in [
        "longhaul.1",
        "longhaul-cp.1",
        "longhaul-token-create.1",
        "longhaul-wan-up.1",
    ] {
        let text =
            std::fs::read_to_string(out.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    // Hidden, internal commands get no page.
    assert!(!out.join("longhaul-wan-reap.1").exists());
}

#[test]
fn each_command_shows_its_own_options_under_their_own_heading() {
    let o = run(&["sync", "--help"]);
    assert_exit(&o, 0);
    let help = stdout(&o);
    let heading = |name: &str| {
        help.find(&format!("\n{name}:\n"))
            .unwrap_or_else(|| panic!("no heading {name}: {help}"))
    };
    let fleet = heading("One transfer across many nodes");
    let own = heading("What sync compares and deletes");
    let delete = help.find("--delete").expect("--delete shown");
    // --delete is under sync's own heading, not the fleet's.
    assert!(delete > own && (fleet < own || delete < fleet), "{help}");
    heading("Trust and credentials");
    heading("Over ssh (HOST:path)");
    assert!(
        help.contains("Usage: longhaul sync [OPTIONS] SRC... DST"),
        "{help}"
    );
    let o = run(&["serve", "--help"]);
    assert!(stdout(&o).contains(":public"), "{}", stdout(&o));
}

/// A small tree for the include/exclude tests: `src/{a.txt, b.o,
/// keep.o, build/x.txt, sub/c.txt, sub/d.o}`.
fn filter_tree(t: &TempDir) -> std::path::PathBuf {
    let src = t.dir("src");
    for d in ["build", "sub"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "a.txt",
        "b.o",
        "keep.o",
        "build/x.txt",
        "sub/c.txt",
        "sub/d.o",
    ] {
        std::fs::write(src.join(f), f.as_bytes()).unwrap();
    }
    src
}

/// Every file beneath `root`, by its path from it, sorted.
fn files_under(root: &std::path::Path) -> Vec<String> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    if root.exists() {
        walk(root, root, &mut out);
    }
    out.sort();
    out
}

/// `cp -r --include --exclude` on a push and on a pull (where the rules
/// travel to the server, which walks): first match wins in command-line
/// order, `/` anchors at the transfer root, a trailing `/` names
/// directories, and an excluded directory is left out whole.
#[test]
fn cp_excludes_and_includes_as_rsync_on_push_and_pull() {
    let t = TempDir::new("habits-filter");
    let src = filter_tree(&t);
    let exp = t.dir("exp");
    let s = data_server(&exp, &t.dir("state"));
    let rules = [
        "--include",
        "keep.o",
        "--exclude",
        "*.o",
        "--exclude",
        "/src/build/",
    ];
    let mut args = vec!["cp", "-a", "--mkpath", "--json"];
    args.extend(rules);
    let src_s = src.display().to_string();
    let pushed = remote(s.addr(), "pushed/");
    args.extend([src_s.as_str(), pushed.as_str()]);
    let o = longhaul(&args);
    assert_exit(&o, 0);
    let want = ["src/a.txt", "src/keep.o", "src/sub/c.txt"];
    assert_eq!(files_under(&exp.join("pushed")), want);

    // The same rules, pulled: the server's walk applies them.
    let pulled = t.dir("pulled");
    std::fs::create_dir_all(&pulled).unwrap();
    let from = remote(s.addr(), "pushed/src");
    let mut args = vec!["cp", "-r", "--json"];
    // The order decides: an --include after the --exclude it would undo
    // does nothing.
    args.extend([
        "--exclude",
        "*.o",
        "--include",
        "keep.o",
        "--exclude",
        "sub/",
    ]);
    let pulled_s = format!("{}/", pulled.display());
    args.extend([from.as_str(), pulled_s.as_str()]);
    let o = longhaul(&args);
    assert_exit(&o, 0);
    assert_eq!(files_under(&pulled), ["src/a.txt"]);
    s.shutdown();
}

/// `sync --delete --exclude`: excluded files at the destination are kept
/// (rsync without --delete-excluded); `--exclude-from` reads rsync's file
/// format, and `SRC/` anchors patterns at its contents.
#[test]
fn sync_delete_keeps_what_is_excluded_and_reads_exclude_from() {
    let t = TempDir::new("habits-sync-filter");
    let src = filter_tree(&t);
    let exp = t.dir("exp");
    let s = data_server(&exp, &t.dir("state"));
    let list = t.path().join("excludes");
    std::fs::write(&list, "# objects\n*.o\n\n; and the build\n/build/\n").unwrap();
    std::fs::create_dir_all(exp.join("m/build")).unwrap();
    std::fs::write(exp.join("m/build/cached"), b"c").unwrap();
    std::fs::write(exp.join("m/local.o"), b"o").unwrap();
    std::fs::write(exp.join("m/stale.txt"), b"s").unwrap();
    let src_slash = format!("{}/", src.display());
    let list_s = list.display().to_string();
    let m = remote(s.addr(), "m");
    let o = longhaul(&[
        "sync",
        "--json",
        "--delete",
        "--exclude-from",
        &list_s,
        &src_slash,
        &m,
    ]);
    assert_exit(&o, 0);
    // Sent: what no rule excludes. Deleted: stale.txt only; the excluded
    // build/ and *.o at the destination stay.
    assert_eq!(
        files_under(&exp.join("m")),
        ["a.txt", "build/cached", "local.o", "sub/c.txt"]
    );
    s.shutdown();
}

/// A pattern that does not compile is refused before anything moves,
/// naming the rule (the server's side against a hostile peer is
/// crates/engine/tests/hostile_transfer.rs).
#[test]
fn bad_filter_rules_are_refused_by_client_and_server() {
    let t = TempDir::new("habits-bad-filter");
    let src = filter_tree(&t);
    let exp = t.dir("exp");
    let s = data_server(&exp, &t.dir("state"));
    let to = remote(s.addr(), "x/");
    let src_s = src.display().to_string();
    let o = longhaul(&["cp", "-r", "--exclude", "[abc", &src_s, &to]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("[abc"), "{}", stderr(&o));

    assert!(!exp.join("x").exists());
    s.shutdown();
}

/// `cp -n` says what it would send and sends nothing; `-q` prints
/// nothing on success; `--progress` draws the bar (a line a second) even
/// into a pipe, where without it there is none.
#[test]
fn cp_dry_run_quiet_and_forced_progress() {
    let t = TempDir::new("habits-cp-look");
    let exp = t.dir("exp");
    let s = data_server(&exp, &t.dir("state"));
    let file = t.path().join("f.bin");
    write_random(&file, 2 << 20, 5);
    let file_s = file.display().to_string();

    let o = longhaul(&["cp", "-n", &file_s, &remote(s.addr(), "f.bin")]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("would send"), "{}", stdout(&o));
    assert!(stdout(&o).contains("f.bin"), "{}", stdout(&o));
    assert!(!exp.join("f.bin").exists(), "a dry run wrote the file");

    let o = longhaul(&["cp", "-q", &file_s, &remote(s.addr(), "f.bin")]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), "", "-q printed a summary");
    assert_eq!(stderr(&o), "", "-q printed to stderr");
    assert_same_file(&file, &exp.join("f.bin"));

    // Now in place: the dry run has nothing to send.
    let o = longhaul(&["cp", "--dry-run", &file_s, &remote(s.addr(), "f.bin")]);
    assert_exit(&o, 0);
    assert!(!stdout(&o).contains("would send:"), "{}", stdout(&o));

    // About 2.5 s at 800 KiB/s: at least one line of the bar.
    let o = longhaul(&[
        "cp",
        "--progress",
        "--bwlimit",
        "800",
        &file_s,
        &remote(s.addr(), "g.bin"),
    ]);
    assert_exit(&o, 0);
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.contains("MiB") && l.contains("files")),
        "no progress line: {err}"
    );
    assert!(!err.contains('\r') && !err.contains("\x1b["), "{err:?}");
    let o = longhaul(&["cp", "--force", &file_s, &remote(s.addr(), "g.bin")]);
    assert_exit(&o, 0);
    assert!(!stderr(&o).contains("files"), "{}", stderr(&o));

    let o = longhaul(&["cp", "-q", "--progress", &file_s, &remote(s.addr(), "h")]);
    assert_exit(&o, 2);
    s.shutdown();
}

/// A server nobody answers on: every client command says `retrying
/// (N/M)` in the same words, then fails with the reason (exit 3); `-q`
/// keeps the retries to itself.
#[test]
fn every_command_retries_a_closed_port_in_the_same_words() {
    let t = TempDir::new("habits-retry");
    let file = t.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let file_s = file.display().to_string();
    let port = free_port();
    let at = |p: &str| format!("127.0.0.1:{port}:data/{p}");
    let host = format!("127.0.0.1:{port}");
    let commands: Vec<Vec<String>> = vec![
        vec!["cp".into(), file_s.clone(), at("f")],
        vec!["sync".into(), file_s.clone(), at("d")],
        vec!["ls".into(), at("")],
        vec!["perf".into(), host.clone(), "-t".into(), "1".into()],
        vec!["perf".into(), "--iperf3".into(), host.clone()],
        vec!["doctor".into(), "--no-copy".into(), at("x")],
    ];
    let started = std::time::Instant::now();
    let runs: Vec<_> = commands
        .into_iter()
        .map(|mut args| {
            args.extend(["--retries".into(), "2".into()]);
            std::thread::spawn(move || {
                let o = bin().args(&args).output().expect("longhaul runs");
                (args, o)
            })
        })
        .collect();
    for r in runs {
        let (args, o) = r.join().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            lines.iter().any(|l| l.starts_with("longhaul: ")
                && l.contains("cannot connect")
                && l.ends_with("retrying (1/2) in 1 s")),
            "{args:?}: {err}"
        );
        assert!(
            lines.iter().any(|l| l.ends_with("retrying (2/2) in 2 s")),
            "{args:?}: {err}"
        );
        assert!(!err.contains("retrying (3/"), "{args:?}: {err}");
        let last = lines.last().copied().unwrap_or_default();
        assert!(
            last.starts_with("longhaul: error: ") && last.contains("cannot connect"),
            "{args:?}: {err}"
        );
    }
    // 1 s + 2 s of waiting, all at once.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    let o = bin()
        .args(["cp", "-q", "--retries", "1", &file_s, &at("f")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(!stderr(&o).contains("retrying"), "{}", stderr(&o));
    assert!(stderr(&o).contains("longhaul: error: "), "{}", stderr(&o));
}

/// perf as iperf3 users type it: `-f` units, `-B`, `-4`/`-6`, its long
/// names, and an error that names ours for an option we lack.
#[test]
fn perf_takes_iperf3s_options_or_names_ours() {
    let t = TempDir::new("habits-perf");
    let s = data_server(&t.dir("exp"), &t.dir("state"));
    let addr = s.addr().to_string();
    let perf = |extra: &[&str]| {
        let mut args = vec!["perf", addr.as_str(), "-t", "0.5", "-i", "0"];
        args.extend(extra);
        run(&args)
    };
    let o = perf(&["-f", "m", "-B", "127.0.0.1", "-4", "--parallel", "2"]);
    assert_exit(&o, 0);
    let summary = stdout(&o);
    let line = summary
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(line.contains(" Mbit/s"), "{line}");
    let o = perf(&["-f", "M", "--version4", "-Z"]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains(" MiB/s"), "{}", stdout(&o));

    // A family the address has not, and an address this host has not.
    let o = perf(&["-6"]);
    assert_exit(&o, 2);
    assert!(stderr(&o).contains("no IPv6 address"), "{}", stderr(&o));
    let o = perf(&["-B", "192.0.2.1", "--retries", "0"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("cannot bind"), "{}", stderr(&o));

    for (flag, ours) in [
        (&["-k", "100"][..], "-n 10G"),
        (&["--cport", "5000"], "-B ADDR"),
        (&["-V"], "-v"),
        (&["-T", "x"], "longhaul history"),
        (&["--fq-rate=1G"], "--pacing"),
    ] {
        let o = perf(flag);
        assert_exit(&o, 2);
        let err = stderr(&o);
        assert!(
            err.contains("iperf3") && err.contains(ours),
            "{flag:?}: {err}"
        );
    }
    s.shutdown();
}

/// `--chunk` takes exactly the sizes its help names, both ends included.
#[test]
fn chunk_takes_its_documented_range() {
    let t = TempDir::new("habits-chunk");
    let exp = t.dir("exp");
    let s = data_server(&exp, &t.dir("state"));
    let file = t.path().join("f.bin");
    write_random(&file, 200 << 10, 9);
    let file_s = file.display().to_string();
    for (chunk, name) in [("64K", "low"), ("2G", "high"), ("2048M", "high2")] {
        let o = longhaul(&["cp", "--chunk", chunk, &file_s, &remote(s.addr(), name)]);
        assert_exit(&o, 0);
        assert_same_file(&file, &exp.join(name));
    }
    for chunk in ["63K", "2049M", "0"] {
        let o = longhaul(&["cp", "--chunk", chunk, &file_s, &remote(s.addr(), "no")]);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains("64K to 2G"), "{}", stderr(&o));
    }
    let help = stdout(&run(&["cp", "--help"]));
    assert!(help.contains("64K to 2G"), "{help}");
    s.shutdown();
}

/// Help and errors name the far side as it is written now (issue 41):
/// `HOST:EXPORT/path` without a port means ssh, so no text offers it for
/// a server; `id` says what it does with a directory that is not there.
#[test]
fn help_and_errors_name_the_far_side_as_it_is_written_now() {
    let stale = |t: &str| t.replace("HOST:PORT:EXPORT", "").contains("HOST:EXPORT");
    for args in [
        &["--help"][..],
        &["doctor", "--help"],
        &["cp", "--help"],
        &["sync", "--help"],
        &["ls", "--help"],
    ] {
        let o = run(args);
        assert_exit(&o, 0);
        assert!(!stale(&stdout(&o)), "{args:?}: {}", stdout(&o));
    }
    let t = TempDir::new("help-words");
    let a = t.path().join("a");
    std::fs::write(&a, b"x").unwrap();
    let b = t.path().join("b");
    let o = run(&["cp", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_exit(&o, 2);
    let e = stderr(&o);
    assert!(
        !stale(&e) && e.contains("[USER@]HOST:path") && e.contains("longhaul://"),
        "{e}"
    );
    // `id` refuses a directory that does not exist, and says so in its help.
    let missing = t.path().join("no/such");
    let o = run(&["id", missing.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(!missing.exists());
    for args in [&["--help"][..], &["id", "--help"]] {
        let h = stdout(&run(args));
        assert!(!h.contains("made if missing"), "{h}");
    }
    let h = stdout(&run(&["id", "--help"]));
    assert!(h.contains("does not exist"), "{h}");
}
