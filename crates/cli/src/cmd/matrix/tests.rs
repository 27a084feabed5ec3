//! The matrix's parsers and summaries on recorded inputs: what each peer
//! tool printed (testdata/, recorded on loopback with the Debian
//! packages' iperf 3.12, iperf 2 and nuttcp), the path names a user types,
//! and the cells' medians, verdicts and ratios.

use super::peers::{read_figure, Figure};
use super::*;

const IPERF3_JSON: &str = include_str!("testdata/iperf3.json");
/// `iperf -c -y C -P 2`: a line per stream, no SUM line (this iperf 2).
const IPERF2_CSV: &str = include_str!("testdata/iperf2-P2.csv");
/// `nuttcp -fparse`.
const NUTTCP: &str = include_str!("testdata/nuttcp.txt");

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= b.abs() * 1e-12
}

#[test]
fn iperf3_figure_is_the_received_sum_in_bytes() {
    let got = read_figure(Figure::Iperf3, IPERF3_JSON).unwrap();
    assert!(close(got, 969_158_189.071_878 / 8.0), "{got}");
}

#[test]
fn iperf2_figure_adds_the_streams_without_a_sum_line_and_takes_the_sum_line_when_there_is_one() {
    let got = read_figure(Figure::Iperf2, IPERF2_CSV).unwrap();
    assert!(
        close(got, (2_760_427_727.0 + 8_914_405_595.0) / 8.0),
        "{got}"
    );
    // Older iperf 2 adds a SUM line (transfer id -1): it alone counts,
    // never the streams and the sum together.
    let with_sum = format!(
        "{IPERF2_CSV}19700101000000,127.0.0.1,0,127.0.0.1,30481,-1,0.0-1.0,1473511544,11674833322\n"
    );
    let got = read_figure(Figure::Iperf2, &with_sum).unwrap();
    assert!(close(got, 11_674_833_322.0 / 8.0), "{got}");
}

#[test]
fn nuttcp_figure_is_its_rate_in_bytes() {
    let got = read_figure(Figure::Nuttcp, NUTTCP).unwrap();
    assert!(close(got, 380.1191e6 / 8.0), "{got}");
}

#[test]
fn longhaul_figure_is_the_summarys_rate_in_bytes() {
    let got = read_figure(
        Figure::Longhaul,
        r#"{"summary":{"bits_per_second":8e9,"bytes":1000}}"#,
    )
    .unwrap();
    assert!(close(got, 1e9), "{got}");
}

#[test]
fn output_without_a_figure_says_what_is_missing() {
    let cases: [(Figure, &str, &str); 7] = [
        (
            Figure::Iperf3,
            "iperf3: error - unable to connect",
            "did not parse",
        ),
        (
            Figure::Iperf3,
            r#"{"start":{}, "error":"busy"}"#,
            "it said: busy",
        ),
        (
            Figure::Longhaul,
            r#"{"summary":{}}"#,
            "summary.bits_per_second",
        ),
        (
            Figure::Iperf2,
            "connect failed: Connection refused\n",
            "CSV field 9",
        ),
        (
            Figure::Nuttcp,
            "nuttcp-t: Info: connect: Connection refused\n",
            "rate_Mbps=",
        ),
        (Figure::Wall, "anything", "no figure"),
        // A run that moved nothing measured nothing.
        (
            Figure::Nuttcp,
            "megabytes=0.0000 real_seconds=0.00 rate_Mbps=0.0000\n",
            "no measurement",
        ),
    ];
    for (f, out, says) in cases {
        let e = read_figure(f, out).unwrap_err();
        assert!(e.contains(says), "{f:?} on {out:?}: {e}");
    }
}

#[test]
fn path_names_and_rtt_loss_rate_triples_parse() {
    let p = path_spec("loopback", 1, None).unwrap();
    assert_eq!((p.rtt_ms, p.loss, p.rate_bps), (0.0, 0.0, None));
    let p = path_spec("satellite", 1_000_000_000, None).unwrap();
    assert_eq!(
        (p.rtt_ms, p.loss, p.rate_bps),
        (540.0, 1e-4, Some(1_000_000_000))
    );
    let p = path_spec("50ms/1e-5/1gbit", 7, None).unwrap();
    assert_eq!(p.name, "50ms/1e-5/1gbit");
    assert!(close(p.rtt_ms, 50.0), "{}", p.rtt_ms);
    assert_eq!((p.loss, p.rate_bps), (1e-5, Some(1_000_000_000)));
    let p = path_spec("far", 1, Some("dtn2")).unwrap();
    assert_eq!(
        (p.name.as_str(), p.far.as_deref()),
        ("far:dtn2", Some("dtn2"))
    );
}

