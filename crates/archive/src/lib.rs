//! longhaul's results archive and file catalogue: every run of perf, cp,
//! sync, doctor, bench disk and matrix (and every transfer or test a server
//! served), with its parameters, summary, per-interval samples and
//! verdict, and for cp and sync each file moved with its digest. One
//! SQLite file per host (`$XDG_DATA_HOME/longhaul/archive.db`).
//!
//! - [`schema`]: the tables and their migrations.
//! - [`store`]: [`Archive`], opening (refusing damaged or newer files), the
//!   queries behind `history`, `show`, `where` and the dashboard.
//! - [`writer`]: the thread that writes a run's rows in batches, off the
//!   data path.
//! - [`reporter`]: [`reporter::ArchiveReporter`], the reporter that turns a
//!   command's events into rows.
//! - [`matrix`]: a test matrix as one run, its cells read back from the
//!   document it keeps, and each cell's history.
//! - [`scrub`]: credentials out of every command line and message the
//!   archive keeps or shows.
//! - [`when`]: the one `since` grammar of its readers and the one UTC
//!   format of a run's time.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod matrix;
pub mod model;
pub mod reporter;
pub mod schema;
pub mod scrub;
pub mod served;
pub mod store;
pub mod when;
pub mod writer;

use std::path::PathBuf;

pub use store::{Archive, ArchiveError};

/// The archive file's name in its directory.
pub const FILE_NAME: &str = "archive.db";

/// Where the archive is unless told otherwise: `$LONGHAUL_ARCHIVE`, else
/// `$XDG_DATA_HOME/longhaul/archive.db`, else
/// `$HOME/.local/share/longhaul/archive.db`. None without a home.
pub fn default_path() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = env("LONGHAUL_ARCHIVE") {
        return Some(PathBuf::from(p));
    }
    let data = env("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("longhaul").join(FILE_NAME))
}
