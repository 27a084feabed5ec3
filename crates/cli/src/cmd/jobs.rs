//! `submit` and `jobs`: a copy or sync handed to a server that runs it to
//! the end unattended, and its owner's view of it afterwards.
//!
//! `submit` asks each far end (a server other than the job server) for a
//! capability scoped to this job (its paths, push or read, its lifetime),
//! hands the job with those capabilities to the job server, prints the
//! job's id and exits. The user's token goes only to the servers it was
//! given for, as in any command; the job holds no token.

use std::time::{Duration, Instant};

use longhaul_engine::net::dial::{host_key, ClientOptions};
use longhaul_engine::ssh::Target;
use longhaul_engine::xfer::jobcaps::{self, JobCapability};
use longhaul_engine::EngineError;
use longhaul_proto::job::{
    JobAnswer, JobCommand, JobCredential, JobEnd, JobOptions, JobSpec, JobState,
};
use longhaul_proto::msg::Message;
use longhaul_proto::xfer::copy::{CapabilityOp, GrantRequest, OrderScope};
use longhaul_proto::xfer::{parse_remote, Remote, SyncOptions};

use super::{usage, Failure, Outcome};
use crate::args::{JobServerArgs, JobsArgs, JobsCommand, SubmitArgs};
use crate::exit;
use crate::print::jobs as print;

fn client(
    security: &crate::args::SecurityArgs,
    connect_timeout: Duration,
) -> Result<ClientOptions, Failure> {
    Ok(ClientOptions {
        connect_timeout,
        security: security.security()?,
        interrupt: super::interrupt_flag(),
        ..ClientOptions::default()
    })
}

/// The ends of a job as the command line names them.
struct Ends {
    sources: Vec<Remote>,
    dest: Remote,
}

fn ends(paths: &[String]) -> Result<Ends, Failure> {
    let (dest, sources) = paths.split_last().ok_or_else(|| usage("name SRC... DST"))?;
    let remote = |p: &String| {
        parse_remote(p).ok_or_else(|| {
            usage(format!(
                "'{p}' is not on a server: a job runs on a server, between servers; put the files in a server's export and name them longhaul://HOST/EXPORT/path (or copy from here with `longhaul cp`, which lasts as long as this session)"
            ))
        })
    };
    let sources = sources.iter().map(remote).collect::<Result<Vec<_>, _>>()?;
    let first = &sources[0];
    if sources
        .iter()
        .any(|s| s.host != first.host || s.export != first.export)
    {
        return Err(usage("a job's sources are on one server and in one export"));
    }
    Ok(Ends {
        dest: remote(dest)?,
        sources,
    })
}

/// A far end's capability for this job, asked of it.
fn capability(
    end: &Remote,
    req: GrantRequest,
    o: &ClientOptions,
) -> Result<(String, JobCapability), Failure> {
    let host = end.host.clone();
    let cap = jobcaps::ask(&host, o, req)
        .map_err(|e| said_by(&host, "gives no capability for this job", e))?;
    Ok((host, cap))
}

/// `e`, saying which server it came from: a refusal alone ("unknown or
/// revoked token") does not tell which of a job's servers refused.
fn said_by(server: &str, what: &str, e: longhaul_engine::EngineError) -> Failure {
    let f = Failure::from(e);
    Failure {
        message: format!("{server} {what}: {}", f.message),
        ..f
    }
}

fn credential(c: &JobCapability) -> Option<JobCredential> {
    Some(JobCredential {
        fingerprint: c.fingerprint.clone(),
        capability: c.capability.clone(),
        lifetime_s: c.lifetime_s,
    })
}

