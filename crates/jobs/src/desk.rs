//! What a job server answers its clients (the engine's `JobDesk`): a job
//! is checked before it is kept (well formed, within the budgets, its end
//! on this server within an export the submitting grant may use, no more
//! than the grant's share of live jobs), and belongs to the grant that
//! submitted it: another grant can neither see nor steer it, and hears the
//! same "no such job" whether it exists or not.

use std::sync::Arc;

use base64::Engine as _;
use longhaul_engine::server::jobs::{JobDesk, Requester};
use longhaul_engine::xfer::{beneath, confine, Export};
use longhaul_proto::job::{JobAnswer, JobCommand, JobKind, JobSpec, JobState, FILES_PAGE_MAX};
use longhaul_proto::msg::RefuseCode;
use longhaul_proto::units::escaped;

use crate::runner::Runner;
use crate::store::{FileQuery, JobRow, JobStore, StoreError};
use crate::{now, random, view, JobsConfig};

/// What a notification secret starts with, so that a scrubber or a person
/// can tell one.
pub const NOTIFY_SECRET_PREFIX: &str = "lh1n_";

pub struct Desk {
    store: Arc<dyn JobStore>,
    cfg: Arc<JobsConfig>,
    runner: Arc<Runner>,
}

type Refusal = (RefuseCode, String);

fn failed(e: StoreError) -> Refusal {
    tracing::warn!("{e}");
    (RefuseCode::ServerError, e.to_string())
}

fn bad(m: impl Into<String>) -> Refusal {
    (RefuseCode::BadRequest, m.into())
}

/// The one answer for a job that is not the asker's, or is not there.
fn not_yours(id: &str) -> Refusal {
    bad(format!(
        "no job {} of yours on this server (`longhaul jobs` lists them)",
        escaped(&id.chars().take(40).collect::<String>())
    ))
}

/// A job's path on a host over ssh, as the job server will write it to
/// reach it (`HOST:path`), that names a path there: `HOST:5310:x` would
/// name a longhaul server on that host, and `HOST:x://y` a URL's.
fn ssh_path(host: &str, path: &str) -> Result<(), Refusal> {
    let read = longhaul_engine::ssh::Target::parse(&format!("{host}:{path}"));
    if read.is_some_and(|t| t.path == path) {
        return Ok(());
    }
    Err(bad(format!(
        "'{}:{}' names no path over ssh (it reads as a longhaul server's or a URL): write the path as ./{}",
        escaped(host),
        escaped(path),
        escaped(path)
    )))
}

impl Desk {
    pub fn new(store: Arc<dyn JobStore>, cfg: Arc<JobsConfig>, runner: Arc<Runner>) -> Desk {
        Desk { store, cfg, runner }
    }

