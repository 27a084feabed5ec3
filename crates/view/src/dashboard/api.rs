//! The JSON the page reads. Each answer opens the archive read-only on a
//! blocking thread (SQLite is synchronous) and closes it; an archive that
//! does not exist yet reads as an empty one.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use longhaul_archive::model::{HistoryFilter, RunRow};
use longhaul_archive::{Archive, ArchiveError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::AppState;

/// Rows `history` gives unless asked for fewer, and at most.
pub const HISTORY_DEFAULT: usize = 200;
pub const HISTORY_MAX: usize = 5000;
/// Files a run page lists.
pub const FILES_DEFAULT: usize = 50;

/// An answer that is not a success: its status and a sentence.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl From<ArchiveError> for ApiError {
    fn from(e: ArchiveError) -> Self {
        let status = match e {
            ArchiveError::NoRun(_) | ArchiveError::Missing { .. } => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

/// The filters of `/api/history`, as the page sends them (empty = none).
#[derive(Debug, Default, Deserialize)]
pub struct HistoryQuery {
    pub kind: Option<String>,
    pub host: Option<String>,
    pub since: Option<String>,
    pub export: Option<String>,
    pub status: Option<String>,
    pub limit: Option<String>,
}

fn given(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl HistoryQuery {
    /// The archive's filter, or why the query makes no sense.
    pub fn filter(&self, now: f64) -> Result<HistoryFilter, ApiError> {
        let since = match given(&self.since) {
            Some(s) => Some(parse_since(&s, now).map_err(ApiError::bad)?),
            None => None,
        };
        let limit = match given(&self.limit) {
            Some(l) => l
                .parse::<usize>()
                .map_err(|_| ApiError::bad(format!("limit {l:?} is not a number")))?
                .clamp(1, HISTORY_MAX),
            None => HISTORY_DEFAULT,
        };
        Ok(HistoryFilter {
            kind: given(&self.kind),
            host: given(&self.host),
            since,
            export: given(&self.export),
            status: given(&self.status),
            limit,
        })
    }
}

/// `since=`: [`longhaul_archive::when::parse_since`], the grammar of
/// `longhaul history --since` too.
fn parse_since(s: &str, now: f64) -> Result<f64, String> {
    longhaul_archive::when::parse_since(s, now).map_err(|e| format!("since {e}"))
}

/// Opens the archive to read it; `None` when there is none yet.
pub fn open(path: &Path) -> Result<Option<Archive>, ArchiveError> {
    match Archive::open_read_only(path) {
        Ok(a) => Ok(Some(a)),
        Err(ArchiveError::Missing { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs `f` on the archive on a blocking thread.
async fn with_archive<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(Option<&Archive>) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let path = st.archive_path.clone();
    tokio::task::spawn_blocking(move || {
        let a = open(&path)?;
        f(a.as_ref())
    })
    .await
    .map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("the archive reader failed: {e}"),
    })?
}

/// `/api/status`: which archive, and whether it can be read.
pub async fn status(State(st): State<Arc<AppState>>) -> Response {
    let path = st.archive_path.display().to_string();
    let r = with_archive(&st, |a| Ok(a.is_some())).await;
    let body = match r {
        Ok(true) => json!({ "archive": path, "state": "ok" }),
        Ok(false) => json!({ "archive": path, "state": "missing",
            "error": "no archive yet: it appears with the first archived run" }),
        Err(e) => json!({ "archive": path, "state": "error", "error": e.message }),
    };
    Json(body).into_response()
}

/// The answer of `/api/history`.
#[derive(Debug, Serialize)]
pub struct HistoryAnswer {
    pub runs: Vec<RunRow>,
    /// No archive file yet.
    pub missing: bool,
}

/// `history` on an archive that may not exist.
pub fn history_of(a: Option<&Archive>, f: &HistoryFilter) -> Result<HistoryAnswer, ApiError> {
    Ok(match a {
        Some(a) => HistoryAnswer {
            runs: a.history(f)?,
            missing: false,
        },
        None => HistoryAnswer {
            runs: Vec::new(),
            missing: true,
        },
    })
}

/// The jobs whose attempts this host's archive holds (a job server's),
/// newest first: each job's attempts, newest first, its latest status.
pub fn jobs_of(a: Option<&Archive>) -> Result<Value, ApiError> {
    let Some(a) = a else {
        return Ok(json!({ "jobs": [], "missing": true }));
    };
    let mut jobs: Vec<(String, Vec<longhaul_archive::model::JobRun>)> = Vec::new();
    for r in a.job_runs(JOB_RUNS_MAX)? {
        match jobs.iter_mut().find(|(id, _)| *id == r.job) {
            Some((_, runs)) => runs.push(r),
            None => jobs.push((r.job.clone(), vec![r])),
        }
    }
    let jobs: Vec<Value> = jobs
        .into_iter()
        .map(|(id, runs)| {
            let last = &runs[0].run;
            json!({
                "job": id,
                "source": last.source,
                "dest": last.dest,
                "status": last.status,
                "bytes": runs.iter().filter_map(|r| r.run.bytes).sum::<u64>(),
                "attempts": runs,
            })
        })
        .collect();
    Ok(json!({ "jobs": jobs, "missing": false }))
}

/// The job attempts `/api/jobs` reads, at most (the newest).
const JOB_RUNS_MAX: usize = 2000;

/// `/api/jobs`: the jobs this host ran, from their archived attempts.
pub async fn jobs(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(with_archive(&st, jobs_of).await?))
}

/// `/api/history?kind=&host=&since=&export=&status=&limit=`.
pub async fn history(
    State(st): State<Arc<AppState>>,
    q: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HistoryAnswer>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad(e.body_text()))?;
    let f = q.filter(longhaul_archive::store::unix_now())?;
    Ok(Json(with_archive(&st, move |a| history_of(a, &f)).await?))
}

/// The stage rates of a cp or sync, from its summary: what the source
/// read, the network carried and the destination wrote.
pub fn stage_rates(summary: Option<&Value>) -> Option<Value> {
    let s = summary?;
    let pick = |k: &str| -> Option<f64> {
        s.get(k).and_then(Value::as_f64).or_else(|| {
            s.as_object()?
                .values()
                .find_map(|v| v.get(k).and_then(Value::as_f64))
        })
    };
    let (r, n, w) = (
        pick("source_read_bps"),
        pick("network_bps"),
        pick("dest_write_bps"),
    );
    if r.is_none() && n.is_none() && w.is_none() {
        return None;
    }
    Some(json!({ "source_read_bps": r, "network_bps": n, "dest_write_bps": w }))
}

/// A run page: the run whole, its first files and its stage rates.
pub fn run_of(a: Option<&Archive>, which: &str) -> Result<Value, ApiError> {
    let Some(a) = a else {
        return Err(ArchiveError::NoRun(which.to_string()).into());
    };
    let id = a.resolve(which)?;
    let detail = a.run(id)?;
    let files = a.files(id, FILES_DEFAULT)?;
    let stages = stage_rates(detail.summary.as_ref());
    let mut v = serde_json::to_value(&detail).map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: e.to_string(),
    })?;
    if let Some(o) = v.as_object_mut() {
        o.insert("files_first".into(), json!(files));
        o.insert("stages".into(), stages.unwrap_or(Value::Null));
    }
    Ok(v)
}

/// `/api/run/{id}` (`id` may be `last`).
pub async fn run(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(with_archive(&st, move |a| run_of(a, &id)).await?))
}

