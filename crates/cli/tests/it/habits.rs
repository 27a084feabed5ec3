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
