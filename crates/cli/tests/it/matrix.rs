//! `longhaul matrix` end to end: a tiny matrix (longhaul and a local copy,
//! loopback and one emulated path, small data) has the table's shape,
//! every file cell verified, and a planted corrupting tool (from
//! `--tools-file`) flagged as not verified; `--resume` keeps done cells;
//! every built-in template runs; a peer's `best` is its sweep's winner,
//! remembered by `--quick`; a server's CPU is counted from its cgroup,
//! processes it forks into new sessions included.

use crate::common;
use common::require;
use common::TempDir;

/// A tool that copies and then appends a byte to one file: what a broken
/// peer would do. The matrix must say its cells did not verify.
const CORRUPT: &str = r#"[{
  "name": "corrupt", "kind": "files", "local": true,
  "put": ["sh", "-c", "cp -a \"$0\" \"$1\"/ && f=$(find \"$1\" -type f | sort | head -n 1) && printf X >> \"$f\"", "{src}", "{dstdir}"],
  "get": ["sh", "-c", "cp -a \"$0\" \"$1\"/ && f=$(find \"$1\" -type f | sort | head -n 1) && printf X >> \"$f\"", "{src}", "{dstdir}"],
  "settings": [{"name": "defaults", "why": "planted by the test", "args": []}]
}]"#;

/// The attacker: another process on the host (a client in the host's own
/// namespace, `local`) tries the port of a server the matrix started on
/// `loopback`, and copies only if that fails. As root the matrix keeps its
/// servers in a namespace of their own, so this tool's cells verify.
const PROBE: &str = r#"{
  "name": "probe", "kind": "files", "local": true,
  "server": {"argv": ["{bin}", "--no-archive", "serve", "--listen", "{host}:{port}", "--state-dir", "{state}", "--export", "m={root}"]},
  "put": ["bash", "-c", "if [ \"$2\" = 127.0.0.1 ] && (exec 3<>/dev/tcp/$2/$3) 2>/dev/null; then echo \"reached the matrix's server at $2:$3\" >&2; exit 1; fi; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{host}", "{port}"],
  "get": ["bash", "-c", "if [ \"$2\" = 127.0.0.1 ] && (exec 3<>/dev/tcp/$2/$3) 2>/dev/null; then echo \"reached the matrix's server at $2:$3\" >&2; exit 1; fi; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{host}", "{port}"],
  "settings": [{"name": "defaults", "args": []}]
}"#;

