//! `dashboard`: the web page of live runs, history and run graphs.

use super::{usage, Failure, Outcome};
use crate::args::{ArchiveArgs, DashboardArgs};
use crate::exit;
use longhaul_view::dashboard::{serve_dashboard, DashboardError, DashboardOptions};

/// `longhaul dashboard`.
pub fn dashboard(a: DashboardArgs, archive: &ArchiveArgs) -> Outcome {
    let Some(archive_path) = archive
        .archive
        .clone()
        .or_else(longhaul_archive::default_path)
    else {
        return Err(usage(
            "dashboard: no archive to read: HOME is not set; give --archive FILE",
        ));
    };
    let token = match &a.token_file {
        Some(p) => {
            let t = longhaul_engine::state::read_credential(p).map_err(|e| {
                usage(format!(
                    "dashboard: cannot read the token file {}: {e}",
                    p.display()
                ))
            })?;
            Some(t.trim().to_string())
        }
        None => None,
    };
    // Off loopback the page is HTTPS, with this host's longhaul identity
    // (refused before a key is made when there is no token).
    let mut tls = None;
    let mut fingerprint = None;
    if !a.listen.ip().is_loopback() && token.is_some() {
        let dir = super::state_dir_or_default(None)?;
        let (id, _) = longhaul_engine::net::tls::Identity::load_or_create(&dir)?;
        fingerprint = Some(id.fingerprint());
        tls = Some(longhaul_view::dashboard::tls::config(&id).map_err(|e| usage(e.to_string()))?);
    }
    let opts = DashboardOptions {
        token,
        open: a.open,
        tls,
        ..DashboardOptions::new(a.listen, archive_path)
    };
    let path = opts.archive_path.clone();
    let open = opts.open;
    // The address goes to stdout only: with a token made here it is the
    // key to the page, for the one who started it.
    serve_dashboard(opts, |_, url| {
        crate::outln!("dashboard: {url}");
        if let Some(fp) = &fingerprint {
            crate::errln!(
                "dashboard: HTTPS with the certificate {fp} (self-signed: check that the browser shows this fingerprint)"
            );
        }
        if open {
            crate::errln!(
                "dashboard: --open: every account on this host can read the archive through this page"
            );
        }
        crate::errln!("dashboard: reading {}", path.display());
    })
    .map_err(|e| match e {
        DashboardError::OpenOffLoopback(_)
        | DashboardError::OpenWithToken
        | DashboardError::EmptyToken
        | DashboardError::Bind(_) => usage(e.to_string()),
        DashboardError::Runtime(_) => Failure {
            code: exit::FAILED,
            message: e.to_string(),
        },
    })?;
    Ok(exit::OK)
}