#[test]
fn bad_paths_are_refused_saying_what_is_wrong() {
    for (s, says) in [
        ("far", "needs --far HOST"),
        ("wan", "unknown path 'wan'"),
        ("50ms/1e-5", "unknown path"),
        ("50ms/2/1gbit", "the loss must be a probability"),
        ("50ms/-0.1/1gbit", "the loss must be a probability"),
        ("50ms/x/1gbit", "the loss must be a probability"),
        ("fast/0/1gbit", "path 'fast/0/1gbit'"),
        ("50ms/0/quick", "path '50ms/0/quick'"),
    ] {
        let e = path_spec(s, 1, None).unwrap_err();
        assert!(e.contains(says), "{s}: {e}");
    }
}

fn cell(tool: &str, workload: &str, runs: Vec<RunResult>) -> Cell {
    Cell {
        cell: archived::Cell {
            tool: tool.into(),
            settings: "defaults".into(),
            path: "loopback".into(),
            workload: workload.into(),
            direction: "put".into(),
            ..archived::Cell::default()
        },
        runs,
    }
}

fn run(rate: Option<f64>, verified: Option<bool>, error: Option<&str>) -> RunResult {
    RunResult {
        bytes_per_second: rate,
        seconds: 2.0,
        cpu_client_seconds: Some(1.0),
        cpu_server_seconds: Some(0.5),
        verified,
        error: error.map(str::to_string),
        ..RunResult::default()
    }
}

#[test]
fn a_cell_summarises_its_runs_median_spread_cpu_and_verdict() {
    // Odd count: the middle one; the spread is the extremes.
    let mut c = cell(
        "rsync",
        "elephant",
        [300.0, 100.0, 200.0]
            .map(|r| run(Some(r), Some(true), None))
            .to_vec(),
    );
    c.summarise(3);
    let r = c.rate.clone().unwrap();
    assert_eq!(
        (
            r.median_bytes_per_second,
            r.min_bytes_per_second,
            r.max_bytes_per_second
        ),
        (200.0, 100.0, 300.0)
    );
    assert_eq!(r.median_bits_per_second, 1600.0);
    let cpu = c.cpu_seconds.clone().unwrap();
    assert_eq!(
        (cpu.client_seconds, cpu.server_seconds),
        (Some(1.0), Some(0.5))
    );
    assert_eq!((c.verified, c.error.clone()), (Some(true), None));
    assert!(c.whole());

    // Even count: the mean of the middle two. One run that did not verify
    // makes the cell unverified; a failed run's error is kept.
    let mut c = cell(
        "scp",
        "elephant",
        vec![
            run(Some(100.0), Some(true), None),
            run(Some(400.0), Some(false), None),
            run(Some(200.0), Some(true), None),
            run(Some(300.0), Some(true), None),
            run(None, None, Some("exit 1: broken pipe")),
        ],
    );
    c.summarise(5);
    assert_eq!(c.rate.clone().unwrap().median_bytes_per_second, 250.0);
    assert_eq!(c.verified, Some(false));
    assert_eq!(c.error.as_deref(), Some("exit 1: broken pipe"));
    assert_eq!(c.runs_succeeded, Some(3));
    assert!(!c.whole());

    // One end unmeasured in one run: that end's CPU is unknown, never 0.
    let mut c = cell(
        "iperf3",
        "mem",
        vec![run(Some(1.0), None, None), run(Some(1.0), None, None)],
    );
    c.runs[1].cpu_server_seconds = None;
    c.summarise(2);
    let cpu = c.cpu_seconds.clone().unwrap();
    assert_eq!((cpu.client_seconds, cpu.server_seconds), (Some(1.0), None));

    // Nothing ran: no rate, no CPU, no verdict.
    let mut c = cell("bbcp", "mem", vec![run(None, None, Some("not installed"))]);
    c.summarise(1);
    assert!(c.rate.is_none() && c.cpu_seconds.is_none() && c.verified.is_none());
    assert!(!c.whole());
}

fn doc(cells: Vec<Cell>) -> Doc {
    Doc {
        format: "longhaul-matrix".into(),
        format_version: VERSION,
        params: Params {
            runs: 1,
            elephant_bytes: 1 << 30,
            small_files: 100,
            mem_seconds: 3.0,
            workloads: vec!["mem".into(), "elephant".into()],
            cold: false,
            given: vec![],
        },
        tools: Vec::new(),
        paths: vec![path_spec("loopback", 1, None).unwrap()],
        cells,
        sweeps: Vec::new(),
        limits: Limits::default(),
        load: Load::default(),
        merged: vec![],
        interrupted: false,
    }
}

