//! The transfer decoders that read peer or disk bytes: chunk headers,
//! resume journals, remote paths and path confinement. None may panic;
//! what they accept must round-trip or stay beneath its root.

#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_proto::xfer::{
    components, landing, parse_journal, parse_remote, ChunkHeader, Create, DestState, Landing,
    CHUNK_HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    if data.len() >= CHUNK_HEADER_LEN {
        let b: [u8; CHUNK_HEADER_LEN] = data[..CHUNK_HEADER_LEN].try_into().unwrap();
        if let Ok(h) = ChunkHeader::decode(&b) {
            assert_eq!(ChunkHeader::decode(&h.encode()), Ok(h));
            assert!(h.offset.checked_add(u64::from(h.len)).is_some());
        }
    }
    if let Some((_, records)) = parse_journal(data) {
        assert!(records.len() <= data.len() / 36);
    }
    // The destination rule: whatever the inputs, nothing is created
    // without mkpath, and several sources never land onto one name.
    if let Some(&b) = data.first() {
        let state = match b & 3 {
            0 => DestState::Dir,
            1 => DestState::Other,
            2 => DestState::Missing { parent: true },
            _ => DestState::Missing { parent: false },
        };
        let (sources, contents, slash, mkpath) =
            (u32::from(b >> 2 & 3), b & 16 != 0, b & 32 != 0, b & 64 != 0);
        if let Ok((l, create)) = landing("d", sources, contents, slash, state, mkpath) {
            assert!(mkpath || create == Create::Nothing);
            assert!(contents || sources <= 1 || l == Landing::Into);
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(r) = parse_remote(s) {
            assert!(!r.path.is_empty() || r.dir);
        }
        if let Ok(parts) = components(s) {
            for p in parts {
                assert!(
                    p != ".." && p != "." && !p.is_empty() && !p.contains('/') && !p.contains('\0')
                );
            }
        }
    }
});
