//! Jobs that run unattended to the end (issue 44): `serve --jobs`,
//! `submit`, `jobs [show|wait|cancel|retry]`, against real servers started
//! as processes on loopback (so that they can be killed with SIGKILL and
//! started again on the same port and state), the emulated WAN where it
//! says so, and a real PostgreSQL for a group of servers. Each attack on
//! the surface (a job's spec, another grant, a notification URL, the
//! stored capabilities) is played against the real binary.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::xfer::*;
use common::{bin, free_port, stderr, stdout, wait_until, TempDir};

/// A `longhaul serve` process on 127.0.0.1, killed when dropped; its log
/// (info) beside its state directory.
pub(crate) struct Serve {
    child: Option<Child>,
    port: u16,
    state: PathBuf,
    args: Vec<String>,
    prefix: Vec<String>,
}

impl Serve {
    fn start(state: &Path, args: &[&str]) -> Serve {
        Self::start_as(&[], state, args)
    }

    /// Started through `prefix` (a program and its arguments that exec the
    /// binary, e.g. setpriv).
    fn start_as(prefix: &[&str], state: &Path, args: &[&str]) -> Serve {
        let mut s = Serve {
            child: None,
            port: free_port(),
            state: common::prepare_state(state),
            args: args.iter().map(|a| a.to_string()).collect(),
            prefix: prefix.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn log(&self) -> PathBuf {
        self.state.with_extension(format!("{}.log", self.port))
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let mut c = match self.prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(env!("CARGO_BIN_EXE_longhaul"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_longhaul")),
        };
        c.args(["-v", "serve", "--listen", &self.addr(), "--state-dir"])
            .arg(&self.state)
            .args(&self.args)
            .env("LONGHAUL_ARCHIVE", common::archive_file())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(c.spawn().expect("start longhaul serve"));
        let start = Instant::now();
        while std::net::TcpStream::connect(self.addr()).is_err() {
            if let Ok(Some(st)) = self.child.as_mut().unwrap().try_wait() {
                panic!("serve ended ({st}): {}", self.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "serve never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// SIGKILL: nothing of it runs after.
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Started again, on the same port and state directory.
    fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `longhaul ARGS`, expecting `code`, its stdout as JSON.
#[track_caller]
fn json_run(args: &[&str], code: i32) -> Value {
    let o = bin().args(args).stdin(Stdio::null()).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(code),
        "longhaul {}: stdout {} stderr {}",
        args.join(" "),
        stdout(&o),
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(&o), stderr(&o)))
}

/// Submits; the job's id and the `longhaul-job` document.
#[track_caller]
pub(crate) fn submit(args: &[&str]) -> (String, Value) {
    let mut all = vec!["submit", "--json"];
    all.extend_from_slice(args);
    let v = json_run(&all, 0);
    assert_eq!(v["format"], "longhaul-job", "{v}");
    assert_eq!(v["format_version"], 1, "{v}");
    (v["id"].as_str().unwrap().to_string(), v)
}

/// `jobs show ID --json`.
#[track_caller]
fn show(server: &Serve, id: &str) -> Value {
    json_run(&["jobs", "show", id, "--via", &server.addr(), "--json"], 0)
}

/// `jobs wait ID --json`: its exit code and document.
pub(crate) fn wait_job(server: &Serve, id: &str, limit: Duration) -> (i32, Value) {
    let o = bin()
        .args(["jobs", "wait", id, "--json", "--via", &server.addr()])
        .args(["--timeout", &format!("{}s", limit.as_secs())])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v)
}

pub(crate) fn url(s: &Serve, path: &str) -> String {
    format!("longhaul://{}/{path}", s.addr())
}

/// A job server exporting `root` as `data`, and a destination exporting
/// `dest` as `in` that takes part in third-party copies (as a job's far end
/// does), each with its own state directory under `t`.
pub(crate) fn pair(t: &TempDir, root: &Path, dest: &Path, job_args: &[&str]) -> (Serve, Serve) {
    let export = format!("data={}", root.display());
    let mut args = vec!["--jobs", "--export", &export, "--no-sync"];
    args.extend_from_slice(job_args);
    let j = Serve::start(&t.path().join("state-j"), &args);
    let into = format!("in={}", dest.display());
    let b = Serve::start(
        &t.path().join("state-b"),
        &["--third-party-copies", "--export", &into, "--no-sync"],
    );
    (j, b)
}

/// A job's attempts, as `jobs show --json` lists them.
fn history(v: &Value) -> Vec<Value> {
    v["job"]["history"].as_array().cloned().unwrap_or_default()
}

/// One HTTP request as a receiver saw it.
struct Request {
    line: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// A webhook receiver on loopback: each request is answered with
/// `answer` and handed to the channel.
fn receiver(answer: &'static str) -> (String, mpsc::Receiver<Request>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut r = BufReader::new(s);
            let mut line = String::new();
            if r.read_line(&mut line).is_err() {
                continue;
            }
            let mut headers = HashMap::new();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
            let n: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; n.min(1 << 20)];
            let _ = r.read_exact(&mut body);
            let _ = r.get_mut().write_all(answer.as_bytes());
            let _ = tx.send(Request {
                line: line.trim().to_string(),
                headers,
                body,
            });
        }
    });
    (format!("http://{addr}"), rx)
}

/// Checks a notification's signature as its receiver would: HMAC-SHA256
/// under the job's secret over `TIMESTAMP.BODY`.
fn signed_by(r: &Request, secret: &str) -> bool {
    use aws_lc_rs::hmac;
    let (Some(ts), Some(sig)) = (
        r.headers.get("x-longhaul-timestamp"),
        r.headers.get("x-longhaul-signature"),
    ) else {
        return false;
    };
    let Some(hex) = sig.strip_prefix("sha256=") else {
        return false;
    };
    let Some(tag) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let mut msg = format!("{ts}.").into_bytes();
    msg.extend_from_slice(&r.body);
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hmac::verify(&key, &msg, &tag).is_ok()
}

#[test]
fn a_tree_job_finishes_verified_after_its_client_left_and_its_webhook_is_signed() {
    let t = TempDir::new("job-tree");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    for i in 0..32 {
        write_random(&src.join(format!("tree/d{}/f{i}.bin", i % 4)), 32 << 20, i);
    }
    write_random(&src.join("tree/small/one"), 1000, 99);
    let (j, b) = pair(&t, &src, &dst, &[]);
    let (hook, requests) =
        receiver("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let started = Instant::now();
    let (id, doc) = submit(&[
        "-r",
        "--notify",
        &format!("{hook}/longhaul?job=tree"),
        &url(&j, "data/tree"),
        &url(&b, "in/"),
    ]);
    let submitted_in = started.elapsed();
    let secret = doc["notify_secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("lh1n_"), "{doc}");
    // The client is gone; the job is not done yet.
    let first = show(&j, &id);
    assert!(
        ["submitted", "active"].contains(&first["job"]["state"].as_str().unwrap()),
        "{first} (the client took {submitted_in:?})"
    );
    let (code, v) = wait_job(&j, &id, Duration::from_secs(300));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["state"], "finished", "{v}");
    assert_eq!(v["job"]["files"]["finished"], 33, "{v}");
    assert_eq!(v["job"]["bytes_done"], (32u64 << 25) + 1000, "{v}");
    assert_same_tree(&src.join("tree"), &dst.join("tree"), false);
    let took = started.elapsed();
    eprintln!(
        "tree job: submit returned in {:.2} s; 1 GiB in 33 files finished verified {:.1} s after submission ({:.0} MB/s)",
        submitted_in.as_secs_f64(),
        took.as_secs_f64(),
        ((32u64 << 25) + 1000) as f64 / took.as_secs_f64() / 1e6
    );
    let r = requests
        .recv_timeout(Duration::from_secs(60))
        .expect("the webhook was called");
    assert!(r.line.starts_with("POST /longhaul?job=tree "), "{}", r.line);
    assert!(signed_by(&r, &secret), "{:?}", r.headers);
    assert!(!signed_by(&r, "lh1n_another"));
    let event: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(event["format"], "longhaul-job-event", "{event}");
    assert_eq!(event["event"], "ended", "{event}");
    assert_eq!(event["job"]["id"], id.as_str(), "{event}");
    assert_eq!(event["job"]["state"], "finished", "{event}");
    assert_eq!(
        event["sent_at"].as_u64().unwrap().to_string(),
        r.headers["x-longhaul-timestamp"]
    );
    // The capability B issued is revoked once the job finished.
    let caps = t.path().join("state-b/capabilities");
    wait_until("the revocation", Duration::from_secs(30), || {
        std::fs::read_to_string(&caps).is_ok_and(|c| c.trim().is_empty())
    });
    drop((j, b));
}

/// The journal of a file being pushed to `dir`, and its chunk size (from
/// its header).
fn journal_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.lhjournal"))
}

fn chunk_of(journal: &Path) -> u64 {
    let b = std::fs::read(journal).unwrap();
    u64::from_be_bytes(b[24..32].try_into().unwrap())
}

/// kill -9 of the job server `j` once B's `journal` holds `records`
/// verified chunks (of a file of `size`), then its restart, on the same
/// port and state. What B had verified and journaled once its session of
/// the dead server ended (chunks, their size), and B's count of bytes
/// written at the restart (its kernel's: the chunks it receives go to its
/// partial file through write calls).
fn kill9_mid_push(
    j: &mut Serve,
    b: &Serve,
    journal: &Path,
    records: u64,
    size: u64,
) -> ((u64, u64), u64) {
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(journal) >= records
    });
    j.kill9();
    wait_until(
        "B to end the session the dead server left",
        Duration::from_secs(60),
        || b.log_text().contains("transfer failed"),
    );
    let verified = journal_indices(journal).len() as u64;
    let chunk = chunk_of(journal);
    assert!(verified * chunk < size, "it finished before the kill");
    let b_before = common::counters::ProcIo::of(b.pid()).unwrap().wchar;
    j.restart();
    ((verified, chunk), b_before)
}

/// After a kill -9 of `who` and its restart: the job's last attempt
/// (after at least one before it) finished, taking from B's journal every
/// chunk B had verified (`chunks`: how many, of what size), and B wrote
/// (`written`, its kernel's count) what was left of `size` and never the
/// verified chunks again: a resend of them all would add their bytes.
#[track_caller]
fn assert_resumed_without_resend(
    v: &Value,
    size: u64,
    chunks: (u64, u64),
    written: u64,
    who: &str,
) {
    let (verified, chunk) = chunks;
    let h = history(v);
    let last = h.last().unwrap();
    assert!(h.len() >= 2, "{v}");
    assert_eq!(last["outcome"], "ok", "{v}");
    let resumed = last["resumed_bytes"].as_u64().unwrap();
    assert!(resumed > 0, "{v}");
    assert!(
        resumed >= verified * chunk,
        "resumed {resumed} < {verified} x {chunk}: {v}"
    );
    let left = size - verified * chunk;
    eprintln!(
        "kill -9 of {who}: {verified} chunks of {chunk} verified before; resumed {resumed} bytes; B then wrote {written} bytes for {left} left"
    );
    assert!(
        written >= left / 2 && written < left + (verified * chunk) / 2,
        "B wrote {written} bytes after the kill; {left} were left, {} verified before",
        verified * chunk
    );
}

#[test]
fn a_job_survives_kill_9_of_its_server_and_resends_no_verified_chunk() {
    let t = TempDir::new("job-kill");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let size = 192u64 << 20;
    write_random(&src.join("big.bin"), size as usize, 7);
    let (mut j, b) = pair(&t, &src, &dst, &["--no-archive"]);
    let (id, _) = submit(&[
        "--rate",
        "240mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/"),
    ]);
    let (chunks, b_before) = kill9_mid_push(&mut j, &b, &journal_of(&dst, "big.bin"), 8, size);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(300));
    let written = common::counters::ProcIo::of(b.pid()).unwrap().wchar - b_before;
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_file(&src.join("big.bin"), &dst.join("big.bin"));
    assert_resumed_without_resend(&v, size, chunks, written, "the job server");
}

