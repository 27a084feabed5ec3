//! Reproducible data: the same seed gives the same bytes on every host,
//! so a failure can be replayed, and none of it compresses (a layer below
//! cannot shortcut it) unless a generator says otherwise. The generator is
//! `longhaul_proto::data`, shared with the shipped code (the matrix, the
//! doctor, `bench disk`); here are its panicking file writers for tests.

use std::path::Path;

pub use longhaul_proto::data::{bytes, text, workload, Planned, Rng, MIB};

/// `len` random bytes of seed `seed` into `path` (its directory made).
pub fn write_random(path: &Path, len: usize, seed: u64) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display())),
    );
    longhaul_proto::data::write_random(&mut f, len as u64, seed)
        .and_then(|()| std::io::Write::flush(&mut f))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// `len` bytes of text that compresses well but is not one repeated
/// block: numbered lines.
pub fn write_text(path: &Path, len: usize) {
    std::fs::write(path, text(len)).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A credential file (a token): mode 0600 from its creation, as longhaul
/// reads only a credential of its owner's alone.
pub fn write_secret(path: &Path, secret: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(secret.as_bytes()))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
