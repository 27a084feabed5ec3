//! A perf test that must end on time: how long it ran, and its intervals'
//! and summary's times.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long past its `-t` a test may run (from its `start` event to its
/// exit) and say it ran: generous for a busy host, the path's round trips
/// and the receiver's grace; well short of what a blocked sender and the
/// bytes queued behind it used to hold.
pub const MARGIN: Duration = Duration::from_millis(1500);

/// Runs `perf` (`c`, to which `--json-stream` is added) and checks that it
/// ended within [`MARGIN`] of `seconds`, that its summary says so too, and
/// that its intervals are in order and end by the summary's time.
pub fn assert_ends_on_time(mut c: Command, seconds: f64) {
    let what = format!("{c:?}");
    let mut child = c
        .arg("--json-stream")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run longhaul");
    let mut events = Vec::new();
    let mut started = None;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).expect("a JSON line");
        if v["event"] == "start" {
            started = Some(Instant::now());
        }
        events.push(v);
    }
    let o = child.wait_with_output().unwrap();
    let ran = started.map(|s| s.elapsed());
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let limit = Duration::from_secs_f64(seconds) + MARGIN;
    // The intervals' times and the summary's, for the messages.
    let times: Vec<(f64, f64)> = events
        .iter()
        .map(|v| match v["event"].as_str() {
            Some("summary") => (0.0, v["seconds"].as_f64().unwrap()),
            _ => (
                v["start_s"].as_f64().unwrap_or(0.0),
                v["end_s"].as_f64().unwrap_or(0.0),
            ),
        })
        .collect();
    let ran = ran.unwrap_or_else(|| panic!("{what}: no start event: {events:?}"));
    assert!(ran < limit, "{what} ran {ran:?} after its start: {times:?}");
    let summary = events.last().unwrap();
    assert_eq!(summary["event"], "summary", "{what}: {times:?}");
    assert_eq!(summary["error"], Value::Null, "{what}: {summary}");
    let said = summary["seconds"].as_f64().unwrap();
    assert!(
        (seconds * 0.95..limit.as_secs_f64()).contains(&said),
        "{what}: the summary says {said} s: {times:?}"
    );
    let intervals: Vec<&Value> = events.iter().filter(|v| v["event"] == "interval").collect();
    assert!(intervals.len() >= 3, "{what}: {times:?}");
    let mut last_end = 0.0;
    for (k, iv) in intervals.iter().enumerate() {
        let (start, end) = (
            iv["start_s"].as_f64().unwrap(),
            iv["end_s"].as_f64().unwrap(),
        );
        assert_eq!(iv["index"], k as u64, "{what}: {iv}");
        assert!(
            start >= last_end - 1e-9 && end >= start,
            "{what}: interval {k} runs {start}-{end} after one that ended at {last_end}: {times:?}"
        );
        last_end = end;
    }
    assert!(
        last_end <= said + 1e-6,
        "{what}: the last interval ends at {last_end}, after the test's {said} s: {times:?}"
    );
}
