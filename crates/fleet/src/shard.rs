//! Cutting a manifest into units of work: pure, no I/O, property-tested
//! (every entry and every chunk of every file exactly once).
//!
//! Static shares follow mpifileutils' dcp: lay the manifest on one line,
//! each entry as long as its bytes plus a fixed cost ([`ENTRY_COST`]: what
//! an entry costs beyond its bytes, its open, create, rename and round
//! trips), and give rank `r` the stretch `[r T/N, (r+1) T/N)` of the line
//! of length `T`. A file that crosses a cut is split between the ranks at
//! chunk boundaries (each chunk goes where its middle falls), so one huge
//! file is shared by every rank; a small file goes whole to the rank where
//! it starts. Queue units are smaller: ranges of about `unit_bytes` of
//! large files, and runs of small entries up to `unit_bytes` or
//! `unit_files`, so that ranks that run faster take more of them.

use longhaul_proto::plan::chunk_count;

/// What a manifest entry weighs beyond its bytes, in bytes: about what a
/// small file's round trips, open, create and rename cost on a data
/// transfer node, at the rates small-file transfers reach (10,000 files/s
/// against 1 Gbit/s is 12.5 KB a file). It keeps a share of 20,000 tiny
/// files from landing on one rank.
pub const ENTRY_COST: u64 = 16 << 10;

/// One manifest entry, in manifest order, as the planner weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub size: u64,
    /// The file's chunk size (0 for what is not a file).
    pub chunk_size: u64,
    /// A regular file (directories and links are whole entries of size 0).
    pub file: bool,
}

impl Item {
    /// Chunks of the file (1 for anything else).
    fn chunks(&self) -> u64 {
        if self.file && self.chunk_size > 0 {
            chunk_count(self.size, self.chunk_size)
        } else {
            1
        }
    }

    fn weight(&self) -> u64 {
        self.size + ENTRY_COST
    }

    /// Bytes of chunks `[lo, hi)`.
    fn bytes(&self, lo: u64, hi: u64) -> u64 {
        let at = |i: u64| i.saturating_mul(self.chunk_size).min(self.size);
        at(hi) - at(lo)
    }
}

/// Whole entries `[first, end)` of the manifest, or with `chunks` the
/// chunk indices `[lo, hi)` of the one file `first` (`end == first + 1`).
/// A unit with every chunk of a file has `chunks: None`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unit {
    pub first: u32,
    pub end: u32,
    pub chunks: Option<[u32; 2]>,
    /// The bytes it carries.
    pub bytes: u64,
}

/// Appends whole entry `i` to `units`, joining the previous run of whole
/// entries when it ends at `i`.
fn push_whole(units: &mut Vec<Unit>, i: u32, bytes: u64) {
    match units.last_mut() {
        Some(u) if u.chunks.is_none() && u.end == i => {
            u.end += 1;
            u.bytes += bytes;
        }
        _ => units.push(Unit {
            first: i,
            end: i + 1,
            chunks: None,
            bytes,
        }),
    }
}

/// Chunks `[lo, hi)` of item `i` (whole when they are all of it).
fn push_range(units: &mut Vec<Unit>, i: u32, item: &Item, lo: u64, hi: u64) {
    let bytes = item.bytes(lo, hi);
    if lo == 0 && hi == item.chunks() {
        push_whole(units, i, bytes);
    } else {
        units.push(Unit {
            first: i,
            end: i + 1,
            chunks: Some([lo as u32, hi as u32]),
            bytes,
        });
    }
}

/// Each rank's share, `ranks` of them (the static mode).
pub fn static_shares(items: &[Item], ranks: u32) -> Vec<Vec<Unit>> {
    let n = u128::from(ranks.max(1));
    let total: u128 = items.iter().map(|i| u128::from(i.weight())).sum();
    let mut shares = vec![Vec::new(); n as usize];
    // The rank whose stretch of the line holds position `at`.
    let rank_at = |at: u128| -> usize {
        (at * n)
            .checked_div(total)
            .map_or(0, |r| r.min(n - 1) as usize)
    };
    let mut start: u128 = 0;
    for (i, item) in items.iter().enumerate() {
        let i = i as u32;
        let count = item.chunks();
        if count <= 1 {
            shares[rank_at(start)].push_whole_entry(i, item.size);
        } else {
            // The entry's cost first, then its chunks; each chunk goes to
            // the rank where its middle falls (monotonic: runs per rank).
            let base = start + u128::from(ENTRY_COST);
            let mut lo = 0u64;
            let mut owner = rank_at(base + u128::from(item.bytes(0, 1)) / 2);
            for c in 1..=count {
                let next = (c < count).then(|| {
                    let mid =
                        base + u128::from(item.bytes(0, c)) + u128::from(item.bytes(c, c + 1)) / 2;
                    rank_at(mid)
                });
                if next != Some(owner) {
                    push_range(&mut shares[owner], i, item, lo, c);
                    if let Some(o) = next {
                        owner = o;
                        lo = c;
                    }
                }
            }
        }
        start += u128::from(item.weight());
    }
    shares
}