fn summarised(tool: &str, workload: &str, rate: f64, verified: Option<bool>) -> Cell {
    let mut c = cell(tool, workload, vec![run(Some(rate), verified, None)]);
    c.summarise(1);
    c
}

#[test]
fn limits_are_the_fastest_memory_run_and_the_verified_local_copy() {
    let mut d = doc(vec![
        summarised("iperf3", "mem", 2e9, None),
        summarised("longhaul-perf", "mem", 3e9, None),
        summarised("cp", "elephant", 5e8, Some(false)),
        summarised("cp", "elephant", 4e8, Some(true)),
    ]);
    d.finish_limits();
    assert_eq!(
        d.limits.mem_to_mem_bytes_per_second.get("loopback"),
        Some(&3e9)
    );
    // The copy that did not verify is no limit.
    assert_eq!(
        d.limits.local_copy_bytes_per_second.get("elephant"),
        Some(&4e8)
    );

    // A limit is what the storage did at best: the local copy's fastest
    // run, put or get, not a median a contended disk pulled below peers.
    let mut put = cell(
        "cp",
        "smallfiles",
        vec![
            run(Some(7e6), Some(true), None),
            run(Some(17e6), Some(true), None),
            run(Some(7e6), Some(true), None),
        ],
    );
    put.summarise(3);
    let mut get = put.clone();
    get.cell.direction = "get".into();
    get.runs[1].bytes_per_second = Some(9e6);
    get.summarise(3);
    let mut d = doc(vec![put, get]);
    d.finish_limits();
    assert_eq!(
        d.limits.local_copy_bytes_per_second.get("smallfiles"),
        Some(&17e6)
    );
}

#[test]
fn ratios_compare_our_best_with_the_best_verified_peer_and_the_local_copy() {
    let mut d = doc(vec![
        summarised("longhaul", "elephant", 9e8, Some(true)),
        summarised("rsync", "elephant", 3e8, Some(true)),
        // Faster, but wrong: never the peer a ratio is against.
        summarised("badpeer", "elephant", 2e9, Some(false)),
        summarised("cp", "elephant", 6e8, Some(true)),
    ]);
    d.finish_limits();
    let lines = ratios::lines(&d, "elephant");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0]
            .starts_with("loopback put: longhaul (defaults), 3.00x the rate of rsync (defaults)"),
        "{lines:?}"
    );
    assert!(
        lines[0].contains("1.50x the limit (the local copy at its fastest 600 MB/s)"),
        "{lines:?}"
    );
    assert!(lines[0].contains("not compared: badpeer"), "{lines:?}");
    // No longhaul cell in a column: no line for it.
    assert!(ratios::lines(&d, "mem").is_empty());
}

#[test]
fn the_far_shell_gets_each_word_quoted_whole() {
    assert_eq!(
        far::join(&["rm", "-rf", "/tmp/lh matrix/$HOME;x"]).unwrap(),
        "rm -rf '/tmp/lh matrix/$HOME;x'"
    );
    assert!(far::join(&["printf", "a\0b"]).is_err());
}

/// The templates put the work directory in URLs and far paths: a relative
/// `--work-dir` is made absolute (under the current directory).
#[test]
fn a_relative_work_dir_is_made_absolute() {
    let d = absolute_dir(Path::new("work/m")).ok().unwrap();
    assert!(d.is_absolute(), "{}", d.display());
    assert_eq!(d, std::env::current_dir().unwrap().join("work/m"));
    assert_eq!(
        absolute_dir(Path::new("/x/y")).ok().as_deref(),
        Some(Path::new("/x/y"))
    );
}

