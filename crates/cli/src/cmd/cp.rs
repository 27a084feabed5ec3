//! `cp`, `sync` and `ls`: file transfers and listings.

use std::sync::Arc;

use longhaul_archive::model::NewRun;
use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::results::CommandReporter;
use longhaul_engine::xfer::client::CpOptions;
use longhaul_proto::xfer::SyncOptions;

use super::{ended, interrupt_flag, Outcome};
use crate::args::{CpArgs, LsArgs};
use crate::exit;
use crate::print::{self, json::Json};

/// `cp`, and `sync` (with `sync` set and, for `sync -n`, `dry_run`).
pub fn cp(
    a: CpArgs,
    sync: Option<SyncOptions>,
    dry_run: bool,
    archive: &crate::args::ArchiveArgs,
) -> Outcome {
    if a.fleet.ranks.is_some() || a.fleet.rank.is_some() {
        if !a.filter_rules().is_empty() {
            return Err(super::usage(
                "--exclude/--include are not supported for a fleet's ranks yet: copy without them, or from one node",
            ));
        }
        return super::fleet::cp(a, sync, dry_run, archive);
    }
    if a.fleet.queue.is_some() || a.fleet.run_dir.is_some() {
        return Err(super::usage(
            "--queue and --run-dir are for one rank of a fleet: add --ranks auto (or --rank R --size N)",
        ));
    }
    let run = new_run(&a, sync.as_ref(), dry_run);
    let archive = super::archive_reporter(archive, &run);
    let catalogue = archive.as_ref().and_then(|a| a.catalogue());
    let printer = print::transfer(print::TransferLook {
        json: a.json,
        intervals: a.intervals,
        dry_run,
        quiet: a.quiet,
        progress: a.progress,
    });
    let mut printer = super::with_archive(printer, archive);
    let outcome = transfer(&a, sync, dry_run, catalogue, printer.as_mut());
    ended(printer.as_mut(), outcome)
}

/// A cp or sync as the archive records it when it starts.
pub(super) fn new_run(a: &CpArgs, sync: Option<&SyncOptions>, dry_run: bool) -> NewRun {
    let (sources, dest) = a.paths.split_at(a.paths.len().saturating_sub(1));
    let ssh = a.paths.iter().find_map(|p| super::remote::ssh_target(p));
    let remote = a
        .paths
        .iter()
        .find_map(|p| longhaul_proto::xfer::parse_remote(p));
    let is_remote = |p: &String| longhaul_proto::xfer::parse_remote(p).is_some();
    let local = |p: &String| {
        if is_remote(p) {
            p.clone()
        } else {
            std::path::absolute(p).map_or_else(|_| p.clone(), |a| a.display().to_string())
        }
    };
    NewRun {
        kind: if sync.is_some() { "sync" } else { "cp" }.into(),
        command: super::command_line(),
        remote_host: match &ssh {
            Some(t) => Some(t.dest.clone()),
            None => remote.as_ref().map(|r| r.host.clone()),
        },
        // Over ssh there is no export, only the far account's paths.
        export: remote.filter(|_| ssh.is_none()).map(|r| r.export),
        source: Some(sources.iter().map(local).collect::<Vec<_>>().join(" ")),
        dest: dest.first().map(local),
        params: Some(serde_json::json!({
            "direction": if a.paths.last().is_some_and(is_remote) { "push" } else { "pull" },
            "over_ssh": ssh.is_some(),
            "third_party": longhaul_engine::xfer::copy::is_third_party(sources, dest.first().map_or("", String::as_str)),
            "recursive": a.recursive,
            "streams": a.streams,
            "rate_bps": a.rate.or(a.bwlimit),
            "chunk": a.chunk,
            "checksum": sync.is_some_and(|s| s.checksum),
            "delete": sync.is_some_and(|s| s.delete),
            "dry_run": dry_run,
            "verify": a.verify,
            "direct": a.direct,
        })),
        ..NewRun::default()
    }
}

fn transfer(
    a: &CpArgs,
    sync: Option<SyncOptions>,
    dry_run: bool,
    catalogue: Option<longhaul_engine::xfer::Catalogue>,
    printer: &mut (dyn CommandReporter + Send),
) -> Outcome {
    let opts = options(a, sync, dry_run, catalogue)?;
    let over_ssh = opts
        .sources
        .iter()
        .chain([&opts.dest])
        .any(|p| super::remote::ssh_target(p).is_some());
    let s = if longhaul_engine::xfer::copy::is_third_party(&opts.sources, &opts.dest) {
        if !opts.filter.is_empty() {
            return Err(super::usage(
                "--exclude/--include are not supported between two remote ends yet: run the copy from the source's host",
            ));
        }
        cp_third_party(&opts, &a.ssh, printer)?
    } else if over_ssh {
        cp_over_ssh(&opts, &a.ssh, printer)?
    } else {
        longhaul_engine::xfer::client::cp_with(&opts, printer)?
    };
    printer.transfer_summary(&s);
    Ok(if s.failed.is_empty() {
        exit::OK
    } else {
        exit::PARTIAL
    })
}

