//! `longhaul matrix` end to end: a tiny matrix (longhaul and a local copy,
//! loopback and one emulated path, small data) has the table's shape,
//! every file cell verified, and a planted corrupting tool (from
//! `--tools-file`) flagged as not verified; `--resume` keeps done cells.

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
    assert_eq!(doc["format_version"], 1);
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
        assert!(
            c["cpu_seconds"]["client_seconds"].as_f64().is_some(),
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
            2,
            "{row} once per workload table:\n{out}"
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

/// The file peers built into the matrix beyond the first ones: scp over
/// the matrix's private sshd (always: it needs only OpenSSH), and rsync
/// over ssh, tar through a socket and XRootD where installed (required with
/// `LONGHAUL_REQUIRE_PEERS=1`, as CI sets); each at its
/// `best` settings (their arguments used), put and get, every cell verified.
#[test]
fn scp_rsync_ssh_tar_socket_and_xrootd_cells_verify_on_loopback() {
    let ssh = ["sshd", "ssh", "ssh-keygen", "scp"];
    if !require::have(
        "SSH",
        ssh.iter()
            .try_for_each(|p| require::program(p, "openssh-server openssh-client")),
    ) {
        return;
    }
    let mut tools = vec!["scp:best"];
    for (tool, needs) in [
        ("rsync-ssh:best", &["rsync"][..]),
        ("tar-socket:best", &["socat", "tar"][..]),
        ("xrootd:best", &["xrootd", "xrdcp"][..]),
    ] {
        match needs.iter().find(|p| require::find(p).is_none()) {
            None => tools.push(tool),
            Some(p) => require::missing(
                "PEERS",
                &format!("{p} is not installed for {tool} (apt-get install rsync socat xrootd-server xrootd-client)"),
            ),
        }
    }
    let t = TempDir::new("matrix-peers");
    let work = t.dir("work");
    let o = common::bin()
        .args(["matrix", "--json", "--tools", &tools.join(",")])
        .args(["--paths", "loopback", "--workloads", "tree", "--runs", "1"])
        .args(["--size", "1M", "--files", "20", "--work-dir"])
        .arg(&work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), tools.len() * 2, "{stderr}");
    for c in cells {
        assert_eq!(c["verified"], true, "{c}\n{stderr}");
        assert!(c["rate"]["median_bytes_per_second"].as_f64().unwrap() > 0.0);
    }
    // The best settings' arguments reached the tools.
    let cmds: String = std::fs::read_dir(work.join("logs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cmd"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap() + "\n")
        .collect();
    assert!(cmds.contains("scp -r -q -S"), "{cmds}");
    assert!(cmds.contains("-c aes128-gcm@openssh.com"), "{cmds}");
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
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let path = format!("far:{}", common::sshd::HOST);
    assert_eq!(doc["paths"][0]["name"], path.as_str(), "{doc}");
    assert_eq!(doc["paths"][0]["far"], common::sshd::HOST);
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{stderr}");
    for c in cells {
        assert_eq!(c["path"], path.as_str());
        assert_eq!(c["verified"], true, "{c}\n{stderr}");
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

/// A peer's server that a run leaves unusable (here: one that accepts two
/// connections, the matrix's readiness probe and one run, then exits, as
/// iperf2's wedged after `-R -P 4`) fails the run after it, and is then
/// started again, so the runs after that one count.
const WEDGE: &str = r#"[{
  "name": "wedge", "kind": "files",
  "server": {"argv": ["python3", "-c", "import socket, sys\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind((sys.argv[2], int(sys.argv[1])))\ns.listen(8)\nfor _ in range(2):\n    s.accept()[0].close()\n", "{port}", "{host}"]},
  "put": ["bash", "-c", "(exec 3<>/dev/tcp/$2/$3) || exit 1; cp -a \"$0\" \"$1\"/", "{src}", "{dstdir}", "{host}", "{port}"],
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