#[test]
fn tiny_matrix_verifies_every_file_cell_and_flags_a_corrupt_peer() {
    let t = TempDir::new("matrix");
    let tools = t.path().join("tools.json");
    let root = require::have("ROOT", require::root("the matrix's private loopback"));
    let mut list: Vec<serde_json::Value> = serde_json::from_str(CORRUPT).unwrap();
    if root {
        list.push(serde_json::from_str(PROBE).unwrap());
    }
    std::fs::write(&tools, serde_json::to_string(&list).unwrap()).unwrap();
    let ntools = if root { 4 } else { 3 };
    let state = t.path().join("matrix.json");
    // The emulated path needs root and TUN: without them (and without
    // LONGHAUL_REQUIRE_TUN=1, which fails here) the matrix runs on loopback only.
    let emulated = require::have("TUN", require::tun());
    let paths = if emulated {
        "loopback,10ms/0/200mbit"
    } else {
        "loopback"
    };
    let work = t.dir("work");
    let args = |extra: &[&str]| {
        let mut c = common::bin();
        c.args([
            "matrix",
            "--tools",
            if root {
                "longhaul:defaults,cp,corrupt,probe"
            } else {
                "longhaul:defaults,cp,corrupt"
            },
            "--tools-file",
            tools.to_str().unwrap(),
            "--paths",
            paths,
            "--workloads",
            "elephant,smallfiles",
            "--runs",
            "1",
            "--size",
            "1M",
            "--files",
            "20",
            "--work-dir",
            work.to_str().unwrap(),
            "--resume",
            state.to_str().unwrap(),
        ])
        .args(extra);
        c
    };
    let o = args(&["--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Cells not verified: exit 6 (some cells failed), the document printed.
    assert_eq!(o.status.code(), Some(6), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(doc["format"], "longhaul-matrix");
    assert_eq!(doc["format_version"], 2);
    let cells = doc["cells"].as_array().unwrap();
    let npaths = if emulated { 2 } else { 1 };
    // tools x paths x 2 workloads x put/get.
    assert_eq!(cells.len(), ntools * npaths * 2 * 2, "{stderr}");
    for c in cells {
        let what = format!("{c}");
        assert!(
            c["rate"]["median_bytes_per_second"].as_f64().unwrap() > 0.0,
            "{what}"
        );
        // As root each end has a cgroup; otherwise its CPU is unknown, never 0.
        let cpu = &c["cpu_seconds"]["client_seconds"];
        assert!(
            if root {
                cpu.as_f64().is_some()
            } else {
                cpu.is_null()
            },
            "{what}"
        );
        if c["tool"] == "corrupt" {
            assert_eq!(c["verified"], false, "{what}");
            assert!(
                c["note"].as_str().unwrap().contains("not verified"),
                "{what}"
            );
        } else {
            assert_eq!(c["verified"], true, "{what}\n{stderr}");
            assert!(c["error"].is_null(), "{what}");
        }
    }
    assert!(
        doc["limits"]["destination_write_bytes_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // Again with the same state: every cell kept, nothing run; the table's shape.
    let o = args(&[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("kept from --resume"), "{stderr}");
    assert!(!stderr.contains("[1/"), "a kept cell ran again: {stderr}");
    let out = String::from_utf8_lossy(&o.stdout);
    for w in ["elephant", "smallfiles"] {
        let head = out
            .lines()
            .skip_while(|l| !l.starts_with(&format!("{w} (")))
            .nth(1)
            .unwrap_or_else(|| panic!("no {w} table in:\n{out}"));
        let cols: Vec<&str> = head.split_whitespace().collect();
        // tool, then "PATH DIR" per path and direction.
        assert_eq!(cols.len(), 1 + 2 * 2 * npaths, "{head}");
    }
    for row in ["longhaul (defaults)", "cp (defaults)", "corrupt (defaults)"] {
        assert_eq!(
            out.lines().filter(|l| l.starts_with(row)).count(),
            4,
            "{row} once per table, rates and CPU, of each workload:\n{out}"
        );
    }
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("corrupt (defaults)"))
            .map(|l| l.matches("NOT VERIFIED").count())
            .sum::<usize>(),
        2 * 2 * npaths,
        "{out}"
    );
    let mb = out
        .lines()
        .filter(|l| l.starts_with("longhaul (defaults)") || l.starts_with("cp (defaults)"));
    for l in mb {
        assert!(!l.contains("NOT VERIFIED") && !l.contains("failed"), "{l}");
    }
}

/// Every built-in template runs, as CI runs it (`LONGHAUL_REQUIRE_PEERS=1`:
/// every peer installed): each tool at `defaults` and at its swept `best`,
/// put and get, memory to memory and the tree, on loopback; every file cell
/// verified, every `best` cell run with its sweep's winner, both ends' CPU
/// read from their cgroups (as root), each tool's version recorded. One round per candidate
/// (`--sweep-rounds 1`): which candidate wins is
/// `a_peers_best_is_its_sweeps_winner_and_quick_remembers_it`'s.
#[test]
fn every_builtin_template_runs_and_verifies_at_defaults_and_its_swept_best() {
    let peers = [
        ("iperf3", "iperf3"),
        ("iperf", "iperf"),
        ("nuttcp", "nuttcp"),
        ("globus-url-copy", "globus-gass-copy-progs"),
        ("globus-gridftp-server", "globus-gridftp-server-progs"),
        ("xrootd", "xrootd-server"),
        ("xrdcp", "xrootd-client"),
        ("rsync", "rsync"),
        ("socat", "socat"),
        ("sshd", "openssh-server"),
        ("scp", "openssh-client"),
    ];
    if !require::have(
        "PEERS",
        peers
            .iter()
            .try_for_each(|(p, pkg)| require::program(p, pkg)),
    ) {
        return;
    }
    let root = require::have("ROOT", require::root("a cgroup for each end's CPU"));
    let t = TempDir::new("matrix-peers");
    let work = t.dir("work");
    let o = common::bin()
        .args(["--no-archive", "matrix", "--json", "--paths", "loopback"])
        .args(["--workloads", "mem,tree", "--runs", "1", "--seconds", "1"])
        .args([
            "--size",
            "1M",
            "--files",
            "20",
            "--sweep-rounds",
            "1",
            "--work-dir",
        ])
        .arg(&work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cells = doc["cells"].as_array().unwrap();
    let tools: std::collections::BTreeSet<&str> =
        cells.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(tools.len(), 13, "{tools:?}\n{stderr}");
    // Each tool's version, as its own version command says it.
    for t in doc["tools"].as_array().unwrap() {
        let v = t["version"].as_str().unwrap_or_default();
        assert!(v.contains(|c: char| c.is_ascii_digit()), "{t}");
    }
    for s in doc["sweeps"].as_array().unwrap() {
        for c in s["candidates"].as_array().unwrap() {
            let rounds = c["rounds"].as_array().map_or(0, Vec::len);
            assert!(rounds <= 1, "--sweep-rounds 1 ran {rounds}: {c}");
        }
    }
    for c in cells {
        let what = format!("{c}");
        assert!(
            c["rate"]["median_bytes_per_second"].as_f64().unwrap() > 0.0,
            "{what}"
        );
        if c["workload"] == "tree" {
            assert_eq!(c["verified"], true, "{what}\n{stderr}");
        }
        if root {
            for end in ["client_seconds", "server_seconds"] {
                assert!(c["cpu_seconds"][end].as_f64().is_some(), "{end}: {what}");
            }
        }
        if c["settings"] == "best" {
            let sweep = doc["sweeps"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["tool"] == c["tool"] && s["workload"] == c["workload"])
                .unwrap_or_else(|| panic!("no sweep for {what}"));
            assert!(!sweep["candidates"].as_array().unwrap().is_empty());
            assert!(sweep["winner"].is_array(), "{sweep}");
            // The winner as in the grid; the cell's as run ({ssh} filled).
            let (ran, won) = (c["args"].as_array(), sweep["winner"].as_array());
            let (ran, won) = (ran.unwrap(), won.unwrap());
            assert_eq!(ran.len(), won.len(), "{what}");
            for (r, w) in ran.iter().zip(won) {
                assert!(
                    r == w || w.as_str().is_some_and(|w| w.contains('{')),
                    "{what}"
                );
            }
        }
    }
}

/// A planted peer whose grid has one fast candidate among slow ones (it
/// sleeps for its argument before copying): its `best` cells run with the
/// fast one, recorded in the document beside every candidate's figure;
/// `--quick` then takes that winner from the archive instead of sweeping.
const SWEPT: &str = r#"[{
  "name": "swept", "kind": "files", "local": true,
  "keeps": {"empty_dirs": true, "symlinks": true, "modes": true},
  "put": ["sh", "-c", "sleep \"$2\" && cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{args}"],
  "get": ["sh", "-c", "sleep \"$2\" && cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{args}"],
  "settings": [{"name": "defaults", "args": ["1"]}],
  "sweep": {"why": "planted by the test", "axes": [[["4"], ["0"], ["2"]]]}
}]"#;

#[test]
fn a_peers_best_is_its_sweeps_winner_and_quick_remembers_it() {
    let t = TempDir::new("matrix-sweep");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, SWEPT).unwrap();
    let archive = t.path().join("archive.db");
    let run = |extra: &[&str]| {
        let o = common::bin()
            .arg("--archive")
            .arg(&archive)
            .args(["matrix", "--json", "--tools", "swept", "--tools-file"])
            .arg(&tools)
            .args(["--paths", "loopback", "--workloads", "elephant"])
            .args(["--size", "64K", "--work-dir"])
            .arg(t.path().join("work"))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (doc, stderr)
    };
    let (doc, stderr) = run(&["--runs", "1"]);
    let sweeps = doc["sweeps"].as_array().unwrap();
    assert_eq!(sweeps.len(), 1, "{stderr}");
    assert_eq!(sweeps[0]["winner"], serde_json::json!(["0"]), "{stderr}");
    let tried: Vec<&serde_json::Value> =
        sweeps[0]["candidates"].as_array().unwrap().iter().collect();
    assert_eq!(tried.len(), 3);
    assert!(tried
        .iter()
        .all(|c| c["bytes_per_second"].as_f64().unwrap() > 0.0));
    // Each warmed up and ran round one, alternated; the sleepers, clearly
    // behind, were pruned; the winner ran every round.
    for (c, rounds) in tried.iter().zip([1, 3, 1]) {
        assert!(c["warmup_bytes_per_second"].as_f64().is_some(), "{c}");
        assert_eq!(c["rounds"].as_array().unwrap().len(), rounds, "{c}");
        assert_eq!(c["pruned"].is_string(), rounds == 1, "{c}");
    }
    for c in doc["cells"].as_array().unwrap() {
        let want = if c["settings"] == "best" { "0" } else { "1" };
        assert_eq!(c["args"], serde_json::json!([want]), "{c}");
    }
    assert_eq!(stderr.matches("[sweep ").count(), 3 + 3 + 2, "{stderr}");
    assert_eq!(stderr.matches(" warm-up] ").count(), 3, "{stderr}");
    // --quick: the winner from the archived matrix, no sweep.
    let (doc, stderr) = run(&["--quick"]);
    assert!(!stderr.contains("[sweep "), "{stderr}");
    let s = &doc["sweeps"][0];
    assert_eq!(s["winner"], serde_json::json!(["0"]), "{doc}");
    assert!(s["remembered"].as_str().unwrap().starts_with("run "), "{s}");
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for c in cells {
        let want = if c["settings"] == "best" { "0" } else { "1" };
        assert_eq!(c["args"], serde_json::json!([want]), "{c}");
        // --quick keeps three runs a cell: a median with its spread.
        assert_eq!(c["runs"].as_array().unwrap().len(), 3, "{c}");
    }
}

/// A planted tool whose lever is a variable: a put fails unless the
/// variable is set and the item that sets it is no argument.
const LEVER: &str = r#"[{
  "name": "lever", "kind": "files", "local": true,
  "keeps": {"empty_dirs": true, "symlinks": true, "modes": true},
  "put": ["sh", "-c", "[ \"$LH_LEVER\" = on ] || { echo \"LH_LEVER unset\" >&2; exit 1; }; [ \"$2\" = lever ] && [ $# = 2 ] || { echo \"arguments: $*\" >&2; exit 1; }; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{args}"],
  "settings": [{"name": "defaults", "args": ["env:LH_LEVER=on", "lever"]}],
  "sweep": {"why": "planted by the test", "axes": [[["lever"], ["env:LH_LEVER=on", "lever"]]]}
}]"#;