/// A copy with `HOST:path` arguments: each attempt starts a far end over
/// ssh and points the transfer at it (see [`super::remote`]). A retry
/// (`--retries`) needs a new far end, since the one-time secret of the
/// last is spent; like any retry it resumes from the sink's journal.
fn cp_over_ssh(
    base: &CpOptions,
    ssh: &crate::args::SshArgs,
    printer: &mut (dyn CommandReporter + Send),
) -> Result<longhaul_engine::xfer::client::CpSummary, super::Failure> {
    // A far end that could not be started is not retried (ssh said why).
    let fatal = std::cell::Cell::new(false);
    let network = |f: &super::Failure| !fatal.get() && worth_another_far_end(f);
    let interrupt = base.client.interrupt.clone();
    longhaul_engine::report::retrying(base.retries, &interrupt, network, |attempt| {
        let mut opts = base.clone();
        opts.retries = 0;
        // Its port is new each time: nothing to remember a rate by.
        opts.path_memory = None;
        let mut all: Vec<String> = opts.sources.clone();
        all.push(opts.dest.clone());
        let far = super::remote::reach(&mut all, &mut opts.client, ssh)
            .inspect_err(|_| fatal.set(true))?;
        let Some(far) = far else {
            return Err(super::Failure::internal("no ssh path after all"));
        };
        opts.dest = all.pop().unwrap_or_default();
        opts.sources = all;
        opts.catalogue = as_written(opts.catalogue.take(), &[&far]);
        match longhaul_engine::xfer::client::cp_with(&opts, printer) {
            Ok(mut s) => {
                s.connections = far.opened();
                far.finish();
                s.attempts = attempt;
                Ok(s)
            }
            Err(e) => {
                let f = super::remote::explain(&far, e);
                far.finish();
                Err(f)
            }
        }
    })
}

/// Whether a copy over ssh that failed so is worth a new far end: the
/// network or the far end went away; never a full destination, which
/// space must be freed for first.
fn worth_another_far_end(f: &super::Failure) -> bool {
    (f.code == exit::CONNECT || f.code == exit::FAILED)
        && !f.message.contains(longhaul_engine::xfer::DESTINATION_FULL)
}

/// `catalogue`, naming paths on far ends over ssh as the user wrote them
/// (`HOST:/tmp/x`), not by the one-shot server each attempt starts on a
/// new port.
fn as_written(
    catalogue: Option<longhaul_engine::xfer::Catalogue>,
    fars: &[&super::remote::FarEnd],
) -> Option<longhaul_engine::xfer::Catalogue> {
    let catalogue = catalogue?;
    let rename: Vec<super::remote::AsWritten> = fars.iter().map(|f| f.as_written()).collect();
    Some(Arc::new(
        move |mut landed: longhaul_engine::xfer::Landed| {
            let inner = landed.namer.clone();
            let rename = rename.clone();
            landed.namer = Arc::new(move |path: &str| {
                let (mut source, mut dest) = inner(path);
                for r in &rename {
                    source = r.name(&source);
                    dest = r.name(&dest);
                }
                (source, dest)
            });
            catalogue(landed)
        },
    ))
}

/// A copy between two remote ends (servers, hosts over ssh, or one of
/// each): each end is reached as it would be alone (a host over ssh gets
/// its own far end, whose secret only this client holds), and the data
/// goes from one to the other directly ([`longhaul_engine::xfer::copy`]).
fn cp_third_party(
    base: &CpOptions,
    ssh: &crate::args::SshArgs,
    printer: &mut (dyn CommandReporter + Send),
) -> Result<longhaul_engine::xfer::client::CpSummary, super::Failure> {
    let mut opts = base.clone();
    let (mut from, mut to) = (opts.client.clone(), opts.client.clone());
    let far_a = super::remote::reach(&mut opts.sources, &mut from, ssh)?;
    let mut dest = [opts.dest.clone()];
    let far_b = match super::remote::reach(&mut dest, &mut to, ssh) {
        Ok(f) => f,
        Err(e) => {
            if let Some(f) = far_a {
                f.finish();
            }
            return Err(e);
        }
    };
    opts.dest = dest[0].clone();
    let fars: Vec<&super::remote::FarEnd> = [&far_a, &far_b].into_iter().flatten().collect();
    opts.catalogue = as_written(opts.catalogue.take(), &fars);
    let copied = longhaul_engine::xfer::copy::third_party_cp(&opts, &from, &to, printer);
    let opened = [&far_a, &far_b]
        .into_iter()
        .flatten()
        .filter_map(|f| f.opened())
        .max_by_key(|o| o.opened_by == "far_end");
    let copied = match (copied, &far_a, &far_b) {
        (Ok(mut s), _, _) => {
            s.connections = opened;
            Ok(s)
        }
        (Err(e), a, b) => Err(super::remote::explain_third_party(
            a.as_ref(),
            b.as_ref(),
            e,
        )),
    };
    for far in [far_a, far_b].into_iter().flatten() {
        far.finish();
    }
    copied
}