/// On a long path a workload that fits in one window (the satellite
/// path's 2 MB tree: its BDP is 67.5 MB, a socket buffer 4 MiB) is swept
/// without the window axis, every tool alike: GridFTP's 18 candidates are
/// 9 (its streams and its -fast/-pp stay). The same tree on loopback (BDP
/// 1.25 MB), an elephant, and memory to memory keep the whole grid.
#[test]
fn a_workload_that_fits_in_one_window_is_swept_without_the_window_axis() {
    let gridftp = peers::builtin()
        .into_iter()
        .find(|t| t.name == "gridftp")
        .and_then(|t| t.sweep)
        .unwrap();
    let facts = |rate_bps: u64, rtt_s: f64| sweep::PathFacts {
        rate_bps,
        rtt_s,
        socket_cap: 4 << 20,
    };
    let (sat, lo) = (facts(1_000_000_000, 0.54), facts(100_000_000_000, 0.0));
    let count = |bytes: Option<u64>, f: &sweep::PathFacts| {
        sweep::candidates(&drive::fitted(&gridftp, bytes, f), f)
    };
    let tree = Some(2_100_000);
    let fit = count(tree, &sat);
    assert_eq!(fit.len(), 9);
    assert!(
        fit.iter().all(|c| !c.iter().any(|a| a == "-tcp-bs")),
        "{fit:?}"
    );
    assert!(fit.iter().any(|c| c.iter().any(|a| a == "-pp")), "{fit:?}");
    assert!(
        fit.iter().any(|c| c.windows(2).any(|w| w == ["-p", "17"])),
        "{fit:?}"
    );
    assert_eq!(count(Some(64 << 20), &sat).len(), 18);
    assert_eq!(count(None, &sat).len(), 18);
    assert_eq!(count(tree, &lo).len(), 12);
}

/// The arguments a run is shown and kept with say the path's facts but
/// not this host's files: rsync over ssh's AES-GCM candidate names
/// `{ssh}`, not the work directory's script (a document is read elsewhere).
#[test]
fn a_runs_arguments_are_kept_without_this_hosts_paths() {
    let vars = BTreeMap::from([
        ("ssh", "/tmp/w/state/rsync-ssh/ssh".to_string()),
        ("state", "/tmp/w/state/x".to_string()),
        ("rate", "1000".to_string()),
    ]);
    let args: Vec<String> = ["-e", "{ssh} -c aes128-gcm@openssh.com", "--rate", "{rate}"]
        .map(String::from)
        .to_vec();
    let shown = peers::fill_all(&args, &drive::shown_vars(&vars));
    assert_eq!(
        shown,
        ["-e", "{ssh} -c aes128-gcm@openssh.com", "--rate", "1000"]
    );
}

#[test]
fn sync_workloads_name_a_file_workloads_data_and_a_step() {
    assert_eq!(
        split_workload("smallfiles+same"),
        ("smallfiles", Some("same"))
    );
    assert_eq!(split_workload("tree"), ("tree", None));
    for good in ["mem", "tree", "elephant+changed", "smallfiles+same"] {
        assert!(known_workload(good), "{good}");
    }
    for bad in [
        "mem+same",
        "smallfiles+",
        "smallfiles+half",
        "disk",
        "+same",
    ] {
        assert!(!known_workload(bad), "{bad}");
    }
}

/// A sync's cells: put only, and only for the tools that have a sync.
#[test]
fn sync_cells_are_puts_of_the_tools_that_have_a_sync() {
    let tools = peers::builtin();
    let chosen: Vec<(Tool, Vec<String>)> = tools
        .iter()
        .filter(|t| ["longhaul", "rsyncd", "xrootd", "cp"].contains(&t.name.as_str()))
        .map(|t| (t.clone(), vec!["defaults".to_string()]))
        .collect();
    let paths = [path_spec("loopback", 1, None).unwrap()];
    let workloads = ["smallfiles".to_string(), "smallfiles+changed".to_string()];
    let cells = plan(&paths, &workloads, &chosen, &BTreeMap::new());
    let synced: Vec<(&str, &str)> = cells
        .iter()
        .filter(|c| c.workload == "smallfiles+changed")
        .map(|c| (c.tool.as_str(), c.direction.as_str()))
        .collect();
    assert_eq!(
        synced,
        [("longhaul", "put"), ("rsyncd", "put"), ("cp", "put")],
        "xrootd has no sync"
    );
    // The first copy is the plain workload's, put and get.
    assert_eq!(
        cells.iter().filter(|c| c.workload == "smallfiles").count(),
        8
    );
}

