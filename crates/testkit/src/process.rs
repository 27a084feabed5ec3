//! Processes a test starts, ended by their PID when the test is done with
//! them (or panics): never by name, since other tests and other users run
//! the same programs. [`Owned`] and [`find_program`] are the engine's own
//! (`longhaul_engine::process`, compiled here from its one source: the test
//! kit stands below the engine in the tests' build).

#[path = "../../engine/src/process.rs"]
mod owned;

pub use owned::{find_program, kill_group, output_within, own, Collected, Owned, Within};

/// Runs a set-up command to its end, which must succeed (else the test
/// fails, naming it and what it said): its output, trimmed.
pub fn run_ok(c: &mut std::process::Command) -> String {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        o.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Whether process `pid` is gone (or a zombie: ended, not yet reaped).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// The parent of process `pid`, if it still runs.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(1)?.parse().ok()
}

/// Every running process descended from one of `roots` (the roots too):
/// what a test started, and not what other tests or users on the same host
/// run beside it.
pub fn descendants(roots: &[u32]) -> std::collections::BTreeSet<u32> {
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut found: std::collections::BTreeSet<u32> = roots.iter().copied().collect();
    loop {
        let before = found.len();
        for &pid in &pids {
            if !found.contains(&pid) && parent_of(pid).is_some_and(|p| found.contains(&p)) {
                found.insert(pid);
            }
        }
        if found.len() == before {
            return found;
        }
    }
}
