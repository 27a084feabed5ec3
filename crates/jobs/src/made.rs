//! What a push over ssh makes on the far host: the shallowest part of its
//! destination's path that is missing when the job first reaches the host
//! (before it writes there), so that a cancel can remove the directories
//! it made there while they are empty, as a push to a server's (whose far
//! end notes it when it issues the job's capability) and a pull's (noted
//! at submission) are. The far host has no longhaul server to note it:
//! the job server asks the one-shot server it started there, by listing.

use longhaul_engine::net::dial::ClientOptions;
use longhaul_engine::reach::End;
use longhaul_engine::xfer::client::ls;
use longhaul_proto::xfer::Remote;

/// The shallowest part of `dest`'s path (on the far end's one-shot server,
/// relative to its export) that does not exist now: found from the
/// deepest up, each part looked for in its parent's listing (never in
/// the destination's own, which may be large). None when all of it
/// exists, or it cannot be told (then nothing is removed for it).
pub fn first_missing_far(dest: &Remote, client: &ClientOptions) -> Option<String> {
    let parts: Vec<&str> = dest
        .path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for k in (0..parts.len()).rev() {
        let parent = End::on_server(Remote {
            path: parts[..k].join("/"),
            dir: true,
            ..dest.clone()
        });
        match ls(&parent, false, client) {
            Ok(entries) => {
                let there = entries.iter().any(|e| e.name == parts[k]);
                return (!there).then(|| parts[..=k].join("/"));
            }
            Err(e) if crate::lasting::not_there(&e.to_string()) => {}
            Err(_) => return None,
        }
    }
    None
}
