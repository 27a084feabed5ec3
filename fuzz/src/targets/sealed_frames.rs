//! Arbitrary bytes as a sealed data stream (PROTOCOL.md 13.2b), read in
//! arbitrary sizes: must never panic, and never return data from a frame
//! that does not open. Then frames sealed from arbitrary pieces, read back
//! in arbitrary sizes: the same bytes, then the clean end.

use arbitrary::Arbitrary;
use longhaul_engine::net::sealed::{seal, Keys, Opener};

#[derive(Arbitrary, Debug)]
struct Input {
    wire: Vec<u8>,
    reads: Vec<u16>,
    pieces: Vec<Vec<u8>>,
}

fn read_all(wire: &[u8], reads: &[u16]) -> std::io::Result<Vec<u8>> {
    let mut opener = Opener::new(Keys::aes_128_gcm([3; 32]));
    let mut src = wire;
    let mut got = Vec::new();
    for i in 0.. {
        let step = reads
            .get(i % reads.len().max(1))
            .map_or(4096, |&r| usize::from(r).max(1));
        let mut buf = vec![0u8; step];
        match opener.read(&mut src, &mut buf)? {
            0 => break,
            n => got.extend_from_slice(&buf[..n]),
        }
    }
    Ok(got)
}

fuzz_target!(|input: Input| {
    // Random bytes never open (the key is not theirs to know), so they
    // give an error and no data.
    if let Ok(got) = read_all(&input.wire, &input.reads) {
        assert!(got.is_empty(), "unsealed bytes read as data");
    }
    let mut keys = Keys::aes_128_gcm([3; 32]);
    let mut wire = Vec::new();
    let mut frame = Vec::new();
    for p in input
        .pieces
        .iter()
        .filter(|p| p.len() <= longhaul_engine::net::sealed::MAX_FRAME)
    {
        seal(&mut keys, p, false, &mut frame).unwrap();
        wire.extend_from_slice(&frame);
    }
    seal(&mut keys, &[], true, &mut frame).unwrap();
    wire.extend_from_slice(&frame);
    let sent: Vec<u8> = input
        .pieces
        .iter()
        .filter(|p| p.len() <= longhaul_engine::net::sealed::MAX_FRAME)
        .flatten()
        .copied()
        .collect();
    assert_eq!(read_all(&wire, &input.reads).unwrap(), sent);
});
