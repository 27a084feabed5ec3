//! What users of rsync, scp and iperf3 reach for first (issue 32): the
//! version with its commit and features, shell completions and manual
//! pages made from the same definitions as `--help`, and help that groups
//! each command's own options apart from the shared ones.

use crate::common;

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
