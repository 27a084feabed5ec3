//! The chunk planner: turns files into chunks, the unit of scheduling,
//! hashing, verification, acknowledgement and resume.
//!
//! A file of `size` bytes is cut into chunks of `chunk_size` bytes (the
//! last one shorter); an empty file is one empty chunk, so that it, too, is
//! created and acknowledged. Streams pull chunks from one planner in order,
//! so every byte of every file is sent exactly once whatever the stream
//! count, and chunks already verified at the destination (resume) are
//! skipped.

use std::collections::VecDeque;

/// Smallest and largest chunk the planner chooses by itself. The largest
/// bounds the tail of a transfer: a chunk goes whole to one stream, so
/// when the queue runs dry the streams finish up to one chunk apart, each
/// at its share of the path (28 streams on 2 Gbit/s at 120 ms: 9 MB/s, so
/// 1.9 s for 16 MiB, 0.47 s for 4 MiB), and the streams that are done do
/// not hand their share to the rest faster than congestion control lets
/// them grow. At 100 Gbit/s 4 MiB is still 3,000 chunks a second.
pub const MIN_AUTO_CHUNK: u64 = 1 << 20;
pub const MAX_AUTO_CHUNK: u64 = 4 << 20;

/// One piece of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Chunk {
    pub file: u64,
    /// Index of the chunk within its file.
    pub index: u32,
    pub offset: u64,
    pub len: u32,
}

/// Chunk size for a file when the user did not choose one: large enough
/// that per-chunk work is noise, small enough that `streams` streams all
/// get a share of one big file and resume loses little. Any count up to
/// the automatic maximum gives the same size, so a rerun whose streams were
/// sized differently for the path (another RTT) still resumes.
pub fn auto_chunk_size(file_size: u64, streams: u16) -> u64 {
    let ways = streams.max(crate::window::MAX_AUTO_STREAMS);
    let per_stream = file_size / (u64::from(ways) * 8);
    let chunk = per_stream
        .next_power_of_two()
        .clamp(MIN_AUTO_CHUNK, MAX_AUTO_CHUNK);
    // Beyond 1 TiB the chunks grow instead (to 1 GiB, a chunk's length
    // being a u32), so that a file's ledger and journal stay bounded.
    let bounded = file_size.div_ceil(MAX_AUTO_CHUNKS).next_power_of_two();
    chunk.max(bounded.min(1 << 30))
}

/// Most chunks the planner gives a file by itself: 262,144 (8 MiB of
/// hashes in the sink's ledger), 1 TiB at [`MAX_AUTO_CHUNK`].
pub const MAX_AUTO_CHUNKS: u64 = 1 << 18;

/// How many chunks a file of `size` bytes has.
pub fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size.max(1)).max(1)
}

/// The chunk `index` of a file.
pub fn chunk_at(file: u64, size: u64, chunk_size: u64, index: u32) -> Chunk {
    let offset = u64::from(index) * chunk_size;
    Chunk {
        file,
        index,
        offset,
        len: size.saturating_sub(offset).min(chunk_size) as u32,
    }
}

struct Pending {
    file: u64,
    size: u64,
    chunk_size: u64,
    next: u32,
    count: u32,
    /// Sorted, disjoint ranges `[first, end)` of chunks the destination
    /// already has.
    skip: Vec<[u32; 2]>,
    /// The first range that may still lie at or after `next`.
    skip_at: usize,
}

/// Hands out the chunks of the files added to it, in order.
#[derive(Default)]
pub struct Planner {
    files: VecDeque<Pending>,
}

/// A chunk size a file cannot be cut into.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chunk size {chunk_size} does not fit a file of {size} bytes: use 64 KiB..=2 GiB, at most 2^32 chunks per file")]
pub struct ChunkSizeError {
    pub size: u64,
    pub chunk_size: u64,
}