#[derive(Debug, Deserialize)]
pub struct AfterQuery {
    pub after: Option<u32>,
    pub limit: Option<usize>,
}

/// `/api/run/{id}/intervals?after=IDX`: what is new since an interval.
pub async fn intervals(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    q: Result<Query<AfterQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    of_run(&st, id, q, |a, id, q| {
        let rows = a.intervals(id, q.after)?;
        let status = a.run(id)?.run.status;
        Ok(json!({ "id": id, "status": status, "intervals": rows }))
    })
    .await
}

/// `f` over the run named `id` (a number, `last`, ...) in the archive, with
/// the request's query.
async fn of_run(
    st: &Arc<AppState>,
    id: String,
    q: Result<Query<AfterQuery>, axum::extract::rejection::QueryRejection>,
    f: impl FnOnce(&Archive, i64, AfterQuery) -> Result<Value, ArchiveError> + Send + 'static,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad(e.body_text()))?;
    Ok(Json(
        with_archive(st, move |a| {
            let a = a.ok_or_else(|| ArchiveError::NoRun(id.clone()))?;
            let id = a.resolve(&id)?;
            Ok(f(a, id, q)?)
        })
        .await?,
    ))
}

/// `/api/run/{id}/files?limit=N` (0: all).
pub async fn files(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    q: Result<Query<AfterQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    of_run(&st, id, q, |a, id, q| {
        let rows = a.files(id, q.limit.unwrap_or(FILES_DEFAULT))?;
        Ok(json!({ "id": id, "files": rows }))
    })
    .await
}

