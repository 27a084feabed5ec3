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