/// A candidate's `env:NAME=VALUE` item reaches its client's environment,
/// never its arguments (xrdcp's chunks are set so): the candidate without
/// it fails, the one with it wins, and the cells run with it, verified.
#[test]
fn a_candidates_env_item_sets_its_clients_variable() {
    let t = TempDir::new("matrix-env");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, LEVER).unwrap();
    let o = common::bin()
        .args(["--no-archive", "-v", "matrix", "--json", "--tools", "lever"])
        .arg("--tools-file")
        .arg(&tools)
        .args(["--paths", "loopback", "--workloads", "elephant"])
        .args(["--size", "64K", "--runs", "1", "--sweep-rounds", "1"])
        .args(["--directions", "put", "--work-dir"])
        .arg(t.path().join("work"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sweep = &doc["sweeps"][0];
    let want = serde_json::json!(["env:LH_LEVER=on", "lever"]);
    assert_eq!(sweep["winner"], want, "{sweep}");
    let plain = sweep["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["args"] == serde_json::json!(["lever"]))
        .unwrap();
    assert!(
        plain["error"].as_str().unwrap().contains("LH_LEVER unset"),
        "{plain}"
    );
    for c in doc["cells"].as_array().unwrap() {
        assert_eq!(c["args"], want, "{c}");
        assert_eq!(c["verified"], true, "{c}");
    }
    // -v shows each run's command with the variables its items set.
    assert!(stderr.contains("  $ LH_LEVER=on sh -c "), "{stderr}");
}

/// A planted tool that copies only to an absolute destination (as a URL's
/// path must be: `ftp://{host}:{port}{dst}/`), its candidates sleeping 1
/// or 0 seconds first.
const ABSOLUTE: &str = r#"[{
  "name": "absolute", "kind": "files", "local": true,
  "keeps": {"empty_dirs": true, "symlinks": true, "modes": true},
  "put": ["sh", "-c", "case \"$1\" in /*) ;; *) echo \"relative: $1\" >&2; exit 1;; esac; sleep \"$2\" && cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{args}"],
  "settings": [{"name": "defaults", "args": ["1"]}],
  "sweep": {"why": "planted by the test", "axes": [[["1"], ["0"]]]}
}]"#;