/// One doctor run on the timeline of its path.
#[derive(Debug, Serialize, PartialEq)]
pub struct Verdict {
    pub id: i64,
    pub started_at: f64,
    pub status: String,
    pub verdict: Option<String>,
    pub bits_per_second: Option<f64>,
}

/// The doctor's verdicts of one path, newest first.
#[derive(Debug, Serialize, PartialEq)]
pub struct PathVerdicts {
    pub path: String,
    pub runs: Vec<Verdict>,
}

/// Doctor runs grouped by the path they examined (`remote_host`), the
/// path last examined first.
pub fn doctor_of(a: Option<&Archive>, since: Option<f64>) -> Result<Vec<PathVerdicts>, ApiError> {
    let Some(a) = a else { return Ok(Vec::new()) };
    let rows = a.history(&HistoryFilter {
        kind: Some("doctor".into()),
        since,
        limit: HISTORY_MAX,
        ..Default::default()
    })?;
    let mut out: Vec<PathVerdicts> = Vec::new();
    for r in rows {
        let path = r.remote_host.clone().unwrap_or_else(|| "(no path)".into());
        let v = Verdict {
            id: r.id,
            started_at: r.started_at,
            status: r.status,
            verdict: r.verdict,
            bits_per_second: r.bits_per_second,
        };
        match out.iter_mut().find(|p| p.path == path) {
            Some(p) => p.runs.push(v),
            None => out.push(PathVerdicts {
                path,
                runs: vec![v],
            }),
        }
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
pub struct SinceQuery {
    pub since: Option<String>,
}

/// `/api/doctor?since=`.
pub async fn doctor(
    State(st): State<Arc<AppState>>,
    q: Result<Query<SinceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad(e.body_text()))?;
    let since = match given(&q.since) {
        Some(s) => {
            Some(parse_since(&s, longhaul_archive::store::unix_now()).map_err(ApiError::bad)?)
        }
        None => None,
    };
    let paths = with_archive(&st, move |a| doctor_of(a, since)).await?;
    Ok(Json(json!({ "paths": paths })))
}

/// Matrix runs the matrix page looks back over unless asked for fewer.
pub const MATRIX_HISTORY_DEFAULT: usize = 50;

/// The query of `/api/matrix`: which matrix (`run`, a number or `last`;
/// none: the latest) and how many matrix runs each cell's history spans
/// (`limit`). Anything else is refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixQuery {
    pub run: Option<String>,
    pub limit: Option<String>,
}

impl MatrixQuery {
    /// The run asked for (None: the latest) and the history's length.
    pub fn check(&self) -> Result<(Option<i64>, usize), ApiError> {
        use longhaul_archive::matrix::HISTORY_MAX;
        let run = match given(&self.run).as_deref() {
            None | Some("last") => None,
            Some(r) => Some(
                r.parse::<i64>()
                    .ok()
                    .filter(|&id| id > 0 && r.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| ApiError::bad("run must be a run number or `last`"))?,
            ),
        };
        let limit = match given(&self.limit) {
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|_| l.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "limit must be a number of matrix runs (1 to {HISTORY_MAX})"
                    ))
                })?
                .clamp(1, HISTORY_MAX),
            None => MATRIX_HISTORY_DEFAULT,
        };
        Ok((run, limit))
    }
}

