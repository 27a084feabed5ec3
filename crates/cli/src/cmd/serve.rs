//! `serve`, and what manages a server's identity and grants: `id`,
//! `trust`, `token`.

use std::net::SocketAddr;
use std::sync::Arc;

use longhaul_engine::server::{ServeConfig, Server};
use longhaul_engine::{EngineError, DEFAULT_PORT};
use longhaul_proto::session::Limits;

use super::{state_dir_or_default, usage, Outcome};
use crate::args::{ArchiveArgs, IdArgs, ServeArgs, TokenArgs, TokenCommand, TrustArgs};
use crate::exit;
use crate::print::json::Json;

/// `serve`: runs the server until the process is ended; with
/// `--metrics`, serves its Prometheus metrics too, and unless
/// `--no-archive` archives what it serves (runs of kind `served`).
pub fn serve(a: ServeArgs, archive: &ArchiveArgs) -> Outcome {
    let listen = if a.listen.is_empty() {
        vec![SocketAddr::from(([0u16; 8], DEFAULT_PORT))]
    } else {
        a.listen.clone()
    };
    let mut cfg = config(&a)?;
    let mut printer = crate::print::outcome(None);
    if let (Some(cert), Some(key)) = (&a.cert, &a.key) {
        load_identity(cert, key, &mut cfg, printer.as_mut())?;
    }
    // Only its owner may enter a new state directory: it holds the key and the grants.
    create_state_dir(&cfg.state_dir)?;
    #[cfg(not(feature = "metrics"))]
    if a.metrics.is_some() {
        return Err(super::left_out("serve --metrics", "metrics"));
    }
    #[cfg(feature = "metrics")]
    let mut metrics = None;
    #[cfg(feature = "metrics")]
    if let Some(addr) = a.metrics {
        let m = Arc::new(longhaul_view::metrics::Metrics::new());
        cfg.observers.push(m.clone());
        metrics = Some((addr, m, a.metrics_host.clone()));
    }
    if let Some(served) = open_archive(archive) {
        cfg.observers.push(Arc::new(served));
    }
    let state_dir = cfg.state_dir.clone();
    if let Some(place) = &a.jobs {
        cfg.jobs = Some(start_jobs(
            &a,
            place,
            &cfg,
            &listen,
            archive,
            printer.as_mut(),
        )?);
    }
    let iperf3 = bind_iperf3(&a, &cfg)?;
    let server = Server::bind(&listen, cfg)?;
    // After the bind: a port in use for the server is said first.
    #[cfg(feature = "metrics")]
    if let Some((addr, m, names)) = metrics {
        let (bound, _thread) = longhaul_view::metrics::serve_metrics(addr, m, &names)
            .map_err(|e| usage(e.to_string()))?;
        let note = match bound.ip().is_loopback() {
            true => "",
            false => " (reachable off this host: it shows export and grant names and traffic)",
        };
        printer.status(&format!(
            "longhaul: metrics on http://{bound}/metrics{note}"
        ));
    }
    for a in server.local_addrs() {
        printer.status(&format!(
            "longhaul: serving on {a} (state in {})",
            state_dir.display()
        ));
    }
    if let Some(fp) = server.fingerprint() {
        printer.status(&format!(
            "longhaul: identity {fp} (clients: longhaul trust HOST, or --trust {fp})"
        ));
    }
    let _iperf3 = match iperf3 {
        Some(l) => {
            let h = l.spawn()?;
            printer.status(&format!(
                "longhaul: answering iperf3 clients on {} (unauthenticated; at most {} tests at once)",
                h.addr, a.iperf3_max_tests
            ));
            Some(h)
        }
        None => None,
    };
    server.run();
    Ok(exit::OK)
}

/// The server's configuration from `serve`'s options.
fn config(a: &ServeArgs) -> Result<ServeConfig, super::Failure> {
    Ok(ServeConfig {
        limits: Limits {
            max_streams: a.max_streams,
            max_duration: a.max_duration,
            max_bytes: a.max_bytes,
            max_buffer_bytes: a.max_buffer,
            allow_third_party: !a.no_third_party,
            handshake_timeout: a.handshake_timeout,
            idle_timeout: a.idle_timeout,
        },
        max_tests: a.max_tests,
        max_queued: a.max_queued.unwrap_or(a.max_tests.saturating_mul(4)),
        public_max_rate: a.public_max_rate,
        public_max_time: a.public_max_time,
        max_connections: a.max_connections,
        max_per_client: a.max_per_client,
        exports: a.export.clone(),
        sync_files: !a.no_sync,
        storage: if a.direct {
            std::sync::Arc::new(longhaul_engine::xfer::storage::Direct)
        } else {
            std::sync::Arc::new(longhaul_engine::xfer::storage::Local)
        },
        state_dir: state_dir_or_default(a.state_dir.clone())?,
        tls: None,
        allow_plaintext: a.allow_plaintext,
        public_perf: a.public_perf,
        perf_tls_only: a.perf_tls_only,
        keep_special_modes: a.keep_special_modes,
        open_access: false,
        observers: Vec::new(),
        one_time: None,
        third_party_copies: a.third_party_copies,
        ..ServeConfig::default()
    })
}