/// A long path's sweeps can run apart from the cells (and apart from each
/// other): `--runs 0` runs only the sweeps and `--resume` keeps each
/// winner as it is found; the next run's cells use it without sweeping
/// again. A relative `--work-dir` is made absolute for the templates.
#[test]
fn sweeps_alone_with_runs_0_are_kept_for_the_cells_of_a_later_run() {
    let t = TempDir::new("matrix-sweep-alone");
    std::fs::write(t.path().join("tools.json"), ABSOLUTE).unwrap();
    let run = |runs: &str| {
        let o = common::bin()
            .current_dir(t.path())
            .args(["--no-archive", "matrix", "--json", "--tools"])
            .args(["absolute:best", "--tools-file", "tools.json"])
            .args(["--paths", "loopback", "--workloads", "tree"])
            .args(["--size", "64K", "--files", "4", "--work-dir", "work"])
            .args(["--resume", "kept.json", "--runs", runs])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (doc, stderr)
    };
    let (doc, stderr) = run("0");
    assert!(!stderr.contains("relative: "), "{stderr}");
    assert_eq!(stderr.matches(" warm-up] ").count(), 2, "{stderr}");
    assert!(
        !stderr.contains("] loopback tree put absolute:best"),
        "{stderr}"
    );
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.path().join("kept.json")).unwrap()).unwrap();
    for d in [&doc, &kept] {
        assert_eq!(d["sweeps"][0]["winner"], serde_json::json!(["0"]), "{d}");
        let cells = d["cells"].as_array().unwrap();
        assert!(
            cells
                .iter()
                .all(|c| c["runs"].as_array().unwrap().is_empty()),
            "{d}"
        );
    }
    let (doc, stderr) = run("2");
    assert!(!stderr.contains("[sweep "), "{stderr}");
    let c = &doc["cells"][0];
    assert_eq!(c["args"], serde_json::json!(["0"]), "{c}");
    assert_eq!(c["runs_succeeded"], 2, "{c}");
    assert_eq!(c["verified"], true, "{c}");
}

