//! `cp --ranks auto`: this process is one rank of a transfer across many
//! nodes (`longhaul-fleet`). Each rank says its own result in a line on
//! stderr; the rank that finishes the run prints the one result of all.

use std::sync::Arc;

use longhaul_engine::reach::{self, End};
use longhaul_engine::server::oneshot::Admits;
use longhaul_engine::xfer::client::CpOptions;
use longhaul_fleet::ranks::{self, Rank};
use longhaul_fleet::run::{self, Fleet, Mode};

use super::plan::Plan;
use super::{ended, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, CpArgs, FleetArgs};
use crate::exit;
use crate::print::fleet as printed;

/// One rank's `cp` of `plan`.
pub fn rank(plan: &Plan, a: &CpArgs, archive: &ArchiveArgs) -> Outcome {
    if plan.sync.is_some() || plan.dry_run {
        return Err(usage(
            "a fleet copies (`cp --ranks`); run the same command again to resume it, `sync` and `--dry-run` are for one node",
        ));
    }
    let rank = rank_of(&a.fleet)?;
    let mode = mode_of(plan, a)?;
    let run = plan.new_run(a);
    // The sessions report into the archive only: under a launcher many
    // ranks share one terminal, so each says one line, and one of them
    // the result.
    let mut reporter = super::with_archive(
        Box::new(longhaul_engine::report::Discard),
        super::archive_reporter(archive, &run),
    );
    let mut cp = plan.options(a, None)?;
    refuse_remote_sources(plan)?;
    // `HOST:path`: this rank's own far end over ssh (each rank its own,
    // with its own secret), admitting the rank's sessions. With
    // `--servers` the destination names an export on those servers.
    let far = match plan.dest.ssh() {
        Some(_) => Some(reach_over_ssh(a, &plan.dest, &mut cp)?),
        None => None,
    };
    if !a.fleet.servers.is_empty() {
        cp.dest = to_server(&plan.dest, &a.fleet.servers, rank.rank)?;
    }
    let json = a.json;
    crate::errln!(
        "longhaul: rank {} of {} ({})",
        rank.rank,
        rank.size,
        rank.launcher
    );
    let fleet = Fleet {
        rank,
        mode,
        cp,
        wait: a.fleet.wait,
        note: Arc::new(|s: &str| crate::errln!("longhaul: {s}")),
        job: ranks::job_from_env(|k| std::env::var(k).ok()),
    };
    let ran = run::run(&fleet, reporter.as_mut());
    let ran = match far {
        Some(far) => {
            let ran = ran.map_err(|e| Failure::from(far.explain(e)));
            far.finish();
            ran
        }
        None => ran.map_err(Failure::from),
    };
    let outcome = ran.map(|o| {
        printed::rank_line(&o.rank);
        reporter.transfer_summary(&printed::as_cp_summary(&o.rank));
        match o.summary {
            Some(s) => {
                if json {
                    crate::print::json::fleet(&s);
                } else {
                    printed::human(&s);
                }
                if s.verified {
                    exit::OK
                } else {
                    exit::PARTIAL
                }
            }
            None if o.rank.failed.is_empty() => exit::OK,
            None => exit::PARTIAL,
        }
    });
    ended(reporter.as_mut(), outcome)
}

/// A fleet's ranks push this node's files, or order a server's files
/// pushed to another (a third-party copy: remote sources and a remote
/// destination, both servers, static shares). A pull, or a remote end over
/// ssh, is refused, saying what to run instead.
fn refuse_remote_sources(plan: &Plan) -> Result<(), Failure> {
    let Some(s) = plan.sources.iter().find(|s| s.is_remote()) else {
        return Ok(());
    };
    let (s, dest) = (s.arg(), plan.dest.arg());
    if !plan.dest.is_remote() {
        return Err(usage(format!(
            "'{s}' is remote and the destination is not: a fleet's ranks push, they do not pull. Run the fleet on the source's nodes, or name a server as the destination for a third-party copy"
        )));
    }
    if let Some(s) = plan.sources.iter().find(|s| s.server().is_none()) {
        return Err(usage(format!(
            "'{}': a fleet of third-party copies names servers (longhaul://HOST/EXPORT/path or HOST:PORT:EXPORT/path), not hosts over ssh or local paths; for an ssh host run `longhaul cp A:src B:dst` without --ranks",
            s.arg()
        )));
    }
    if plan.dest.server().is_none() {
        return Err(usage(format!(
            "'{dest}': a fleet of third-party copies pushes to a server (longhaul://HOST/EXPORT/path, HOST:PORT:EXPORT/path, or --servers), not to a host over ssh"
        )));
    }
    Ok(())
}