/// The matrix page: one matrix run (`run`, else the latest) whole, the
/// matrix runs there are, and each cell's rate over them.
pub fn matrix_of(a: Option<&Archive>, run: Option<i64>, limit: usize) -> Result<Value, ApiError> {
    use longhaul_archive::matrix::{cell_history, matrix_runs, Document, MatrixRun, KIND};
    let Some(a) = a else {
        return Ok(
            json!({ "missing": true, "run": null, "matrix": null, "runs": [], "history": [] }),
        );
    };
    let runs = matrix_runs(a, limit)?;
    let chosen = match run {
        None => runs.first().cloned(),
        Some(id) => {
            let detail = a.run(id)?;
            if detail.run.kind != KIND {
                return Err(ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!("run {id} is a {} run, not a matrix", detail.run.kind),
                });
            }
            let matrix = Document::of(&detail).ok_or_else(|| ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("the matrix run {id} kept no cells (it ended before its first)"),
            })?;
            Some(MatrixRun {
                run: detail.run,
                matrix,
            })
        }
    };
    let list: Vec<Value> = runs
        .iter()
        .map(|m| {
            json!({ "id": m.run.id, "started_at": m.run.started_at, "status": m.run.status,
                    "cells": m.matrix.cells.len() })
        })
        .collect();
    Ok(json!({
        "missing": false,
        "run": chosen.as_ref().map(|m| &m.run),
        "matrix": chosen.as_ref().map(|m| m.matrix.view()),
        "runs": list,
        "history": cell_history(&runs),
    }))
}

