//! Reproducible data: the same seed gives the same bytes on every host,
//! so a failure can be replayed, and none of it compresses (a layer below
//! cannot shortcut it) unless a generator says otherwise.

use std::io::Write;
use std::path::Path;

pub const MIB: u64 = 1 << 20;

/// splitmix64: reproducible random bytes without a dependency.
pub struct Rng(pub u64);

impl Rng {
    // Not an Iterator: it never ends, and `rng.next()` reads as the tests
    // have always written it.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// `len` random bytes of seed `seed` into `path` (its directory made).
pub fn write_random(path: &Path, len: usize, seed: u64) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    // Written in pieces so that large files do not need one large buffer.
    let mut f =
        std::fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let mut rng = Rng(seed);
    let mut left = len;
    while left > 0 {
        let n = left.min(4 << 20);
        f.write_all(&rng.bytes(n)).unwrap();
        left -= n;
    }
}

/// `len` bytes of text that compresses well but is not one repeated
/// block: numbered lines.
pub fn write_text(path: &Path, len: usize) {
    let mut s = String::with_capacity(len + 100);
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!(
            "{i:>10} the quick brown fox jumps over the lazy dog; {} sheep\n",
            i * 7 % 1000
        ));
        i += 1;
    }
    s.truncate(len);
    std::fs::write(path, s).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