/// `--cert`/`--key`: the server's TLS identity, said on stderr.
fn load_identity(
    cert: &std::path::Path,
    key: &std::path::Path,
    cfg: &mut ServeConfig,
    printer: &mut dyn longhaul_engine::results::CommandReporter,
) -> Result<(), super::Failure> {
    match longhaul_engine::net::tls::Identity::load(cert, key)
        .and_then(|id| longhaul_engine::net::tls::server_config(&id).map(|c| (id, c)))
    {
        Ok((id, c)) => {
            printer.status(&format!(
                "longhaul: certificate {} ({})",
                cert.display(),
                id.fingerprint()
            ));
            cfg.tls = Some(c);
            Ok(())
        }
        Err(e) => Err(usage(e.to_string())),
    }
}

/// The state directory, made 0700 if new.
fn create_state_dir(dir: &std::path::Path) -> Result<(), super::Failure> {
    if let Err(e) =
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
    {
        return Err(usage(format!(
            "cannot create state directory {}: {e} (choose another with --state-dir)",
            dir.display()
        )));
    }
    Ok(())
}

/// `--iperf3 ADDR`: the listener for stock iperf3 clients, bound now so a
/// port in use is said before the server starts.
fn bind_iperf3(
    a: &ServeArgs,
    cfg: &ServeConfig,
) -> Result<Option<longhaul_engine::server::iperf3::Iperf3Server>, super::Failure> {
    Ok(match a.iperf3 {
        Some(addr) => {
            let c = longhaul_engine::server::iperf3::Iperf3Config {
                max_tests: a.iperf3_max_tests,
                max_streams: a.iperf3_max_streams,
                max_seconds: a.iperf3_max_time.as_secs().max(1),
                max_rate_bps: a.iperf3_max_rate,
                handshake_timeout: a.handshake_timeout,
                observers: cfg.observers.clone(),
                ..Default::default()
            };
            Some(longhaul_engine::server::iperf3::Iperf3Server::bind(
                addr, c,
            )?)
        }
        None => None,
    })
}

/// `serve --jobs [URL]`: the jobs' store opened (SQLite in the state
/// directory, or the PostgreSQL database named) and the runner started.
fn start_jobs(
    a: &ServeArgs,
    place: &str,
    cfg: &ServeConfig,
    listen: &[SocketAddr],
    archive: &ArchiveArgs,
    printer: &mut dyn longhaul_engine::results::CommandReporter,
) -> Result<Arc<dyn longhaul_engine::server::jobs::JobDesk>, super::Failure> {
    let place = if place.is_empty() {
        longhaul_jobs::Place::Sqlite(cfg.state_dir.clone())
    } else if place.starts_with("postgres://")
        || place.starts_with("postgresql://")
        || place.contains('=')
    {
        longhaul_jobs::Place::Postgres(place.to_string())
    } else {
        return Err(usage(format!(
            "--jobs {place}: give no value (the state directory's jobs.db) or a PostgreSQL URL (postgres://...)"
        )));
    };
    let shown = match &place {
        longhaul_jobs::Place::Sqlite(d) => d
            .join(longhaul_jobs::store::sqlite::FILE_NAME)
            .display()
            .to_string(),
        longhaul_jobs::Place::Postgres(_) => {
            "a PostgreSQL database shared with other servers".into()
        }
    };
    let worker = format!(
        "{} {} pid {}",
        longhaul_engine::net::sock::hostname(),
        listen.first().map(|l| l.to_string()).unwrap_or_default(),
        std::process::id()
    );
    let desk = longhaul_jobs::start(longhaul_jobs::JobsConfig {
        place,
        exports: cfg.exports.clone(),
        state_dir: cfg.state_dir.clone(),
        workers: a.jobs_workers as usize,
        max_per_grant: a.jobs_max_per_grant,
        min_every: a.jobs_min_every,
        archive: (!archive.no_archive)
            .then(|| {
                archive
                    .archive
                    .clone()
                    .or_else(longhaul_archive::default_path)
            })
            .flatten(),
        sendmail: a.sendmail.clone(),
        observers: cfg.observers.clone(),
        worker,
        connect_timeout: std::time::Duration::from_secs(5),
        handshake_timeout: a.handshake_timeout,
        lease_s: a.jobs_lease.as_secs().max(3),
        stall: a.jobs_stall.max(std::time::Duration::from_secs(5)),
        backoff_first_s: a.jobs_backoff.as_secs().max(1),
        open_access: false,
        ssh_hosts: a.jobs_ssh.clone(),
        ssh: longhaul_engine::reach::SshOptions {
            rsh: a.jobs_rsh.clone(),
            remote_path: a.jobs_remote_path.clone(),
            unattended: true,
            ..Default::default()
        },
    })
    .map_err(|e| usage(e.to_string()))?;
    printer.status(&format!("longhaul: taking jobs (kept in {shown})"));
    Ok(desk)
}

