//! Cutting a manifest into units of work (pure, property-tested).
// STUB until the helper's module lands.
pub struct Item {
    pub size: u64,
    pub chunk_size: u64,
    pub file: bool,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub first: u32,
    pub end: u32,
    pub chunks: Option<[u32; 2]>,
    pub bytes: u64,
}
pub fn static_shares(items: &[Item], ranks: u32) -> Vec<Vec<Unit>> {
    let total: u64 = items.iter().map(|i| i.size + 1).sum();
    let mut out = vec![Vec::new(); ranks as usize];
    let mut acc = 0u64;
    for (i, it) in items.iter().enumerate() {
        let count = longhaul_proto::plan::chunk_count(it.size, it.chunk_size.max(1)) as u32;
        if it.file && count >= ranks && it.size > total / 4 {
            let per = count.div_ceil(ranks);
            for r in 0..ranks {
                let lo = r * per;
                let hi = ((r + 1) * per).min(count);
                if lo < hi {
                    out[r as usize].push(Unit {
                        first: i as u32,
                        end: i as u32 + 1,
                        chunks: Some([lo, hi]),
                        bytes: 0,
                    });
                }
            }
        } else {
            let r = ((acc * ranks as u64) / total.max(1)).min(ranks as u64 - 1) as usize;
            out[r].push(Unit {
                first: i as u32,
                end: i as u32 + 1,
                chunks: None,
                bytes: it.size,
            });
        }
        acc += it.size + 1;
    }
    out
}
pub fn queue_units(items: &[Item], _unit_bytes: u64, _unit_files: u32) -> Vec<Unit> {
    items
        .iter()
        .enumerate()
        .map(|(i, it)| Unit {
            first: i as u32,
            end: i as u32 + 1,
            chunks: None,
            bytes: it.size,
        })
        .collect()
}
