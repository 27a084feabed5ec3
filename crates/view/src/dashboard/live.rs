//! The live view. One thread polls the archive (a read-only connection;
//! WAL mode, so it never blocks the running command's writer) every
//! [`POLL`]: the running runs, their bytes, files and rate so far, and
//! their new intervals. It publishes a snapshot, serialized once, when
//! something changed and at least every [`HEARTBEAT`]; every open page
//! gets it as a Server-Sent Event (`/api/live`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::Stream;
use longhaul_archive::model::{HistoryFilter, IntervalRow, RunRow};
use longhaul_archive::Archive;
use serde::Serialize;
use tokio::sync::watch;

use super::AppState;

/// How often the archive is read.
pub const POLL: Duration = Duration::from_millis(250);
/// A snapshot goes out at least this often, changed or not.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Interval indices of a running run the live chart keeps.
pub const KEEP_INTERVALS: u32 = 120;
/// Finished runs the live page lists under the running ones.
const RECENT: usize = 8;

/// One point of a live chart: an interval of a stream (or the total, -1).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    pub idx: u32,
    pub dir: String,
    pub stream: i32,
    pub t: f64,
    pub bps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

impl From<&IntervalRow> for Point {
    fn from(r: &IntervalRow) -> Self {
        Point {
            idx: r.idx,
            dir: r.direction.clone(),
            stream: r.stream,
            t: r.end_s,
            bps: r.bits_per_second,
            limit: r.limit.clone(),
        }
    }
}

/// A running run as the live page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRun {
    #[serde(flatten)]
    pub run: RunRow,
    /// The rate to show: the writer's latest, else the last total interval's.
    pub rate_bps: Option<f64>,
    pub points: Vec<Point>,
}

/// What one event carries (besides its sequence number and time).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Snapshot {
    /// `ok`, `missing` (no archive yet) or `error`.
    pub archive: String,
    pub error: Option<String>,
    pub running: Vec<LiveRun>,
    pub recent: Vec<RunRow>,
}

/// The poller's state between polls.
#[derive(Default)]
pub struct Poller {
    archive: Option<Archive>,
    /// Per running run: the points kept and the last index read.
    kept: HashMap<i64, (Vec<Point>, Option<u32>)>,
}

impl Poller {
    /// Reads the archive once. Opening is retried every poll while the
    /// file is missing or unreadable; a failed read drops the connection.
    pub fn poll(&mut self, path: &std::path::Path) -> Snapshot {
        if self.archive.is_none() {
            match super::api::open(path) {
                Ok(Some(a)) => self.archive = Some(a),
                Ok(None) => {
                    self.kept.clear();
                    return Snapshot {
                        archive: "missing".into(),
                        error: Some(format!(
                            "no archive at {} yet: runs appear when the first one is archived",
                            path.display()
                        )),
                        ..Default::default()
                    };
                }
                Err(e) => {
                    return Snapshot {
                        archive: "error".into(),
                        error: Some(e.to_string()),
                        ..Default::default()
                    }
                }
            }
        }
        match self.read() {
            Ok(s) => s,
            Err(e) => {
                self.archive = None;
                Snapshot {
                    archive: "error".into(),
                    error: Some(e.to_string()),
                    ..Default::default()
                }
            }
        }
    }

    fn read(&mut self) -> Result<Snapshot, longhaul_archive::ArchiveError> {
        let Some(a) = &self.archive else {
            return Ok(Snapshot::default());
        };
        let runs = a.running()?;
        self.kept.retain(|id, _| runs.iter().any(|r| r.id == *id));
        let mut running = Vec::with_capacity(runs.len());
        for run in runs {
            let (points, last) = self.kept.entry(run.id).or_default();
            // The first read of a run takes only its latest intervals.
            let after = match *last {
                Some(l) => Some(l),
                None => {
                    let newest = a.intervals(run.id, None)?.last().map(|r| r.idx);
                    newest.and_then(|n| n.checked_sub(KEEP_INTERVALS))
                }
            };
            let new = a.intervals(run.id, after)?;
            if let Some(n) = new.last() {
                *last = Some(n.idx);
            }
            points.extend(new.iter().map(Point::from));
            if let Some(floor) = last.and_then(|l| l.checked_sub(KEEP_INTERVALS)) {
                points.retain(|p| p.idx > floor);
            }
            let total = points.iter().rev().find(|p| p.stream < 0).map(|p| p.bps);
            running.push(LiveRun {
                rate_bps: run.live_bps.or(total),
                run,
                points: points.clone(),
            });
        }
        let recent = a
            .history(&HistoryFilter {
                limit: RECENT + running.len(),
                ..Default::default()
            })?
            .into_iter()
            .filter(|r| r.status != "running")
            .take(RECENT)
            .collect();
        Ok(Snapshot {
            archive: "ok".into(),
            error: None,
            running,
            recent,
        })
    }
}

/// The latest snapshot, as the JSON of an event, for every page.
pub struct LiveFeed {
    rx: watch::Receiver<Arc<String>>,
}

impl LiveFeed {
    /// Starts the poller thread. It ends when the feed is dropped.
    pub fn start(path: PathBuf) -> LiveFeed {
        let (tx, rx) = watch::channel(Arc::new(initial()));
        let spawned = std::thread::Builder::new()
            .name("lh-dash-poll".into())
            .spawn(move || poll_loop(&path, &tx));
        if let Err(e) = spawned {
            tracing::warn!("dashboard: cannot start the archive poller: {e}");
        }
        LiveFeed { rx }
    }