/// Sessions a rank's far end over ssh admits. Static shares: the first
/// listing (see [`reach_over_ssh`]), then its share and the final check,
/// each with its retries. A queue rank opens a session for each
/// `FeedConfig::span` of work (about a minute) for as long as the queue
/// lasts, which no count foresees: its far end admits sessions while the
/// rank's ssh channel lives, a few at once (`--sessions open`, PROTOCOL.md
/// 16).
fn fleet_sessions(queue: bool, retries: u32) -> Admits {
    if queue {
        return Admits::Open;
    }
    Admits::Sessions(
        2u32.saturating_mul(retries.saturating_add(1))
            .saturating_add(1)
            .clamp(3, longhaul_engine::server::oneshot::SESSIONS_MAX),
    )
}

/// Starts this rank's far end on the destination's host (`dest`, over
/// ssh) and points the transfer at it.
fn reach_over_ssh(a: &CpArgs, dest: &End, cp: &mut CpOptions) -> Result<reach::FarEnd, Failure> {
    let mut dest = [dest.clone()];
    let far = reach::reach_ends(
        &mut dest,
        &mut cp.client,
        // A rank runs under srun or mpirun: nobody answers a prompt.
        &reach::SshOptions {
            unattended: true,
            ..a.ssh.options()
        },
        fleet_sessions(a.fleet.queue.is_some(), cp.retries),
    )?
    .ok_or_else(|| Failure::internal("no ssh path after all"))?;
    let [dest] = dest;
    // Claimed at once, by a listing of `/`: the rank may wait for the
    // manifest longer than a far end waits for its first session; this
    // also says now, not after that wait, whether the far end is reachable.
    let host = dest.server().map(|r| r.host.as_str()).unwrap_or_default();
    let root = End::on_server(longhaul_proto::xfer::Remote {
        host: host.to_string(),
        export: reach::ROOT_EXPORT.to_string(),
        path: String::new(),
        dir: true,
    });
    if let Err(e) = longhaul_engine::xfer::client::ls(&root, false, &cp.client) {
        let f = far.explain(e).into();
        far.finish();
        return Err(f);
    }
    cp.dest = dest;
    // Its port is new each run: nothing to remember a rate by.
    cp.path_memory = None;
    Ok(far)
}

fn rank_of(f: &FleetArgs) -> Result<Rank, Failure> {
    use crate::args::Ranks;
    if let (Some(Ranks::Count(n)), Some(s)) = (f.ranks, f.size) {
        if n != s {
            return Err(usage(format!(
                "--ranks {n} and --size {s} (its old name) disagree: give --ranks N alone"
            )));
        }
    }
    let env = |k: &str| std::env::var(k).ok();
    match (f.ranks, f.rank, f.count()) {
        (Some(Ranks::Auto), Some(_), _) => Err(usage(
            "give --ranks auto (the launcher says the rank) or --rank R --ranks N, not both",
        )),
        (_, Some(r), Some(n)) => ranks::from_flags(r, n).map_err(usage),
        (_, Some(_), None) => Err(usage("--rank R needs the number of ranks: add --ranks N")),
        (Some(_), None, n) => ranks::from_env(env, n).map_err(usage),
        (None, None, _) => unreachable!("called for a rank only"),
    }
}

