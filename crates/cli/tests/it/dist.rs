//! What `dist/` ships for running `serve` as a service: the systemd unit and
//! its example configuration say only what this binary accepts.

use std::path::Path;

use crate::common::{bin, stderr, TempDir};

fn dist(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../dist/systemd")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every option the example configuration sets or shows in a comment is
/// one `serve` takes, with a value it accepts (clap parses each before it
/// reaches `--help`), and the unit starts the binary with them.
#[test]
fn the_systemd_unit_and_its_example_configuration_are_accepted_by_serve() {
    let unit = dist("longhaul-serve.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    assert!(
        exec.starts_with("/usr/local/bin/longhaul serve --state-dir /var/lib/longhaul ")
            && exec.ends_with(" $LONGHAUL_SERVE_OPTS"),
        "{exec}"
    );
    for want in [
        "EnvironmentFile=/etc/longhaul/serve.conf",
        "StateDirectory=longhaul",
        "User=longhaul",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(unit.lines().any(|l| l == want), "no '{want}' in the unit");
    }

    let conf = dist("serve.conf");
    let set = conf
        .lines()
        .find_map(|l| l.strip_prefix("LONGHAUL_SERVE_OPTS=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("a LONGHAUL_SERVE_OPTS line");
    let shown = conf
        .lines()
        .filter_map(|l| l.strip_prefix("#   --"))
        .map(|l| format!("--{l}"));
    // The exports name /data: here a directory that exists.
    let t = TempDir::new("dist-conf");
    let data = t.dir("data");
    let data = data.to_str().unwrap();
    // What is set, then everything shown (an option may be in both).
    let shown: Vec<String> = shown.collect();
    for words in [set.to_string(), shown.join(" ")] {
        let mut args: Vec<String> = vec!["serve".into(), "--state-dir".into()];
        args.push(t.path().join("state").display().to_string());
        args.extend(words.split_whitespace().map(|w| w.replace("/data", data)));
        args.push("--help".into());
        let o = bin().args(&args).output().unwrap();
        assert!(
            o.status.success(),
            "serve refused the example configuration {args:?}: {}",
            stderr(&o)
        );
    }
}