/// A server that forks its work into a new session for each connection
/// (as OpenSSH's sshd does, where scp's and rsync's cipher runs): the
/// child burns a second of CPU, then closes. Counting the server's process
/// group missed it; its cgroup counts it.
const FORKS: &str = r#"[{
  "name": "forks", "kind": "files",
  "server": {"argv": ["python3", "-c", "import os, signal, socket, sys, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind((sys.argv[2], int(sys.argv[1])))\ns.listen(8)\nwhile True:\n    c = s.accept()[0]\n    if os.fork() == 0:\n        os.setsid()\n        if c.recv(2) == b'go':\n            t = time.process_time()\n            while time.process_time() - t < 1.0:\n                pass\n        c.close()\n        os._exit(0)\n    c.close()\n", "{port}", "{host}"]},
  "put": ["bash", "-c", "exec 3<>/dev/tcp/$2/$3 && printf go >&3 && cat <&3 >/dev/null && cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{host}", "{port}"],
  "settings": [{"name": "defaults", "args": []}]
}]"#;

#[test]
fn a_server_forking_its_work_into_a_new_session_has_that_cpu_counted() {
    if !require::have("PEERS", require::program("python3", "python3"))
        || !require::have("ROOT", require::root("a cgroup for each end's CPU"))
    {
        return;
    }
    let t = TempDir::new("matrix-forks");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, FORKS).unwrap();
    let o = common::bin()
        .args([
            "--no-archive",
            "matrix",
            "--json",
            "--tools",
            "forks",
            "--tools-file",
        ])
        .arg(&tools)
        .args([
            "--paths",
            "loopback",
            "--workloads",
            "elephant",
            "--runs",
            "2",
        ])
        .args(["--size", "64K", "--work-dir"])
        .arg(t.dir("work"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = doc["cells"][0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{stderr}");
    for r in runs {
        let cpu = r["cpu_server_seconds"].as_f64().unwrap();
        assert!(cpu >= 0.9, "the forked session's second of CPU: {r}");
    }
}

/// `--far HOST`: a second host reached by the user's ssh (here localhost
/// through the tests' private sshd, `LONGHAUL_RSH`): longhaul's server
/// started there, scp over that ssh; every put's far copy and every get
/// verified; a tool the far host lacks is a row that says so; at the end
/// the far work directory and every far process of the matrix are gone.
#[test]
fn far_host_over_ssh_runs_servers_there_verifies_and_leaves_nothing() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("matrix-far");
    // `absent` is installed here (on the matrix's PATH) and not on the far
    // host (its ssh session's PATH): a row that says so, and no cells.
    let here = t.dir("here");
    let prog = here.join("lh-only-here");
    std::fs::write(&prog, "#!/bin/sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tools = t.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"name": "absent", "kind": "files", "far": true, "needs": ["lh-only-here"],
             "package": "absent-pkg", "server": {"argv": ["lh-only-here"]},
             "put": ["lh-only-here"], "settings": [{"name": "defaults"}]}]"#,
    )
    .unwrap();
    let path_env = format!(
        "{}:{}",
        here.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let work = t.dir("work");
    let o = s
        .longhaul()
        .env("PATH", &path_env)
        .args(["matrix", "--json", "--far", common::sshd::HOST])
        .args(["--remote-path", common::sshd::BIN])
        .args([
            "--tools",
            "longhaul:defaults,scp:defaults,absent",
            "--tools-file",
        ])
        .arg(&tools)
        .args(["--workloads", "elephant", "--runs", "1", "--size", "1M"])
        .arg("--work-dir")
        .arg(&work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    let notes: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("\"error\": \""))
        .map(str::to_string)
        .collect();
    assert_eq!(o.status.code(), Some(0), "{stderr}\n{notes:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let path = format!("far:{}", common::sshd::HOST);
    assert_eq!(doc["paths"][0]["name"], path.as_str(), "{doc}");
    assert_eq!(doc["paths"][0]["far"], common::sshd::HOST);
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 5, "{stderr}");
    // The tool not installed there is a cell that says so, and ran nothing.
    let (absent, cells): (Vec<_>, Vec<_>) = cells.iter().partition(|c| c["tool"] == "absent");
    let said = format!(
        "not installed on {} (see the tool's line)",
        common::sshd::HOST
    );
    assert_eq!(absent[0]["note"], said.as_str());
    assert_eq!(absent[0]["runs_planned"], 0, "{}", absent[0]);
    assert!(absent[0]["runs"].as_array().unwrap().is_empty());
    let root = require::have("ROOT", require::root("a cgroup for each end's CPU"));
    for c in cells {
        assert_eq!(c["path"], path.as_str());
        assert_eq!(c["verified"], true, "{c}\n{stderr}");
        // Each server ran in a cgroup on the far host: longhaul's, and the
        // private sshd scp talks to there, its sessions included.
        let server = &c["cpu_seconds"]["server_seconds"];
        if root {
            assert!(server.as_f64().is_some_and(|s| s > 0.0), "{c}");
        }
    }
    let absent = doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "absent")
        .unwrap();
    let note = absent["note"].as_str().unwrap();
    assert!(
        note.contains("not installed on lhtest (lh-only-here") && note.contains("absent-pkg"),
        "{absent}"
    );
    // Nothing left on the far host: its work directory, its servers.
    let far_root = stderr
        .lines()
        .find_map(|l| l.split_once("work directory on ").map(|x| x.1.to_string()))
        .and_then(|l| l.split(' ').nth(1).map(str::to_string))
        .unwrap_or_else(|| panic!("no far work directory in:\n{stderr}"));
    assert!(!std::path::Path::new(&far_root).exists(), "{far_root} left");
    let far_processes = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .map(|e| std::fs::read(e.path().join("cmdline")).unwrap_or_default())
            .map(|cmd| String::from_utf8_lossy(&cmd).replace('\0', " "))
            .filter(|cmd| cmd.contains(&far_root))
            .collect::<Vec<_>>()
    };
    // The far servers are ended as the run ends; wait for them to be gone.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !far_processes().is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "far processes are left: {:?}",
            far_processes()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A peer's server that a run leaves unusable (here: one that serves two
