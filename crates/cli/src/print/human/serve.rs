//! `serve`'s companions for people: `id`, `trust`, `token`.

use longhaul_engine::server::auth::Grant;

/// `token list`: a line per grant: its id, how it authenticates, its
/// exports and note.
pub(super) fn print_grants(grants: &[Grant]) {
    for g in grants {
        let exports: Vec<String> = g
            .exports
            .iter()
            .map(|e| format!("{}:{}", e.name, if e.write { "rw" } else { "ro" }))
            .collect();
        let how = match &g.client_cert {
            Some(fp) => format!("client-cert {fp}"),
            None => "token".to_string(),
        };
        outln!("{} {how} {} {}", g.id, exports.join(","), g.note);
    }
}