#[test]
fn a_job_survives_its_far_end_killed_and_started_again() {
    let t = TempDir::new("job-far");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("big.bin"), 128 << 20, 8);
    let (j, mut b) = pair(&t, &src, &dst, &["--no-archive"]);
    let (id, _) = submit(&[
        "--rate",
        "200mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/"),
    ]);
    let journal = journal_of(&dst, "big.bin");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 4
    });
    b.kill9();
    wait_until("a failed attempt", Duration::from_secs(60), || {
        history(&show(&j, &id))
            .iter()
            .any(|a| a["outcome"] == "failed")
    });
    // Its capability was kept (hashed) in its state directory: it still
    // admits the job after the restart.
    b.restart();
    let (code, v) = wait_job(&j, &id, Duration::from_secs(300));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_file(&src.join("big.bin"), &dst.join("big.bin"));
    let h = history(&v);
    assert!(h.len() >= 2, "{v}");
    assert!(h.iter().any(|a| a["outcome"] == "failed"), "{v}");
    assert!(
        h.last().unwrap()["resumed_bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
}

/// The capabilities a job server holds, read from its database as an
/// attacker who stole the file would.
fn stolen_capabilities(state: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open(state.join("jobs.db")).unwrap();
    let mut st = db.prepare("SELECT spec FROM jobs").unwrap();
    let specs: Vec<String> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    specs
        .iter()
        .flat_map(|s| {
            let v: Value = serde_json::from_str(s).unwrap();
            [&v["source"], &v["dest"]]
                .into_iter()
                .filter_map(|e| e["credential"]["capability"].as_str().map(String::from))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A job server J (with `job_args`) pushing `big.bin` (256 MiB of seed
/// `seed`, written into `src`) at 100 Mbit/s to B's `dst`, under way: B's
/// journal holds verified chunks. J, B and the job's id.
fn slow_push_under_way(
    src: &Path,
    dst: &Path,
    t: &TempDir,
    seed: u64,
    job_args: &[&str],
) -> (Serve, Serve, String) {
    write_random(&src.join("big.bin"), 256 << 20, seed);
    let (j, b) = pair(t, src, dst, job_args);
    let (id, _) = submit(&[
        "--rate",
        "100mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/"),
    ]);
    let journal = journal_of(dst, "big.bin");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 2
    });
    (j, b, id)
}

#[test]
fn cancelling_a_job_stops_its_streams_removes_its_partial_files_and_revokes_its_capability() {
    use std::os::unix::fs::PermissionsExt;
    let t = TempDir::new("job-cancel");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let (j, b, id) = slow_push_under_way(&src, &dst, &t, 9, &["--no-archive"]);
    // A wait whose time runs out says the job goes on, not that it failed.
    assert_eq!(wait_job(&j, &id, Duration::from_secs(1)).0, 9);
    let journal = journal_of(&dst, "big.bin");
    let part = dst.join(".big.bin.lhpart");
    // The job server's database is its user's alone: it holds capabilities.
    let mode = std::fs::metadata(j.state.join("jobs.db"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "jobs.db is {mode:o}");
    let stolen = stolen_capabilities(&j.state);
    assert_eq!(stolen.len(), 1);
    let cancelled = Instant::now();
    let o = bin()
        .args(["jobs", "cancel", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 8, "{v}");
    assert_eq!(v["job"]["state"], "cancelled", "{v}");
    // No partial file remains, and nothing moves any more.
    wait_until(
        "the partial files' removal",
        Duration::from_secs(30),
        || !part.exists() && !journal.exists(),
    );
    wait_until(
        "the job's streams to close",
        Duration::from_secs(30),
        || common::counters::established(b.port) == 0,
    );
    eprintln!(
        "cancel: streams closed and partial files removed {:.2} s after `jobs cancel` began",
        cancelled.elapsed().as_secs_f64()
    );
    assert!(
        std::fs::read_dir(&dst).unwrap().next().is_none(),
        "{:?}",
        std::fs::read_dir(&dst).unwrap().collect::<Vec<_>>()
    );
    // The capability no longer works: a push with it is refused.
    let o = bin()
        .env("LONGHAUL_TOKEN", &stolen[0])
        .args([
            "cp",
            &src.join("big.bin").display().to_string(),
            &url(&b, "in/"),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown, expired or revoked"),
        "{}",
        stderr(&o)
    );
    assert!(!dst.join("big.bin").exists());
    assert_eq!(
        common::counters::established(b.port),
        0,
        "the job opened a stream again"
    );
    assert!(!part.exists() && !journal.exists());
    // Never printed, never logged.
    assert!(!stdout(&o).contains("lh1c_"));
    assert!(
        !j.log_text().contains("lh1c_"),
        "the job server logged a capability"
    );
    assert!(
        !b.log_text().contains("lh1c_"),
        "the far end logged a capability"
    );
    assert!(!v.to_string().contains("lh1c_"));
}

/// A server that cannot read what it may not read, even as root: started
/// without the capabilities that pass over file modes.
fn without_dac_override() -> Vec<&'static str> {
    if rustix::process::geteuid().is_root() {
        vec![
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search",
            "--",
        ]
    } else {
        Vec::new()
    }
}

#[test]
fn a_file_unreadable_at_first_fails_alone_and_a_retry_moves_only_it() {
    use std::os::unix::fs::PermissionsExt;
    let t = TempDir::new("job-retry");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("tree/a.bin"), 3 << 20, 1);
    write_random(&src.join("tree/b.bin"), 2 << 20, 2);
    write_random(&src.join("tree/locked.bin"), 1 << 20, 3);
    let locked = src.join("tree/locked.bin");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let export = format!("data={}", src.display());
    let j = Serve::start_as(
        &without_dac_override(),
        &t.path().join("state-j"),
        &["--jobs", "--export", &export, "--no-sync", "--no-archive"],
    );
    let into = format!("in={}", dst.display());
    let b = Serve::start(
        &t.path().join("state-b"),
        &["--third-party-copies", "--export", &into, "--no-sync"],
    );
    let (id, _) = submit(&[
        "-r",
        "--retries",
        "0",
        &url(&j, "data/tree"),
        &url(&b, "in/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(120));
    assert_eq!(code, 6, "{v} {}", j.log_text());
    assert_eq!(v["job"]["state"], "finished_with_failures", "{v}");
    assert_eq!(v["job"]["files"]["failed"], 1, "{v}");
    assert_eq!(v["job"]["files"]["finished"], 2, "{v}");
    let failed = v["files"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["path"], "tree/locked.bin", "{v}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("ermission"),
        "{v}"
    );
    assert!(!dst.join("tree/locked.bin").exists());
    // Its capability stays for the retry.
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = json_run(&["jobs", "retry", &id, "--via", &j.addr(), "--json"], 0);
    assert_eq!(r["done"], "retried", "{r}");
    assert_eq!(r["files"], 1, "{r}");
    let (code, v) = wait_job(&j, &id, Duration::from_secs(120));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_tree(&src.join("tree"), &dst.join("tree"), false);
    let last = history(&v).last().cloned().unwrap();
    assert_eq!(last["outcome"], "ok", "{v}");
    // Only the failed file moved.
    assert_eq!(last["files"], 1, "{v}");
    assert_eq!(last["sent_bytes"], 1u64 << 20, "{v}");
}

/// Also the sync options a job takes: `--exclude` (a scratch file never
/// goes), `--delete` (a file removed at the source goes at the
/// destination), `--checksum` (a file rewritten with its size and mtime
/// kept is found changed) and `-z`.
#[test]
fn a_recurring_sync_runs_twice_and_the_second_run_moves_only_what_changed() {
    let t = TempDir::new("job-every");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    for i in 0..5 {
        write_random(&src.join(format!("tree/f{i}")), 1 << 20, 20 + i);
    }
    write_random(&src.join("tree/scratch.tmp"), 1000, 19);
    let (j, b) = pair(&t, &src, &dst, &["--jobs-min-every", "1s"]);
    let (id, _) = submit(&[
        "--sync",
        "--delete",
        "--checksum",
        "-z",
        "--exclude",
        "*.tmp",
        "--every",
        "3s",
        &url(&j, "data/tree"),
        &url(&b, "in/"),
    ]);
    wait_until("the first run", Duration::from_secs(120), || {
        show(&j, &id)["job"]["runs"].as_u64() >= Some(1)
    });
    for i in 0..5 {
        let f = format!("tree/f{i}");
        assert_same_file(&src.join(&f), &dst.join(&f));
    }
    assert!(!dst.join("tree/scratch.tmp").exists());
    // The change, whole when a run sees it: f3's content (its size and
    // mtime kept, so that only --checksum finds it), and f4 removed.
    let f3 = src.join("tree/f3");
    let mtime = std::fs::metadata(&f3).unwrap().modified().unwrap();
    let new = src.join("f3.new");
    write_random(&new, 1 << 20, 99);
    std::fs::File::options()
        .write(true)
        .open(&new)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&new, &f3).unwrap();
    std::fs::remove_file(src.join("tree/f4")).unwrap();
    wait_until(
        "the change at the destination",
        Duration::from_secs(120),
        || {
            std::fs::read(dst.join("tree/f3")).ok() == std::fs::read(&f3).ok()
                && !dst.join("tree/f4").exists()
        },
    );
    wait_until(
        "the run that moved it to end",
        Duration::from_secs(60),
        || {
            history(&show(&j, &id))
                .iter()
                .skip(1)
                .any(|r| r["outcome"] == "ok" && r["bytes"] == 1u64 << 20)
        },
    );
    let v = show(&j, &id);
    let runs = history(&v);
    assert!(runs.len() >= 2, "{v}");
    assert!(runs.iter().all(|r| r["attempt"] == 1), "{v}");
    assert_eq!(runs[0]["files"], 5, "{v}");
    assert_eq!(runs[0]["bytes"], 5u64 << 20, "{v}");
    // What the later runs moved, together: f3 alone.
    let later = |k: &str| {
        runs[1..]
            .iter()
            .map(|r| r[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(later("bytes"), 1 << 20, "{v}");
    // No run started before the last one's interval ran out.
    for w in runs.windows(2) {
        let (a, b) = (w[0]["started"].as_f64(), w[1]["started"].as_f64());
        assert!(b >= a.map(|s| s + 3.0), "{v}");
    }
    assert!(!dst.join("tree/scratch.tmp").exists());
    // Each run is an archived run of the job.
    let archived = json_run(&["history", "--json", "--kind", "job"], 0);
    let mine = archived["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["command"].as_str().is_some_and(|c| c.contains(&id)))
        .count();
    assert!(mine >= 2, "{archived}");
    let o = bin()
        .args(["jobs", "cancel", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

fn refused_with(o: &std::process::Output, words: &str) {
    assert!(!o.status.success(), "{}", stdout(o));
    assert!(
        stderr(o).contains(words),
        "expected {words:?}: {}",
        stderr(o)
    );
}

/// `submit --help` names every form its SRC... DST take: servers' paths
/// and a host over ssh the job server may reach.
#[test]
fn submit_help_names_every_form_its_paths_take() {
    let o = bin().args(["submit", "--help"]).output().unwrap();
    let out = stdout(&o);
    assert!(
        out.contains("Usage: longhaul submit [OPTIONS] SRC... DST")
            && out.contains("longhaul://HOST[:PORT]/EXPORT/path")
            && out.contains("[USER@]HOST:path")
            && out.contains("--jobs-ssh"),
        "{out}"
    );
}

/// A refusal names the server it came from (the destination gave its
/// capability; the job server does not know the token), and `jobs show`
/// says its times are UTC.
#[test]
fn a_refused_submission_names_its_server_and_jobs_show_says_utc() {
    let t = TempDir::new("job-named");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("f"), 1000, 1);
    let (j, b) = pair(&t, &src, &dst, &[]);
    let bad = t.path().join("bad.token");
    longhaul_testkit::data::write_secret(
        &bad,
        "lh1_0badbad0_not-a-token-of-this-server-0123456789",
    );
    let o = bin()
        .arg("submit")
        .arg(format!("--token-file={}={}", j.addr(), bad.display()))
        .args([&url(&j, "data/f"), &url(&b, "in/")])
        .output()
        .unwrap();
    refused_with(
        &o,
        &format!("{} (the job server) did not take the job", j.addr()),
    );
    refused_with(&o, "unknown or revoked token");
    let (id, _) = submit(&[&url(&j, "data/f"), &url(&b, "in/")]);
    let o = bin()
        .args(["jobs", "show", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(
        out.contains(" UTC, capabilities until ") && out.contains(" UTC\n"),
        "{out}"
    );
}

#[test]
fn attacker_a_job_that_leaves_its_export_widens_its_capability_or_is_malformed_is_refused() {
    use longhaul_engine::xfer::jobcaps;
    use longhaul_proto::job::*;
    use longhaul_proto::msg::{Message, RefuseCode};
    use longhaul_proto::xfer::copy::GrantRequest;
    let t = TempDir::new("job-attack-spec");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("tree/f"), 1000, 1);
    std::os::unix::fs::symlink("/etc", src.join("out")).unwrap();
    let (j, b) = pair(&t, &src, &dst, &[]);
    // Paths that leave the export: refused by the job server, and the
    // capability the destination gave for them revoked by the client.
    for (bad, why) in [
        ("data/tree/../../../etc", "leaves the export"),
        ("data/out/passwd", "outside"),
        ("nodata/tree", "no export named"),
    ] {
        let o = bin()
            .args(["submit", &url(&j, bad), &url(&b, "in/")])
            .output()
            .unwrap();
        refused_with(&o, why);
    }
    let caps = t.path().join("state-b/capabilities");
    assert!(
        std::fs::read_to_string(&caps).is_ok_and(|c| c.trim().is_empty()),
        "a refused job's capability stayed at the destination"
    );
    // A local source, and two ends on the job server: said what to do.
    let o = bin()
        .args([
            "submit",
            &src.join("tree").display().to_string(),
            &url(&b, "in/"),
        ])
        .output()
        .unwrap();
    refused_with(&o, "longhaul cp");
    // A job whose destination is wider than its capability: the far end
    // refuses its push; the job fails at once, saying why, writing nothing.
    let client = crate::third_party_copy::client();
    let narrow = GrantRequest {
        export: "in".into(),
        dest: "x".into(),
        dest_dir: true,
        lifetime_s: 600,
        ..GrantRequest::default()
    };
    let cap = jobcaps::ask(&b.addr(), &client, narrow).unwrap();
    let mut spec = JobSpec {
        source: JobEnd {
            host: None,
            export: "data".into(),
            paths: vec!["tree".into()],
            dir: false,
            credential: None,
            ssh: None,
        },
        dest: JobEnd {
            host: Some(b.addr()),
            export: "in".into(),
            paths: vec!["".into()],
            dir: true,
            credential: Some(JobCredential {
                fingerprint: cap.fingerprint.clone(),
                capability: cap.capability.clone(),
                lifetime_s: cap.lifetime_s,
            }),
            ssh: None,
        },
        options: JobOptions {
            recursive: true,
            retries: 3,
            ..JobOptions::default()
        },
    };
    let answer = jobcaps::ask_job_server(
        &j.addr(),
        &client,
        Message::JobSubmit(Box::new(spec.clone())),
    )
    .unwrap();
    let JobAnswer::Accepted { id, .. } = answer else {
        panic!("{answer:?}")
    };
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 5, "{v}");
    assert_eq!(v["job"]["state"], "failed", "{v}");
    assert_eq!(history(&v).len(), 1, "a refusal is not retried: {v}");
    assert!(
        v["job"]["error"].as_str().unwrap().contains("in/x only"),
        "{v}"
    );
    assert!(std::fs::read_dir(&dst).unwrap().next().is_none());
    // Malformed: too many sources, a token instead of a capability, a
    // notification URL with credentials; each refused with its reason.
    let refused = |spec: JobSpec, why: &str| match jobcaps::ask_job_server(
        &j.addr(),
        &client,
        Message::JobSubmit(Box::new(spec)),
    ) {
        Err(longhaul_engine::EngineError::Refused { code, message }) => {
            assert_eq!(code, RefuseCode::BadRequest, "{message}");
            assert!(message.contains(why), "{why}: {message}");
        }
        other => panic!("{why}: {other:?}"),
    };
    let mut many = spec.clone();
    many.source.paths = vec!["tree".into(); 2000];
    refused(many, "1 to 1024 sources");
    let mut token = spec.clone();
    token.dest.credential.as_mut().unwrap().capability = common::TOKEN.into();
    refused(token, "not a capability");
    spec.options.notify = Some("https://user:secret@hooks.example/x".into());
    refused(spec, "credentials");
    // Bytes that are no job at all: the session ends with a protocol
    // refusal, the server serves on.
    let mut raw = crate::security::hello(Some(common::TOKEN));
    longhaul_proto::frame::encode_frame(0x60, b"{\"source\":", &mut raw).unwrap();
    let addr: std::net::SocketAddr = j.addr().parse().unwrap();
    let got = crate::security::hostile(addr, &raw);
    let r = crate::security::refusal(&got).expect("a refusal");
    assert_eq!(r.code, RefuseCode::Protocol, "{r:?}");
    let o = bin().args(["jobs", "--via", &j.addr()]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn attacker_another_grant_cannot_see_or_steer_a_job_and_a_grant_has_a_limit() {
    let t = TempDir::new("job-attack-grant");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("big.bin"), 64 << 20, 5);
    let (j, b) = pair(&t, &src, &dst, &["--jobs-max-per-grant", "1"]);
    let other = "lh1_0b0e0000_othersecret-othersecret-othersecret-01";
    longhaul_engine::server::auth::add_token(
        &j.state,
        other,
        vec![longhaul_engine::server::auth::ExportGrant {
            name: "*".into(),
            write: true,
        }],
        "another user",
    )
    .unwrap();
    let (id, _) = submit(&[
        "--rate",
        "20mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/"),
    ]);
    // The grant's limit: one job that has not ended.
    let o = bin()
        .args(["submit", &url(&j, "data/big.bin"), &url(&b, "in/again")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    refused_with(&o, "--jobs-max-per-grant 1");
    // Another grant: sees none, and hears of its job what it hears of a
    // job that does not exist.
    let as_other = |args: &[&str]| {
        bin()
            .env("LONGHAUL_TOKEN", other)
            .args(args)
            .args(["--via", &j.addr()])
            .output()
            .unwrap()
    };
    let o = as_other(&["jobs", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(0), "{v}");
    let none = "ffffffffffffffff";
    for cmd in ["show", "cancel", "retry", "wait"] {
        let theirs = as_other(&["jobs", cmd, &id]);
        let missing = as_other(&["jobs", cmd, none]);
        refused_with(&theirs, "no job");
        assert_eq!(
            stderr(&theirs).replace(&id, "ID"),
            stderr(&missing).replace(none, "ID"),
            "{cmd}"
        );
    }
    assert_eq!(show(&j, &id)["job"]["state"], "active");
    let o = bin()
        .args(["jobs", "cancel", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A grant that submits job after job (each ended before the next, so
/// its limit of live jobs never bites) would grow the job server's store
/// without end, and every `jobs` list, which reads them all: its ended
/// jobs past its `--jobs-max-per-grant` newest go once nothing is left to
/// do for them.
#[test]
fn attacker_a_grant_submitting_job_after_job_keeps_only_its_share_of_ended_jobs() {
    let t = TempDir::new("job-attack-ended");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("f"), 1000, 6);
    let (j, b) = pair(&t, &src, &dst, &["--jobs-max-per-grant", "1"]);
    for n in 0..5 {
        let (id, _) = submit(&[&url(&j, "data/f"), &url(&b, &format!("in/f{n}"))]);
        let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
        assert_eq!(code, 0, "{v}");
    }
    let v = json_run(&["jobs", "--via", &j.addr(), "--json"], 0);
    let kept = v["jobs"].as_array().map_or(0, Vec::len);
    // The newest, the one before it, and one whose revocation may lag.
    assert!(kept <= 3, "{kept} jobs kept of 5: {v}");
}

#[test]
fn attacker_a_notification_url_gets_the_jobs_outcome_only_and_no_redirect_is_followed() {
    let t = TempDir::new("job-attack-hook");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("f"), 1000, 4);
    let (j, b) = pair(&t, &src, &dst, &[]);
    let (elsewhere, followed) = receiver("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    let redirect: &'static str = Box::leak(
        format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere}/steal\r\nContent-Length: 0\r\n\r\n")
            .into_boxed_str(),
    );
    let (hook, requests) = receiver(redirect);
    // The attacker chooses the URL (its path and query) and the paths;
    // the request carries the job's outcome, in a fixed document.
    let (id, doc) = submit(&[
        "--notify",
        &format!("{hook}/x?body=%7B%22evil%22%3A1%7D"),
        &url(&j, "data/f"),
        &url(&b, "in/"),
    ]);
    let (code, _) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 0);
    let first = requests
        .recv_timeout(Duration::from_secs(60))
        .expect("a POST");
    assert!(
        first
            .line
            .starts_with("POST /x?body=%7B%22evil%22%3A1%7D HTTP/1.1"),
        "{}",
        first.line
    );
    let event: Value = serde_json::from_slice(&first.body).unwrap();
    let keys: Vec<&String> = event.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["event", "format", "format_version", "job", "sent_at"],
        "{event}"
    );
    assert!(event.get("evil").is_none());
    assert!(signed_by(&first, doc["notify_secret"].as_str().unwrap()));
    assert!(
        !first.body.windows(5).any(|w| w == b"lh1c_"),
        "a capability in the notification"
    );
    assert!(
        !first.body.windows(5).any(|w| w == b"lh1n_"),
        "the secret in the notification"
    );
    // A redirect is an answer, never followed: it is a failure, retried,
    // each try signed anew, four tries in all (the job's end is told once:
    // no other worker takes the ended job up while its tries go on).
    for n in 2..=4 {
        let again = requests
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("try {n} of the notification"));
        assert_eq!(again.line, first.line);
        assert!(signed_by(&again, doc["notify_secret"].as_str().unwrap()));
    }
    wait_until(
        "the notification given up, and the job's chores done",
        Duration::from_secs(60),
        || {
            j.log_text().contains("(4 tries)")
                && std::fs::read_to_string(t.path().join("state-b/capabilities"))
                    .is_ok_and(|c| c.trim().is_empty())
        },
    );
    // A second telling would have begun within a worker's idle second of
    // the first and be trying by now.
    let extra = requests.recv_timeout(Duration::from_secs(3));
    assert!(
        extra.is_err(),
        "a fifth try of the notification: {}",
        j.log_text()
    );
    assert_eq!(j.log_text().matches("(4 tries)").count(), 1);
    assert!(
        followed.recv_timeout(Duration::from_secs(1)).is_err(),
        "the job server followed a redirect"
    );
    // Only http and https, no credentials in the URL.
    for bad in ["file:///etc/passwd", "gopher://h/x", "http://u:p@h/x"] {
        let o = bin()
            .args([
                "submit",
                "--notify",
                bad,
                &url(&j, "data/f"),
                &url(&b, "in/g"),
            ])
            .output()
            .unwrap();
        refused_with(&o, "notification URL");
    }
    let o = bin()
        .args([
            "submit",
            "--mail=-oQ/tmp/x@evil",
            &url(&j, "data/f"),
            &url(&b, "in/g"),
        ])
        .output()
        .unwrap();
    refused_with(&o, "plain address");
}

#[test]
fn a_jobs_end_is_mailed_through_the_servers_sendmail() {
    use std::os::unix::fs::PermissionsExt;
    let t = TempDir::new("job-mail");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("f"), 1000, 6);
    let sent = t.path().join("sent");
    let sendmail = t.path().join("sendmail");
    std::fs::write(
        &sendmail,
        format!(
            "#!/bin/sh\necho \"$@\" > {0}.args\ncat > {0}\n",
            sent.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&sendmail, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sm = sendmail.display().to_string();
    let (j, b) = pair(&t, &src, &dst, &["--sendmail", &sm]);
    let (id, _) = submit(&[
        "--mail",
        "ops@example.org",
        &url(&j, "data/f"),
        &url(&b, "in/"),
    ]);
    assert_eq!(wait_job(&j, &id, Duration::from_secs(60)).0, 0);
    wait_until("the mail", Duration::from_secs(30), || sent.exists());
    wait_until("the whole mail", Duration::from_secs(10), || {
        std::fs::read_to_string(&sent).is_ok_and(|m| m.contains("tells more"))
    });
    let mail = std::fs::read_to_string(&sent).unwrap();
    assert!(
        mail.starts_with("To: ops@example.org\nSubject: longhaul: job "),
        "{mail}"
    );
    assert!(mail.contains(&id), "{mail}");
    assert!(mail.contains("finished"), "{mail}");
    assert_eq!(
        std::fs::read_to_string(t.path().join("sent.args"))
            .unwrap()
            .trim(),
        "-i -- ops@example.org"
    );
}

#[cfg(feature = "queue")]
#[test]
fn two_servers_share_postgresql_and_one_finishes_the_job_of_the_other_killed() {
    let Some(pg) = common::pg::TempPostgres::start() else {
        return;
    };
    let t = TempDir::new("job-pg");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("big.bin"), 96 << 20, 10);
    let export = format!("data={}", src.display());
    let url_pg = pg.url();
    let args = [
        "--jobs",
        &url_pg,
        "--jobs-lease",
        "4s",
        "--export",
        &export,
        "--no-sync",
        "--no-archive",
    ];
    let mut servers = [
        Serve::start(&t.path().join("state-j1"), &args),
        Serve::start(&t.path().join("state-j2"), &args),
    ];
    let into = format!("in={}", dst.display());
    let b = Serve::start(
        &t.path().join("state-b"),
        &["--third-party-copies", "--export", &into, "--no-sync"],
    );
    let (id, _) = submit(&[
        "--rate",
        "150mbit",
        &url(&servers[0], "data/big.bin"),
        &url(&b, "in/"),
    ]);
    let journal = journal_of(&dst, "big.bin");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 4
    });
    // Whichever server leased it is killed; the other takes it over.
    let worker = show(&servers[1], &id)["job"]["worker"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let holder = servers
        .iter()
        .position(|s| worker.contains(&format!("{} pid {}", s.addr(), s.pid())))
        .unwrap_or_else(|| panic!("no server holds it: {worker:?}"));
    servers[holder].kill9();
    let killed = Instant::now();
    let other = &servers[1 - holder];
    let (code, v) = wait_job(other, &id, Duration::from_secs(300));
    eprintln!(
        "PostgreSQL takeover (lease 4 s): finished {:.1} s after the kill, {} bytes resumed",
        killed.elapsed().as_secs_f64(),
        history(&v)
            .last()
            .map_or(Value::Null, |a| a["resumed_bytes"].clone())
    );
    assert_eq!(code, 0, "{v} {}", other.log_text());
    assert_same_file(&src.join("big.bin"), &dst.join("big.bin"));
    let last = history(&v).last().cloned().unwrap();
    assert!(
        last["worker"].as_str().unwrap().contains(&other.addr()),
        "{v}"
    );
    assert!(last["resumed_bytes"].as_u64().unwrap() > 0, "{v}");
}

/// The emulator stopped (SIGSTOP) for as long as this lives: the link
/// carries nothing, both ways, as in an outage; SIGCONT when dropped.
struct Outage(rustix::process::Pid);

impl Outage {
    fn start(pid: u32) -> Outage {
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        Outage(pid)
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

/// The link goes down once the job's data is flowing (not at a guessed
/// time), for 30 s; the stalled attempt is stopped (`--jobs-stall 5s`),
/// the retries (`--jobs-backoff 1s`: 1, 2, 4 ... s apart, each waiting
/// up to its connect time-out) fail until the link is back, and the one
/// connecting then resumes.
#[test]
fn a_job_rides_out_a_30_s_outage_on_an_80_ms_path() {
    use common::wan::*;
    if !can_emulate() {
        return;
    }
    let name = format!("lhj{}", std::process::id() % 100_000);
    let t = TempDir::new("job-wan");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("big.bin"), 32 << 20, 11);
    // 80 ms, 20 Mbit/s: about 13 s of copying, on the emulator's
    // default MTU for this rate (1500 bytes; its queue holds at least 32
    // packets at any MTU).
    let w = Wan::up(&name, &["--rtt", "80ms", "--rate", "20mbit"]);
    let serve = |h: &str, ip: &str, state: &str, args: &[&str]| {
        let mut all = vec![
            "serve",
            "--listen",
            ip,
            "--no-sync",
            "--no-archive",
            "--state-dir",
        ];
        let state = common::prepare_state(&t.path().join(state));
        let state = state.to_str().unwrap().to_string();
        all.push(&state);
        all.extend_from_slice(args);
        common::Owned::spawn(
            w.exec(h, &all)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(t.path().join(format!("{h}.log"))).unwrap()),
        )
        .unwrap()
    };
    let export = format!("data={}", src.display());
    let into = format!("in={}", dst.display());
    let _j = serve(
        "a",
        "198.18.0.1:5310",
        "state-j",
        &[
            "--jobs",
            "--jobs-stall",
            "5s",
            "--jobs-backoff",
            "1s",
            "--export",
            &export,
        ],
    );
    let _b = serve(
        "b",
        "198.18.0.2:5310",
        "state-b",
        &["--third-party-copies", "--export", &into],
    );
    let client = |args: &[&str]| {
        let mut c = w.exec("a", args);
        c.env("LONGHAUL_TRUST", common::fingerprint());
        c.output().unwrap()
    };
    let via = ["--json", "--via", "198.18.0.1:5310"];
    wait_until("the servers", Duration::from_secs(30), || {
        client(&["jobs", "--via", "198.18.0.1:5310"])
            .status
            .success()
            && client(&["ls", "longhaul://198.18.0.2:5310/in/"])
                .status
                .success()
    });
    let o = client(&[
        "submit",
        "--json",
        "-P",
        "19",
        "longhaul://198.18.0.1:5310/data/big.bin",
        "longhaul://198.18.0.2:5310/in/",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let id = serde_json::from_slice::<Value>(&o.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let journal = journal_of(&dst, "big.bin");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 1
    });
    let outage = Outage::start(w.child.id());
    let down = Instant::now();
    let shown = || {
        let o = client(&[&["jobs", "show", &id][..], &via[..]].concat());
        serde_json::from_slice::<Value>(&o.stdout).unwrap_or(Value::Null)
    };
    wait_until("the stalled attempt's end", Duration::from_secs(60), || {
        history(&shown()).iter().any(|a| a["outcome"] == "failed")
    });
    // The outage lasts its 30 s whatever the job does meanwhile.
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    drop(outage);
    let up = Instant::now();
    let o = client(&[&["jobs", "wait", &id, "--timeout", "240s"][..], &via[..]].concat());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{v} {}",
        std::fs::read_to_string(t.path().join("a.log")).unwrap_or_default()
    );
    assert_eq!(v["job"]["state"], "finished", "{v}");
    assert_same_file(&src.join("big.bin"), &dst.join("big.bin"));
    let h = history(&v);
    let last = h.last().unwrap();
    assert_eq!(last["outcome"], "ok", "{v}");
    assert!(last["resumed_bytes"].as_u64().unwrap() > 0, "{v}");
    eprintln!(
        "outage of 30 s: {} attempts, finished {:.1} s after the link came back, {} bytes resumed",
        h.len(),
        up.elapsed().as_secs_f64(),
        last["resumed_bytes"]
    );
    for a in &h {
        eprintln!(
            "  attempt {}: {} {}",
            a["started"], a["outcome"], a["error"]
        );
    }
    if std::env::var_os("LONGHAUL_TEST_LOGS").is_some() {
        for h in ["a", "b"] {
            let log =
                std::fs::read_to_string(t.path().join(format!("{h}.log"))).unwrap_or_default();
            eprintln!("--- {h}.log\n{log}");
        }
    }
    drop(w);
}

/// A job server exporting `here` as `data` that pulls into it, and a
/// source exporting `far` as `src` that takes part in third-party copies,
/// each with its own state directory under `t`.
fn pull_pair(t: &TempDir, far: &Path, here: &Path) -> (Serve, Serve) {
    pull_pair_with(t, far, here, &[])
}

/// [`pull_pair`], the job server started with `job_args` too.
fn pull_pair_with(t: &TempDir, far: &Path, here: &Path, job_args: &[&str]) -> (Serve, Serve) {
    let into = format!("data={}", here.display());
    let mut args = vec!["--jobs", "--export", &into, "--no-sync", "--no-archive"];
    args.extend_from_slice(job_args);
    let j = Serve::start(&t.path().join("state-j"), &args);
    let from = format!("src={}", far.display());
    let a = Serve::start(
        &t.path().join("state-a"),
        &["--third-party-copies", "--export", &from, "--no-sync"],
    );
    (j, a)
}

#[test]
fn a_pull_job_brings_a_tree_into_the_job_servers_export_and_its_capability_reads_nothing_else() {
    let t = TempDir::new("job-pull");
    let (far, here) = (t.dir("far"), t.dir("here"));
    for i in 0..3 {
        write_random(&far.join(format!("tree/f{i}")), 4 << 20, 30 + i);
    }
    write_random(&far.join("secret/key"), 100, 40);
    let (j, a) = pull_pair(&t, &far, &here);
    // The job server holds the destination: it pulls, with a capability
    // the source issued to read the job's sources only.
    let (id, _) = submit(&[
        "-r",
        "--rate",
        "20mbit",
        "--via",
        &j.addr(),
        &url(&a, "src/tree"),
        &url(&j, "data/"),
    ]);
    let stolen = stolen_capabilities(&j.state);
    assert_eq!(stolen.len(), 1);
    let with_it = |args: &[&str]| {
        bin()
            .env("LONGHAUL_TOKEN", &stolen[0])
            .args(args)
            .output()
            .unwrap()
    };
    let o = with_it(&["ls", &url(&a, "src/tree")]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (args, why) in [
        (vec!["ls", &url(&a, "src/secret")] as Vec<&str>, "only"),
        (vec!["ls", &url(&a, "src/")], "only"),
        (
            vec!["cp", &url(&a, "src/secret/key"), t.path().to_str().unwrap()],
            "only",
        ),
    ] {
        let o = with_it(&args);
        refused_with(&o, why);
    }
    let payload = t.path().join("payload");
    std::fs::write(&payload, b"x").unwrap();
    let o = with_it(&["cp", payload.to_str().unwrap(), &url(&a, "src/tree/")]);
    refused_with(&o, "capability");
    let (code, v) = wait_job(&j, &id, Duration::from_secs(120));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["kind"], "pull", "{v}");
    assert_eq!(v["job"]["files"]["finished"], 3, "{v}");
    assert_same_tree(&far.join("tree"), &here.join("tree"), false);
    assert!(!here.join("secret").exists());
    assert!(!here.join("payload").exists() && !far.join("tree/payload").exists());
}

/// `-a` and `--bwlimit` in a job: the edge tree (links, empty files and
/// directories, odd names, modes, old mtimes) lands with its modes and
/// times, and the job's bytes take at least what the cap allows (a busy
/// machine only makes them slower).
#[test]
fn a_job_with_archive_mode_and_bwlimit_keeps_modes_and_times_and_holds_to_its_cap() {
    let t = TempDir::new("job-archive-mode");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    build_tree(&src.join("tree"));
    let (j, b) = pair(&t, &src, &dst, &[]);
    let started = Instant::now();
    let (id, _) = submit(&[
        "-a",
        "--bwlimit",
        "2M",
        &url(&j, "data/tree"),
        &url(&b, "in/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(300));
    let took = started.elapsed();
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_tree(&src.join("tree"), &dst.join("tree"), true);
    assert_no_leftovers(&dst);
    let bytes = v["job"]["bytes_total"].as_u64().unwrap();
    let at_cap = Duration::from_secs_f64(bytes as f64 / (2u64 << 20) as f64);
    eprintln!(
        "-a --bwlimit 2M: {bytes} bytes in {:.1} s ({:.2} MiB/s; {:.1} s at the cap)",
        took.as_secs_f64(),
        bytes as f64 / took.as_secs_f64() / (1 << 20) as f64,
        at_cap.as_secs_f64()
    );
    assert!(bytes > 12 << 20, "{v}");
    assert!(
        took >= at_cap * 3 / 4,
        "{took:?} for {bytes} bytes at 2 MiB/s"
    );
    // The cap is the job's, kept with each archived attempt.
    let archived = json_run(&["history", "--json", "--kind", "job"], 0);
    let attempt = archived["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["command"].as_str().is_some_and(|c| c.contains(&id)))
        .cloned()
        .unwrap_or_else(|| panic!("no archived attempt of {id}: {archived}"));
    let shown = json_run(&["show", &attempt["id"].to_string(), "--json"], 0);
    assert_eq!(
        shown["run"]["params"]["rate_bps"],
        2u64 * (1 << 20) * 8,
        "{shown}"
    );
}

/// The metrics of a job server count its jobs by state (of its store).
#[test]
fn a_job_servers_metrics_count_its_jobs_by_state() {
    let t = TempDir::new("job-metrics");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("small"), 1000, 1);
    write_random(&src.join("big.bin"), 64 << 20, 2);
    let metrics = format!("127.0.0.1:{}", free_port());
    let (j, b) = pair(&t, &src, &dst, &["--no-archive", "--metrics", &metrics]);
    let scrape = |state: &str| -> Option<f64> {
        let text = ureq::get(&format!("http://{metrics}/metrics"))
            .config()
            .timeout_global(Some(Duration::from_secs(20)))
            .proxy(None)
            .build()
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()?;
        let prefix = format!("longhaul_jobs{{state=\"{state}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    };
    let (done, _) = submit(&[&url(&j, "data/small"), &url(&b, "in/")]);
    assert_eq!(wait_job(&j, &done, Duration::from_secs(60)).0, 0);
    let (slow, _) = submit(&[
        "--rate",
        "20mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/"),
    ]);
    wait_until(
        "one finished and one active job",
        Duration::from_secs(60),
        || scrape("finished") == Some(1.0) && scrape("active") == Some(1.0),
    );
    assert_eq!(scrape("failed"), Some(0.0));
    let o = bin()
        .args(["jobs", "cancel", &slow, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    wait_until("the cancelled job counted", Duration::from_secs(60), || {
        scrape("cancelled") == Some(1.0) && scrape("active") == Some(0.0)
    });
    assert_eq!(scrape("finished"), Some(1.0));
}

/// A job server's stored credential of one end, as an attacker who stole
/// its database reads it: (fingerprint, capability).
fn stolen_credential(state: &Path, end: &str) -> (String, String) {
    let db = rusqlite::Connection::open(state.join("jobs.db")).unwrap();
    let spec: String = db
        .query_row("SELECT spec FROM jobs", [], |r| r.get(0))
        .unwrap();
    let v: Value = serde_json::from_str(&spec).unwrap();
    let c = &v[end]["credential"];
    (
        c["fingerprint"].as_str().unwrap().to_string(),
        c["capability"].as_str().unwrap().to_string(),
    )
}

/// Three servers: the job server J holds neither end; the source A
/// exports `src`, the destination B `in`, each taking part in
/// third-party copies and nothing more.
fn three(t: &TempDir, far: &Path, into: &Path) -> (Serve, Serve, Serve) {
    let spare = t.dir("spare");
    let j_export = format!("spare={}", spare.display());
    let j = Serve::start(
        &t.path().join("state-j"),
        &["--jobs", "--export", &j_export, "--no-sync", "--no-archive"],
    );
    let from = format!("src={}", far.display());
    let a = Serve::start(
        &t.path().join("state-a"),
        &["--third-party-copies", "--export", &from, "--no-sync"],
    );
    let to = format!("in={}", into.display());
    let b = Serve::start(
        &t.path().join("state-b"),
        &["--third-party-copies", "--export", &to, "--no-sync"],
    );
    (j, a, b)
}

#[test]
fn a_job_between_two_other_servers_is_ordered_by_the_job_server_and_finishes_verified() {
    let t = TempDir::new("job-third");
    let (far, into) = (t.dir("far"), t.dir("into"));
    for i in 0..4 {
        write_random(&far.join(format!("tree/d{}/f{i}", i % 2)), 3 << 20, 50 + i);
    }
    write_random(&far.join("tree/empty"), 0, 59);
    let (j, a, b) = three(&t, &far, &into);
    let (id, _) = submit(&[
        "-r",
        "--via",
        &j.addr(),
        &url(&a, "src/tree"),
        &url(&b, "in/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(180));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["kind"], "third_party", "{v}");
    assert_eq!(v["job"]["files"]["finished"], 5, "{v}");
    assert_eq!(v["job"]["bytes_done"], 12u64 << 20, "{v}");
    assert_same_tree(&far.join("tree"), &into.join("tree"), false);
    // Both far ends' capabilities are revoked once it finished.
    for end in ["a", "b"] {
        let caps = t.path().join(format!("state-{end}/capabilities"));
        wait_until("the revocations", Duration::from_secs(30), || {
            std::fs::read_to_string(&caps).is_ok_and(|c| c.trim().is_empty())
        });
    }
    assert!(!j.log_text().contains("lh1c_"));
    assert!(!a.log_text().contains("lh1c_") && !b.log_text().contains("lh1c_"));
}

/// The attacker stole the job server's database mid-job: the source's
/// order capability orders the job's copy and nothing else (no other
/// source, export, destination address, certificate or path; no push, no
/// pull, no listing outside its sources), and once the job finished, not
/// even that.
#[test]
fn attacker_a_third_party_jobs_order_capability_cannot_be_widened_and_ends_when_revoked() {
    use longhaul_engine::net::dial::ClientOptions;
    use longhaul_engine::xfer::{copy::order_copy, jobcaps};
    use longhaul_proto::xfer::copy::{CopyOptions, CopyOrder};
    let t = TempDir::new("job-third-attack");
    let (far, into) = (t.dir("far"), t.dir("into"));
    write_random(&far.join("tree/big.bin"), 24 << 20, 60);
    write_random(&far.join("secret/key"), 100, 61);
    let (j, a, b) = three(&t, &far, &into);
    let (id, _) = submit(&[
        "-r",
        "--rate",
        "12mbit",
        "--via",
        &j.addr(),
        &url(&a, "src/tree"),
        &url(&b, "in/"),
    ]);
    let (a_fp, a_cap) = stolen_credential(&j.state, "source");
    let (b_fp, b_cap) = stolen_credential(&j.state, "dest");
    assert!(a_cap.starts_with("lh1c_") && b_cap.starts_with("lh1c_"));
    let at_a = jobcaps::presenting(&ClientOptions::default(), &a_fp, &a_cap).unwrap();
    let the_job = CopyOrder {
        export: "src".into(),
        sources: vec!["tree".into()],
        target: b.addr(),
        fingerprint: b_fp.clone(),
        capability: b_cap.clone(),
        dest_export: "in".into(),
        dest: String::new(),
        dest_dir: true,
        options: CopyOptions {
            recursive: true,
            ..CopyOptions::default()
        },
        connect_back: None,
        share: None,
    };
    let elsewhere = Serve::start(
        &t.path().join("state-c"),
        &[
            "--third-party-copies",
            "--export",
            &format!("loot={}", t.dir("loot").display()),
            "--no-sync",
        ],
    );
    type Widen<'a> = Box<dyn Fn(&mut CopyOrder) + 'a>;
    let widened: Vec<(&str, Widen)> = vec![
        (
            "another source",
            Box::new(|o| o.sources = vec!["secret".into()]),
        ),
        (
            "a path out",
            Box::new(|o| o.sources = vec!["tree/../secret".into()]),
        ),
        ("another export", Box::new(|o| o.export = "loot".into())),
        (
            "another destination",
            Box::new(|o| {
                o.target = elsewhere.addr();
                o.dest_export = "loot".into();
            }),
        ),
        (
            "another certificate",
            Box::new(|o| o.fingerprint = format!("SHA256:{}", "A".repeat(43))),
        ),
        ("another path", Box::new(|o| o.dest = "other".into())),
    ];
    for (what, widen) in &widened {
        let mut o = the_job.clone();
        widen(&mut o);
        let e = order_copy(&a.addr(), &at_a, o).expect_err(what);
        assert!(e.to_string().contains("only"), "{what}: {e}");
    }
    assert!(std::fs::read_dir(t.path().join("loot"))
        .unwrap()
        .next()
        .is_none());
    assert!(!into.join("secret").exists());
    // Nor does it push, pull, or list outside its sources.
    let with_it = |args: &[&str]| {
        bin()
            .env("LONGHAUL_TOKEN", &a_cap)
            .args(args)
            .output()
            .unwrap()
    };
    refused_with(&with_it(&["ls", &url(&a, "src/secret")]), "only");
    let stolen_to = t.dir("stolen");
    refused_with(
        &with_it(&[
            "cp",
            "-r",
            &url(&a, "src/tree"),
            stolen_to.to_str().unwrap(),
        ]),
        "neither pushes nor pulls",
    );
    assert!(with_it(&["ls", &url(&a, "src/tree")]).status.success());
    assert_eq!(
        show(&j, &id)["job"]["state"],
        "active",
        "the job ended before its capability was tried"
    );
    let (code, v) = wait_job(&j, &id, Duration::from_secs(180));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_tree(&far.join("tree"), &into.join("tree"), false);
    // Revoked with the job's end: the job's own order is refused.
    wait_until("the revocation at A", Duration::from_secs(30), || {
        std::fs::read_to_string(t.path().join("state-a/capabilities"))
            .is_ok_and(|c| c.trim().is_empty())
    });
    let e = order_copy(&a.addr(), &at_a, the_job).expect_err("a revoked capability");
    assert!(e.to_string().contains("unknown, expired or revoked"), "{e}");
}

/// A job server that may reach the test's own sshd (as `lhtest`) for its
/// jobs' far ends, exporting `root` as `data`.
fn ssh_job_server(t: &TempDir, s: &common::sshd::Sshd, root: &Path, more: &[&str]) -> Serve {
    let export = format!("data={}", root.display());
    let rsh = s.rsh();
    let mut args = vec![
        "--jobs",
        "--export",
        &export,
        "--no-sync",
        "--no-archive",
        "--jobs-ssh",
        common::sshd::HOST,
        "--jobs-rsh",
        &rsh,
        "--jobs-remote-path",
        common::sshd::BIN,
    ];
    args.extend_from_slice(more);
    Serve::start(&t.path().join("state-j"), &args)
}

/// A job whose far end is a host with no longhaul server, reached by the
/// job server's own ssh (`serve --jobs-ssh`): a push there, then a pull of
/// it back into the job server's export; both finish verified.
#[test]
fn a_job_pushes_to_and_pulls_from_a_host_over_ssh_the_job_server_may_reach() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh");
    let (here, far) = (t.dir("here"), t.dir("far"));
    for i in 0..3 {
        write_random(&here.join(format!("tree/f{i}")), 2 << 20, 70 + i);
    }
    std::fs::create_dir_all(here.join("back")).unwrap();
    let j = ssh_job_server(&t, &s, &here, &[]);
    let to = format!("{}:{}/", common::sshd::HOST, far.display());
    let (id, _) = submit(&["-r", &url(&j, "data/tree"), &to]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(180));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["kind"], "push", "{v}");
    assert_eq!(v["job"]["files"]["finished"], 3, "{v}");
    assert_same_tree(&here.join("tree"), &far.join("tree"), false);
    let from = format!("{}:{}/tree", common::sshd::HOST, far.display());
    let (id, _) = submit(&["-r", &from, &url(&j, "data/back/")]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(180));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["kind"], "pull", "{v}");
    assert_same_tree(&here.join("tree"), &here.join("back/tree"), false);
}

/// The job server's ssh is its admin's: a job names only a host the
/// admin listed, never one that ssh would read as an option, and a job
/// server that lists none reaches none.
#[test]
fn attacker_a_job_reaches_over_ssh_only_a_host_its_server_allows() {
    use longhaul_engine::xfer::jobcaps;
    use longhaul_proto::job::*;
    use longhaul_proto::msg::{Message, RefuseCode};
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-attack");
    let here = t.dir("here");
    write_random(&here.join("f"), 1000, 80);
    let j = ssh_job_server(&t, &s, &here, &[]);
    let pwned = t.path().join("pwned");
    let o = bin()
        .args(["submit", &url(&j, "data/f"), "elsewhere:/tmp/x"])
        .output()
        .unwrap();
    refused_with(&o, "reaches no host 'elsewhere' over ssh");
    let client = crate::third_party_copy::client();
    let spec = |ssh: &str| JobSpec {
        source: JobEnd {
            host: None,
            export: "data".into(),
            paths: vec!["f".into()],
            dir: false,
            credential: None,
            ssh: None,
        },
        dest: JobEnd {
            host: None,
            export: String::new(),
            paths: vec!["/tmp/x".into()],
            dir: false,
            credential: None,
            ssh: Some(ssh.into()),
        },
        options: JobOptions::default(),
    };
    for (ssh, why) in [
        (
            format!("-oProxyCommand=touch {}", pwned.display()),
            "no [USER@]HOST",
        ),
        (
            format!("{} -oProxyCommand=x", common::sshd::HOST),
            "no [USER@]HOST",
        ),
        ("elsewhere".to_string(), "reaches no host"),
    ] {
        match jobcaps::ask_job_server(&j.addr(), &client, Message::JobSubmit(Box::new(spec(&ssh))))
        {
            Err(longhaul_engine::EngineError::Refused { code, message }) => {
                assert_eq!(code, RefuseCode::BadRequest, "{message}");
                assert!(message.contains(why), "{ssh}: {message}");
            }
            other => panic!("{ssh}: {other:?}"),
        }
    }
    // A job server that lists no host reaches none.
    let export = format!("data={}", here.display());
    let plain = Serve::start(
        &t.path().join("state-p"),
        &["--jobs", "--export", &export, "--no-sync", "--no-archive"],
    );
    let o = bin()
        .args([
            "submit",
            &url(&plain, "data/f"),
            &format!("{}:/tmp/x", common::sshd::HOST),
        ])
        .output()
        .unwrap();
    refused_with(&o, "jobs-ssh");
    assert!(!pwned.exists(), "ssh read a host as an option");
}

/// The one-shot far ends the test's sshd runs now (started over ssh by a
/// job server): its descendants that serve `--one-shot`.
fn one_shots(s: &common::sshd::Sshd) -> Vec<u32> {
    longhaul_testkit::process::descendants(&[s.child.id()])
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"--one-shot"))
        })
        .collect()
}

/// `jobs cancel ID` mid-push, then: the job reads cancelled (`jobs wait`
/// exits 8), and the push's partial file and journal are gone at its
/// destination. When the cancel began.
#[track_caller]
fn cancel_until_discarded(j: &Serve, id: &str, part: &Path, journal: &Path) -> Instant {
    let began = Instant::now();
    let o = bin()
        .args(["jobs", "cancel", id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, v) = wait_job(j, id, Duration::from_secs(60));
    assert_eq!(code, 8, "{v}");
    assert_eq!(v["job"]["state"], "cancelled", "{v}");
    wait_until(
        "the partial file's removal at the destination",
        Duration::from_secs(30),
        || !part.exists() && !journal.exists(),
    );
    began
}

/// A job's destination named through a link (`in/linked/`, a link to the
/// directory `real/`) is written through it, so a cancel must discard the
/// partial files where they were written, in `real/`, not look for them
/// beside the link and leave them behind.
#[test]
fn cancelling_a_job_whose_destination_is_a_linked_directory_removes_its_partial_files() {
    let t = TempDir::new("job-cancel-linked");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let real = dst.join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink("real", dst.join("linked")).unwrap();
    write_random(&src.join("big.bin"), 256 << 20, 94);
    let (j, b) = pair(&t, &src, &dst, &["--no-archive"]);
    let (id, _) = submit(&[
        "--rate",
        "100mbit",
        &url(&j, "data/big.bin"),
        &url(&b, "in/linked/"),
    ]);
    let journal = journal_of(&real, "big.bin");
    let part = real.join(".big.bin.lhpart");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 2
    });
    cancel_until_discarded(&j, &id, &part, &journal);
    assert!(std::fs::read_dir(&real).unwrap().next().is_none());
    assert!(std::fs::symlink_metadata(dst.join("linked"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// Jobs pushing `big.bin` (their ids, each with where it lands), each
/// once it has verified chunks there.
fn wait_landing(landing: &[(String, PathBuf)]) {
    for (_, at) in landing {
        wait_until("verified chunks", Duration::from_secs(60), || {
            journal_records(&journal_of(at, "big.bin")) >= 2
        });
    }
}

/// Cancels each of `landing` ([`wait_landing`]) until its partial file
/// and journal are gone, then waits for the directories of `emptied` to go.
fn cancel_landing(j: &Serve, landing: &[(String, PathBuf)], emptied: &[PathBuf]) {
    for (id, at) in landing {
        cancel_until_discarded(
            j,
            id,
            &at.join(".big.bin.lhpart"),
            &journal_of(at, "big.bin"),
        );
    }
    wait_until(
        "the emptied directories' removal",
        Duration::from_secs(30),
        || emptied.iter().all(|d| !d.exists()),
    );
}

/// The names in directory `dir`.
fn names_in(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect()
}

/// A cancel removes the directories its job made once they are empty, and
/// nothing else: a destination that was there before the job (empty)
/// stays, and so does one the job made but someone planted a file in (the
/// directories the job made beneath it, emptied, go). Three jobs under way
/// into `dst`, each submitted by `go(SOURCE, DEST)` (paths within the
/// source's and the destination's export), then cancelled.
fn cancels_remove_only_the_empty_directories_their_jobs_made(
    j: &Serve,
    dst: &Path,
    go: impl Fn(&str, &str) -> String,
) {
    std::fs::create_dir(dst.join("before")).unwrap();
    // Into `made/` (made by --mkpath), into `before/`, and onto `planted`
    // (the tree's own directory made there).
    let made = go("tree", "made/");
    let before = go("tree/sub/big.bin", "before/");
    let planted = go("tree", "planted");
    let landing = [
        (made, dst.join("made/tree/sub")),
        (before, dst.join("before")),
        (planted, dst.join("planted/sub")),
    ];
    wait_landing(&landing);
    let mine = dst.join("planted/mine.txt");
    std::fs::write(&mine, b"the user's own").unwrap();
    cancel_landing(j, &landing, &[dst.join("made"), dst.join("planted/sub")]);
    assert!(
        dst.join("before").is_dir(),
        "a directory of the user's went"
    );
    assert!(names_in(&dst.join("before")).is_empty());
    assert_eq!(std::fs::read(&mine).unwrap(), b"the user's own");
    assert_eq!(names_in(&dst.join("planted")), ["mine.txt"]);
}

/// The far end of a push removes them (it noted, when it issued the
/// job's capability, what of the destination's path was missing).
#[test]
fn cancelling_a_job_removes_the_empty_directories_it_made_and_nothing_else() {
    let t = TempDir::new("job-cancel-dirs");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("tree/sub/big.bin"), 256 << 20, 95);
    let (j, b) = pair(&t, &src, &dst, &["--no-archive"]);
    cancels_remove_only_the_empty_directories_their_jobs_made(&j, &dst, |from, into| {
        let (from, into) = (
            url(&j, &format!("data/{from}")),
            url(&b, &format!("in/{into}")),
        );
        submit(&["-r", "--mkpath", "--rate", "100mbit", &from, &into]).0
    });
}

/// A pull's job server removes them at its own end (it noted, when the
/// job was submitted, what of the destination's path was missing).
#[test]
fn cancelling_a_pull_removes_the_empty_directories_it_made_and_nothing_else() {
    let t = TempDir::new("job-cancel-pull-dirs");
    let (far, here) = (t.dir("far"), t.dir("here"));
    write_random(&far.join("tree/sub/big.bin"), 256 << 20, 96);
    let (j, a) = pull_pair(&t, &far, &here);
    cancels_remove_only_the_empty_directories_their_jobs_made(&j, &here, |from, into| {
        let (from, into) = (
            url(&a, &format!("src/{from}")),
            url(&j, &format!("data/{into}")),
        );
        let via = j.addr();
        submit(&[
            "-r", "--mkpath", "--rate", "100mbit", "--via", &via, &from, &into,
        ])
        .0
    });
}

/// A cancelled push over ssh leaves nothing of itself on the far host:
/// the job server reaches the host again with its own ssh and has a
/// one-shot server there discard the job's unfinished entries beneath its
/// destination, and nothing else (a partial file of another entry beside
/// them, the place the file would have taken had the destination not been
/// named as a directory).
#[test]
fn cancelling_an_ssh_push_stops_it_and_removes_its_partial_files_on_the_far_host() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-cancel");
    let (here, far) = (t.dir("here"), t.dir("far"));
    write_random(&here.join("big.bin"), 256 << 20, 90);
    let j = ssh_job_server(&t, &s, &here, &[]);
    let to = format!("{}:{}/", common::sshd::HOST, far.display());
    let (id, _) = submit(&["--rate", "100mbit", &url(&j, "data/big.bin"), &to]);
    let journal = journal_of(&far, "big.bin");
    let part = far.join(".big.bin.lhpart");
    wait_until(
        "verified chunks on the far host",
        Duration::from_secs(60),
        || journal_records(&journal) >= 2,
    );
    let others = [far.join(".other.bin.lhpart"), t.path().join(".far.lhpart")];
    for o in &others {
        std::fs::write(o, b"not the job's").unwrap();
    }
    let cancelled = cancel_until_discarded(&j, &id, &part, &journal);
    wait_until("the far end's exit", Duration::from_secs(30), || {
        one_shots(&s).is_empty()
    });
    eprintln!(
        "ssh cancel: far end gone and partial files removed {:.2} s after `jobs cancel` began",
        cancelled.elapsed().as_secs_f64()
    );
    for o in &others {
        assert!(o.exists(), "{} was removed", o.display());
    }
    assert!(!far.join("big.bin").exists());
    assert_eq!(
        std::fs::read_dir(&far).unwrap().count(),
        1,
        "{:?}",
        std::fs::read_dir(&far).unwrap().collect::<Vec<_>>()
    );
    wait_until(
        "the job server's word on it",
        Duration::from_secs(30),
        || j.log_text().contains("partial file(s) removed on"),
    );
    // Its chores done, nothing of it runs or comes back on the far host.
    wait_until("the far end's exit", Duration::from_secs(30), || {
        one_shots(&s).is_empty()
    });
    assert!(!part.exists() && !journal.exists());
    assert_eq!(show(&j, &id)["job"]["files"]["cancelled"], 1);
}

/// A job pushing `size` random bytes (`big.bin`) from a job server's
/// export to a host over ssh at 200 Mbit/s, once `records` chunks are
/// verified there.
struct SshPush {
    server: Serve,
    id: String,
    journal: PathBuf,
}

fn ssh_push_under_way(
    t: &TempDir,
    s: &common::sshd::Sshd,
    (here, far): (&Path, &Path),
    size: u64,
    records: u64,
    server_args: &[&str],
) -> SshPush {
    write_random(&here.join("big.bin"), size as usize, 90 + records);
    let server = ssh_job_server(t, s, here, server_args);
    let to = format!("{}:{}/", common::sshd::HOST, far.display());
    let (id, _) = submit(&["--rate", "200mbit", &url(&server, "data/big.bin"), &to]);
    let journal = journal_of(far, "big.bin");
    wait_until(
        "verified chunks on the far host",
        Duration::from_secs(60),
        || journal_records(&journal) >= records,
    );
    SshPush {
        server,
        id,
        journal,
    }
}

/// The far end over ssh killed mid-push (kill -9 of the one-shot server
/// there): the attempt breaks, the next one starts the far end again and
/// resumes from its chunk journal, and the job finishes verified.
#[test]
fn an_ssh_job_survives_its_far_end_killed_and_finishes_resuming() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-far");
    let (here, far) = (t.dir("here"), t.dir("far"));
    let push = ssh_push_under_way(
        &t,
        &s,
        (&here, &far),
        64 << 20,
        3,
        &["--jobs-backoff", "1s"],
    );
    let (j, id) = (push.server, push.id);
    let killed = one_shots(&s);
    assert!(!killed.is_empty(), "no far end runs");
    for pid in &killed {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(*pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    let (code, v) = wait_job(&j, &id, Duration::from_secs(120));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_file(&here.join("big.bin"), &far.join("big.bin"));
    let h = history(&v);
    assert!(h.iter().any(|a| a["outcome"] == "failed"), "{v}");
    let resumed = h.last().unwrap()["resumed_bytes"].as_u64().unwrap();
    assert!(resumed > 0, "{v}");
    assert!(killed.iter().all(|p| longhaul_testkit::process::gone(*p)));
}

/// kill -9 of the job server mid third-party job, then its restart: the
/// source A stops sending when its orderer is gone, the job is taken back
/// and ordered again, and B resumes from its journal: resumed bytes
/// cover every chunk B had verified, and B writes only what was left.
#[test]
fn a_third_party_job_survives_kill_9_of_its_job_server_and_resends_no_verified_chunk() {
    let t = TempDir::new("job-third-kill");
    let (far, into) = (t.dir("far"), t.dir("into"));
    let size = 128u64 << 20;
    write_random(&far.join("big.bin"), size as usize, 92);
    let (mut j, a, b) = three(&t, &far, &into);
    let (id, _) = submit(&[
        "--rate",
        "200mbit",
        "--via",
        &j.addr(),
        &url(&a, "src/big.bin"),
        &url(&b, "in/"),
    ]);
    let (chunks, b_before) = kill9_mid_push(&mut j, &b, &journal_of(&into, "big.bin"), 6, size);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(120));
    let written = common::counters::ProcIo::of(b.pid()).unwrap().wchar - b_before;
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_file(&far.join("big.bin"), &into.join("big.bin"));
    assert_resumed_without_resend(&v, size, chunks, written, "a third-party job's server");
}

/// Cancel mid third-party job: the source stops sending (no stream to B
/// left), B holds no partial file, and both capabilities are revoked: the
/// job's own order is refused at A, and a push with B's at B.
#[test]
fn cancelling_a_third_party_job_stops_its_source_discards_at_its_destination_and_revokes_both() {
    use longhaul_engine::net::dial::ClientOptions;
    use longhaul_engine::xfer::{copy::order_copy, jobcaps};
    use longhaul_proto::xfer::copy::{CopyOptions, CopyOrder};
    let t = TempDir::new("job-third-cancel");
    let (far, into) = (t.dir("far"), t.dir("into"));
    write_random(&far.join("big.bin"), 256 << 20, 93);
    let (j, a, b) = three(&t, &far, &into);
    let (id, _) = submit(&[
        "--rate",
        "100mbit",
        "--via",
        &j.addr(),
        &url(&a, "src/big.bin"),
        &url(&b, "in/"),
    ]);
    let journal = journal_of(&into, "big.bin");
    let part = into.join(".big.bin.lhpart");
    wait_until("verified chunks at B", Duration::from_secs(60), || {
        journal_records(&journal) >= 2
    });
    let (a_fp, a_cap) = stolen_credential(&j.state, "source");
    let (b_fp, b_cap) = stolen_credential(&j.state, "dest");
    let cancelled = cancel_until_discarded(&j, &id, &part, &journal);
    wait_until("A's streams to B to close", Duration::from_secs(30), || {
        common::counters::established(b.port) == 0
    });
    for end in ["a", "b"] {
        let caps = t.path().join(format!("state-{end}/capabilities"));
        wait_until("the revocations", Duration::from_secs(30), || {
            std::fs::read_to_string(&caps).is_ok_and(|c| c.trim().is_empty())
        });
    }
    eprintln!(
        "third-party cancel: streams closed, partial file removed, both revoked {:.2} s after `jobs cancel` began",
        cancelled.elapsed().as_secs_f64()
    );
    assert!(
        std::fs::read_dir(&into).unwrap().next().is_none(),
        "{:?}",
        std::fs::read_dir(&into).unwrap().collect::<Vec<_>>()
    );
    let at_a = jobcaps::presenting(&ClientOptions::default(), &a_fp, &a_cap).unwrap();
    let the_job = CopyOrder {
        export: "src".into(),
        sources: vec!["big.bin".into()],
        target: b.addr(),
        fingerprint: b_fp,
        capability: b_cap.clone(),
        dest_export: "in".into(),
        dest: String::new(),
        dest_dir: true,
        options: CopyOptions::default(),
        connect_back: None,
        share: None,
    };
    let e = order_copy(&a.addr(), &at_a, the_job).expect_err("a revoked order capability");
    assert!(e.to_string().contains("unknown, expired or revoked"), "{e}");
    let o = bin()
        .env("LONGHAUL_TOKEN", &b_cap)
        .args([
            "cp",
            &far.join("big.bin").display().to_string(),
            &url(&b, "in/"),
        ])
        .output()
        .unwrap();
    refused_with(&o, "unknown, expired or revoked");
    assert_eq!(common::counters::established(b.port), 0);
    assert!(!into.join("big.bin").exists() && !part.exists() && !journal.exists());
}

/// A job between a server and a host over ssh, neither of them the job
/// server's, is refused saying what to do instead (submit it to the
/// server of its other end, which may reach the host): by `submit`, and
/// by the job server for a spec written by hand. A job server relays no
/// data between two other hosts.
#[test]
fn attacker_a_job_between_a_server_and_an_ssh_host_neither_the_job_servers_is_refused() {
    use longhaul_engine::xfer::jobcaps;
    use longhaul_proto::job::*;
    use longhaul_proto::msg::{Message, RefuseCode};
    let t = TempDir::new("job-third-ssh");
    let far = t.dir("far");
    write_random(&far.join("f"), 1000, 94);
    let (j, a, _b) = three(&t, &far, &t.dir("into"));
    let host = format!("{}:/tmp/x", common::sshd::HOST);
    for (from, to) in [
        (url(&a, "src/f"), host.clone()),
        (host.clone(), url(&a, "src/")),
    ] {
        let o = bin()
            .args(["submit", "--via", &j.addr(), &from, &to])
            .output()
            .unwrap();
        refused_with(&o, "relays no data between two other hosts");
        refused_with(&o, "--jobs-ssh");
    }
    let client = crate::third_party_copy::client();
    let server_end = JobEnd {
        host: Some(a.addr()),
        export: "src".into(),
        paths: vec!["f".into()],
        dir: false,
        credential: Some(JobCredential {
            fingerprint: common::fingerprint().to_string(),
            capability: format!("lh1c_{}", "A".repeat(43)),
            lifetime_s: 600,
        }),
        ssh: None,
    };
    let ssh_end = JobEnd {
        host: None,
        export: String::new(),
        paths: vec!["/tmp/x".into()],
        dir: false,
        credential: None,
        ssh: Some(common::sshd::HOST.into()),
    };
    for (source, dest) in [(server_end.clone(), ssh_end.clone()), (ssh_end, server_end)] {
        let spec = JobSpec {
            source,
            dest,
            options: JobOptions::default(),
        };
        match jobcaps::ask_job_server(&j.addr(), &client, Message::JobSubmit(Box::new(spec))) {
            Err(longhaul_engine::EngineError::Refused { code, message }) => {
                assert_eq!(code, RefuseCode::BadRequest, "{message}");
                assert!(message.contains("relays no data"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(json_run(&["jobs", "--via", &j.addr(), "--json"], 0)["jobs"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// The discard a one-shot server takes from its own client (a job server
/// that reached the host over ssh, cancelling a push there) names its
/// destination; nobody else may name one. It removes only the partial
/// files and journals of the entries named, beneath that destination,
/// regular files only, through no link, and no entry out by `..`.
#[test]
fn attacker_a_discard_names_its_destination_on_a_one_shot_server_only_and_removes_nothing_else() {
    use longhaul_engine::net::dial::ClientOptions;
    use longhaul_engine::reach::{FarEnd, SshOptions};
    use longhaul_engine::server::oneshot::Admits;
    use longhaul_engine::xfer::jobcaps;
    use longhaul_proto::xfer::copy::{DiscardInto, GrantRequest};
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-discard-attack");
    let (dest, outside) = (t.dir("dest"), t.dir("outside"));
    for f in [".a.lhpart", ".a.lhjournal", "sub/.e.lhpart"] {
        write_random(&dest.join(f), 100, 95);
    }
    std::fs::create_dir_all(dest.join(".b.lhpart")).unwrap();
    for f in [".c.lhpart", ".d.lhpart"] {
        write_random(&outside.join(f), 100, 96);
    }
    std::os::unix::fs::symlink(&outside, dest.join("link")).unwrap();
    let ssh = SshOptions {
        rsh: Some(s.rsh()),
        remote_path: Some(common::sshd::BIN.into()),
        ..SshOptions::default()
    };
    let (far, _) = FarEnd::open_for(&ssh, common::sshd::HOST, Admits::Sessions(4), &[]).unwrap();
    let o = ClientOptions {
        security: far.security(),
        ..ClientOptions::default()
    };
    let rel = dest
        .display()
        .to_string()
        .trim_start_matches('/')
        .to_string();
    let into = |d: String| DiscardInto {
        export: "root".into(),
        dest: d,
        made: None,
    };
    let entries: Vec<String> = ["a", "b", "link/c", "../outside/d", "sub/e"]
        .map(String::from)
        .into();
    let out = into(format!("{rel}/../outside"));
    let e = jobcaps::discard(&far.server(), &o, Some(&out), &entries).expect_err("..");
    assert!(e.to_string().contains(".."), "{e}");
    let e = jobcaps::discard(&far.server(), &o, None, &entries).expect_err("no destination");
    assert!(e.to_string().contains("only a push capability"), "{e}");
    let n = jobcaps::discard(&far.server(), &o, Some(&into(format!("{rel}/"))), &entries).unwrap();
    far.finish();
    assert_eq!(n, 3, "removed {n}");
    for gone in [".a.lhpart", ".a.lhjournal", "sub/.e.lhpart"] {
        assert!(!dest.join(gone).exists(), "{gone} stays");
    }
    assert!(dest.join(".b.lhpart").is_dir());
    assert!(outside.join(".c.lhpart").exists() && outside.join(".d.lhpart").exists());
    // A server's own grant, and a push capability's holder, name none.
    let b = Serve::start(
        &t.path().join("state-b"),
        &[
            "--third-party-copies",
            "--export",
            &format!("in={}", outside.display()),
            "--no-sync",
        ],
    );
    let grant = crate::third_party_copy::client();
    let cap = jobcaps::ask(
        &b.addr(),
        &grant,
        GrantRequest {
            export: "in".into(),
            dest_dir: true,
            lifetime_s: 600,
            ..GrantRequest::default()
        },
    )
    .unwrap();
    let holder =
        jobcaps::presenting(&ClientOptions::default(), &cap.fingerprint, &cap.capability).unwrap();
    let named = DiscardInto {
        export: "in".into(),
        dest: String::new(),
        made: None,
    };
    for (who, o) in [("a grant", &grant), ("a capability", &holder)] {
        match jobcaps::discard(&b.addr(), o, Some(&named), &["c".to_string()]) {
            Err(longhaul_engine::EngineError::Refused { message, .. }) => {
                assert!(
                    message.contains("only a push capability"),
                    "{who}: {message}"
                )
            }
            other => panic!("{who}: {other:?}"),
        }
    }
    assert!(outside.join(".c.lhpart").exists() && outside.join(".d.lhpart").exists());
}

/// The discards of `jobs show --json`.
fn discards(v: &Value) -> Vec<Value> {
    v["job"]["discards"].as_array().cloned().unwrap_or_default()
}

/// A cancel while the far end is down: its partial files cannot be
/// removed then, so the job keeps a pending discard (shown by `jobs show`,
/// its tries and error), tried again with backoff; the far end started
/// again (its capability kept, hashed), the next try removes them, and
/// only then is the capability revoked.
#[test]
fn a_cancel_while_the_far_end_is_down_removes_its_partial_files_once_it_is_back() {
    let t = TempDir::new("job-discard-later");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let (j, mut b, id) = slow_push_under_way(
        &src,
        &dst,
        &t,
        97,
        &["--no-archive", "--jobs-backoff", "1s"],
    );
    let journal = journal_of(&dst, "big.bin");
    let part = dst.join(".big.bin.lhpart");
    b.kill9();
    let o = bin()
        .args(["jobs", "cancel", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 8, "{v}");
    wait_until("a pending discard", Duration::from_secs(60), || {
        discards(&show(&j, &id))
            .first()
            .is_some_and(|d| d["state"] == "pending" && d["tries"].as_u64() >= Some(1))
    });
    let v = show(&j, &id);
    let d = &discards(&v)[0];
    assert_eq!(d["end"], b.addr(), "{v}");
    assert!(d["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert!(d["next_try"].as_f64().is_some(), "{v}");
    let o = bin()
        .args(["jobs", "show", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains(&format!("partial files on {}: discard pending", b.addr())),
        "{}",
        stdout(&o)
    );
    assert!(part.exists() && journal.exists());
    // Its capability is kept for the discard meanwhile.
    let caps = t.path().join("state-b/capabilities");
    assert!(std::fs::read_to_string(&caps).is_ok_and(|c| !c.trim().is_empty()));
    b.restart();
    let back = Instant::now();
    wait_until(
        "the partial files' removal once B is back",
        Duration::from_secs(120),
        || !part.exists() && !journal.exists(),
    );
    wait_until("the discard done", Duration::from_secs(30), || {
        discards(&show(&j, &id))
            .first()
            .is_some_and(|d| d["state"] == "done")
    });
    let v = show(&j, &id);
    let d = &discards(&v)[0];
    eprintln!(
        "discard after the far end came back: {:.1} s, {} tries, {} removed",
        back.elapsed().as_secs_f64(),
        d["tries"],
        d["removed"]
    );
    assert!(d["tries"].as_u64() >= Some(2), "{v}");
    assert_eq!(d["removed"], 2, "{v}");
    assert!(
        d.get("next_try").is_none() && d.get("error").is_none(),
        "{v}"
    );
    wait_until("the revocation", Duration::from_secs(30), || {
        std::fs::read_to_string(&caps).is_ok_and(|c| c.trim().is_empty())
    });
    assert!(std::fs::read_dir(&dst).unwrap().next().is_none());
    assert_eq!(v["job"]["state"], "cancelled", "{v}");
}

/// kill -9 of the job server mid-push to a host over ssh, then its
/// restart: the far end there ends with its ssh channel, the job is taken
/// back, a new far end resumes from the chunk journal, and the attempt
/// after the restart sends only what was not verified before.
#[test]
fn an_ssh_job_survives_kill_9_of_its_server_and_resends_no_verified_chunk() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-kill");
    let (here, far) = (t.dir("here"), t.dir("far"));
    let size = 128u64 << 20;
    let push = ssh_push_under_way(&t, &s, (&here, &far), size, 6, &[]);
    let (mut j, id, journal) = (push.server, push.id, push.journal);
    let far_ends = one_shots(&s);
    assert!(!far_ends.is_empty(), "no far end runs");
    j.kill9();
    wait_until(
        "the far end to end with its ssh channel",
        Duration::from_secs(60),
        || far_ends.iter().all(|p| longhaul_testkit::process::gone(*p)),
    );
    let chunk = chunk_of(&journal);
    let indices = journal_indices(&journal);
    let verified: u64 = indices
        .iter()
        .map(|&i| chunk.min(size - (i as u64) * chunk))
        .sum();
    assert!(verified < size, "it finished before the kill");
    j.restart();
    let (code, v) = wait_job(&j, &id, Duration::from_secs(180));
    assert_eq!(code, 0, "{v} {}", j.log_text());
    assert_same_file(&here.join("big.bin"), &far.join("big.bin"));
    let h = history(&v);
    assert!(h.len() >= 2, "{v}");
    assert!(h.iter().any(|a| a["outcome"] == "lost"), "{v}");
    let last = h.last().unwrap();
    assert_eq!(last["outcome"], "ok", "{v}");
    let resumed = last["resumed_bytes"].as_u64().unwrap();
    let sent = last["sent_bytes"].as_u64().unwrap();
    eprintln!(
        "kill -9 of an ssh job's server: {} chunks of {chunk} ({verified} bytes) verified before; resumed {resumed}, then sent {sent} of {size}",
        indices.len()
    );
    assert!(resumed >= verified, "{v}");
    assert!(sent + verified <= size, "a verified chunk went again: {v}");
}

/// An unattended ssh never prompts: a job whose far host would ask for a
/// key's passphrase, or to accept an unknown host key, fails at once
/// saying that ssh needs a key or agent, and no prompt was ever shown
/// (an askpass that ssh would use, forced, records it and hangs).
#[test]
fn an_ssh_job_never_prompts_and_fails_at_once_saying_ssh_needs_a_key() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-batch");
    let here = t.dir("here");
    write_random(&here.join("f"), 1000, 99);
    let d = s.dir.path();
    let locked = t.path().join("locked_key");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "a passphrase", "-f"])
        .arg(&locked)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let mut keys = std::fs::read_to_string(d.join("authorized_keys")).unwrap();
    keys.push_str(&std::fs::read_to_string(locked.with_extension("pub")).unwrap());
    std::fs::write(d.join("authorized_keys"), keys).unwrap();
    let shown = std::fs::read_to_string(&s.config).unwrap();
    let line = |k: &str| {
        shown
            .lines()
            .find(|l| l.trim_start().starts_with(k))
            .unwrap()
            .trim()
            .to_string()
    };
    let (addr, port, user) = (line("HostName"), line("Port"), line("User"));
    let empty = t.path().join("no_known_hosts");
    std::fs::write(&empty, "").unwrap();
    let config = t.path().join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host lhpass\n  {addr}\n  {port}\n  {user}\n  IdentityFile {k}\n  IdentitiesOnly yes\n  \
             {known}\n  StrictHostKeyChecking yes\n\
             Host lhnew\n  {addr}\n  {port}\n  {user}\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n  \
             UserKnownHostsFile {e}\n  StrictHostKeyChecking ask\n",
            k = locked.display(),
            known = line("UserKnownHostsFile"),
            d = d.display(),
            e = empty.display()
        ),
    )
    .unwrap();
    let asked = t.path().join("asked");
    let askpass = t.path().join("askpass");
    std::fs::write(
        &askpass,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\nexec sleep 600\n",
            asked.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &askpass,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let export = format!("data={}", here.display());
    let rsh = format!("ssh -F {}", config.display());
    let env_askpass = format!("SSH_ASKPASS={}", askpass.display());
    let j = Serve::start_as(
        &[
            "env",
            &env_askpass,
            "SSH_ASKPASS_REQUIRE=force",
            "DISPLAY=:99",
        ],
        &t.path().join("state-j"),
        &[
            "--jobs",
            "--export",
            &export,
            "--no-sync",
            "--no-archive",
            "--jobs-ssh",
            "lhpass",
            "--jobs-ssh",
            "lhnew",
            "--jobs-rsh",
            &rsh,
            "--jobs-remote-path",
            common::sshd::BIN,
        ],
    );
    for host in ["lhpass", "lhnew"] {
        let began = Instant::now();
        let to = format!("{host}:{}/", t.path().join("far").display());
        let (id, _) = submit(&["--retries", "0", &url(&j, "data/f"), &to]);
        let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
        eprintln!(
            "{host}: the job failed {:.1} s after submission",
            began.elapsed().as_secs_f64()
        );
        assert_eq!(code, 5, "{host}: {v} {}", j.log_text());
        assert_eq!(v["job"]["state"], "failed", "{v}");
        let e = v["job"]["error"].as_str().unwrap_or_default();
        assert!(e.contains("ssh needs a key or agent"), "{host}: {e}");
        assert!(
            std::fs::read_to_string(&asked)
                .unwrap_or_default()
                .is_empty(),
            "{host}: ssh prompted: {}",
            std::fs::read_to_string(&asked).unwrap_or_default()
        );
    }
}

/// A directory named without `-r` is refused as `cp` refuses it: by the
/// job server at submission when the directory is in its own export (a
/// push; nothing is kept), the path named export-relative.
#[test]
fn submitting_a_directory_without_r_is_refused_at_once_naming_it() {
    let t = TempDir::new("job-nor-push");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("tree/f"), 1000, 1);
    let (j, b) = pair(&t, &src, &dst, &[]);
    for (named, shown) in [
        ("data/tree", "data:tree is a directory"),
        ("data/tree/", "data:tree/ is a directory"),
    ] {
        let o = bin()
            .args(["submit", &url(&j, named), &url(&b, "in/")])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(4), "{named}: {}", stderr(&o));
        refused_with(&o, shown);
        refused_with(&o, "use -r to copy trees");
    }
    let v = json_run(&["jobs", "--via", &j.addr(), "--json"], 0);
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(0), "{v}");
    assert!(std::fs::read_dir(&dst).unwrap().next().is_none());
}

/// A pull whose source turns out to be a directory without `-r`, or not to
/// be there, ends failed at its first attempt with what `cp` would say,
/// for each entry: no attempt could do better, so none is retried.
#[test]
fn a_pull_of_a_directory_without_r_or_of_nothing_ends_failed_and_is_not_retried() {
    let t = TempDir::new("job-nor-pull");
    let (far, here) = (t.dir("far"), t.dir("here"));
    write_random(&far.join("tree/f"), 1000, 1);
    write_random(&far.join("tree/sub/g"), 1000, 2);
    let (j, a) = pull_pair(&t, &far, &here);
    for (named, says) in [
        ("src/tree", "is a directory: use -r to copy trees"),
        ("src/gone", "gone"),
    ] {
        let started = Instant::now();
        let (id, _) = submit(&["--via", &j.addr(), &url(&a, named), &url(&j, "data/")]);
        let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
        assert_eq!(code, 5, "{named}: {v} {}", j.log_text());
        assert_eq!(v["job"]["state"], "failed", "{named}: {v}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{named}: {:?}",
            started.elapsed()
        );
        assert_eq!(history(&v).len(), 1, "{named}: {v}");
        let error = v["job"]["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{named}: {v}");
        let files = v["files"].as_array().unwrap();
        assert_eq!(files.len(), usize::from(named == "src/tree"), "{v}");
        for f in files {
            assert_eq!(f["state"], "failed", "{named}: {v}");
            assert!(f["error"].as_str().unwrap().contains(says), "{v}");
        }
    }
    assert!(std::fs::read_dir(&here).unwrap().next().is_none());
    // Beside a file, the directory fails alone (its far end does not
    // report it: the job does), never "finished".
    write_random(&far.join("one"), 1000, 3);
    let (id, _) = submit(&[
        "--retries",
        "0",
        "--via",
        &j.addr(),
        &url(&a, "src/tree"),
        &url(&a, "src/one"),
        &url(&j, "data/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 6, "{v} {}", j.log_text());
    let failed = v["files"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["path"], "tree", "{v}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("is a directory: use -r to copy trees"),
        "{v}"
    );
    assert_same_file(&far.join("one"), &here.join("one"));
    assert!(!here.join("tree").exists());
}

/// A pull job whose far walk can send none of its files (a special file
/// the listing shows, which the far end's walk refuses) hears each from
/// the far end, and ends failed, not finished.
#[test]
fn a_pull_job_whose_far_walk_fails_every_file_ends_failed() {
    let t = TempDir::new("job-walk-pull");
    let (far, here) = (t.dir("far"), t.dir("here"));
    let mode = rustix::fs::Mode::from_raw_mode(0o644);
    std::fs::create_dir(far.join("tree")).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, far.join("tree/pipe"), mode).unwrap();
    let (j, a) = pull_pair(&t, &far, &here);
    let (id, _) = submit(&[
        "--retries",
        "0",
        "-r",
        "--via",
        &j.addr(),
        &url(&a, "src/tree"),
        &url(&j, "data/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_ne!(code, 0, "{v} {}", j.log_text());
    assert_eq!(v["job"]["state"], "failed", "{v}");
    let failed: Vec<&Value> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["state"] == "failed")
        .collect();
    assert!(
        failed.iter().any(|f| f["path"] == "tree/pipe"
            && f["error"]
                .as_str()
                .unwrap_or_default()
                .contains("not a regular file")),
        "{v}"
    );
    assert!(!here.join("tree/pipe").exists());
}

/// The general case behind it: an attempt whose every entry fails when
/// the sources are listed (here a recurring sync's source, gone after its
/// first run) ends the job failed, naming the source export-relative,
/// instead of retrying a copy of nothing.
#[test]
fn a_recurring_push_whose_source_went_ends_failed_and_is_not_retried() {
    let t = TempDir::new("job-gone");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    write_random(&src.join("g"), 1000, 1);
    let (j, b) = pair(&t, &src, &dst, &["--jobs-min-every", "1s"]);
    let (id, _) = submit(&[
        "--sync",
        "--every",
        "2s",
        &url(&j, "data/g"),
        &url(&b, "in/"),
    ]);
    wait_until("the first run", Duration::from_secs(60), || {
        show(&j, &id)["job"]["runs"].as_u64() >= Some(1)
    });
    std::fs::remove_file(src.join("g")).unwrap();
    let (code, v) = wait_job(&j, &id, Duration::from_secs(60));
    assert_eq!(code, 5, "{v} {}", j.log_text());
    assert_eq!(v["job"]["state"], "failed", "{v}");
    let error = v["job"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot read data/g"), "{v}");
    assert!(!error.contains(src.to_str().unwrap()), "{v}");
    let last = history(&v).last().cloned().unwrap();
    assert_eq!(last["attempt"], 1, "{v}");
    assert_eq!(last["outcome"], "failed", "{v}");
    let failed = v["files"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["path"], "g", "{v}");
}

/// A job whose entries mostly copy but one fails for good (a directory
/// named without `-r`, which every attempt would fail the same way) ends
/// once the rest is done: the good files land, the directory is failed at
/// the first attempt and marked permanent, and no retry is made for it,
/// though the job allows 20 and its server waits a minute before the
/// first (the old way: over 20 minutes of retries of the same failure).
#[test]
fn a_mixed_job_ends_at_once_failing_for_good_the_directory_without_r_and_retries_nothing() {
    let t = TempDir::new("job-mixed");
    let (far, here) = (t.dir("far"), t.dir("here"));
    write_random(&far.join("tree/f"), 1000, 1);
    write_random(&far.join("one"), 200_000, 2);
    write_random(&far.join("two"), 300_000, 3);
    let (j, a) = pull_pair_with(&t, &far, &here, &["--jobs-backoff", "60s"]);
    let started = Instant::now();
    let (id, _) = submit(&[
        "--retries",
        "20",
        "--via",
        &j.addr(),
        &url(&a, "src/one"),
        &url(&a, "src/tree"),
        &url(&a, "src/two"),
        &url(&j, "data/"),
    ]);
    let (code, v) = wait_job(&j, &id, Duration::from_secs(90));
    let took = started.elapsed();
    assert_eq!(code, 6, "{v} {}", j.log_text());
    assert_eq!(v["job"]["state"], "finished_with_failures", "{v}");
    assert!(took < Duration::from_secs(30), "{took:?}: {v}");
    assert_same_file(&far.join("one"), &here.join("one"));
    assert_same_file(&far.join("two"), &here.join("two"));
    assert!(!here.join("tree").exists());
    assert_eq!(v["job"]["files"]["finished"], 2, "{v}");
    assert_eq!(v["job"]["files"]["failed"], 1, "{v}");
    assert_eq!(v["job"]["attempts"], 1, "{v}");
    let attempts = history(&v);
    assert_eq!(attempts.len(), 1, "{v}");
    assert_eq!(attempts[0]["outcome"], "partial", "{v}");
    let failed = v["files"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["path"], "tree", "{v}");
    assert_eq!(failed[0]["state"], "failed", "{v}");
    assert_eq!(failed[0]["attempts"], 1, "{v}");
    assert_eq!(failed[0]["permanent"], true, "{v}");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("is a directory: use -r to copy trees"),
        "{v}"
    );
    // People read the same.
    let o = bin()
        .args(["jobs", "show", &id, "--via", &j.addr()])
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("is a directory: use -r to copy trees (for good: not retried)"),
        "{}",
        stdout(&o)
    );
}

/// A cancelled push over ssh removes the empty directories it made on the
/// far host, as a push to a server does, and nothing else: the job server
/// noted, when the job first reached the host, what of the destination's
/// path was missing. Into `before/new/` (`before` there already, empty:
/// it stays, `new` and what the job made in it go); into `made/` with a
/// link planted in the tree the job made there (the link stays, and so
/// does its directory, not empty; the emptied `sub` goes; the link's
/// target is untouched).
#[test]
fn cancelling_an_ssh_push_removes_the_empty_directories_it_made_and_keeps_a_link_planted() {
    let Some(s) = common::sshd::sshd() else {
        return;
    };
    let t = TempDir::new("job-ssh-cancel-dirs");
    let (here, far) = (t.dir("here"), t.dir("far"));
    write_random(&here.join("tree/sub/big.bin"), 256 << 20, 97);
    std::fs::create_dir_all(far.join("before")).unwrap();
    std::fs::create_dir_all(far.join("elsewhere")).unwrap();
    let j = ssh_job_server(&t, &s, &here, &[]);
    let go = |into: &str| {
        let to = format!("{}:{}/{into}", common::sshd::HOST, far.display());
        submit(&[
            "-r",
            "--mkpath",
            "--rate",
            "100mbit",
            &url(&j, "data/tree"),
            &to,
        ])
        .0
    };
    let landing = [
        (go("before/new/"), far.join("before/new/tree/sub")),
        (go("made/"), far.join("made/tree/sub")),
    ];
    wait_landing(&landing);
    let link = far.join("made/tree/link");
    std::os::unix::fs::symlink(far.join("elsewhere"), &link).unwrap();
    let emptied = [far.join("before/new"), far.join("made/tree/sub")];
    cancel_landing(&j, &landing, &emptied);
    assert!(far.join("before").is_dir(), "a directory there before went");
    assert!(names_in(&far.join("before")).is_empty());
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(names_in(&far.join("made/tree")), ["link"]);
    assert!(far.join("elsewhere").is_dir());
}
