//! The transfer decoders that read peer or disk bytes: chunk headers,
//! resume journals, remote paths and path confinement. None may panic;
//! what they accept must round-trip or stay beneath its root.

#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_proto::xfer::{
    components, parse_journal, parse_remote, ChunkHeader, CHUNK_HEADER_LEN,
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
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_remote(s);
        if let Ok(parts) = components(s) {
            for p in parts {
                assert!(
                    p != ".." && p != "." && !p.is_empty() && !p.contains('/') && !p.contains('\0')
                );
            }
        }
    }
});