    fn export(&self, name: &str) -> Result<&Export, Refusal> {
        self.cfg
            .exports
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                bad(format!(
                    "no export named '{}' on the job server",
                    escaped(name)
                ))
            })
    }

    /// The job's end on this server: an export the grant may read (the
    /// source) or write (the destination), its paths beneath it; a source
    /// that is there, a directory only with `-r` (refused now, as `cp`
    /// refuses it, rather than found at the first attempt).
    fn check_local_end(
        &self,
        who: &Requester,
        spec: &JobSpec,
        kind: JobKind,
    ) -> Result<(), Refusal> {
        let (end, write) = match kind {
            JobKind::Push => (&spec.source, false),
            JobKind::Pull => (&spec.dest, true),
            JobKind::ThirdParty => return Ok(()),
        };
        let ex = self.export(&end.export)?;
        let allowed = if write {
            who.access.check_write(ex)
        } else {
            who.access.check_read(ex)
        };
        allowed.map_err(|m| (RefuseCode::Unauthorized, m))?;
        if write && ex.read_only {
            return Err(bad(format!("export '{}' is read-only", ex.name)));
        }
        let recursive = spec.options.recursive;
        for p in &end.paths {
            let r = beneath(&ex.root, p).map_err(|e| bad(e.to_string()))?;
            confine(&ex.root, &r).map_err(|e| bad(e.to_string()))?;
            if write {
                continue;
            }
            let shown = format!("{}:{}", ex.name, escaped(p));
            match std::fs::symlink_metadata(&r) {
                Err(_) => return Err(bad(format!("{shown} does not exist"))),
                Ok(m) if m.is_dir() && !recursive => {
                    return Err(bad(longhaul_engine::xfer::source::directory_without_r(
                        &shown,
                    )))
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// A pull's destination here: the first directory of its path that does
    /// not exist yet ([`JobRow::made`]).
    fn made_by(&self, spec: &JobSpec, kind: JobKind) -> Option<String> {
        if kind != JobKind::Pull {
            return None;
        }
        let ex = self.export(&spec.dest.export).ok()?;
        let dest = beneath(&ex.root, spec.dest.paths.first()?).ok()?;
        longhaul_engine::xfer::sink::first_missing(&ex.root, &dest)
    }

    /// A far end over ssh: a host this server's admin allowed (the job
    /// runs ssh as this server's user, never as the submitter).
    fn check_ssh_ends(&self, spec: &JobSpec) -> Result<(), Refusal> {
        for end in [&spec.source, &spec.dest] {
            if let Some(h) = &end.ssh {
                if !self.cfg.ssh_hosts.iter().any(|a| a == h) {
                    return Err(bad(format!(
                        "this job server reaches no host '{}' over ssh for its jobs (its admin may allow one with `serve --jobs-ssh [USER@]HOST`)",
                        escaped(h)
                    )));
                }
                end.paths.iter().try_for_each(|p| ssh_path(h, p))?;
            }
        }
        Ok(())
    }

    /// The far ends' credentials: a pinned certificate each.
    fn check_far_ends(spec: &JobSpec) -> Result<u64, Refusal> {
        let mut lifetime = u64::from(longhaul_proto::job::MAX_LIFETIME_S);
        for end in [&spec.source, &spec.dest] {
            if let Some(c) = &end.credential {
                longhaul_engine::net::tls::parse_fingerprint(&c.fingerprint).map_err(bad)?;
                lifetime = lifetime.min(u64::from(c.lifetime_s));
            }
        }
        Ok(lifetime)
    }

    fn check(&self, who: &Requester, spec: &JobSpec) -> Result<(JobKind, u64), Refusal> {
        let kind = spec.check().map_err(bad)?;
        self.check_local_end(who, spec, kind)?;
        self.check_ssh_ends(spec)?;
        let lifetime = Self::check_far_ends(spec)?;
        let o = &spec.options;
        longhaul_engine::xfer::client::compile_filter(
            &o.filter,
            spec.source.paths.iter().all(|p| p.ends_with('/')),
        )
        .map_err(bad)?;
        if let Some(every) = o.every_s {
            let least = self.cfg.min_every.as_secs().max(1);
            if every < least {
                return Err(bad(format!(
                    "--every {every}s is shorter than this server allows ({least} s, its --jobs-min-every)"
                )));
            }
        }
        let live = self.store.live_jobs_of(who.grant).map_err(failed)?;
        if live >= self.cfg.max_per_grant {
            return Err((
                RefuseCode::Limit,
                format!(
                    "your grant has {live} jobs that have not ended, this server's limit (--jobs-max-per-grant {}): wait for some, or cancel them",
                    self.cfg.max_per_grant
                ),
            ));
        }
        self.room_for_ended(who)?;
        Ok((kind, lifetime))
    }

    /// A grant keeps its `--jobs-max-per-grant` newest ended jobs; older
    /// ones go once nothing is left to do for them, so that submitting and
    /// cancelling in a loop cannot grow the store (nor every `jobs` list,
    /// which reads them all). A grant whose older ended jobs still hold
    /// capabilities (for `jobs retry`) as many again submits no more.
    fn room_for_ended(&self, who: &Requester) -> Result<(), Refusal> {
        let keep = self.cfg.max_per_grant;
        let ended = self.store.forget_ended(who.grant, keep).map_err(failed)?;
        if ended >= keep.saturating_mul(2) {
            return Err((
                RefuseCode::Limit,
                format!(
                    "your grant keeps {ended} ended jobs still holding capabilities (for `jobs retry`, or a discard still to do), twice this server's limit (--jobs-max-per-grant {keep}): retry or cancel some"
                ),
            ));
        }
        Ok(())
    }

    fn show(&self, who: &Requester, id: &str, q: FileQuery) -> Result<JobAnswer, Refusal> {
        let row = self.mine(who, id)?;
        let tally = self
            .store
            .tally(id, row.spec.options.retries)
            .map_err(failed)?;
        let limit = if q.limit == 0 {
            100
        } else {
            q.limit.min(FILES_PAGE_MAX)
        };
        let (files, files_total) = self
            .store
            .files(id, FileQuery { limit, ..q })
            .map_err(failed)?;
        Ok(JobAnswer::Show {
            job: Box::new(view::of(&row, &tally, true)),
            files: files.iter().map(view::file).collect(),
            files_total,
        })
    }

    /// The job `id`, if it is `who`'s.
    fn mine(&self, who: &Requester, id: &str) -> Result<JobRow, Refusal> {
        if !longhaul_proto::job::valid_id(id) {
            return Err(not_yours(id));
        }
        match self.store.get(id).map_err(failed)? {
            Some(row) if row.owner == who.grant => Ok(row),
            _ => Err(not_yours(id)),
        }
    }

    fn retry(&self, who: &Requester, id: &str) -> Result<JobAnswer, Refusal> {
        let mut row = self.mine(who, id)?;
        if !matches!(row.state, JobState::FinishedWithFailures | JobState::Failed) {
            return Err(bad(format!(
                "job {id} is {}: only a job that ended with failures is retried",
                row.state.word().replace('_', " ")
            )));
        }
        if row.revoked || now() >= row.expires {
            return Err(bad(format!(
                "job {id}'s capabilities have ended: submit it again"
            )));
        }
        let files = self.store.retry_failed(id).map_err(failed)?;
        let t = now();
        row.state = JobState::Submitted;
        row.attempts = 0;
        row.next_attempt = t;
        row.updated = t;
        row.error = None;
        row.notified = false;
        if !self.store.save(&row, None).map_err(failed)? {
            return Err(not_yours(id));
        }
        tracing::info!("{} retries job {id}: {files} file(s)", who.peer);
        self.runner.wake();
        Ok(JobAnswer::Retried {
            id: id.to_string(),
            files,
        })
    }
}

impl JobDesk for Desk {
    fn submit(&self, who: &Requester, spec: &JobSpec) -> Result<JobAnswer, Refusal> {
        let (kind, lifetime) = self.check(who, spec)?;
        let made = self.made_by(spec, kind);
        let t = now();
        let id = longhaul_proto::units::hex(&random::<8>());
        let notify_secret = spec.options.notify.as_ref().map(|_| {
            format!(
                "{NOTIFY_SECRET_PREFIX}{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<32>())
            )
        });
        let row = JobRow {
            id: id.clone(),
            owner: who.grant.to_string(),
            kind,
            state: JobState::Submitted,
            spec: spec.clone(),
            created: t,
            updated: t,
            expires: t.saturating_add(lifetime),
            next_attempt: t,
            attempts: 0,
            runs: 0,
            listed: false,
            cancel: false,
            error: None,
            worker: None,
            lease_until: 0,
            notify_secret: notify_secret.clone(),
            notified: false,
            revoked: false,
            history: Vec::new(),
            live_bytes: 0,
            live_bps: None,
            discards: Vec::new(),
            made,
        };
        self.store.insert(&row).map_err(failed)?;
        tracing::info!(
            "{} ({}) submitted job {id}: {} {} to {}",
            who.peer,
            who.grant,
            kind.word(),
            escaped(&spec.source.shown()),
            escaped(&spec.dest.shown())
        );
        self.runner.wake();
        Ok(JobAnswer::Accepted { id, notify_secret })
    }

    fn command(&self, who: &Requester, cmd: &JobCommand) -> Result<JobAnswer, Refusal> {
        match cmd {
            JobCommand::List {} => {
                let rows = self.store.list(Some(who.grant)).map_err(failed)?;
                let mut jobs = Vec::new();
                for row in rows {
                    let tally = self
                        .store
                        .tally(&row.id, row.spec.options.retries)
                        .map_err(failed)?;
                    jobs.push(view::of(&row, &tally, false));
                }
                Ok(JobAnswer::List { jobs })
            }
            JobCommand::Show {
                id,
                files_from,
                files_limit,
                state,
            } => self.show(
                who,
                id,
                FileQuery {
                    state: *state,
                    from: *files_from,
                    limit: *files_limit,
                },
            ),
            JobCommand::Cancel { id } => {
                self.mine(who, id)?;
                if !self.store.cancel(id, now()).map_err(failed)? {
                    return Err(bad(format!("job {id} has ended: nothing to cancel")));
                }
                tracing::info!("{} cancels job {id}", who.peer);
                self.runner.cancel(id);
                Ok(JobAnswer::Cancelled { id: id.clone() })
            }
            JobCommand::Retry { id } => self.retry(who, id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job server runs `ssh HOST` for a path only if `HOST:path` names
    /// a path there, never a longhaul server on that host nor a URL.
    #[test]
    fn an_ssh_path_that_reads_as_a_server_or_a_url_is_refused() {
        for (host, path) in [
            ("dtn9", "/scratch/in/"),
            ("me@dtn9", "run7"),
            ("dtn9", ""),
            ("dtn9", "./5310:x"),
        ] {
            assert!(ssh_path(host, path).is_ok(), "{host}:{path}");
        }
        for path in ["5310:data/x", "x://y"] {
            let e = ssh_path("dtn9", path).unwrap_err().1;
            assert!(e.contains("names no path over ssh"), "{e}");
        }
    }
}
