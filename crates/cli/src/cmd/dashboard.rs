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
            let t = std::fs::read_to_string(p).map_err(|e| {
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
        listen: a.listen,
        archive_path,
        token,
        tls,
    };
    let path = opts.archive_path.clone();
    serve_dashboard(opts, |addr| {
        match &fingerprint {
            Some(fp) => {
                crate::outln!("dashboard: https://{addr}/");
                crate::errln!(
                    "dashboard: HTTPS with the certificate {fp} (self-signed: check that the browser shows this fingerprint)"
                );
            }
            None => crate::outln!("dashboard: http://{addr}/"),
        }
        crate::errln!("dashboard: reading {}", path.display());
    })
    .map_err(|e| match e {
        DashboardError::OpenOffLoopback(_) | DashboardError::EmptyToken => usage(e.to_string()),
        DashboardError::Bind { .. } | DashboardError::Runtime(_) => Failure {
            code: exit::FAILED,
            message: e.to_string(),
        },
    })?;
    Ok(exit::OK)
}
