//! `cp` and `sync` read their command line once, into a [`Plan`]: each
//! end local, on a server or on a host over ssh (the engine's
//! [`End`]), a copy between two remote ends or not, one rank of a fleet or
//! not. Everything below (the copy here, over ssh, between two remote
//! ends, a fleet's rank, the archive's record) takes the plan's ends and
//! reads no argument again; a host over ssh becomes its far end's server
//! by [`reach::reach_ends`].

use std::sync::Arc;

use longhaul_archive::model::NewRun;
use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::{self, End};
use longhaul_engine::xfer::client::CpOptions;
use longhaul_proto::xfer::SyncOptions;

use super::{interrupt_flag, usage, Failure};
use crate::args::CpArgs;

/// What a `cp` or `sync` command line asks for.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sources: Vec<End>,
    pub dest: End,
    /// One rank of a fleet (`--ranks`, `--rank`).
    pub fleet: bool,
    /// `sync`'s options (None: `cp`).
    pub sync: Option<SyncOptions>,
    /// `sync -n`.
    pub dry_run: bool,
}

impl Plan {
    /// Reads the command line's paths. A fleet's destination with
    /// `--servers` names an export on those servers (`HOST:EXPORT/path`,
    /// its host replaced by each rank's server), never a host over ssh.
    pub fn read(a: &CpArgs, sync: Option<SyncOptions>, dry_run: bool) -> Plan {
        let fleet = a.fleet.ranks.is_some() || a.fleet.rank.is_some();
        let (sources, dest) = a.paths.split_at(a.paths.len().saturating_sub(1));
        let dest = dest.first().map_or("", String::as_str);
        Plan {
            sources: sources.iter().map(|s| End::read(s)).collect(),
            dest: if fleet && !a.fleet.servers.is_empty() {
                End::read_server(dest)
            } else {
                End::read(dest)
            },
            fleet,
            sync,
            dry_run,
        }
    }

    /// Every end, the destination last.
    pub fn ends(&self) -> impl Iterator<Item = &End> {
        self.sources.iter().chain([&self.dest])
    }

    /// A copy between two remote ends (servers, hosts over ssh, or one of each).
    pub fn third_party(&self) -> bool {
        reach::is_third_party(&self.sources, &self.dest)
    }

    /// Some end is on a host over ssh.
    pub fn over_ssh(&self) -> bool {
        self.ends().any(|e| e.ssh().is_some())
    }

    /// The run as the archive records it when it starts.
    pub fn new_run(&self, a: &CpArgs) -> NewRun {
        let ssh = self.ends().find_map(End::ssh);
        let server = self.ends().find_map(End::server);
        let shown = |e: &End| match e {
            End::Local(p) => {
                std::path::absolute(p).map_or_else(|_| p.clone(), |a| a.display().to_string())
            }
            e => e.arg().to_string(),
        };
        let sync = self.sync.as_ref();
        NewRun {
            kind: if sync.is_some() { "sync" } else { "cp" }.into(),
            command: super::command_line(),
            remote_host: match ssh {
                Some(t) => Some(t.dest.clone()),
                None => server.map(|r| r.host.clone()),
            },
            // Over ssh there is no export, only the far account's paths.
            export: server.filter(|_| ssh.is_none()).map(|r| r.export.clone()),
            source: Some(self.sources.iter().map(shown).collect::<Vec<_>>().join(" ")),
            dest: Some(shown(&self.dest)),
            params: Some(serde_json::json!({
                "direction": if self.dest.is_remote() { "push" } else { "pull" },
                "over_ssh": ssh.is_some(),
                "third_party": self.third_party(),
                "recursive": a.recursive,
                "streams": a.streams,
                "rate_bps": a.rate.or(a.bwlimit),
                "chunk": a.chunk,
                "checksum": sync.is_some_and(|s| s.checksum),
                "delete": sync.is_some_and(|s| s.delete),
                "dry_run": self.dry_run,
                "verify": a.verify,
                "direct": a.direct,
            })),
            ..NewRun::default()
        }
    }

    /// The engine's transfer of this plan (its ends as read: a host over
    /// ssh is put on its far end's server when the copy reaches it).
    pub fn options(
        &self,
        a: &CpArgs,
        catalogue: Option<longhaul_engine::xfer::Catalogue>,
    ) -> Result<CpOptions, Failure> {
        let security = a.security.security()?;
        // A bad rule is the user's to fix before anything connects.
        let filter = a.filter_rules();
        longhaul_engine::xfer::client::compile_filter(
            &filter,
            self.sources.iter().all(End::slashed),
        )
        .map_err(|e| usage(&e))?;
        let interrupt = interrupt_flag();
        Ok(CpOptions {
            sources: self.sources.clone(),
            dest: self.dest.clone(),
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
            sync: self.sync.clone(),
            dry_run: self.dry_run,
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
}
