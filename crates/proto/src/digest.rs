//! What proves a copy's bytes: each chunk's BLAKE3 *chaining value* (its
//! subtree in the file's BLAKE3 tree), which combine into the file's
//! standard BLAKE3 digest (what `b3sum` prints, whatever the chunk size);
//! and each chunk's XXH3-128 *check*, which the sink computes over what it
//! received instead of BLAKE3 (PROTOCOL.md 13.3 argues why that is enough).
//!
//! A chunk's subtree is a whole subtree of the file's tree when chunks
//! are a power of two of at least 1 KiB (BLAKE3's chunk) and start at
//! multiples of their size: [`chunk_size_ok`]. A file of one chunk has
//! no subtree below the root: its chunk's value is the file's digest.

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};

/// A chunk's BLAKE3 chaining value (or, for a file of one chunk, the
/// file's BLAKE3 hash).
pub type ChunkValue = [u8; 32];
/// A chunk's XXH3-128, big-endian.
pub type Check = [u8; 16];

/// The check a trailer carries where the data streams' AEAD tags are the
/// chunks' checks (`TransferAccept::tag_checks`): any other value there
/// marks a chunk the source could not read, which the sink drops.
pub const NO_CHECK: Check = [0; 16];

/// Smallest chunk of a file of several chunks: BLAKE3's own chunk.
pub const MIN_CHUNK: u64 = blake3::CHUNK_LEN as u64;

/// Whether chunks of `chunk_size` combine into the standard digest of a
/// file of `size` bytes: one chunk holds the whole file, or chunks are a
/// power of two of at least [`MIN_CHUNK`].
pub fn chunk_size_ok(size: u64, chunk_size: u64) -> bool {
    chunk_size > 0
        && (size <= chunk_size || chunk_size.is_power_of_two() && chunk_size >= MIN_CHUNK)
}

/// The largest chunk size that combines into the digest, at most `asked`
/// (a power of two, at least [`MIN_CHUNK`]).
pub fn usable_chunk_size(asked: u64) -> u64 {
    let asked = asked.max(MIN_CHUNK);
    1 << (63 - asked.leading_zeros())
}

/// A chunk's BLAKE3 value as it streams by.
pub struct ValueHasher {
    blake: blake3::Hasher,
    root: bool,
    /// Most bytes the subtree at this offset can hold (None: no limit).
    room: Option<u64>,
    /// More came than a subtree at this offset holds (a chunk size that
    /// is not a power of two): the value is one no chunk has.
    overflowed: bool,
}

impl ValueHasher {
    /// For the chunk at `offset` of a file that is this one chunk
    /// (`whole`) or has several.
    pub fn new(offset: u64, whole: bool) -> ValueHasher {
        let mut blake = blake3::Hasher::new();
        let mut room = None;
        let mut overflowed = false;
        if !whole {
            // A misplaced chunk (never one the sink accepted) gets a
            // value that matches nothing, not a panic.
            overflowed = offset % MIN_CHUNK != 0;
            blake.set_input_offset(offset - offset % MIN_CHUNK);
            room = blake3::hazmat::max_subtree_len(offset - offset % MIN_CHUNK);
        }
        ValueHasher {
            blake,
            root: whole,
            room,
            overflowed,
        }
    }

    pub fn update(&mut self, piece: &[u8]) {
        if self
            .room
            .is_some_and(|room| self.blake.count() + piece.len() as u64 > room)
        {
            self.overflowed = true;
        }
        if !self.overflowed {
            self.blake.update(piece);
        }
    }

    pub fn finalize(&self) -> ChunkValue {
        if self.overflowed {
            *blake3::hash(b"longhaul: not a subtree of the file").as_bytes()
        } else if self.root {
            *self.blake.finalize().as_bytes()
        } else if self.blake.count() == 0 {
            // Chunks of a file of several are never empty; the value of
            // nothing, should one be asked for, is nothing's hash.
            *blake3::hash(&[]).as_bytes()
        } else {
            self.blake.finalize_non_root()
        }
    }
}

/// Hashes one chunk as it streams by: its BLAKE3 value and (unless the
/// data streams' AEAD tags are the checks) its XXH3-128 check, in one pass
/// over each piece.
pub struct ChunkHasher {
    value: ValueHasher,
    check: Option<Checker>,
}

impl ChunkHasher {
    /// See [`ValueHasher::new`]; `checked`: the XXH3-128 check too, else
    /// the check is [`NO_CHECK`].
    pub fn new(offset: u64, whole: bool, checked: bool) -> ChunkHasher {
        ChunkHasher {
            value: ValueHasher::new(offset, whole),
            check: checked.then(Checker::new),
        }
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.value.update(piece);
        if let Some(c) = &mut self.check {
            c.update(piece);
        }
    }

    /// The chunk's value and check.
    pub fn finalize(&self) -> (ChunkValue, Check) {
        let check = self.check.as_ref().map_or(NO_CHECK, Checker::finalize);
        (self.value.finalize(), check)
    }
}

/// The value of a chunk held whole.
pub fn chunk_value(data: &[u8], offset: u64, whole: bool) -> ChunkValue {
    let mut h = ValueHasher::new(offset, whole);
    h.update(data);
    h.finalize()
}