/// connections, the matrix's readiness probe and one run, then exits, as
/// iperf2's wedged after `-R -P 4`) fails the run after it, and is then
/// started again, so the runs after that one count. A run counts as served
/// only when the server greets it: a connect alone succeeds as soon as the
/// kernel queues it on the listener, and on a busy host the server had not
/// yet taken its second connection (nor exited) when the next run's
/// connect was queued too, so that run passed without being served.
const WEDGE: &str = r#"[{
  "name": "wedge", "kind": "files",
  "server": {"argv": ["python3", "-c", "import socket, sys\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind((sys.argv[2], int(sys.argv[1])))\ns.listen(8)\nfor _ in range(2):\n    c = s.accept()[0]\n    try:\n        c.sendall(b'served\\n')\n    except OSError:\n        pass\n    c.close()\n", "{port}", "{host}"]},
  "put": ["bash", "-c", "exec 3<>/dev/tcp/$2/$3 || exit 1; read -r -t 10 hello <&3; [ \"$hello\" = served ] || exit 1; exec 3<&-; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{host}", "{port}"],
  "get": [],
  "settings": [{"name": "defaults", "args": []}]
}]"#;

#[test]
fn a_server_a_failed_run_left_unusable_is_started_again_for_the_next_run() {
    if !require::have("PEERS", require::program("python3", "python3")) {
        return;
    }
    let t = TempDir::new("matrix-wedge");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, WEDGE).unwrap();
    let work = t.dir("work");
    let o = common::bin()
        .args(["matrix", "--json", "--tools", "wedge", "--tools-file"])
        .arg(&tools)
        .args([
            "--paths",
            "loopback",
            "--workloads",
            "elephant",
            "--runs",
            "3",
        ])
        .args(["--size", "64K", "--work-dir"])
        .arg(&work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&o.stdout)));
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 1, "{stderr}");
    let runs = cells[0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{stderr}");
    assert!(runs[0]["error"].is_null(), "the first run: {stderr}");
    assert!(
        runs[1]["error"].is_string(),
        "the server had gone: {stderr}"
    );
    assert!(
        runs[2]["error"].is_null() && runs[2]["verified"] == true,
        "the run after the server's new start: {stderr}"
    );
    assert!(
        stderr.contains("started wedge's server again after a failed run"),
        "{stderr}"
    );
}

/// The attacker: a stranger on the port of the private sshd the over-ssh
/// tools' template starts (here, and on a real far host): a key it does
/// not hold, a password, or another user are refused; the matrix's own
/// throwaway key gets in.
#[test]
fn the_private_sshd_of_the_over_ssh_tools_lets_in_only_its_own_key() {
    let ssh = ["sshd", "ssh", "ssh-keygen"];
    if !require::have(
        "SSH",
        ssh.iter()
            .try_for_each(|p| require::program(p, "openssh-server openssh-client")),
    ) {
        return;
    }
    let tools = include_str!("../../src/cmd/matrix/tools.toml");
    let script = tools
        .split_once("sshd = '''\n")
        .and_then(|(_, s)| s.split_once("'''"))
        .map(|(s, _)| s)
        .expect("the sshd script in tools.toml");
    let t = TempDir::new("matrix-sshd");
    let state = t.dir("state");
    let port = common::free_port();
    let script = script
        .replace("{state}", state.to_str().unwrap())
        .replace("{port}", &port.to_string())
        .replace("{host}", "127.0.0.1");
    std::fs::write(state.join("sshd.sh"), script).unwrap();
    let log = std::fs::File::create(t.path().join("sshd.log")).unwrap();
    let mut sshd = common::Owned::spawn(
        std::process::Command::new("sh")
            .arg(state.join("sshd.sh"))
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    )
    .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(sshd.try_wait().unwrap().is_none(), "the sshd exited");
        assert!(std::time::Instant::now() < until, "the sshd never listened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let stranger = t.path().join("stranger");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&stranger)
        .status()
        .unwrap();
    assert!(made.success());
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let login = |key: &std::path::Path, user: &str, extra: &[&str]| {
        std::process::Command::new("ssh")
            .args(["-F", "/dev/null", "-p", &port.to_string()])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ])
            .args(["-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-i"])
            .arg(key)
            .args(extra)
            .arg(format!("{user}@127.0.0.1"))
            .arg("echo in")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let me = me.trim();
    let batch = ["-o", "BatchMode=yes"];
    let o = login(&stranger, me, &batch);
    assert!(!o.status.success(), "a stranger's key got in: {o:?}");
    let o = login(
        &stranger,
        me,
        &[
            "-o",
            "BatchMode=yes",
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
        ],
    );
    assert!(!o.status.success(), "a password got in: {o:?}");
    let own = state.join("client_key");
    let o = login(&own, "nobody", &batch);
    assert!(!o.status.success(), "another user got in: {o:?}");
    let o = login(&own, me, &batch);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "in",
        "its own key: {o:?}"
    );
}

