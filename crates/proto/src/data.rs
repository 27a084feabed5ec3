//! Reproducible data, the one generator of the tests, the benchmarks, the
//! doctor and the matrix: the same seed gives the same bytes and the same
//! tree on every host, so a failure can be replayed, and none of it
//! compresses (a layer below cannot shortcut it).
//!
//! No I/O here: it makes bytes ([`Rng`], [`bytes`]), writes them into any
//! [`Write`] the caller opened ([`write_random`]), and plans trees
//! ([`workload`]) that the caller makes on disk. Randomness in the
//! workspace is two crates: getrandom for secrets, fastrand for the rest;
//! this is fastrand with a seed.

use std::io::{self, Write};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// A seeded generator: the same seed, the same numbers and bytes.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    // Not an Iterator: it never ends, and `rng.next()` reads as the tests
    // have always written it.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// A number in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill(buf);
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

/// `len` bytes of seed `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// `len` bytes of seed `seed` into `out`, a mebibyte at a time (so that a
/// large file needs no large buffer); the same bytes as [`bytes`].
pub fn write_random(out: &mut impl Write, len: u64, seed: u64) -> io::Result<()> {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; len.min(MIB) as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        rng.fill(&mut buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// `len` bytes of text that compresses well but is not one repeated
/// block: numbered lines.
pub fn text(len: usize) -> String {
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
    s
}

/// One entry of a planned tree, its path relative to the tree's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Planned {
    /// A directory; its mode, if any, is set once everything under it is
    /// made (a 0700 directory still takes its files).
    Dir { path: String, mode: Option<u32> },
    /// A file of `len` bytes of seed `seed` ([`write_random`]).
    File {
        path: String,
        len: u64,
        seed: u64,
        mode: u32,
    },
    /// A symbolic link to `target`.
    Link { path: String, target: String },
}

/// A workload's tree, as the matrix moves it (and any test may):
/// - `elephant`: one file of `size` bytes;
/// - `smallfiles`: `files` files of 1-64 KiB, a hundred to a directory;
/// - anything else, a mixed tree: `files / 10` files (at least 4) in
///   nested directories, from empty to `size / 8`, modes 0644, 0600 and
///   0755, with the edges a copy must keep: an empty directory inside
///   another, a link to a file, a private (0700) directory.
///
/// Sizes come from a generator of seed 1, each file's bytes from a seed
/// of its own, so one file's change moves no other.
pub fn workload(name: &str, size: u64, files: u32) -> Vec<Planned> {
    match name {
        "elephant" => vec![Planned::File {
            path: "big.bin".into(),
            len: size,
            seed: 7,
            mode: 0o644,
        }],
        "smallfiles" => small_files(files),
        _ => mixed_tree(size, files),
    }
}

fn small_files(files: u32) -> Vec<Planned> {
    let mut sizes = Rng::new(1);
    let dirs = (files / 100).max(1);
    (0..files)
        .map(|i| Planned::File {
            path: format!("d{:03}/f{i:06}", i % dirs),
            len: 1024 + sizes.below(64 * 1024 - 1024),
            seed: 1000 + u64::from(i),
            mode: 0o644,
        })
        .collect()
}

fn mixed_tree(size: u64, files: u32) -> Vec<Planned> {
    let mut sizes = Rng::new(1);
    let count = (files / 10).max(4);
    let big = (size / 8).max(MIB);
    let mut plan: Vec<Planned> = (0..count)
        .map(|i| Planned::File {
            path: format!("a{}/b{}/t{i:05}.dat", i % 3, i % 7),
            len: match i % 10 {
                0 => 0,
                1 => big,
                2..=4 => sizes.below(MIB),
                _ => sizes.below(64 * 1024),
            },
            seed: 5000 + u64::from(i),
            mode: match i % 5 {
                1 => 0o600,
                2 => 0o755,
                _ => 0o644,
            },
        })
        .collect();
    plan.extend([
        Planned::Dir {
            path: "empty/dir".into(),
            mode: None,
        },
        Planned::Dir {
            path: "private".into(),
            mode: Some(0o700),
        },
        Planned::File {
            path: "private/key".into(),
            len: 4096,
            seed: 9,
            mode: 0o600,
        },
        Planned::Link {
            path: "a0/link".into(),
            target: "b3/t00003.dat".into(),
        },
    ]);
    plan
}

/// The bytes and regular files a plan makes.
pub fn totals(plan: &[Planned]) -> (u64, u64) {
    plan.iter().fold((0, 0), |(bytes, n), p| match p {
        Planned::File { len, .. } => (bytes + len, n + 1),
        _ => (bytes, n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_other_bytes() {
        assert_eq!(bytes(3, 1000), bytes(3, 1000));
        assert_ne!(bytes(3, 1000), bytes(4, 1000));
        assert_eq!(bytes(3, 10), bytes(3, 1000)[..10]);
        let mut written = Vec::new();
        write_random(&mut written, 3 * MIB + 5, 11).unwrap();
        assert_eq!(written, bytes(11, 3 * MIB as usize + 5));
        write_random(&mut Vec::new(), 0, 11).unwrap();
    }

    #[test]
    fn random_bytes_do_not_compress() {
        let b = bytes(5, 1 << 16);
        let packed = zstd::bulk::compress(&b, 3).unwrap();
        assert!(packed.len() > b.len() * 99 / 100, "{}", packed.len());
    }

    #[test]
    fn text_is_as_long_as_asked_and_compresses() {
        let t = text(100_000);
        assert_eq!(t.len(), 100_000);
        assert!(zstd::bulk::compress(t.as_bytes(), 3).unwrap().len() < 20_000);
    }

    #[test]
    fn workloads_keep_their_counts_sizes_and_edges() {
        assert_eq!(totals(&workload("elephant", 5 * MIB, 0)), (5 * MIB, 1));
        let small = workload("smallfiles", 0, 1000);
        assert_eq!(small, workload("smallfiles", 0, 1000), "deterministic");
        assert_eq!(totals(&small).1, 1000);
        assert!(small.iter().all(|p| matches!(p,
            Planned::File { len, path, .. } if (1024..64 * 1024).contains(len) && path.starts_with('d'))));
        let tree = workload("tree", 64 * MIB, 200);
        assert_eq!(tree, workload("tree", 64 * MIB, 200), "deterministic");
        assert_eq!(totals(&tree).1, 20 + 1);
        assert!(tree.contains(&Planned::File {
            path: "a1/b1/t00001.dat".into(),
            len: 8 * MIB,
            seed: 5001,
            mode: 0o600
        }));
        assert!(tree
            .iter()
            .any(|p| matches!(p, Planned::Link { target, .. } if target == "b3/t00003.dat")));
        assert!(tree.iter().any(|p| matches!(
            p,
            Planned::Dir {
                mode: Some(0o700),
                ..
            }
        )));
    }
}