/// The XXH3-128 check of a whole chunk.
pub fn check(data: &[u8]) -> Check {
    xxhash_rust::xxh3::xxh3_128(data).to_be_bytes()
}

/// Streams a chunk's check as it arrives.
#[derive(Clone, Default)]
pub struct Checker(xxhash_rust::xxh3::Xxh3);

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finalize(&self) -> Check {
        self.0.digest128().to_be_bytes()
    }
}

/// The file's BLAKE3 digest from its chunks' values, in order (chunks of
/// a size [`chunk_size_ok`] allows). None for no chunks.
pub fn file_digest(values: &[ChunkValue]) -> Option<[u8; 32]> {
    match values {
        [] => None,
        [whole] => Some(*whole),
        _ => {
            let left = left_count(values.len());
            Some(
                *merge_subtrees_root(
                    &subtree(&values[..left]),
                    &subtree(&values[left..]),
                    Mode::Hash,
                )
                .as_bytes(),
            )
        }
    }
}

/// The chaining value of the subtree over these chunks' values.
fn subtree(values: &[ChunkValue]) -> ChunkValue {
    match values {
        [one] => *one,
        _ => {
            let left = left_count(values.len());
            merge_subtrees_non_root(
                &subtree(&values[..left]),
                &subtree(&values[left..]),
                Mode::Hash,
            )
        }
    }
}

/// How many of `n` equal chunks (n >= 2, the last possibly short) the
/// left subtree holds: the largest power of two below `n`, as BLAKE3
/// splits its input (the whole chunks are equal powers of two, so its
/// split in bytes falls on a chunk boundary).
fn left_count(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 4093) as u8).collect()
    }

    fn digest_by_chunks(d: &[u8], chunk: usize) -> [u8; 32] {
        let whole = d.len() <= chunk;
        let values: Vec<ChunkValue> = if d.is_empty() {
            vec![chunk_value(d, 0, true)]
        } else {
            d.chunks(chunk)
                .enumerate()
                .map(|(i, c)| chunk_value(c, (i * chunk) as u64, whole))
                .collect()
        };
        file_digest(&values).unwrap()
    }

    #[test]
    fn chunk_values_combine_into_the_files_standard_blake3_whatever_the_chunk_size() {
        for len in [
            0,
            1,
            1023,
            1024,
            1025,
            4096,
            5000,
            65536,
            65537,
            200_000,
            1 << 20,
            (3 << 20) + 17,
        ] {
            let d = data(len);
            let want = *blake3::hash(&d).as_bytes();
            for chunk in [1024, 2048, 4096, 65536, 1 << 20, 4 << 20] {
                assert_eq!(digest_by_chunks(&d, chunk), want, "len {len} chunk {chunk}");
            }
        }
    }

    #[test]
    fn streaming_in_pieces_gives_the_same_value_and_check() {
        let d = data(300_000);
        let mut h = ChunkHasher::new(1 << 18, false, true);
        let mut tagged = ChunkHasher::new(1 << 18, false, false);
        for p in d.chunks(7777) {
            h.update(p);
            tagged.update(p);
        }
        let (v, c) = h.finalize();
        assert_eq!(v, chunk_value(&d, 1 << 18, false));
        assert_eq!(c, check(&d));
        // Without the check (the AEAD's tag is it): the same value.
        assert_eq!(tagged.finalize(), (v, NO_CHECK));
        let mut k = Checker::new();
        for p in d.chunks(1000) {
            k.update(p);
        }
        assert_eq!(k.finalize(), check(&d));
    }

    #[test]
    fn only_power_of_two_chunks_of_a_kib_or_more_split_a_file() {
        assert!(chunk_size_ok(10 << 20, 1 << 20));
        assert!(chunk_size_ok(10 << 20, 1024));
        assert!(!chunk_size_ok(10 << 20, 3 << 20));
        assert!(!chunk_size_ok(10 << 20, 512));
        assert!(!chunk_size_ok(10, 0));
        // One chunk holds the file: any size does.
        assert!(chunk_size_ok(3 << 20, 3 << 20));
        assert_eq!(usable_chunk_size(3 << 20), 2 << 20);
        assert_eq!(usable_chunk_size(100), 1024);
        assert_eq!(usable_chunk_size(4 << 20), 4 << 20);
    }

    #[test]
    fn a_chunk_that_is_not_a_subtree_gets_a_value_and_no_panic() {
        let d = data(3 << 20);
        // 3 MiB at 1 MiB is no subtree; neither is an offset off the 1 KiB grid.
        let v = chunk_value(&d, 1 << 20, false);
        assert_ne!(v, chunk_value(&d[..1 << 20], 1 << 20, false));
        assert_eq!(v, chunk_value(&d[..5], 100, false));
    }

    #[test]
    fn a_changed_byte_changes_the_value_and_the_check() {
        let mut d = data(8192);
        let (v, c) = (chunk_value(&d, 0, false), check(&d));
        d[4000] ^= 1;
        assert_ne!(chunk_value(&d, 0, false), v);
        assert_ne!(check(&d), c);
        // The same bytes at another offset are another subtree.
        assert_ne!(chunk_value(&data(8192), 8192, false), v);
    }
}
