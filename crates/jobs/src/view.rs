//! A job as its owner sees it (`jobs`, `jobs show`, notifications): the
//! row and its files' tally, with no secret.

use longhaul_proto::job::{FileView, JobView};

use crate::store::{FileRow, JobRow, Tally};

/// `row` with its files counted, for people and `--json`.
pub fn of(row: &JobRow, tally: &Tally, history: bool) -> JobView {
    let o = &row.spec.options;
    let active = row.state == longhaul_proto::job::JobState::Active;
    let done = if active {
        tally.bytes_done.max(row.live_bytes.min(tally.bytes_total))
    } else {
        tally.bytes_done
    };
    let rate = row.live_bps.filter(|_| active);
    let eta = rate
        .filter(|r| *r > 0.0)
        .map(|r| tally.bytes_total.saturating_sub(done) as f64 * 8.0 / r);
    JobView {
        id: row.id.clone(),
        state: row.state,
        kind: row.kind,
        source: row.spec.source.shown(),
        dest: row.spec.dest.shown(),
        sync: o.sync.is_some(),
        every_s: o.every_s,
        created: row.created as f64,
        updated: row.updated as f64,
        expires: row.expires as f64,
        attempts: row.attempts,
        retries: o.retries,
        next_attempt: (row.state == longhaul_proto::job::JobState::Submitted)
            .then_some(row.next_attempt as f64),
        files: tally.counts,
        bytes_total: tally.bytes_total,
        bytes_done: done,
        rate_bps: rate,
        eta_s: eta,
        error: row.error.clone(),
        worker: row.worker.clone().filter(|_| active),
        runs: row.runs,
        history: if history {
            row.history.clone()
        } else {
            Vec::new()
        },
        discards: row.discards.clone(),
    }
}

pub fn file(f: &FileRow) -> FileView {
    FileView {
        path: f.path.clone(),
        state: f.state,
        size: f.size,
        attempts: f.attempts,
        error: f.error.clone(),
        permanent: f.permanent,
    }
}