/// A tool that cannot run here (a program it needs is not installed) is a
/// row of the table that says so in every cell, with the reason and the
/// package under the table, not an empty cell or a missing row; the other
/// tools run, and the matrix ends well (nothing that ran failed).
#[test]
fn a_tool_that_cannot_run_here_is_a_row_that_says_why() {
    const ABSENT: &str = r#"[{
      "name": "absent", "kind": "files", "local": true,
      "needs": ["longhaul-test-no-such-program"], "package": "no-such-package",
      "put": ["longhaul-test-no-such-program", "{src}", "{dstdir}"],
      "settings": [{"name": "defaults", "args": []}]
    }]"#;
    let t = TempDir::new("matrix-absent");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, ABSENT).unwrap();
    let o = common::bin()
        .args(["--no-archive", "matrix", "--md", "--tools", "cp,absent"])
        .arg("--tools-file")
        .arg(&tools)
        .args([
            "--paths",
            "loopback",
            "--workloads",
            "elephant",
            "--runs",
            "1",
        ])
        .args(["--size", "64K", "--work-dir"])
        .arg(t.path().join("work"))
        .output()
        .unwrap();
    let (out, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{out}\n{stderr}");
    let row = out
        .lines()
        .find(|l| l.starts_with("| absent (defaults) |"))
        .unwrap_or_else(|| panic!("no row for the absent tool:\n{out}"));
    assert_eq!(row, "| absent (defaults) | not installed | - |", "{out}");
    assert!(
        out.contains(
            "- absent: not installed (longhaul-test-no-such-program not on PATH): apt-get install \
             no-such-package"
        ),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("| cp (defaults) | ")),
        "{out}"
    );
    assert!(!out.contains("note: absent"), "{out}");
}

/// A planted local tool that copies the elephant only if none of its
/// source is in the page cache (`fincore`): with `--cold` the matrix
/// dropped the cache before its clock; without, the manifest the matrix
/// read just before has it cached and the tool says so.
const COLD_PROBE: &str = r#"[{
  "name": "cold-probe", "kind": "files", "local": true,
  "put": ["sh", "-c", "res=$(fincore --noheadings --bytes --output RES \"$0\"/big.bin) || exit 1; [ \"$res\" -eq 0 ] || { echo \"error: big.bin has $res bytes in the page cache\" >&2; exit 1; }; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}"],
  "settings": [{"name": "defaults", "args": []}]
}]"#;

/// `--cold` drops the page cache before every timed run, and `--build`
/// runs another longhaul build (here a wrapper that notes each start of
/// this one) as tools of their own beside this one, first copies and a
/// sync with 1% of the files changed after one, every result verified.
#[test]
fn a_cold_matrix_runs_another_build_and_a_changed_sync_verified() {
    if !require::have("ROOT", require::root("dropping the page cache (--cold)"))
        || !require::have("PEERS", require::program("fincore", "util-linux"))
    {
        return;
    }
    let t = TempDir::new("matrix-cold");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, COLD_PROBE).unwrap();
    let started = t.path().join("other-build-started");
    let other = t.path().join("longhaul-other");
    std::fs::write(
        &other,
        format!(
            "#!/bin/sh\necho \"$1 $2 $3\" >> '{}'\nexec '{}' \"$@\"\n",
            started.display(),
            env!("CARGO_BIN_EXE_longhaul")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let work = t.dir("work");
    let matrix = |cold: bool, tools_wanted: &str, workloads: &str| {
        let mut c = common::bin();
        c.args(["--no-archive", "matrix", "--json", "--paths", "loopback"])
            .args(["--tools", tools_wanted, "--workloads", workloads])
            .args(["--runs", "1", "--size", "256K", "--files", "200"])
            .arg("--build")
            .arg(format!("other={}", other.display()))
            .arg("--tools-file")
            .arg(&tools)
            .arg("--work-dir")
            .arg(&work);
        if cold {
            c.arg("--cold");
        }
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&o.stdout)));
        (o.status.code(), doc, stderr)
    };
    let (code, doc, stderr) = matrix(
        true,
        "cold-probe,longhaul:defaults,longhaul@other:defaults",
        "elephant,smallfiles+changed",
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(doc["params"]["cold"], true, "{stderr}");
    let cells = doc["cells"].as_array().unwrap();
    let mut seen = Vec::new();
    for c in cells {
        assert!(c["error"].is_null(), "{c}\n{stderr}");
        assert_eq!(c["verified"], true, "{c}\n{stderr}");
        seen.push(format!("{} {} {}", c["tool"], c["workload"], c["direction"]).replace('"', ""));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "cold-probe elephant put",
            "longhaul elephant get",
            "longhaul elephant put",
            "longhaul smallfiles+changed put",
            "longhaul@other elephant get",
            "longhaul@other elephant put",
            "longhaul@other smallfiles+changed put",
        ],
        "{stderr}"
    );
    let ran = std::fs::read_to_string(&started).unwrap_or_default();
    for what in ["--no-archive serve", "cp -a", "sync -a"] {
        assert!(
            ran.contains(what),
            "the other build never ran `{what}`: {ran}"
        );
    }
    // Without --cold the source is in the cache: the probe can fail.
    let (code, doc, stderr) = matrix(false, "cold-probe", "elephant");
    assert_ne!(code, Some(0), "{stderr}");
    let e = doc["cells"][0]["runs"][0]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(e.contains("in the page cache"), "{e}\n{stderr}");
}

