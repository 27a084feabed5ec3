//! What `doctor` measured of a path, remembered on this host, so that a
//! later `cp` to the same server sizes its streams and buffers for the
//! rate the path really carried instead of a guess (10 Gbit/s).
//!
//! One JSON file (`$XDG_STATE_HOME/longhaul/paths.json`, or the file
//! `LONGHAUL_PATHS` names; [`crate::state::default_pathdb_file`]): a list
//! of records, one per server and direction, the newest kept. A record is
//! used only while it is fresh and the RTT still looks like the same path.

use std::io;
use std::path::Path;

use longhaul_proto::msg::Direction;

/// Records kept at most (the newest).
pub const MAX_RECORDS: usize = 256;
pub use longhaul_proto::window::{PathRecord, HEADROOM, MAX_AGE};

fn read(file: &Path) -> Vec<PathRecord> {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Stores `rec` in place of any older record of its server and direction
/// (written to a temporary file and renamed, so a reader never sees half).
pub fn remember(file: &Path, rec: &PathRecord) -> io::Result<()> {
    if file.as_os_str().is_empty() {
        return Err(io::Error::other(crate::state::NO_STATE_DIR));
    }
    let mut all = read(file);
    all.retain(|r| !(r.host == rec.host && r.direction == rec.direction));
    all.push(rec.clone());
    all.sort_by_key(|r| std::cmp::Reverse(r.measured_at));
    all.truncate(MAX_RECORDS);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write(file, &all)
}

/// Writes the records to a temporary file and renames it over `file`.
fn write(file: &Path, all: &[PathRecord]) -> io::Result<()> {
    let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(all).map_err(io::Error::other)?,
    )?;
    std::fs::rename(&tmp, file)
}

/// Removes every record of `host` (`HOST:PORT`, [`crate::net::dial::host_key`]);
/// returns how many there were. Later copies to it are sized by their own
/// probe again.
pub fn forget(file: &Path, host: &str) -> io::Result<usize> {
    let all = read(file);
    let kept: Vec<PathRecord> = all.iter().filter(|r| r.host != host).cloned().collect();
    let gone = all.len() - kept.len();
    if gone > 0 {
        write(file, &kept)?;
    }
    Ok(gone)
}

/// The record for this server and direction that still applies, if any.
pub fn recall(
    file: &Path,
    host: &str,
    direction: Direction,
    now: u64,
    rtt_us: u32,
) -> Option<PathRecord> {
    read(file)
        .into_iter()
        .find(|r| r.host == host && r.direction == direction && r.applies(now, rtt_us))
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(host: &str, direction: Direction, bps: f64, at: u64) -> PathRecord {
        PathRecord {
            host: host.into(),
            direction,
            bits_per_second: bps,
            rtt_us: 80_000,
            measured_at: at,
        }
    }

    #[test]
    fn a_record_applies_while_fresh_and_on_the_same_rtt() {
        let r = rec("a:5310", Direction::Up, 2e9, 1_000_000);
        assert!(r.applies(1_000_000 + 3600, 82_000));
        assert!(
            !r.applies(1_000_000 + MAX_AGE.as_secs() + 1, 80_000),
            "stale"
        );
        assert!(!r.applies(1_000_100, 120_000), "another route");
        assert!(!r.applies(1_000_100, 40_000), "another route");
        // A LAN's RTT moves by more than a quarter: a millisecond of slack.
        let lan = PathRecord {
            rtt_us: 100,
            ..r.clone()
        };
        assert!(lan.applies(1_000_100, 900));
        assert_eq!(r.target_bps(), 2_500_000_000);
        let bad = PathRecord {
            bits_per_second: f64::NAN,
            ..r
        };
        assert!(!bad.applies(1_000_100, 80_000));
    }

    #[test]
    fn remember_replaces_the_same_path_and_recall_finds_it() {
        let dir = std::env::temp_dir().join(format!("lh-paths-{}", std::process::id()));
        let file = dir.join("sub/paths.json");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(recall(&file, "a:5310", Direction::Up, 10, 80_000), None);
        remember(&file, &rec("a:5310", Direction::Up, 1e9, 5)).unwrap();
        remember(&file, &rec("a:5310", Direction::Down, 3e9, 6)).unwrap();
        remember(&file, &rec("a:5310", Direction::Up, 2e9, 7)).unwrap();
        let got = recall(&file, "a:5310", Direction::Up, 10, 80_000).unwrap();
        assert_eq!(got.bits_per_second, 2e9);
        assert_eq!(read(&file).len(), 2);
        assert_eq!(recall(&file, "b:5310", Direction::Up, 10, 80_000), None);
        // A damaged file is no record, and the next remember starts over.
        std::fs::write(&file, b"{not json").unwrap();
        assert_eq!(recall(&file, "a:5310", Direction::Up, 10, 80_000), None);
        remember(&file, &rec("a:5310", Direction::Up, 1e9, 8)).unwrap();
        assert_eq!(read(&file).len(), 1);
        // forget takes both directions of one server, and no other.
        remember(&file, &rec("a:5310", Direction::Down, 1e9, 9)).unwrap();
        remember(&file, &rec("b:5310", Direction::Up, 1e9, 9)).unwrap();
        assert_eq!(forget(&file, "a:5310").unwrap(), 2);
        assert_eq!(forget(&file, "a:5310").unwrap(), 0);
        assert_eq!(recall(&file, "a:5310", Direction::Up, 10, 80_000), None);
        assert!(recall(&file, "b:5310", Direction::Up, 10, 80_000).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
