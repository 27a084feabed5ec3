//! `serve --jobs`: where a server's control sessions hand jobs' messages
//! (PROTOCOL.md 18). The jobs themselves (their store, the runner that
//! drives the copies, notifications) live above the engine, in
//! `longhaul-jobs`, behind [`JobDesk`]; the engine only checks who asks
//! and carries the answer, so that it depends on no database.

use std::sync::Arc;

use longhaul_proto::job::{JobAnswer, JobCommand, JobSpec};
use longhaul_proto::msg::{Message, RefuseCode};

use super::{auth, Shared};
use crate::net::conn::FramedConn;

/// Who asks, as the server authenticated them.
pub struct Requester<'a> {
    /// The grant's id (`anonymous` for an open server's clients): a job
    /// belongs to the grant that submitted it, and only it sees and steers
    /// the job.
    pub grant: &'a str,
    pub access: &'a auth::Access,
    /// The client's address, for logs.
    pub peer: &'a str,
}

/// What takes jobs on a server (`ServeConfig::jobs`).
pub trait JobDesk: Send + Sync {
    /// Checks a job and keeps it; `Accepted` with its id, or a refusal
    /// that says what is wrong.
    fn submit(&self, who: &Requester, spec: &JobSpec) -> Result<JobAnswer, (RefuseCode, String)>;
    /// Lists, shows, cancels or retries the requester's jobs.
    fn command(&self, who: &Requester, cmd: &JobCommand)
        -> Result<JobAnswer, (RefuseCode, String)>;
}

fn desk(shared: &Shared) -> Result<&Arc<dyn JobDesk>, (RefuseCode, String)> {
    shared.cfg.jobs.as_ref().ok_or_else(|| {
        (
            RefuseCode::BadRequest,
            "this server takes no jobs: its admin may start it with `longhaul serve --jobs`".into(),
        )
    })
}

fn requester<'a>(
    conn: &'a FramedConn,
    access: &'a auth::Access,
) -> Result<Requester<'a>, (RefuseCode, String)> {
    if access.is_anonymous() || access.scope.is_some() {
        return Err((
            RefuseCode::Unauthorized,
            "jobs are for authenticated clients only: pass --token-file FILE or set LONGHAUL_TOKEN"
                .into(),
        ));
    }
    Ok(Requester {
        grant: access.grant_label(),
        access,
        peer: conn.peer(),
    })
}

/// A job submitted: it carries capabilities, so it is taken inside TLS
/// only.
pub(super) fn serve_submit(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    spec: &JobSpec,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let desk = desk(shared)?;
    if !conn.is_tls() {
        return Err((
            RefuseCode::TlsRequired,
            "a job is submitted inside TLS only: it carries its far ends' capabilities".into(),
        ));
    }
    let answer = desk.submit(&requester(conn, access)?, spec)?;
    conn.send(&Message::JobAnswer(answer))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}

/// A command about the requester's jobs.
pub(super) fn serve_command(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    cmd: &JobCommand,
    access: &auth::Access,
) -> Result<(), (RefuseCode, String)> {
    let desk = desk(shared)?;
    let answer = desk.command(&requester(conn, access)?, cmd)?;
    conn.send(&Message::JobAnswer(answer))
        .map_err(|e| (RefuseCode::ServerError, e.to_string()))
}