/// `/api/matrix?run=&limit=`.
pub async fn matrix(
    State(st): State<Arc<AppState>>,
    q: Result<Query<MatrixQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad(e.body_text()))?;
    let (run, limit) = q.check()?;
    Ok(Json(
        with_archive(&st, move |a| matrix_of(a, run, limit)).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::model::{IntervalRow, NewRun};
    use longhaul_archive::writer::{RunEnd, RunResult, Writer};

    fn run(a: Archive, n: NewRun, verdict: Option<&str>, summary: Option<Value>) -> i64 {
        let id = a.begin_run(&n).unwrap();
        let (w, fin) = Writer::start(a, id);
        w.interval(IntervalRow {
            idx: 0,
            direction: "send".into(),
            stream: -1,
            start_s: 0.0,
            end_s: 1.0,
            bytes: 1000,
            bits_per_second: 8000.0,
            retransmits: None,
            rtt_us: None,
            cwnd_bytes: None,
            streams: Some(2),
            limit: Some("storage_read".into()),
            omitted: false,
        });
        w.result(RunResult {
            summary,
            bytes: Some(1000),
            bits_per_second: Some(8000.0),
            verdict: verdict.map(str::to_string),
            ..Default::default()
        });
        w.end(RunEnd {
            status: "ok".into(),
            ..Default::default()
        });
        drop(w);
        fin.finish();
        id
    }

    fn sample(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("archive.db");
        let new = |kind: &str, host: &str, export: Option<&str>| NewRun {
            kind: kind.into(),
            command: format!("longhaul {kind}"),
            remote_host: Some(host.into()),
            export: export.map(str::to_string),
            ..Default::default()
        };
        run(
            Archive::open(&p).unwrap(),
            new("cp", "alpha", Some("data")),
            None,
            Some(json!({"source_read_bps": 3e9, "network_bps": 2e9, "dest_write_bps": 1e9})),
        );
        run(
            Archive::open(&p).unwrap(),
            new("perf", "beta", None),
            None,
            None,
        );
        run(
            Archive::open(&p).unwrap(),
            new("doctor", "alpha:/data", None),
            Some("network"),
            None,
        );
        run(
            Archive::open(&p).unwrap(),
            new("doctor", "beta:/x", None),
            Some("storage_write"),
            None,
        );
        run(
            Archive::open(&p).unwrap(),
            new("doctor", "alpha:/data", None),
            Some("storage_read"),
            None,
        );
        p
    }

    /// The Jobs page: a job server's archived attempts, grouped by job,
    /// newest first, each with its run.
    #[test]
    fn jobs_are_grouped_from_their_archived_attempts() {
        let t = tempfile::tempdir().unwrap();
        let p = sample(t.path());
        let attempt = |job: &str, n: u32| NewRun {
            kind: "job".into(),
            command: format!("job {job} attempt {n}"),
            source: Some("data/tree".into()),
            dest: Some("b:in/".into()),
            params: Some(json!({"job": job, "attempt": n, "run": 1})),
            ..Default::default()
        };
        run(Archive::open(&p).unwrap(), attempt("aaaa", 1), None, None);
        run(Archive::open(&p).unwrap(), attempt("bbbb", 1), None, None);
        run(Archive::open(&p).unwrap(), attempt("aaaa", 2), None, None);
        let a = Archive::open_read_only(&p).unwrap();
        let v = jobs_of(Some(&a)).unwrap();
        let jobs = v["jobs"].as_array().unwrap();
        assert_eq!(jobs.len(), 2, "{v}");
        assert_eq!(jobs[0]["job"], "aaaa", "{v}");
        assert_eq!(jobs[0]["attempts"].as_array().unwrap().len(), 2, "{v}");
        assert_eq!(jobs[0]["attempts"][0]["attempt"], 2, "{v}");
        assert_eq!(jobs[0]["source"], "data/tree", "{v}");
        assert_eq!(jobs[1]["job"], "bbbb", "{v}");
        assert_eq!(jobs_of(None).unwrap()["missing"], true);
    }

    #[test]
    fn history_filters_and_shape() {
        let t = tempfile::tempdir().unwrap();
        let p = sample(t.path());
        let a = Archive::open_read_only(&p).unwrap();
        let all = history_of(Some(&a), &HistoryQuery::default().filter(0.0).unwrap()).unwrap();
        assert_eq!(all.runs.len(), 5);
        assert!(!all.missing);
        let q = HistoryQuery {
            kind: Some("cp".into()),
            host: Some("alp".into()),
            export: Some("data".into()),
            since: Some("1h".into()),
            ..Default::default()
        };
        let f = q.filter(longhaul_archive::store::unix_now()).unwrap();
        let cp = history_of(Some(&a), &f).unwrap();
        assert_eq!(cp.runs.len(), 1);
        assert_eq!(cp.runs[0].kind, "cp");
        let v = serde_json::to_value(&cp).unwrap();
        for k in [
            "id",
            "kind",
            "status",
            "started_at",
            "remote_host",
            "export",
            "live_bps",
        ] {
            assert!(v["runs"][0].get(k).is_some(), "{k} in {v}");
        }
        // Empty filters are no filters; a filter in the future finds nothing.
        let empty = HistoryQuery {
            kind: Some(" ".into()),
            ..Default::default()
        };
        assert_eq!(
            history_of(Some(&a), &empty.filter(0.0).unwrap())
                .unwrap()
                .runs
                .len(),
            5
        );
        let later = HistoryQuery {
            since: Some("2999-01-01".into()),
            ..Default::default()
        };
        assert!(history_of(Some(&a), &later.filter(0.0).unwrap())
            .unwrap()
            .runs
            .is_empty());
        let missing = history_of(None, &HistoryFilter::default()).unwrap();
        assert!(missing.missing && missing.runs.is_empty());
    }

    #[test]
    fn bad_filters_are_told_not_panicked() {
        for since in [
            "yesterday",
            "-5m",
            "2026-13-01",
            "5 parsecs",
            "NaN",
            "1e999",
            "3600",
            "2026-02-31",
        ] {
            let q = HistoryQuery {
                since: Some(since.into()),
                ..Default::default()
            };
            let e = q.filter(1e9).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{since}");
        }
        let q = HistoryQuery {
            limit: Some("many".into()),
            ..Default::default()
        };
        assert!(q.filter(0.0).is_err());
        let q = HistoryQuery {
            limit: Some("999999999".into()),
            ..Default::default()
        };
        assert_eq!(q.filter(0.0).unwrap().limit, HISTORY_MAX);
    }

    #[test]
    fn since_is_the_archives_one_grammar() {
        let now = 2_000_000_000.0;
        assert_eq!(parse_since("2h", now).unwrap(), now - 7200.0);
        assert_eq!(parse_since("2026-11-23", now).unwrap(), 1_795_392_000.0);
        for bad in ["3600", "2026-02-31"] {
            let e = parse_since(bad, now).unwrap_err();
            assert!(e.starts_with("since ") && e.contains("UTC date"), "{e}");
        }
    }

    #[test]
    fn run_page_has_stages_and_files() {
        let t = tempfile::tempdir().unwrap();
        let p = sample(t.path());
        let a = Archive::open_read_only(&p).unwrap();
        let v = run_of(Some(&a), "1").unwrap();
        assert_eq!(v["kind"], "cp");
        assert_eq!(v["stages"]["network_bps"], 2e9);
        assert_eq!(v["intervals"][0]["limit"], "storage_read");
        assert!(v["files_first"].is_array());
        let last = run_of(Some(&a), "last").unwrap();
        assert_eq!(last["id"], 5);
        for bad in ["0", "99", "x", "", "-1", "last; DROP TABLE runs"] {
            let e = run_of(Some(&a), bad).unwrap_err();
            assert_eq!(e.status, StatusCode::NOT_FOUND, "{bad}");
        }
        assert_eq!(run_of(None, "1").unwrap_err().status, StatusCode::NOT_FOUND);
        assert!(stage_rates(Some(&json!({"x": 1}))).is_none());
        let nested = json!({"stages": {"network_bps": 5.0}});
        assert_eq!(stage_rates(Some(&nested)).unwrap()["network_bps"], 5.0);
    }

    #[test]
    fn the_matrix_query_takes_a_run_number_or_last_and_a_limit_only() {
        let q = |run: Option<&str>, limit: Option<&str>| MatrixQuery {
            run: run.map(str::to_string),
            limit: limit.map(str::to_string),
        };
        assert_eq!(
            q(None, None).check().unwrap(),
            (None, MATRIX_HISTORY_DEFAULT)
        );
        assert_eq!(q(Some("last"), Some("3")).check().unwrap(), (None, 3));
        assert_eq!(q(Some("12"), Some("0")).check().unwrap(), (Some(12), 1));
        assert_eq!(q(Some(" 7 "), Some("99999")).check().unwrap().1, 200);
        for bad in [
            "0",
            "-1",
            "+3",
            "1e3",
            "x",
            "<script>",
            "1;DROP TABLE runs",
            "99999999999999999999",
        ] {
            let e = q(Some(bad), None).check().unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(!e.message.contains(bad), "the answer echoes {bad}");
        }
        for bad in ["many", "-2", "+2", "<i>"] {
            assert!(q(None, Some(bad)).check().is_err(), "{bad}");
        }
        let a = matrix_of(None, None, 5).unwrap();
        assert_eq!(a["missing"], true);
        assert!(a["matrix"].is_null());
    }

    #[test]
    fn a_matrix_page_is_the_matrix_and_its_cells_histories() {
        use longhaul_archive::matrix::Recorder;
        let t = tempfile::tempdir().unwrap();
        let p = sample(t.path());
        for scale in [1.0, 2.0] {
            let r = Recorder::start(&p, &NewRun::default()).unwrap();
            r.finish(
                Some(json!({"format": "longhaul-matrix", "format_version": 1,
                    "params": {"workloads": ["mem"]}, "paths": [{"name": "loopback"}],
                    "cells": [{"tool": "<script>x</script>", "settings": "s", "path": "loopback",
                        "workload": "mem", "direction": "put",
                        "rate": {"median_bits_per_second": 8e9 * scale}}]})),
                RunEnd {
                    status: "ok".into(),
                    ..Default::default()
                },
            );
        }
        let a = Archive::open_read_only(&p).unwrap();
        let v = matrix_of(Some(&a), None, 50).unwrap();
        assert_eq!(v["run"]["id"], 7);
        assert_eq!(v["matrix"]["cells"][0]["tool"], "<script>x</script>");
        assert_eq!(v["runs"].as_array().unwrap().len(), 2);
        let points = &v["history"][0]["points"];
        assert_eq!(points[0]["bits_per_second"], 8e9);
        assert_eq!(points[1]["bits_per_second"], 16e9);
        let v = matrix_of(Some(&a), Some(6), 1).unwrap();
        assert_eq!(v["run"]["id"], 6);
        assert_eq!(v["history"][0]["points"].as_array().unwrap().len(), 1);
        // A run that is not a matrix, or none at all: not found.
        assert_eq!(
            matrix_of(Some(&a), Some(1), 5).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            matrix_of(Some(&a), Some(99), 5).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn doctor_verdicts_group_by_path() {
        let t = tempfile::tempdir().unwrap();
        let p = sample(t.path());
        let a = Archive::open_read_only(&p).unwrap();
        let d = doctor_of(Some(&a), None).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].path, "alpha:/data");
        let verdicts: Vec<_> = d[0]
            .runs
            .iter()
            .map(|r| r.verdict.clone().unwrap())
            .collect();
        assert_eq!(verdicts, ["storage_read", "network"]);
        assert_eq!(d[1].path, "beta:/x");
        assert!(doctor_of(None, None).unwrap().is_empty());
    }
}