    /// A feed nothing updates (tests).
    pub fn idle() -> LiveFeed {
        let (_tx, rx) = watch::channel(Arc::new(initial()));
        LiveFeed { rx }
    }

    pub fn latest(&self) -> Arc<String> {
        self.rx.borrow().clone()
    }
}

fn initial() -> String {
    wrap(
        0,
        &Snapshot {
            archive: "starting".into(),
            ..Default::default()
        },
    )
}

/// One event as it is sent.
#[derive(Serialize)]
struct Sent<'a> {
    seq: u64,
    at: f64,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
}

/// An event's JSON: `{"seq":N,"at":UNIX,"archive":...,"running":[...],...}`.
fn wrap(seq: u64, s: &Snapshot) -> String {
    let at = longhaul_archive::store::unix_now();
    serde_json::to_string(&Sent {
        seq,
        at,
        snapshot: s,
    })
    .unwrap_or_else(|_| "{}".into())
}

fn poll_loop(path: &std::path::Path, tx: &watch::Sender<Arc<String>>) {
    let mut poller = Poller::default();
    let mut seq = 0u64;
    let mut last_body = String::new();
    let mut last_sent = Instant::now();
    while !tx.is_closed() {
        let started = Instant::now();
        let snap = poller.poll(path);
        let body = serde_json::to_string(&snap).unwrap_or_default();
        if body != last_body || last_sent.elapsed() >= HEARTBEAT {
            seq += 1;
            tx.send_replace(Arc::new(wrap(seq, &snap)));
            last_body = body;
            last_sent = Instant::now();
        }
        std::thread::sleep(POLL.saturating_sub(started.elapsed()));
    }
}

/// `/api/live`: the snapshots as Server-Sent Events (`event: live`), the
/// current one at once.
pub async fn events(
    State(st): State<Arc<AppState>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut rx = st.live.rx.clone();
    rx.mark_changed();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let data = rx.borrow_and_update().clone();
        Some((Ok(Event::default().event("live").data(data.as_str())), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `/api/running`: the latest snapshot, once (for scripts and tests).
pub async fn running(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        st.live.latest().as_str().to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::model::NewRun;
    use longhaul_archive::writer::{RunEnd, Writer};

    fn iv(idx: u32, stream: i32, bps: f64) -> IntervalRow {
        IntervalRow {
            idx,
            direction: "up".into(),
            stream,
            start_s: f64::from(idx),
            end_s: f64::from(idx + 1),
            bytes: 1,
            bits_per_second: bps,
            retransmits: Some(0),
            rtt_us: Some(100),
            cwnd_bytes: None,
            streams: None,
            limit: Some("cwnd".into()),
            omitted: false,
        }
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_missing_archive_then_a_running_run_then_its_end() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sub/archive.db");
        let mut poller = Poller::default();
        let s = poller.poll(&p);
        assert_eq!(s.archive, "missing");
        assert!(s.running.is_empty());

        let a = Archive::open(&p).unwrap();
        let id = a
            .begin_run(&NewRun {
                kind: "perf".into(),
                command: "longhaul perf x".into(),
                ..Default::default()
            })
            .unwrap();
        let (w, fin) = Writer::start(a, id);
        for i in 0..200 {
            w.interval(iv(i, -1, 2e9));
            w.interval(iv(i, 0, 1e9));
            w.interval(iv(i, 1, 1e9));
        }
        w.live(1 << 30, 0, Some(2.5e9));
        wait_for(|| {
            let s = poller.poll(&p);
            s.running.len() == 1 && s.running[0].run.live_bytes == 1 << 30
        });
        let s = poller.poll(&p);
        assert_eq!(s.archive, "ok");
        let r = &s.running[0];
        assert_eq!(r.rate_bps, Some(2.5e9));
        // Only the latest intervals are kept.
        assert!(r.points.iter().all(|p| p.idx >= 199 - KEEP_INTERVALS));
        assert!(r.points.iter().any(|p| p.idx == 199 && p.stream == 1));
        w.interval(iv(200, -1, 3e9));
        wait_for(|| {
            poller.poll(&p).running[0]
                .points
                .iter()
                .any(|p| p.idx == 200)
        });
        let s = poller.poll(&p);
        assert!(s.running[0]
            .points
            .iter()
            .all(|p| p.idx > 200 - KEEP_INTERVALS));
        let json = wrap(7, &s);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["seq"], 7);
        assert_eq!(v["running"][0]["id"], id);
        assert_eq!(v["running"][0]["points"][0]["dir"], "up");

        w.end(RunEnd {
            status: "ok".into(),
            ..Default::default()
        });
        drop(w);
        fin.finish();
        wait_for(|| poller.poll(&p).running.is_empty());
        let s = poller.poll(&p);
        assert_eq!(s.recent.len(), 1);
        assert_eq!(s.recent[0].status, "ok");
    }

    #[test]
    fn a_damaged_archive_is_an_error_not_a_panic() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("archive.db");
        std::fs::write(&p, b"this is not sqlite at all, not even close......").unwrap();
        let s = Poller::default().poll(&p);
        assert_eq!(s.archive, "error");
        assert!(s.error.unwrap().contains("archive"));
    }
}