/// The transfer the command line asks for.
pub(super) fn options(
    a: &CpArgs,
    sync: Option<SyncOptions>,
    dry_run: bool,
    catalogue: Option<longhaul_engine::xfer::Catalogue>,
) -> Result<CpOptions, super::Failure> {
    let security = a.security.security()?;
    let mut paths = a.paths.clone();
    let dest = paths.pop().expect("clap requires two paths");
    // A bad rule is the user's to fix before anything connects.
    let filter = a.filter_rules();
    longhaul_engine::xfer::client::compile_filter(&filter, paths.iter().all(|s| s.ends_with('/')))
        .map_err(|e| super::usage(&e))?;
    let interrupt = interrupt_flag();
    Ok(CpOptions {
        sources: paths,
        dest,
        recursive: a.recursive || a.archive_mode,
        preserve: a.preserve || a.archive_mode,
        streams: a.streams,
        rate: a.rate.or(a.bwlimit),
        congestion: a.congestion.clone(),
        chunk_size: a.chunk,
        force: a.force,
        mkpath: a.mkpath,
        keep_special_modes: a.keep_special_modes,
        retries: a.retry.retries,
        sync_files: !a.no_sync,
        direct: a.direct,
        verify: a.verify,
        sync,
        dry_run,
        filter,
        compress: (a.compress || a.compress_level.is_some()).then(|| {
            a.compress_level
                .unwrap_or(longhaul_proto::xfer::compress::DEFAULT_LEVEL)
        }),
        tune: !a.no_tune,
        files_in_flight: a.files_in_flight,
        path_memory: Some(longhaul_engine::state::default_pathdb_file()),
        digests_to: a.digests.clone(),
        catalogue,
        share: None,
        source_anchor: None,
        progress: Arc::new(longhaul_engine::xfer::Progress {
            interrupt: interrupt.clone(),
            ..Default::default()
        }),
        client: ClientOptions {
            connect_timeout: a.connect_timeout,
            interrupt,
            security,
            paths: longhaul_engine::net::dial::Paths {
                bind: a.bind.clone(),
                via: a.via.clone(),
            },
            ..ClientOptions::default()
        },
    })
}

/// `ls`: lists a remote directory.
pub fn ls(a: LsArgs) -> Outcome {
    let mut opts = ClientOptions {
        security: a.security.security()?,
        interrupt: interrupt_flag(),
        ..ClientOptions::default()
    };
    if let Some(t) = super::remote::ssh_target(&a.target) {
        if !t.path.is_empty() && t.path.bytes().all(|b| b.is_ascii_digit()) {
            // `ls HOST:5310` is far more often a server's port than a
            // directory named 5310 in a home directory: say what it means.
            return Err(super::usage(format!(
                "'{target}' means the path '{port}' on {host} over ssh (HOST:path, as scp reads it); a longhaul server on port {port} is longhaul://{host}:{port}/EXPORT/path (or {host}:{port}:EXPORT/path); a directory named {port} is {host}:./{port}",
                target = a.target,
                port = t.path,
                host = t.dest,
            )));
        }
    }
    let mut target = [a.target.clone()];
    let far = super::remote::reach(&mut target, &mut opts, &a.ssh)?;
    let mut printer: print::Printer = match a.json {
        true => Box::new(Json::ls()),
        false => Box::new(print::human::Human::listing(print::human::ListStyle {
            long: a.long,
            human_sizes: a.human_readable,
        })),
    };
    // A far end over ssh serves one client: no second attempt at it.
    let retries = if far.is_some() { 0 } else { a.retry.retries };
    let listed =
        longhaul_engine::report::retrying(retries, &opts.interrupt, super::unreachable, |_| {
            longhaul_engine::xfer::client::ls(&target[0], a.recursive, &opts)
        });
    let listed = match far {
        Some(far) => {
            let l = listed.map_err(|e| super::remote::explain(&far, e));
            far.finish();
            l
        }
        None => listed.map_err(Into::into),
    };
    let outcome = listed.map(|mut entries| {
        // In the order ls prints them: by name, byte for byte.
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        printer.listing(&entries);
        exit::OK
    });
    ended(printer.as_mut(), outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_ssh_a_lost_far_end_is_tried_again_and_a_full_destination_is_not() {
        let failure = |code, message: &str| super::super::Failure {
            code,
            message: message.into(),
        };
        assert!(worth_another_far_end(&failure(
            exit::CONNECT,
            "connection refused"
        )));
        assert!(worth_another_far_end(&failure(
            exit::FAILED,
            "data stream failed: reset"
        )));
        assert!(!worth_another_far_end(&failure(
            exit::FAILED,
            "the sink ended the transfer early: destination full: no room for home/f (5.00 MiB); free space and run the same command again"
        )));
        assert!(!worth_another_far_end(&failure(
            exit::PARTIAL,
            "some files failed"
        )));
    }
}
