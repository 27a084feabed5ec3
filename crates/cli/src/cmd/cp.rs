//! `cp`, `sync` and `ls`: file transfers and listings. The command line
//! is read once into a [`Plan`]; the copy runs as its ends say: here, over
//! ssh, between two remote ends, or as one rank of a fleet.

use std::sync::Arc;

use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::{self, End};
use longhaul_engine::results::CommandReporter;
use longhaul_engine::server::oneshot::Admits;
use longhaul_engine::xfer::client::{CopyReport, CpOptions};
use longhaul_proto::xfer::SyncOptions;

use super::plan::Plan;
use super::{ended, interrupt_flag, usage, Failure, Outcome};
use crate::args::{ArchiveArgs, CpArgs, LsArgs, SshArgs};
use crate::exit;
use crate::print::{self, json::Json};

/// `cp`, and `sync` (with `sync` set and, for `sync -n`, `dry_run`).
pub fn cp(a: CpArgs, sync: Option<SyncOptions>, dry_run: bool, archive: &ArchiveArgs) -> Outcome {
    let plan = Plan::read(&a, sync, dry_run);
    if plan.fleet {
        if !a.filter_rules().is_empty() {
            return Err(usage(
                "--exclude/--include are not supported for a fleet's ranks yet: copy without them, or from one node",
            ));
        }
        return super::fleet::rank(&plan, &a, archive);
    }
    if a.fleet.queue.is_some() || a.fleet.run_dir.is_some() {
        return Err(usage(
            "--queue and --run-dir are for one rank of a fleet: add --ranks auto (or --rank R --size N)",
        ));
    }
    let archive = super::archive_reporter(archive, &plan.new_run(&a));
    let catalogue = archive.as_ref().and_then(|a| a.catalogue());
    let printer = print::transfer(print::TransferLook {
        json: a.json,
        intervals: a.intervals,
        dry_run,
        quiet: a.quiet,
        progress: a.progress,
    });
    let mut printer = super::with_archive(printer, archive);
    let outcome = transfer(&plan, &a, catalogue, printer.as_mut());
    ended(printer.as_mut(), outcome)
}