/// A tool that records what TCP autotuning allows where it runs: its
/// server (in the emulated path's far host) as it starts, its client (in
/// the near host) before it copies. `SEEN` is replaced by a directory.
const SYSCTLS: &str = r#"[{
  "name": "sysctls", "kind": "files",
  "server": {"argv": ["sh", "-c", "cat /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem > \"$0\" && exec \"$@\"", "SEEN/b", "{bin}", "--no-archive", "serve", "--listen", "{host}:{port}", "--state-dir", "{state}", "--export", "m={root}"]},
  "put": ["sh", "-c", "cat /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem > \"$2\" && cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "SEEN/a"],
  "settings": [{"name": "defaults", "args": []}]
}]"#;

/// Both hosts of an emulated path are tuned as DTNs for it: a tool left to
/// the kernel's autotuning runs, on either host, under tcp_wmem and
/// tcp_rmem maxima of at least twice the path's bandwidth-delay product
/// (40 Gbit/s at 100 ms: 500 MB, so 1 GB; Linux's defaults are 4 and 6
/// MiB), as the document records and the table says; `--resume` keeps it.
#[test]
fn an_emulated_paths_hosts_autotune_to_twice_its_bdp() {
    if !require::have("TUN", require::tun()) {
        return;
    }
    let t = TempDir::new("matrix-sysctls");
    let seen = t.dir("seen");
    let tools = t.path().join("tools.json");
    std::fs::write(&tools, SYSCTLS.replace("SEEN", seen.to_str().unwrap())).unwrap();
    let path = "100ms/0/40gbit";
    let run = |json: bool| {
        let mut c = common::bin();
        c.args([
            "--no-archive",
            "matrix",
            "--tools",
            "sysctls",
            "--tools-file",
        ])
        .arg(&tools)
        .args(["--paths", path, "--workloads", "elephant", "--directions"])
        .args(["put", "--runs", "1", "--size", "64K", "--work-dir"])
        .arg(t.path().join("work"))
        .arg("--resume")
        .arg(t.path().join("kept.json"));
        if json {
            c.arg("--json");
        }
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        (String::from_utf8_lossy(&o.stdout).to_string(), stderr)
    };
    let (out, stderr) = run(true);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let twice_bdp = 2 * 500_000_000u64;
    let tuned = &doc["limits"]["host_tuning"][path];
    assert_eq!(tuned["bdp_bytes"], 500_000_000, "{doc}");
    let max = |what: &str| tuned[what].as_u64().unwrap();
    assert!(max("tcp_wmem_max") >= twice_bdp, "{tuned}");
    assert!(max("tcp_rmem_max") >= twice_bdp, "{tuned}");
    for host in ["a", "b"] {
        let text = std::fs::read_to_string(seen.join(host)).unwrap();
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(v.len(), 6, "{host}: {text}");
        assert_eq!(
            (v[2], v[5]),
            (max("tcp_wmem_max"), max("tcp_rmem_max")),
            "host {host}'s tcp_wmem, tcp_rmem: {text}"
        );
        // The minimum and default stay the kernel's (4 KiB at least).
        assert!(
            v[0] >= 4096 && v[1] >= v[0] && v[3] >= 4096 && v[4] >= v[3],
            "{text}"
        );
    }
    assert!(
        stderr.contains("both hosts' TCP autotuning maximum"),
        "{stderr}"
    );
    // Kept from --resume (nothing runs again), said under the table.
    let (out, stderr) = run(false);
    assert!(!stderr.contains("[1/"), "{stderr}");
    assert!(
        out.contains(&format!(
            "hosts: {path}: both hosts' TCP autotuning maximum raised to 954 MiB (2x the path's BDP)"
        )) || out.contains(&format!("hosts: {path}: both hosts' TCP autotuning maximum at ")),
        "{out}"
    );
    assert!(out.contains("not per namespace"), "{out}");
}