impl Planner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a file; `skip` lists ranges `[first, end)` of chunk indices
    /// already verified at the destination (any order, overlaps allowed).
    /// Returns how many of its chunks it will hand out.
    pub fn add(
        &mut self,
        file: u64,
        size: u64,
        chunk_size: u64,
        mut skip: Vec<[u32; 2]>,
    ) -> Result<u64, ChunkSizeError> {
        let count = chunk_count(size, chunk_size);
        if !(64 << 10..=1 << 31).contains(&chunk_size) || count > u64::from(u32::MAX) {
            return Err(ChunkSizeError { size, chunk_size });
        }
        skip.retain(|r| r[0] < r[1]);
        skip.sort_unstable();
        let mut merged: Vec<[u32; 2]> = Vec::with_capacity(skip.len());
        for r in skip {
            match merged.last_mut() {
                Some(m) if r[0] <= m[1] => m[1] = m[1].max(r[1]),
                _ => merged.push(r),
            }
        }
        let skipped: u64 = merged
            .iter()
            .map(|r| u64::from(r[1]).min(count) - u64::from(r[0]).min(count))
            .sum();
        self.files.push_back(Pending {
            file,
            size,
            chunk_size,
            next: 0,
            count: count as u32,
            skip: merged,
            skip_at: 0,
        });
        Ok(count - skipped)
    }

    /// The next chunk to send, if any is left.
    pub fn next_chunk(&mut self) -> Option<Chunk> {
        loop {
            let p = self.files.front_mut()?;
            while let Some(r) = p.skip.get(p.skip_at) {
                if r[1] <= p.next {
                    p.skip_at += 1;
                } else {
                    if r[0] <= p.next {
                        p.next = r[1];
                    }
                    break;
                }
            }
            if p.next >= p.count {
                self.files.pop_front();
                continue;
            }
            let c = chunk_at(p.file, p.size, p.chunk_size, p.next);
            p.next += 1;
            return Some(c);
        }
    }

    /// Files not yet fully handed out.
    pub fn pending_files(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_file_is_one_empty_chunk() {
        let mut p = Planner::new();
        p.add(7, 0, 1 << 20, vec![]).unwrap();
        assert_eq!(
            p.next_chunk(),
            Some(Chunk {
                file: 7,
                index: 0,
                offset: 0,
                len: 0
            })
        );
        assert_eq!(p.next_chunk(), None);
    }

    #[test]
    fn bad_chunk_sizes_are_refused() {
        let mut p = Planner::new();
        assert!(p.add(1, 10, 0, vec![]).is_err());
        assert!(p.add(1, 10, 1000, vec![]).is_err());
        assert!(p.add(1, u64::MAX, 64 << 10, vec![]).is_err());
    }

    #[test]
    fn auto_chunk_size_is_bounded() {
        assert_eq!(auto_chunk_size(0, 4), MIN_AUTO_CHUNK);
        assert_eq!(auto_chunk_size(1 << 40, 1), MAX_AUTO_CHUNK);
        // Past 1 TiB the chunk grows, the count stays bounded.
        assert_eq!(auto_chunk_size(1 << 42, 1), 16 << 20);
        assert_eq!(auto_chunk_size(1 << 50, 1), 1 << 30);
        let huge = (1u64 << 44) + 1;
        assert!(chunk_count(huge, auto_chunk_size(huge, 8)) <= MAX_AUTO_CHUNKS);
        assert_eq!(auto_chunk_size(4 << 30, 4), 4 << 20);
        assert_eq!(auto_chunk_size(512 << 20, 4), 2 << 20);
        // Stream counts up to the automatic maximum do not change it.
        assert_eq!(
            auto_chunk_size(512 << 20, 19),
            auto_chunk_size(512 << 20, 32)
        );
        assert_eq!(auto_chunk_size(512 << 20, 64), 1 << 20);
    }

    fn sizes_around(chunk: u64) -> Vec<u64> {
        vec![0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 7]
    }

    proptest! {
        /// Every byte of every file is covered exactly once, whatever the
        /// stream count, chunk size, file sizes and skipped chunks; skipped
        /// chunks are exactly the ones not handed out.
        #[test]
        fn every_byte_exactly_once(
            chunk_kib in 64u64..4096,
            extra_sizes in proptest::collection::vec(0u64..(64 << 20), 0..6),
            huge in proptest::option::of(1u64 << 30..1 << 44),
            streams in 1usize..64,
            skip_mask in any::<u64>(),
        ) {
            let chunk = chunk_kib << 10;
            let mut sizes = sizes_around(chunk);
            sizes.extend(extra_sizes);
            sizes.extend(huge.filter(|h| chunk_count(*h, chunk) < 100_000));
            let mut p = Planner::new();
            let mut skipped = Vec::new();
            for (f, &size) in sizes.iter().enumerate() {
                let count = chunk_count(size, chunk) as u32;
                let skip: Vec<u32> = (0..count.min(64)).filter(|i| skip_mask >> i & 1 == 1 && f % 2 == 1).collect();
                // As ranges, with a duplicate and out of order: add() must cope.
                let mut ranges = crate::xfer::skip_ranges(skip.iter().copied(), usize::MAX);
                ranges.reverse();
                if let Some(&r) = ranges.first() {
                    ranges.push(r);
                }
                let handed_out = p.add(f as u64, size, chunk, ranges).unwrap();
                prop_assert_eq!(handed_out, u64::from(count) - skip.len() as u64);
                skipped.push(skip);
            }
            // Streams take turns pulling, as workers do.
            let mut per_stream: Vec<Vec<Chunk>> = vec![Vec::new(); streams];
            let mut turn = 0;
            while let Some(c) = p.next_chunk() {
                per_stream[turn % streams].push(c);
                turn += 1;
            }
            let mut all: Vec<Chunk> = per_stream.into_iter().flatten().collect();
            all.sort();
            for (f, &size) in sizes.iter().enumerate() {
                let mine: Vec<&Chunk> = all.iter().filter(|c| c.file == f as u64).collect();
                let count = chunk_count(size, chunk) as u32;
                let mut covered = 0u64;
                let mut expect_index = 0u32;
                for c in &mine {
                    while skipped[f].contains(&expect_index) {
                        covered += u64::from(chunk_at(f as u64, size, chunk, expect_index).len);
                        expect_index += 1;
                    }
                    prop_assert_eq!(c.index, expect_index);
                    prop_assert_eq!(c.offset, covered);
                    prop_assert!(u64::from(c.len) <= chunk);
                    covered += u64::from(c.len);
                    expect_index += 1;
                }
                while expect_index < count && skipped[f].contains(&expect_index) {
                    covered += u64::from(chunk_at(f as u64, size, chunk, expect_index).len);
                    expect_index += 1;
                }
                prop_assert_eq!(expect_index, count);
                prop_assert_eq!(covered, size);
            }
        }
    }
}