fn transfer(
    plan: &Plan,
    a: &CpArgs,
    catalogue: Option<longhaul_engine::xfer::Catalogue>,
    printer: &mut (dyn CommandReporter + Send),
) -> Outcome {
    let opts = plan.options(a, catalogue)?;
    let s = if plan.third_party() {
        if !opts.filter.is_empty() {
            return Err(usage(
                "--exclude/--include are not supported between two remote ends yet: run the copy from the source's host",
            ));
        }
        cp_third_party(plan, &opts, &a.ssh, printer)?
    } else if plan.over_ssh() {
        cp_over_ssh(plan, &opts, &a.ssh, printer)?
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

/// A copy with `HOST:path` ends: each attempt starts a far end over ssh
/// and points the transfer at it ([`reach::reach_ends`]). A retry
/// (`--retries`) needs a new far end, since the one-time secret of the
/// last is spent; like any retry it resumes from the sink's journal.
fn cp_over_ssh(
    plan: &Plan,
    base: &CpOptions,
    ssh: &SshArgs,
    printer: &mut (dyn CommandReporter + Send),
) -> Result<CopyReport, Failure> {
    // A far end that could not be started is not retried (ssh said why).
    let fatal = std::cell::Cell::new(false);
    let network = |f: &Failure| !fatal.get() && worth_another_far_end(f);
    let interrupt = base.client.interrupt.clone();
    let ssh = ssh.options();
    longhaul_engine::report::retrying(base.retries, &interrupt, network, |attempt| {
        let mut opts = base.clone();
        opts.retries = 0;
        // Its port is new each time: nothing to remember a rate by.
        opts.path_memory = None;
        let mut ends: Vec<End> = plan.ends().cloned().collect();
        let far = reach::reach_ends(&mut ends, &mut opts.client, &ssh, Admits::Sessions(1))
            .map_err(Failure::from)
            .inspect_err(|_| fatal.set(true))?
            .ok_or_else(|| Failure::internal("no ssh path after all"))?;
        opts.dest = ends.pop().unwrap_or_else(|| plan.dest.clone());
        opts.sources = ends;
        opts.catalogue = as_written(opts.catalogue.take(), &[&far]);
        match longhaul_engine::xfer::client::cp_with(&opts, printer) {
            Ok(mut s) => {
                s.connections = far.opened();
                far.finish();
                s.attempts = attempt;
                Ok(s)
            }
            Err(e) => {
                let f = far.explain(e).into();
                far.finish();
                Err(f)
            }
        }
    })
}

/// Whether a copy over ssh that failed so is worth a new far end: the
/// network or the far end went away; never a full destination, which
/// space must be freed for first.
fn worth_another_far_end(f: &Failure) -> bool {
    (f.code == exit::CONNECT || f.code == exit::FAILED)
        && !f.message.contains(longhaul_engine::xfer::DESTINATION_FULL)
}

/// `catalogue`, naming paths on far ends over ssh as the user wrote them
/// (`HOST:/tmp/x`), not by the one-shot server each attempt starts on a
/// new port.
fn as_written(
    catalogue: Option<longhaul_engine::xfer::Catalogue>,
    fars: &[&reach::FarEnd],
) -> Option<longhaul_engine::xfer::Catalogue> {
    let catalogue = catalogue?;
    let rename: Vec<reach::AsWritten> = fars.iter().map(|f| f.as_written()).collect();
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
    plan: &Plan,
    base: &CpOptions,
    ssh: &SshArgs,
    printer: &mut (dyn CommandReporter + Send),
) -> Result<CopyReport, Failure> {
    let ssh = ssh.options();
    let mut opts = base.clone();
    let (mut from, mut to) = (opts.client.clone(), opts.client.clone());
    let mut sources = plan.sources.clone();
    let far_a = reach::reach_ends(&mut sources, &mut from, &ssh, Admits::Sessions(1))?;
    let mut dest = [plan.dest.clone()];
    let far_b = match reach::reach_ends(&mut dest, &mut to, &ssh, Admits::Sessions(1)) {
        Ok(f) => f,
        Err(e) => {
            if let Some(f) = far_a {
                f.finish();
            }
            return Err(e.into());
        }
    };
    opts.sources = sources;
    let [dest] = dest;
    opts.dest = dest;
    let fars: Vec<&reach::FarEnd> = [&far_a, &far_b].into_iter().flatten().collect();
    opts.catalogue = as_written(opts.catalogue.take(), &fars);
    let copied = longhaul_engine::xfer::copy::third_party_cp(&opts, &from, &to, printer);
    let opened = fars
        .iter()
        .filter_map(|f| f.opened())
        .max_by_key(|o| o.opened_by == "far_end");
    let copied = match copied {
        Ok(mut s) => {
            s.connections = opened;
            Ok(s)
        }
        Err(e) => Err(reach::explain_third_party(far_a.as_ref(), far_b.as_ref(), e).into()),
    };
    for far in [far_a, far_b].into_iter().flatten() {
        far.finish();
    }
    copied
}

/// `ls`: lists a remote directory.
pub fn ls(a: LsArgs) -> Outcome {
    let mut opts = ClientOptions {
        security: a.security.security()?,
        interrupt: interrupt_flag(),
        ..ClientOptions::default()
    };
    let mut target = [End::read(&a.target)];
    if let Some(t) = target[0].ssh() {
        if !t.path.is_empty() && t.path.bytes().all(|b| b.is_ascii_digit()) {
            // `ls HOST:5310` is far more often a server's port than a
            // directory named 5310 in a home directory: say what it means.
            return Err(usage(format!(
                "'{target}' means the path '{port}' on {host} over ssh (HOST:path, as scp reads it); a longhaul server on port {port} is longhaul://{host}:{port}/EXPORT/path (or {host}:{port}:EXPORT/path); a directory named {port} is {host}:./{port}",
                target = a.target,
                port = t.path,
                host = t.dest,
            )));
        }
    }
    let far = reach::reach_ends(
        &mut target,
        &mut opts,
        &a.ssh.options(),
        Admits::Sessions(1),
    )?;
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
            let l = listed.map_err(|e| Failure::from(far.explain(e)));
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