#[test]
fn another_build_is_every_longhaul_tool_again_with_its_program() {
    let t = tempfile::tempdir().unwrap();
    let old = t.path().join("longhaul-old");
    std::fs::write(&old, "").unwrap();
    let tools = peers::builtin();
    let spec = format!("old={}", old.display());
    let b = peers::builds(&tools, std::slice::from_ref(&spec)).unwrap();
    let names: Vec<&str> = b.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["longhaul@old", "longhaul-ssh@old", "longhaul-perf@old"]
    );
    for t in &b {
        assert_eq!(t.bin.as_deref(), Some(old.to_str().unwrap()), "{}", t.name);
        assert!(!t.far, "{}: a build is a file here", t.name);
    }
    let missing = format!("x={}", t.path().join("absent").display());
    for (bad, why) in [
        ("old", "NAME=PATH"),
        ("=x", "NAME=PATH"),
        ("a@b=/bin/sh", "without"),
        (missing.as_str(), "is not a file"),
    ] {
        let e = peers::builds(&tools, &[bad.to_string()]).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
    let e = peers::builds(&tools, &[spec.clone(), spec]).unwrap_err();
    assert!(e.contains("given twice"), "{e}");
}

/// `W+changed`: every hundredth file of the source differs in the copy,
/// in its bytes, its size and its time; the rest are left alone.
#[test]
fn a_changed_sync_makes_one_file_in_a_hundred_differ() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("smallfiles");
    run::make_data("smallfiles", &d, 0, 250).unwrap();
    let before = verify::manifest(&d).unwrap();
    let n = run::change_files(&d, &before, 9).unwrap();
    assert_eq!(n, 3);
    let after = verify::manifest(&d).unwrap();
    let differ: Vec<&std::path::PathBuf> = before
        .iter()
        .filter(|(p, e)| after.get(*p) != Some(*e))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(differ.len(), 3, "{differ:?}");
    for p in differ {
        let (Some(verify::Entry::File { len: a, .. }), Some(verify::Entry::File { len: b, .. })) =
            (before.get(p), after.get(p))
        else {
            panic!("{p:?} is not a file");
        };
        assert_eq!(*b, a + 1);
        let m = std::fs::metadata(d.join(p)).unwrap().modified().unwrap();
        assert!(m < std::time::SystemTime::now() - Duration::from_secs(86400 * 365));
    }
}

/// Pieces run apart make one document: `--merge` files then `--resume`,
/// a later file's cell replacing an earlier's, cells of other data left out.
#[test]
fn merged_files_give_their_cells_of_this_runs_data_later_files_winning() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, d: &Doc| {
        let p = dir.path().join(name);
        std::fs::write(&p, serde_json::to_string(d).unwrap()).unwrap();
        p
    };
    let mut a = doc(vec![
        summarised("iperf3", "mem", 1e9, None),
        summarised("cp", "elephant", 1e8, Some(true)),
    ]);
    a.load.start = "0.50 a".into();
    let mut b = doc(vec![summarised("cp", "elephant", 2e8, Some(true))]);
    b.load.start = "0.50 b".into();
    let mut c = doc(vec![
        summarised("nuttcp", "mem", 3e9, None),
        summarised("gridftp", "elephant", 4e8, Some(true)),
    ]);
    c.params.mem_seconds = 2.0;
    let (pa, pb, pc) = (
        write("a.json", &a),
        write("b.json", &b),
        write("c.json", &c),
    );
    let Ok(Kept { done, pieces, .. }) = resumed(&[&pa, &pb, &pc], 2, &a.params) else {
        panic!("the files read")
    };
    // The two --merge files are the pieces, each with its load; the
    // --resume file (c) is this run's own.
    let named: Vec<(&str, &str)> = pieces
        .iter()
        .map(|p| (p.file.as_str(), p.load.start.as_str()))
        .collect();
    assert_eq!(named, [("a.json", "0.50 a"), ("b.json", "0.50 b")]);
    let kept: Vec<(String, f64)> = done
        .values()
        .map(|c| {
            (
                c.tool.clone(),
                c.rate.as_ref().unwrap().median_bytes_per_second,
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("cp".to_string(), 2e8),
            ("gridftp".to_string(), 4e8),
            ("iperf3".to_string(), 1e9)
        ],
        "{kept:?}"
    );
    // The elephant of another size is left out, the memory cells stay.
    let mut big = a.params.clone();
    big.elephant_bytes = 1 << 20;
    let Ok(Kept { done, .. }) = resumed(&[&pa], 1, &big) else {
        panic!("the file read")
    };
    assert_eq!(done.len(), 1);
    assert!(done.values().all(|c| c.workload == "mem"));
    // A piece merged from pieces gives those, not itself.
    let mut ab = doc(vec![]);
    ab.merged = pieces;
    let pab = write("ab.json", &ab);
    let Ok(Kept { pieces, .. }) = resumed(&[&pab, &pc], 2, &a.params) else {
        panic!("the files read")
    };
    let files: Vec<&str> = pieces.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(files, ["a.json", "b.json", "c.json"]);
}