/// `submit`: the far ends' capabilities asked for (the destination's
/// first: a third-party job's source pins its certificate in its own), the
/// job handed to the job server; the capabilities given back if it is not
/// taken.
pub fn submit(a: SubmitArgs) -> Outcome {
    if let Some((spec, server)) = over_ssh(&a)? {
        let o = client(&a.security, a.connect_timeout)?;
        return hand_over(&a, &server, spec, &o);
    }
    let ends = ends(&a.paths)?;
    let server = a
        .via
        .clone()
        .unwrap_or_else(|| ends.sources[0].host.clone());
    let key = host_key(&server);
    let at_server = |r: &Remote| host_key(&r.host) == key;
    let (source_here, dest_here) = (at_server(&ends.sources[0]), at_server(&ends.dest));
    if source_here && dest_here {
        return Err(usage(format!("the source and the destination are both on {server}: a job moves data between servers (copy within one with cp there)")));
    }
    let o = client(&a.security, a.connect_timeout)?;
    let paths: Vec<String> = ends
        .sources
        .iter()
        .zip(&a.paths)
        .map(|(r, named)| source_path(r, named))
        .collect();
    let dest_cap = match dest_here {
        true => None,
        false => Some(capability(
            &ends.dest,
            push_request(&ends.dest, a.lifetime),
            &o,
        )?),
    };
    let source_cap = match source_here {
        true => None,
        false => {
            let to = dest_cap.as_ref().map(|(_, c)| c);
            let req = source_request(&ends, &paths, a.lifetime, to);
            match capability(&ends.sources[0], req, &o) {
                Ok(c) => Some(c),
                Err(f) => {
                    give_back(&o, dest_cap.iter());
                    return Err(f);
                }
            }
        }
    };
    let spec = JobSpec {
        source: JobEnd {
            host: (!source_here).then(|| ends.sources[0].host.clone()),
            export: ends.sources[0].export.clone(),
            paths,
            dir: false,
            credential: source_cap.as_ref().and_then(|(_, c)| credential(c)),
            ssh: None,
        },
        dest: JobEnd {
            host: (!dest_here).then(|| ends.dest.host.clone()),
            export: ends.dest.export.clone(),
            paths: vec![ends.dest.path.clone()],
            dir: ends.dest.dir,
            credential: dest_cap.as_ref().and_then(|(_, c)| credential(c)),
            ssh: None,
        },
        options: options(&a),
    };
    let handed = hand_over(&a, &server, spec, &o);
    if handed.is_err() {
        give_back(&o, dest_cap.iter().chain(source_cap.iter()));
    }
    handed
}

/// Hands `spec` to the job server and prints the job's id.
fn hand_over(a: &SubmitArgs, server: &str, spec: JobSpec, o: &ClientOptions) -> Outcome {
    match jobcaps::ask_job_server(server, o, Message::JobSubmit(Box::new(spec))) {
        Ok(JobAnswer::Accepted { id, notify_secret }) => {
            print::submitted(a.json, &id, server, notify_secret.as_deref());
            Ok(exit::OK)
        }
        Err(e) => Err(said_by(server, "(the job server) did not take the job", e)),
        Ok(_) => Err(Failure::internal(format!(
            "{server} answered the job with something else"
        ))),
    }
}

/// A job with a far end over ssh (`[USER@]HOST:path`, no server there):
/// the job and the job server (the other end's: `--via` may only name
/// it), or None for a job between servers. The job server reaches the
/// host with its own ssh, if its admin allowed it (`serve --jobs-ssh`);
/// no capability is asked of anyone.
fn over_ssh(a: &SubmitArgs) -> Result<Option<(JobSpec, String)>, Failure> {
    let (dest, sources) = a
        .paths
        .split_last()
        .ok_or_else(|| usage("name SRC... DST"))?;
    let ssh_sources: Vec<Option<Target>> = sources.iter().map(|s| Target::parse(s)).collect();
    let ssh_dest = Target::parse(dest);
    if ssh_dest.is_none() && ssh_sources.iter().all(Option::is_none) {
        return Ok(None);
    }
    let server_end = |p: &str| {
        parse_remote(p).ok_or_else(|| {
            usage(format!(
                "'{p}': a job with a host over ssh runs between it and a longhaul server (the job server): name that end longhaul://HOST/EXPORT/path"
            ))
        })
    };
    let ssh_end = |t: &Target, paths: Vec<String>| JobEnd {
        host: None,
        export: String::new(),
        paths,
        dir: false,
        credential: None,
        ssh: Some(t.dest.clone()),
    };
    let (source, dest, server) = match ssh_dest {
        Some(t) => {
            let here: Vec<Remote> = sources
                .iter()
                .map(|p| server_end(p))
                .collect::<Result<_, _>>()?;
            let paths = here
                .iter()
                .zip(sources)
                .map(|(r, p)| source_path(r, p))
                .collect();
            let end = JobEnd {
                host: None,
                export: here[0].export.clone(),
                paths,
                dir: false,
                credential: None,
                ssh: None,
            };
            (end, ssh_end(&t, vec![t.path.clone()]), here[0].host.clone())
        }
        None => {
            let Some(Some(first)) = ssh_sources.first().cloned() else {
                return Err(usage("a job's sources are on one host"));
            };
            if ssh_sources
                .iter()
                .any(|t| t.as_ref().is_none_or(|t| t.dest != first.dest))
            {
                return Err(usage("a job's sources over ssh are on one host"));
            }
            let paths = ssh_sources.into_iter().flatten().map(|t| t.path).collect();
            let r = server_end(dest)?;
            let end = JobEnd {
                host: None,
                export: r.export.clone(),
                paths: vec![r.path.clone()],
                dir: r.dir,
                credential: None,
                ssh: None,
            };
            (ssh_end(&first, paths), end, r.host.clone())
        }
    };
    if a.via
        .as_ref()
        .is_some_and(|v| host_key(v) != host_key(&server))
    {
        return Err(usage(format!(
            "a job with a host over ssh runs on the server of its other end ({server}), which reaches the host with its own ssh if its admin allows it (`serve --jobs-ssh [USER@]HOST`): leave out --via or name that server; a job server relays no data between two other hosts"
        )));
    }
    let spec = JobSpec {
        source,
        dest,
        options: options(a),
    };
    Ok(Some((spec, server)))
}

