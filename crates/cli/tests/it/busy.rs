//! A busy server queues requests instead of turning clients away (issue
//! 13, item 5): many clients at once all complete, each bit-identical; the
//! waiting ones are told once, on stderr, that they wait; beyond the queue
//! limit a client is refused as busy, saying which limit.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_engine::server::{ServeConfig, ServerHandle};
use longhaul_engine::xfer::storage::{Faults, Faulty, Local, Storage};

use crate::common;
use common::xfer::{export, remote, write_random};
use common::{assert_exit, bin, stderr, TempDir};

fn server(
    root: &Path,
    state: &Path,
    storage: Arc<dyn Storage>,
    max_tests: usize,
    max_queued: usize,
) -> ServerHandle {
    common::xfer::spawn_server(ServeConfig {
        exports: vec![export("data", root, false)],
        storage,
        sync_files: false,
        state_dir: common::prepare_state(state),
        max_tests,
        max_queued,
        // Every client of these tests is 127.0.0.1.
        max_connections: 4096,
        max_per_client: 4096,
        ..ServeConfig::default()
    })
}

#[test]
fn thirty_two_pushes_at_once_all_complete_through_the_queue() {
    let t = TempDir::new("busy32");
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let srv = server(&dst, &t.dir("state"), Arc::new(Local), 4, 64);
    let n = 32;
    for i in 0..n {
        write_random(&src.join(format!("f{i:02}.bin")), 16 << 20, 1000 + i as u64);
    }
    let children: Vec<Child> = (0..n)
        .map(|i| {
            let mut c = bin();
            c.args([
                "cp",
                src.join(format!("f{i:02}.bin")).to_str().unwrap(),
                &remote(srv.addr(), &format!("f{i:02}.bin")),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            c.spawn().expect("start longhaul cp")
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut waited = 0;
    for (i, o) in outputs.iter().enumerate() {
        assert_exit(o, 0);
        let e = stderr(o);
        if e.contains("waiting in queue") {
            waited += 1;
            assert!(e.contains("server busy ("), "client {i}: {e}");
            assert_eq!(
                e.matches("waiting in queue").count(),
                1,
                "told more than once: {e}"
            );
        }
        let name = format!("f{i:02}.bin");
        assert!(
            fs::read(src.join(&name)).unwrap() == fs::read(dst.join(&name)).unwrap(),
            "{name} differs after the copy"
        );
    }
    assert!(waited > 0, "no client said that it waited for a slot");
    srv.shutdown();
}

/// Lines a child writes to stderr, collected as they come.
fn collect_stderr(c: &mut Child) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let (err, s) = (c.stderr.take().unwrap(), seen.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut s = s.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    seen
}

#[track_caller]
fn wait_for(seen: &Mutex<String>, phrase: &str, limit: Duration) {
    let until = Instant::now() + limit;
    while !seen.lock().unwrap().contains(phrase) {
        assert!(
            Instant::now() < until,
            "no '{phrase}' within {limit:?}: {}",
            seen.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn slow_push(src: &Path, to: &str) -> Child {
    let mut c = bin();
    c.args(["cp", "-P", "1", src.to_str().unwrap(), to])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().expect("start longhaul cp")
}

/// A server with one slot and a queue of one on a slow disk, and a push
/// of an 8 MiB file (`seed`) that holds the slot (its partial file is in
/// the export): returns the server, the file, the export and that push.
fn one_slot_taken(t: &TempDir, seed: u64) -> (ServerHandle, PathBuf, PathBuf, Child) {
    let (src, dst) = (t.dir("src"), t.dir("dst"));
    let slow = Arc::new(Faulty {
        faults: Arc::new(Faults {
            write_delay: Some(Duration::from_millis(100)),
            ..Faults::default()
        }),
    });
    let srv = server(&dst, &t.dir("state"), slow, 1, 1);
    let file = src.join("a.bin");
    write_random(&file, 8 << 20, seed);
    let mut first = slow_push(&file, &remote(srv.addr(), "a.bin"));
    // Its stderr drained in the background, so that it never blocks.
    let first_err = collect_stderr(&mut first);
    let until = Instant::now() + Duration::from_secs(60);
    while fs::read_dir(&dst).unwrap().next().is_none() {
        assert!(
            first.try_wait().unwrap().is_none() && Instant::now() < until,
            "the first push never opened its file: {}",
            first_err.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (srv, file, dst, first)
}

#[test]
fn beyond_the_queue_limit_a_client_is_refused_as_busy() {
    let t = TempDir::new("busycap");
    let (srv, file, dst, mut first) = one_slot_taken(&t, 7);
    // The second waits: that is the queue's one place.
    let mut second = slow_push(&file, &remote(srv.addr(), "b.bin"));
    let second_err = collect_stderr(&mut second);
    wait_for(
        &second_err,
        "waiting in queue, position 1",
        Duration::from_secs(60),
    );
    // The third finds the queue full.
    let mut c = bin();
    c.args(["cp", file.to_str().unwrap(), &remote(srv.addr(), "c.bin")]);
    let o = c.stdin(Stdio::null()).output().unwrap();
    assert_exit(&o, 4);
    let e = stderr(&o);
    assert!(
        e.contains("--max-queued 1") && e.contains("try again later"),
        "{e}"
    );
    assert!(!dst.join("c.bin").exists());
    // The two others complete.
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    assert_eq!(
        fs::read(dst.join("b.bin")).unwrap(),
        fs::read(&file).unwrap()
    );
    srv.shutdown();
}

#[test]
fn ctrl_c_while_queued_exits_130_and_leaves_the_queue() {
    let t = TempDir::new("busyint");
    let (srv, file, dst, mut first) = one_slot_taken(&t, 8);
    let mut queued = slow_push(&file, &remote(srv.addr(), "q.bin"));
    let queued_err = collect_stderr(&mut queued);
    wait_for(&queued_err, "waiting in queue", Duration::from_secs(60));
    if let Some(pid) = rustix::process::Pid::from_raw(queued.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
    }
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = queued.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "the queued client ignored Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130), "{}", queued_err.lock().unwrap());
    // Its place is free again once the server notices the closed
    // connection (within a poll or two): another client queues instead of
    // being refused (the queue holds one).
    let until = Instant::now() + Duration::from_secs(30);
    let (mut next, next_err) = loop {
        let mut next = slow_push(&file, &remote(srv.addr(), "n.bin"));
        let next_err = collect_stderr(&mut next);
        let refused = loop {
            if next_err.lock().unwrap().contains("waiting in queue") {
                break None;
            }
            if let Some(s) = next.try_wait().unwrap() {
                break Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match refused {
            None => break (next, next_err),
            Some(s) => assert!(
                s.code() == Some(4) && Instant::now() < until,
                "the queue's place was never given back: {s} {}",
                next_err.lock().unwrap()
            ),
        }
    };
    assert!(
        next.wait().unwrap().success(),
        "{}",
        next_err.lock().unwrap()
    );
    assert!(first.wait().unwrap().success());
    assert!(!dst.join("q.bin").exists());
    srv.shutdown();
}

/// The connection limits: past `max_per_client` from one address, and past
/// `max_connections` in all, a new connection is told why and closed, and
/// the ones already open stay; once they close, the server takes more.
#[test]
fn attacker_connections_past_the_limits_are_told_busy_and_closed() {
    use std::io::Read;
    use std::net::TcpStream;
    let read_refusal = |addr| {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        // The refusal, then the close: read_to_end ends.
        c.read_to_end(&mut got).unwrap();
        String::from_utf8_lossy(&got).into_owned()
    };
    for (per_client, total, why) in [
        (2, 64, "too many connections from your address"),
        (64, 2, "server has too many open connections"),
    ] {
        let t = TempDir::new("busy-conns");
        let srv = common::xfer::spawn_server(ServeConfig {
            state_dir: common::prepare_state(&t.dir("state")),
            max_per_client: per_client,
            max_connections: total,
            ..ServeConfig::default()
        });
        let held: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(srv.addr()).unwrap())
            .collect();
        // The accept loop counts a connection when it takes it, before it
        // takes the next: wait until it has taken both.
        common::wait_until(
            "the server to take both connections",
            Duration::from_secs(30),
            || common::counters::accept_queue(srv.addr().port()) == Some(0),
        );
        let said = read_refusal(srv.addr());
        assert!(said.contains(why), "{why}: got {said:?}");
        drop(held);
        // Freed: a client gets in (the refusal no longer comes).
        let start = Instant::now();
        loop {
            let mut c = TcpStream::connect(srv.addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 256];
            match c.read(&mut buf) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    break
                }
                _ if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                other => panic!("still refused after the others closed: {other:?}"),
            }
        }
    }
}