fn mode_of(plan: &Plan, a: &CpArgs) -> Result<Mode, Failure> {
    let f = &a.fleet;
    #[cfg(not(feature = "queue"))]
    if f.queue.is_some() {
        return Err(usage(run::NO_QUEUE));
    }
    #[cfg(feature = "queue")]
    if f.queue
        .as_deref()
        .is_some_and(longhaul_fleet::dbauth::url_has_password)
    {
        crate::errln!(
            "longhaul: warning: the --queue URL holds a password, which every user of this node sees in `ps` (the archive keeps the command without it); {}",
            longhaul_fleet::dbauth::WHERE_PASSWORDS_GO
        );
    }
    match (&f.queue, &f.run_dir) {
        (Some(url), _) => Ok(Mode::Queue {
            url: url.clone(),
            run_id: f.run_id.clone().unwrap_or_else(|| default_run_id(plan.ends())),
            unit_bytes: f.unit,
            unit_files: UNIT_FILES,
            lease: f.lease,
        }),
        (None, Some(dir)) => Ok(Mode::Static {
            run_dir: dir.clone(),
        }),
        (None, None) => Err(usage(
            "a rank needs --run-dir DIR (static shares, a directory every rank sees) or --queue postgres://... (a work queue)",
        )),
    }
}

/// `dest` on this rank's server of `servers`.
fn to_server(dest: &End, servers: &[String], rank: u32) -> Result<End, Failure> {
    let r = dest.server().ok_or_else(|| {
        usage("--servers needs a remote destination (HOST:EXPORT/path): a fleet pushes")
    })?;
    Ok(End::on_server(longhaul_proto::xfer::Remote {
        host: servers[rank as usize % servers.len()].clone(),
        ..r.clone()
    }))
}

/// Small files one queue unit carries at most.
const UNIT_FILES: u32 = 2_000;

/// The run id of a command: its sources (absolute) and destination's
/// export and path (not its host: ranks may push to different servers of
/// one site, `--servers`; over ssh, the far path's first part and the rest).
fn default_run_id<'a>(ends: impl IntoIterator<Item = &'a End>) -> String {
    let mut h = blake3::Hasher::new();
    for end in ends {
        let named = match end {
            End::Server { at, .. } => format!("{}/{}", at.export, at.path),
            End::Ssh { at, .. } => {
                let p = at.path.trim_start_matches('/');
                let (first, rest) = p.split_once('/').unwrap_or((p, ""));
                format!("{first}/{}", rest.trim_end_matches('/'))
            }
            End::Local(p) => {
                std::path::absolute(p).map_or_else(|_| p.clone(), |a| a.display().to_string())
            }
        };
        h.update(named.as_bytes());
        h.update(&[0]);
    }
    format!("cp-{}", &h.finalize().to_hex()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_pushes_to_its_server_with_the_same_export_and_path() {
        let s = vec!["dtn1".to_string(), "dtn2:5999".to_string()];
        let to = |d: &str, rank| {
            Some(
                to_server(&End::read_server(d), &s, rank)
                    .ok()?
                    .arg()
                    .to_string(),
            )
        };
        assert_eq!(to("far:data/in/", 0).unwrap(), "longhaul://dtn1/data/in/");
        assert_eq!(
            to("far:7:data/in/x", 3).unwrap(),
            "longhaul://dtn2:5999/data/in/x"
        );
        assert_eq!(to("far:data", 1).unwrap(), "longhaul://dtn2:5999/data/");
        assert!(to("/local/dir", 0).is_none());
    }

    #[test]
    fn a_run_id_names_the_sources_and_destination() {
        let id = |paths: &[&str]| {
            let ends: Vec<End> = paths.iter().map(|p| End::read(p)).collect();
            default_run_id(&ends)
        };
        let a = id(&["/a", "h:data/x"]);
        assert_eq!(a, id(&["/a", "h:data/x"]));
        assert_ne!(a, id(&["/b", "h:data/x"]));
        assert_eq!(
            a,
            id(&["/a", "other:7:data/x"]),
            "the same run through another server"
        );
        assert!(a.starts_with("cp-"));
    }
}