/// The server-side archive, unless `--no-archive`; None (after one
/// warning saying why) when it cannot be opened: the server serves anyway.
fn open_archive(a: &ArchiveArgs) -> Option<longhaul_archive::served::ServedArchive> {
    if a.no_archive {
        return None;
    }
    let Some(path) = a.archive.clone().or_else(longhaul_archive::default_path) else {
        tracing::warn!(
            "not archiving what this server serves: no archive path (set HOME, or pass --archive FILE; --no-archive silences this)"
        );
        return None;
    };
    match longhaul_archive::served::ServedArchive::open(&path) {
        Ok(s) => {
            tracing::info!("archiving served runs in {}", path.display());
            Some(s)
        }
        Err(e) => {
            tracing::warn!(
                "not archiving what this server serves: {e} (serving anyway; --no-archive silences this)"
            );
            None
        }
    }
}

/// `id`: prints the fingerprint of the identity in a state directory (made
/// in an existing directory that holds none).
pub fn id(a: IdArgs) -> Outcome {
    // A mistyped directory must not get a new key: DIR has to exist. One
    // that exists and holds no identity gets one (a client identity for
    // --identity is made this way).
    let result = state_dir_or_default(a.dir).and_then(|dir| {
        if dir.is_dir() {
            return Ok(dir);
        }
        Err(EngineError::Usage(format!(
            "no state directory at {d}: start `longhaul serve --state-dir {d}` once, or check the path (for a client identity, make the directory first: mkdir {d})",
            d = dir.display()
        )))
    });
    let dir = result?;
    let (id, created) = longhaul_engine::net::tls::Identity::load_or_create(&dir)?;
    let mut printer = crate::print::outcome(a.json.then(Json::id));
    if created {
        printer.status(&format!(
            "longhaul: made a new identity in {}",
            dir.display()
        ));
    }
    printer.identity(&id.fingerprint());
    Ok(exit::OK)
}

/// `trust`: records a server's fingerprint in the known-hosts file.
pub fn trust(a: TrustArgs) -> Outcome {
    let Some(file) = a
        .known_hosts
        .clone()
        .or_else(longhaul_engine::state::default_known_hosts)
    else {
        return Err(usage(
            "no known-hosts file: set HOME or pass --known-hosts FILE",
        ));
    };
    let host = longhaul_engine::net::dial::host_key(&a.host);
    let result =
        longhaul_engine::net::dial::probe_fingerprint(&host, a.connect_timeout).and_then(|fp| {
            if let Some(want) = &a.fingerprint {
                if *want != fp {
                    return Err(EngineError::Trust(format!(
                        "{host} presents {fp}, not the expected {want}: not trusted"
                    )));
                }
            }
            let added = longhaul_engine::net::tls::add_known_host(&file, &host, &fp, a.replace)?;
            Ok((fp, added))
        });
    match result {
        Ok((fp, added)) => {
            let mut printer = crate::print::outcome(None);
            printer.trusted(&host, &fp);
            printer.status(&format!(
                "longhaul: {} {}",
                if added { "added to" } else { "already in" },
                file.display()
            ));
            if a.fingerprint.is_none() {
                printer.status(&format!(
                    "longhaul: compare it with `longhaul id` on the server; if it differs, remove the line from {}",
                    file.display()
                ));
            }
            Ok(exit::OK)
        }
        Err(e) => Err(e.into()),
    }
}

/// `token`: makes, lists and revokes a server's grants.
pub fn token(a: TokenArgs) -> Outcome {
    use longhaul_engine::server::auth;
    let mut printer = crate::print::outcome(None);
    let result = match a.command {
        TokenCommand::Create {
            state_dir,
            exports,
            client_cert,
            note,
        } => {
            let dir = state_dir_or_default(state_dir)?;
            match client_cert {
                Some(fp) => auth::create_cert_grant(&dir, &fp, exports, &note).map(|g| {
                    printer.status(&format!(
                        "longhaul: grant {} lets the client certificate {fp} in",
                        g.id
                    ));
                }),
                None => auth::create_token(&dir, exports, &note).map(|(g, token)| {
                    printer.status(&format!(
                        "longhaul: grant {} made; its token follows, shown this once (clients: --token-file FILE or LONGHAUL_TOKEN)",
                        g.id
                    ));
                    printer.token_created(&token);
                }),
            }
        }
        TokenCommand::List { state_dir } => state_dir_or_default(state_dir)
            .and_then(|d| auth::list(&d))
            .map(|grants| printer.grants(&grants)),
        TokenCommand::Revoke { id, state_dir } => {
            match state_dir_or_default(state_dir).and_then(|d| auth::revoke(&d, &id)) {
                Ok(true) => {
                    printer.status(&format!("longhaul: grant {id} revoked"));
                    Ok(())
                }
                Ok(false) => Err(EngineError::Usage(format!("no grant with id {id}"))),
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => Ok(exit::OK),
        Err(e) => Err(e.into()),
    }
}
