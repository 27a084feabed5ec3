//! The transfer decoders that read peer or disk bytes: chunk headers,
//! the blocks of compressed chunk frames (their words and the bounded
//! zstd decoder, on raw bytes and on damaged real frames), bundle frames,
//! resume journals, remote paths, path confinement and the third-party
//! copy messages with their scope check. None may panic; what they accept
//! must round-trip or stay beneath its root, and a block decodes to
//! exactly its declared length or not at all.

use longhaul_proto::frame::Frame;
use longhaul_proto::msg::{kind, Message};
use longhaul_proto::xfer::compress::{Block, Decoder, Encoder, BLOCK};
use longhaul_proto::xfer::copy::within_scope;
use longhaul_proto::xfer::TransferRequest;
use longhaul_proto::xfer::{
    components, landing, parse_journal, parse_remote, push_bundle_record, BundleHeader,
    ChunkHeader, Create, DestState, Landing, BUNDLE_HEADER_LEN, CHUNK_HEADER_LEN, MAX_BUNDLE_BODY,
    MAX_BUNDLE_FILE, MAX_BUNDLE_FILES,
};

fuzz_target!(|data: &[u8]| {
    if data.len() >= CHUNK_HEADER_LEN {
        let b: [u8; CHUNK_HEADER_LEN] = data[..CHUNK_HEADER_LEN].try_into().unwrap();
        if let Ok(h) = ChunkHeader::decode(&b) {
            assert_eq!(ChunkHeader::decode(&h.encode()), Ok(h));
            assert!(h.offset.checked_add(u64::from(h.len)).is_some());
        }
    }
    compressed_blocks(data);
    if data.len() >= BUNDLE_HEADER_LEN {
        let b: [u8; BUNDLE_HEADER_LEN] = data[..BUNDLE_HEADER_LEN].try_into().unwrap();
        let body = &data[BUNDLE_HEADER_LEN..];
        if let Ok(h) = BundleHeader::decode(&b) {
            assert_eq!(BundleHeader::decode(&h.encode()), Ok(h));
            assert!(h.count >= 1 && h.count <= MAX_BUNDLE_FILES && h.body_len <= MAX_BUNDLE_BODY);
            let _ = h.records(body);
        }
        // Records under any count, the body taken as long as it is: what
        // is accepted is exactly `count` records that re-encode to it.
        let count = u32::from_be_bytes(b[1..5].try_into().unwrap());
        let h = BundleHeader {
            count,
            body_len: body.len().min(u32::MAX as usize) as u32,
        };
        if let Ok(records) = h.records(body) {
            assert_eq!(records.len(), count as usize);
            let mut again = Vec::new();
            for r in &records {
                assert!(r.data.len() <= MAX_BUNDLE_FILE as usize);
                push_bundle_record(&mut again, r.file, r.data, &r.trailer);
            }
            assert_eq!(again, body);
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
    // A third-party copy's messages, from any body: what decodes
    // re-encodes to itself, and a request checked against a decoded scope
    // is only within it when it names exactly its export and destination.
    for kind in [
        kind::GRANT_REQUEST,
        kind::GRANT,
        kind::COPY_ORDER,
        kind::COPY_RELAY,
    ] {
        if let Ok(m) = Message::decode(&Frame {
            kind,
            body: data.to_vec(),
        }) {
            let mut wire = Vec::new();
            m.encode(&mut wire).expect("a decoded message encodes");
            if let Message::GrantRequest(scope) = &m {
                if let Ok(t) = serde_json::from_slice::<TransferRequest>(data) {
                    if within_scope(scope, &t).is_ok() {
                        assert!(t.export == scope.export && t.dest == scope.dest);
                    }
                }
            }
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

/// A compressed chunk's block as a sink reads it: a word checked against
/// a raw length the input picks, then the decoder with exactly that room,
/// fed the input's bytes, and a real frame of the input damaged at a few
/// places the input picks.
fn compressed_blocks(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let raw = (usize::from(u16::from_be_bytes([head[0], head[1]])) * 8).clamp(1, BLOCK);
    let word: [u8; 4] = head[2..6].try_into().unwrap();
    let mut d = Decoder::new().unwrap();
    let mut out = vec![0u8; raw];
    match Block::decode(word, raw) {
        Ok(Block::Stored(n)) => assert_eq!(n as usize, raw),
        Ok(Block::Compressed(n)) => {
            assert!(n > 0 && (n as usize) < raw);
            let wire = &rest[..rest.len().min(n as usize)];
            let _ = d.decode(wire, &mut out);
        }
        Err(_) => {}
    }
    // A real frame of the input's bytes (repeated, so that it compresses),
    // damaged, decoded into its own length and into one byte less.
    if rest.len() < 8 {
        return;
    }
    let (edits, body) = rest.split_at(4);
    let raw: Vec<u8> = body.iter().copied().cycle().take(body.len() * 8).collect();
    let Some(z) = Encoder::new(1).unwrap().compress(&raw).map(<[u8]>::to_vec) else {
        return;
    };
    let mut bad = z.clone();
    for e in edits.chunks(2) {
        let at = usize::from(e[0]) % bad.len();
        bad[at] ^= e.get(1).copied().unwrap_or(1);
    }
    let mut out = vec![0u8; raw.len()];
    if d.decode(&z, &mut out).is_ok() {
        assert_eq!(out, raw, "an undamaged frame decodes to its bytes");
    }
    let _ = d.decode(&bad, &mut out);
    let _ = d.decode(&bad, &mut out[..raw.len() - 1]);
}