/// The destination's capability for a job: one push into its path.
fn push_request(dest: &Remote, lifetime_s: u32) -> GrantRequest {
    GrantRequest {
        export: dest.export.clone(),
        dest: dest.path.clone(),
        dest_dir: dest.dir,
        lifetime_s,
        ..GrantRequest::default()
    }
}

/// The source's capability for a job: to read its `paths` (a pull), or,
/// when the job server holds neither end, to order their copy to the
/// destination whose capability is `dest` (that destination's address,
/// certificate and path, exactly).
fn source_request(
    ends: &Ends,
    paths: &[String],
    lifetime_s: u32,
    dest: Option<&JobCapability>,
) -> GrantRequest {
    let order = dest.map(|d| OrderScope {
        target: ends.dest.host.clone(),
        fingerprint: d.fingerprint.clone(),
        dest_export: ends.dest.export.clone(),
        dest: ends.dest.path.clone(),
        dest_dir: ends.dest.dir,
    });
    GrantRequest {
        export: ends.sources[0].export.clone(),
        op: if order.is_some() {
            CapabilityOp::Order
        } else {
            CapabilityOp::Pull
        },
        sources: paths.to_vec(),
        order,
        lifetime_s,
        ..GrantRequest::default()
    }
}

/// Revokes the capabilities of a job no one took.
fn give_back<'a>(o: &ClientOptions, held: impl Iterator<Item = &'a (String, JobCapability)>) {
    for (far, cap) in held {
        let revoked = jobcaps::presenting(o, &cap.fingerprint, &cap.capability)
            .and_then(|p| jobcaps::revoke(far, &p));
        if let Err(e) = revoked {
            tracing::warn!("the capability {far} gave for the job could not be revoked ({e}); it ends with its lifetime");
        }
    }
}

/// A source's path within its export as a pull names it: a trailing `/`
/// kept (its contents), the export's root as `/`.
fn source_path(r: &Remote, named: &str) -> String {
    match (named.ends_with('/'), r.path.is_empty()) {
        (true, false) => format!("{}/", r.path),
        (true, true) => "/".into(),
        _ => r.path.clone(),
    }
}

fn options(a: &SubmitArgs) -> JobOptions {
    JobOptions {
        recursive: a.recursive || a.archive_mode || a.sync,
        preserve: a.preserve || a.archive_mode,
        mkpath: a.mkpath,
        verify: a.verify,
        sync: a.sync.then_some(SyncOptions {
            checksum: a.checksum,
            delete: a.delete,
        }),
        filter: a.filter.rules(),
        compress: a
            .compress
            .then_some(longhaul_proto::xfer::compress::DEFAULT_LEVEL),
        streams: a.streams,
        chunk_size: a.chunk,
        rate: a.rate.or(a.bwlimit),
        retries: a.retries,
        every_s: a.every.map(|d| d.as_secs().max(1)),
        notify: a.notify.clone(),
        mail: a.mail.clone(),
    }
}

/// The job server of a `jobs` command: the subcommand's `--via`, else
/// the parent's.
fn job_server<'a>(
    sub: &'a JobServerArgs,
    parent: &'a JobServerArgs,
) -> Result<(String, &'a JobServerArgs), Failure> {
    let chosen = if sub.via.is_some() { sub } else { parent };
    let via = chosen.via.clone().ok_or_else(|| {
        usage("name the job server: --via HOST[:PORT] (or set LONGHAUL_JOB_SERVER)")
    })?;
    Ok((via, chosen))
}

