//! Where longhaul keeps what outlives a process, and the environment that
//! names it: the state directory (the server's identity and grants, the
//! remembered path rates), the known-hosts file, and the path-rate file.
//! Every lookup of `HOME`, `XDG_*` and `LONGHAUL_PATHS` is here.

use std::path::{Path, PathBuf};

use crate::EngineError;

/// `$XDG_STATE_HOME/longhaul`, else `$HOME/.local/state/longhaul` (each
/// only if absolute). With neither, an error that says to set HOME or pass
/// `--state-dir`: there is no fallback to a shared directory such as /tmp,
/// where another user could make the directory first and then read or
/// plant the server's key and grants.
pub fn state_dir_from_env() -> Result<PathBuf, EngineError> {
    let var = |name| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(x) = var("XDG_STATE_HOME") {
        return Ok(x.join("longhaul"));
    }
    var("HOME")
        .map(|h| h.join(".local/state/longhaul"))
        .ok_or_else(|| EngineError::Usage(NO_STATE_DIR.into()))
}

/// Why there is no default state directory.
pub const NO_STATE_DIR: &str = "no state directory: neither HOME nor XDG_STATE_HOME is set (to an absolute path); set HOME or pass --state-dir DIR";

/// [`state_dir_from_env`] for [`crate::server::ServeConfig::default`], which cannot fail:
/// an empty path when there is none, which the identity and the grants
/// refuse with [`NO_STATE_DIR`] before anything is made. Callers that can
/// report an error use [`state_dir_from_env`].
pub fn default_state_dir() -> PathBuf {
    state_dir_from_env().unwrap_or_default()
}

/// Makes the state directory if it is missing (only its owner may enter a
/// new one: it holds the server's key and grants).
pub fn make_state_dir(state: &Path) -> Result<(), EngineError> {
    use std::os::unix::fs::DirBuilderExt;
    named_state_dir(state)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)
        .map_err(|e| {
            EngineError::Usage(format!(
                "cannot create the state directory {}: {e} (choose another with --state-dir)",
                state.display()
            ))
        })
}

/// Refuses the empty path that [`default_state_dir`] gives
/// when it knows of no state directory.
pub fn named_state_dir(state: &Path) -> Result<(), EngineError> {
    if state.as_os_str().is_empty() {
        return Err(EngineError::Usage(NO_STATE_DIR.into()));
    }
    Ok(())
}

/// The default known-hosts file.
pub fn default_known_hosts() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("longhaul").join("known_hosts"))
}

/// The file of remembered path rates ([`crate::pathdb`]): `LONGHAUL_PATHS`, else `paths.json` in the state directory;
/// the empty path when there is no state directory (HOME unset), which
/// [`crate::pathdb::recall`] finds nothing in and [`crate::pathdb::remember`] refuses, rather than a file
/// in the current directory.
pub fn default_pathdb_file() -> PathBuf {
    std::env::var_os("LONGHAUL_PATHS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| state_dir_from_env().ok().map(|d| d.join("paths.json")))
        .unwrap_or_default()
}

/// Reads a credential (a `--token-file`, the dashboard's token, a
/// server's grants), refused as OpenSSH refuses a private key with open
/// permissions: a file of this user's (or read by root) that its group or
/// others may read or write; a file of root's that others may (its group
/// may: a service's group); any other user's file. The error says why and
/// what to do (`chmod 600 FILE`).
pub fn read_credential(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt;
    let mut f = std::fs::File::open(path)?;
    let m = f.metadata()?;
    let me = rustix::process::geteuid().as_raw();
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let open_to = if m.uid() == me || me == 0 {
        0o077
    } else if m.uid() == 0 {
        0o007
    } else {
        return Err(refused(format!(
            "it belongs to uid {}, not to this user (uid {me}) or root: a credential must be its user's alone",
            m.uid()
        )));
    };
    if m.mode() & open_to != 0 {
        return Err(refused(format!(
            "its mode {:04o} lets others read or change it, and a credential must be its owner's alone: chmod 600 {}",
            m.mode() & 0o7777,
            path.display()
        )));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(text)
}

/// Why `dir` is not this user's alone, if it is not: not a directory,
/// another user's, or writable by its group or others (who could plant
/// files, links or sockets where this user's programs write or listen).
/// A fleet's run directory and the wan emulator's socket directory.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).map_err(|e| format!("it cannot be examined ({e})"))?;
    let me = rustix::process::geteuid().as_raw();
    if !m.is_dir() {
        Err("it is not a directory".into())
    } else if m.uid() != me {
        Err(format!("it belongs to uid {}, not to this user", m.uid()))
    } else if m.mode() & 0o022 != 0 {
        Err(format!(
            "it is writable by others (mode {:04o}), who could plant what is read or written there (chmod go-w it)",
            m.mode() & 0o7777
        ))
    } else {
        Ok(())
    }
}

/// Replaces `dir/name` with `bytes`, durably and never half-written: a
/// fresh temporary file (mode 0600, made with `O_EXCL`, so a link planted
/// in its place is never written through) synced, renamed over the file,
/// and the directory synced. Readers see the old file or the new one.
pub fn replace_private(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &p));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", p.display()));
    }
    // The rename itself, durable.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
}