trait PushWhole {
    fn push_whole_entry(&mut self, i: u32, bytes: u64);
}

impl PushWhole for Vec<Unit> {
    fn push_whole_entry(&mut self, i: u32, bytes: u64) {
        push_whole(self, i, bytes);
    }
}

/// The queue's units: files over `unit_bytes` cut into ranges of about
/// `unit_bytes` (whole chunks), the rest grouped in runs of at most
/// `unit_bytes` and `unit_files` entries.
pub fn queue_units(items: &[Item], unit_bytes: u64, unit_files: u32) -> Vec<Unit> {
    let unit_bytes = unit_bytes.max(1);
    let unit_files = unit_files.max(1);
    let mut units: Vec<Unit> = Vec::new();
    // Whether the last unit is an open run of whole entries.
    let mut open = false;
    for (i, item) in items.iter().enumerate() {
        let i = i as u32;
        let count = item.chunks();
        if count > 1 && item.size > unit_bytes {
            let per = (unit_bytes / item.chunk_size).max(1);
            let mut lo = 0;
            while lo < count {
                let hi = (lo + per).min(count);
                push_range(&mut units, i, item, lo, hi);
                lo = hi;
            }
            open = false;
            continue;
        }
        let fits = open
            && units
                .last()
                .is_some_and(|u| u.bytes + item.size <= unit_bytes && u.end - u.first < unit_files);
        if fits {
            push_whole(&mut units, i, item.size);
        } else {
            units.push(Unit {
                first: i,
                end: i + 1,
                chunks: None,
                bytes: item.size,
            });
        }
        open = true;
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every entry once, every chunk of every file once, across `units`.
    fn assert_exactly_once(items: &[Item], units: &[&Unit]) {
        let mut seen: Vec<Vec<u32>> = items
            .iter()
            .map(|it| vec![0; it.chunks() as usize])
            .collect();
        for u in units {
            assert!(u.first < u.end && (u.end as usize) <= items.len(), "{u:?}");
            match u.chunks {
                None => {
                    for i in u.first..u.end {
                        for c in &mut seen[i as usize] {
                            *c += 1;
                        }
                    }
                }
                Some([lo, hi]) => {
                    assert_eq!(u.end, u.first + 1, "a range is of one file: {u:?}");
                    let it = &items[u.first as usize];
                    assert!(
                        it.file && lo < hi && u64::from(hi) <= it.chunks(),
                        "{u:?} {it:?}"
                    );
                    assert!(
                        !(lo == 0 && u64::from(hi) == it.chunks()),
                        "a whole file is whole: {u:?}"
                    );
                    for c in lo..hi {
                        seen[u.first as usize][c as usize] += 1;
                    }
                }
            }
        }
        for (i, s) in seen.iter().enumerate() {
            assert!(s.iter().all(|c| *c == 1), "entry {i}: chunks seen {s:?}");
        }
        let bytes: u64 = units.iter().map(|u| u.bytes).sum();
        assert_eq!(
            bytes,
            items.iter().map(|i| i.size).sum::<u64>(),
            "every byte once"
        );
    }

    fn item() -> impl Strategy<Value = Item> {
        prop_oneof![
            Just(Item {
                size: 0,
                chunk_size: 0,
                file: false
            }),
            (0u64..200_000).prop_map(|s| Item {
                size: s,
                chunk_size: 1 << 20,
                file: true
            }),
            (
                0u64..(40 << 20),
                prop_oneof![Just(64u64 << 10), Just(1 << 20)]
            )
                .prop_map(|(s, c)| Item {
                    size: s,
                    chunk_size: c,
                    file: true
                }),
        ]
    }

    proptest! {
        #[test]
        fn static_shares_hold_every_byte_once_and_are_balanced(
            items in prop::collection::vec(item(), 0..60),
            ranks in 1u32..12,
        ) {
            let shares = static_shares(&items, ranks);
            prop_assert_eq!(shares.len(), ranks as usize);
            let all: Vec<&Unit> = shares.iter().flatten().collect();
            assert_exactly_once(&items, &all);
            // In manifest order within a share.
            for s in &shares {
                for w in s.windows(2) {
                    prop_assert!(w[0].first < w[1].first || (w[0].first == w[1].first && w[0].chunks < w[1].chunks));
                }
            }
            // Balanced: each rank within one item (or chunk) of its stretch.
            let total: u64 = items.iter().map(Item::weight).sum();
            let slack = items
                .iter()
                .map(|i| if i.chunks() > 1 { i.chunk_size + ENTRY_COST } else { i.weight() })
                .max()
                .unwrap_or(0);
            for s in &shares {
                let w: u64 = s
                    .iter()
                    .map(|u| {
                        let entries = match u.chunks {
                            None => u64::from(u.end - u.first),
                            Some([0, _]) => 1,
                            Some(_) => 0,
                        };
                        u.bytes + entries * ENTRY_COST
                    })
                    .sum();
                let fair = total / u64::from(ranks);
                prop_assert!(w <= fair + 2 * slack, "share {} vs fair {} (slack {})", w, fair, slack);
            }
        }

        #[test]
        fn queue_units_hold_every_byte_once_and_stay_small(
            items in prop::collection::vec(item(), 0..60),
            unit in (1u64 << 20)..(16 << 20),
            files in 1u32..50,
        ) {
            let units = queue_units(&items, unit, files);
            let all: Vec<&Unit> = units.iter().collect();
            assert_exactly_once(&items, &all);
            for u in &units {
                let largest = items[u.first as usize].chunk_size.max(items[u.first as usize].size);
                prop_assert!(u.bytes <= unit + largest.min(u.bytes), "{:?}", u);
                prop_assert!(u.chunks.is_some() || u.end - u.first <= files, "{:?}", u);
            }
        }
    }

    /// The skewed dataset: one 4 GiB file and 20,000 small files.
    fn skewed() -> Vec<Item> {
        let mut items = vec![Item {
            size: 4 << 30,
            chunk_size: 64 << 20,
            file: true,
        }];
        items.extend((0..20_000).map(|i| Item {
            size: 1024 + (i * 7919) % 15_000,
            chunk_size: 1 << 20,
            file: true,
        }));
        items
    }

    #[test]
    fn a_huge_file_is_shared_by_every_rank_and_the_small_files_spread() {
        let items = skewed();
        let shares = static_shares(&items, 4);
        for (r, s) in shares.iter().enumerate() {
            assert!(
                s.iter().any(|u| u.first == 0),
                "rank {r} carries part of the huge file: {s:?}"
            );
        }
        // Balanced by weight: bytes, and each entry's cost (the rank with
        // the small files carries fewer bytes, more entries).
        let weights: Vec<u64> = shares
            .iter()
            .map(|s| {
                s.iter()
                    .map(|u| match u.chunks {
                        None => u.bytes + u64::from(u.end - u.first) * ENTRY_COST,
                        Some(_) => u.bytes,
                    })
                    .sum()
            })
            .collect();
        let fair = items.iter().map(Item::weight).sum::<u64>() / 4;
        for w in &weights {
            let off = (*w as f64 - fair as f64).abs() / fair as f64;
            assert!(off < 0.05, "shares {weights:?} vs fair {fair}");
        }
        let units = queue_units(&items, 256 << 20, 2_000);
        assert_eq!(
            units.iter().filter(|u| u.first == 0).count(),
            16,
            "4 GiB in 256 MiB ranges"
        );
        assert_eq!(units.len(), 16 + 10, "20,000 small files in runs of 2,000");
    }

    #[test]
    fn nothing_to_share_gives_every_rank_nothing() {
        assert_eq!(static_shares(&[], 3), vec![Vec::<Unit>::new(); 3]);
        assert!(queue_units(&[], 1, 1).is_empty());
        // Fewer entries than ranks: some ranks have nothing, none twice.
        let items = vec![
            Item {
                size: 10,
                chunk_size: 1 << 20,
                file: true
            };
            2
        ];
        let shares = static_shares(&items, 5);
        let all: Vec<&Unit> = shares.iter().flatten().collect();
        assert_exactly_once(&items, &all);
    }
}
