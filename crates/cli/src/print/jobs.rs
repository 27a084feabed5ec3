//! Jobs for people and for scripts: `submit`'s id, `jobs`' list, `jobs
//! show`/`wait`'s job with its files, `jobs cancel`/`retry`'s word. Every
//! string that came from the job server (paths, errors, names) is escaped
//! before a terminal sees it; the JSON documents (docs/JSON.md section 16)
//! carry them as they are.

use longhaul_archive::when::utc;
use longhaul_proto::job::{DiscardState, DiscardView, FileView, JobAnswer, JobView};
use longhaul_proto::units::{escaped, format_bytes, format_rate};
use serde_json::json;

/// Version of `submit --json` (`longhaul-job`), `jobs --json`
/// (`longhaul-jobs`), `jobs show|wait --json` (`longhaul-job-show`) and
/// `jobs cancel|retry --json` (`longhaul-job-command`).
pub const JOBS_JSON_FORMAT_VERSION: u32 = 1;

/// Prints one versioned document of `format` on stdout.
fn print_document(format: &str, mut body: serde_json::Value) {
    body["format"] = format.into();
    body["format_version"] = JOBS_JSON_FORMAT_VERSION.into();
    outln!("{body}");
}

/// `submit`: the id alone on stdout (a script reads it), and the
/// notification secret, shown this once, on the next line.
pub fn submitted(json: bool, id: &str, server: &str, secret: Option<&str>) {
    if json {
        print_document(
            "longhaul-job",
            json!({"id": id, "server": server, "notify_secret": secret}),
        );
        return;
    }
    outln!("{id}");
    if let Some(s) = secret {
        errln!("longhaul: its notifications are signed (HMAC-SHA256) with the secret on the next line, shown this once");
        outln!("{s}");
    }
    errln!("longhaul: job {id} runs on {server}: `longhaul jobs show {id} --via {server}`, `longhaul jobs wait {id} --via {server}`");
}

fn state_words(v: &JobView) -> String {
    let mut s = v.state.word().replace('_', " ");
    if let (Some(next), true) = (v.next_attempt, v.attempts > 0 || v.runs > 0) {
        let wait = (next - longhaul_jobs::now() as f64).max(0.0);
        s.push_str(&format!(" (next in {wait:.0} s)"));
    }
    s
}

fn progress(v: &JobView) -> String {
    let mut s = format!(
        "{} of {}",
        format_bytes(v.bytes_done),
        format_bytes(v.bytes_total)
    );
    if let Some(r) = v.rate_bps {
        s.push_str(&format!(", {}", format_rate(r)));
    }
    if let Some(eta) = v.eta_s {
        s.push_str(&format!(", {eta:.0} s left"));
    }
    s
}

/// `jobs`: one line a job.
pub fn list(json: bool, jobs: &[JobView]) {
    if json {
        print_document("longhaul-jobs", json!({ "jobs": jobs }));
        return;
    }
    if jobs.is_empty() {
        errln!("longhaul: no jobs of yours on this server");
        return;
    }
    for v in jobs {
        outln!(
            "{}  {:<24} {} -> {}  {} files, {} failed; {}",
            escaped(&v.id),
            state_words(v),
            escaped(&v.source),
            escaped(&v.dest),
            v.files.total(),
            v.files.failed,
            progress(v)
        );
    }
}

fn file_line(f: &FileView) -> String {
    let mut s = format!(
        "  {:<10} {:>10}  attempts {}  {}",
        f.state.word(),
        format_bytes(f.size),
        f.attempts,
        escaped(&f.path)
    );
    if let Some(e) = &f.error {
        s.push_str(&format!(": {}", escaped(e)));
    }
    if f.permanent {
        s.push_str(" (for good: not retried)");
    }
    s
}

/// A cancelled job's partial files at one far end: removed, or not yet.
fn discard_line(d: &DiscardView) -> String {
    let end = escaped(&d.end);
    let mut s = match d.state {
        DiscardState::Done => format!("  partial files on {end}: {} removed", d.removed),
        DiscardState::Pending => format!(
            "  partial files on {end}: discard pending (tried {} time(s){})",
            d.tries,
            d.next_try
                .map(|at| format!(
                    ", again in {:.0} s",
                    (at - longhaul_jobs::now() as f64).max(0.0)
                ))
                .unwrap_or_default()
        ),
        DiscardState::GivenUp => format!(
            "  partial files on {end}: left there, given up after {} tries",
            d.tries
        ),
    };
    if let Some(e) = d.error.as_ref().filter(|_| d.state != DiscardState::Done) {
        s.push_str(&format!(": {}", escaped(e)));
    }
    s
}

/// `jobs show`, `jobs wait`: the job, its attempts, a page of its files.
pub fn show(json: bool, answer: &JobAnswer, with_files: bool) {
    let JobAnswer::Show {
        job: v,
        files,
        files_total,
    } = answer
    else {
        return;
    };
    if json {
        print_document(
            "longhaul-job-show",
            json!({"job": v, "files": files, "files_total": files_total}),
        );
        return;
    }
    outln!("job {}: {}", escaped(&v.id), state_words(v));
    outln!(
        "  {} {} -> {}",
        v.kind.word(),
        escaped(&v.source),
        escaped(&v.dest)
    );
    outln!(
        "  files: {} finished, {} failed, {} submitted, {} cancelled; {}",
        v.files.finished,
        v.files.failed,
        v.files.submitted,
        v.files.cancelled,
        progress(v)
    );
    outln!(
        "  attempts: {} (retries {}){}; created {} UTC, capabilities until {} UTC",
        v.attempts,
        v.retries,
        match v.every_s {
            Some(e) => format!("; every {e} s, {} runs so far", v.runs),
            None => String::new(),
        },
        utc(v.created).unwrap_or_default(),
        utc(v.expires).unwrap_or_default()
    );
    if let Some(e) = &v.error {
        outln!("  error: {}", escaped(e));
    }
    for a in &v.history {
        outln!(
            "  attempt {} on {}: {}, {} files, {} ({} resumed){}",
            a.attempt,
            escaped(&a.worker),
            escaped(&a.outcome),
            a.files,
            format_bytes(a.bytes),
            format_bytes(a.resumed_bytes),
            a.error
                .as_ref()
                .map(|e| format!(": {}", escaped(e)))
                .unwrap_or_default()
        );
    }
    for d in &v.discards {
        outln!("{}", discard_line(d));
    }
    if with_files && !files.is_empty() {
        outln!("  files ({} of {files_total}):", files.len());
        for f in files {
            outln!("{}", file_line(f));
        }
    }
}

/// `jobs cancel`, `jobs retry`.
pub fn done(json: bool, answer: &JobAnswer) {
    let (id, what, files) = match answer {
        JobAnswer::Cancelled { id } => (id, "cancelled", None),
        JobAnswer::Retried { id, files } => (id, "retried", Some(*files)),
        _ => return,
    };
    if json {
        print_document(
            "longhaul-job-command",
            json!({"id": id, "done": what, "files": files}),
        );
        return;
    }
    match files {
        Some(n) => errln!("longhaul: job {id}: {n} failed file(s) go again"),
        None => errln!("longhaul: job {id} is cancelled: its streams stop, its partial files are removed and its capabilities revoked"),
    }
}