fn ask(server: &str, s: &JobServerArgs, cmd: JobCommand) -> Result<JobAnswer, Failure> {
    let o = client(&s.security, s.connect_timeout)?;
    jobcaps::ask_job_server(server, &o, Message::JobCommand(cmd)).map_err(Failure::from)
}

/// `jobs [show|wait|cancel|retry]`.
pub fn jobs(a: JobsArgs) -> Outcome {
    let parent = a.server.clone();
    match a.command {
        None => {
            let (server, s) = job_server(&parent, &parent)?;
            match ask(&server, s, JobCommand::List {})? {
                JobAnswer::List { jobs } => print::list(s.json, &jobs),
                _ => return Err(Failure::internal("the job server answered something else")),
            }
            Ok(exit::OK)
        }
        Some(JobsCommand::Show {
            id,
            files,
            state,
            server,
        }) => {
            let (host, s) = job_server(&server, &parent)?;
            let cmd = JobCommand::Show {
                id,
                files_from: 0,
                files_limit: files,
                state,
            };
            let answer = ask(&host, s, cmd)?;
            print::show(s.json, &answer, files > 0);
            Ok(exit::OK)
        }
        Some(JobsCommand::Wait {
            id,
            timeout,
            server,
        }) => {
            let (host, s) = job_server(&server, &parent)?;
            wait(&host, s, &id, timeout)
        }
        Some(JobsCommand::Cancel { id, server }) => {
            let (host, s) = job_server(&server, &parent)?;
            let answer = ask(&host, s, JobCommand::Cancel { id })?;
            print::done(s.json, &answer);
            Ok(exit::OK)
        }
        Some(JobsCommand::Retry { id, server }) => {
            let (host, s) = job_server(&server, &parent)?;
            let answer = ask(&host, s, JobCommand::Retry { id })?;
            print::done(s.json, &answer);
            Ok(exit::OK)
        }
    }
}

/// The exit code of a job that ended in `state`.
pub fn exit_of(state: JobState) -> i32 {
    match state {
        JobState::Finished => exit::OK,
        JobState::FinishedWithFailures => exit::PARTIAL,
        JobState::Cancelled => exit::CANCELLED,
        _ => exit::FAILED,
    }
}

/// `jobs wait`: asks every two seconds until the job ends (a recurring
/// one: until a run that ends after the wait began), riding out the job
/// server's restarts.
fn wait(host: &str, s: &JobServerArgs, id: &str, timeout: Option<Duration>) -> Outcome {
    let started = Instant::now();
    let show = JobCommand::Show {
        id: id.to_string(),
        files_from: 0,
        files_limit: 100,
        state: Some(longhaul_proto::job::FileState::Failed),
    };
    let o = client(&s.security, s.connect_timeout)?;
    let mut runs_at_start = None;
    loop {
        match jobcaps::ask_job_server(host, &o, Message::JobCommand(show.clone())) {
            Ok(JobAnswer::Show {
                job,
                files,
                files_total,
            }) => {
                let first = *runs_at_start.get_or_insert(job.runs);
                let run_ended = job.every_s.is_some() && job.runs > first;
                if job.state.is_terminal() || run_ended {
                    let state = if run_ended {
                        job.history
                            .last()
                            .map_or(job.state, |a| match a.outcome.as_str() {
                                "ok" => JobState::Finished,
                                "partial" => JobState::FinishedWithFailures,
                                _ => JobState::Failed,
                            })
                    } else {
                        job.state
                    };
                    let answer = JobAnswer::Show {
                        job,
                        files,
                        files_total,
                    };
                    print::show(s.json, &answer, true);
                    return Ok(exit_of(state));
                }
            }
            Ok(_) => return Err(Failure::internal("the job server answered something else")),
            // Refused (no such job): said at once; unreachable: it may be restarting.
            Err(e @ EngineError::Refused { .. })
            | Err(e @ EngineError::Usage(_))
            | Err(e @ EngineError::Trust(_)) => return Err(e.into()),
            Err(e) => tracing::info!("the job server: {e}; asking again"),
        }
        if o.interrupt.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(exit::INTERRUPTED);
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(Failure {
                code: exit::NOT_ENDED,
                message: format!("job {id} has not ended yet (the job goes on; wait again, or `longhaul jobs show {id}`)"),
            });
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}
