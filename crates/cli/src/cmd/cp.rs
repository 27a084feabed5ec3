//! `cp`, `sync` and `ls`: file transfers and listings.

use std::sync::Arc;

use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::results::CommandReporter;
use longhaul_engine::xfer::client::CpOptions;
use longhaul_proto::xfer::SyncOptions;

use super::{ended, interrupt_flag, Outcome};
use crate::args::{CpArgs, LsArgs};
use crate::exit;
use crate::print::{self, json::Json};

/// `cp`, and `sync` (with `sync` set and, for `sync -n`, `dry_run`).
pub fn cp(a: CpArgs, sync: Option<SyncOptions>, dry_run: bool) -> Outcome {
    let mut printer = print::transfer(a.json, a.intervals, dry_run);
    let outcome = transfer(&a, sync, dry_run, printer.as_mut());
    ended(printer.as_mut(), outcome)
}

fn transfer(
    a: &CpArgs,
    sync: Option<SyncOptions>,
    dry_run: bool,
    printer: &mut (dyn CommandReporter + Send),
) -> Outcome {
    let security = a.security.security()?;
    let mut paths = a.paths.clone();
    let dest = paths.pop().expect("clap requires two paths");
    let interrupt = interrupt_flag();
    let opts = CpOptions {
        sources: paths,
        dest,
        recursive: a.recursive,
        preserve: a.preserve,
        streams: a.streams,
        rate: a.rate,
        congestion: a.congestion.clone(),
        chunk_size: a.chunk,
        force: a.force,
        mkpath: a.mkpath,
        keep_special_modes: a.keep_special_modes,
        retries: a.retries,
        sync_files: !a.no_sync,
        direct: a.direct,
        verify: a.verify,
        sync,
        dry_run,
        tune: !a.no_tune,
        files_in_flight: a.files_in_flight,
        path_memory: Some(longhaul_engine::state::default_pathdb_file()),
        digests_to: a.digests.clone(),
        progress: Arc::new(longhaul_engine::xfer::Progress {
            interrupt: interrupt.clone(),
            ..Default::default()
        }),
        client: ClientOptions {
            connect_timeout: a.connect_timeout,
            interrupt,
            security,
            ..ClientOptions::default()
        },
    };
    let s = longhaul_engine::xfer::client::cp_with(&opts, printer)?;
    printer.transfer_summary(&s);
    Ok(if s.failed.is_empty() {
        exit::OK
    } else {
        exit::PARTIAL
    })
}

/// `ls`: lists a remote directory.
pub fn ls(a: LsArgs) -> Outcome {
    let opts = ClientOptions {
        security: a.security.security()?,
        ..ClientOptions::default()
    };
    let mut printer = print::outcome(a.json.then(Json::ls));
    let outcome = longhaul_engine::xfer::client::ls(&a.target, &opts)
        .map(|entries| {
            printer.listing(&entries);
            exit::OK
        })
        .map_err(Into::into);
    ended(printer.as_mut(), outcome)
}
