//! Per-chunk compression (`cp -z`, PROTOCOL.md 13.5c): the blocks of a
//! compressed chunk frame (`0xC4`), the encoder and the bounded decoder of
//! one block, and the [`Governor`] that turns compression off by itself
//! when the data does not compress or the path is faster than the
//! compressor. No I/O and no clock: the engine passes the times it
//! measured.
//!
//! A compressed chunk frame carries the same header as a `C1` frame (its
//! `len` is the chunk's raw length) and the same trailer (the check and
//! value of the raw bytes); between them the raw bytes go as blocks of
//! [`BLOCK`] bytes (the last one shorter), each behind a 4-byte word:
//!
//! ```text
//! | word u32 | wire bytes |
//! word: bit 31 set: stored, the block's raw bytes follow (low bits: their length)
//!       bit 31 clear: one zstd frame of `word` bytes follows, which decodes to
//!       exactly the block's raw length, and is shorter than it
//! ```

use serde::{Deserialize, Serialize};

use super::FrameError;

/// Raw bytes of each block of a compressed chunk (the last one of a chunk
/// is shorter): the engine's piece, so that neither end holds more than
/// one block of a chunk.
pub const BLOCK: usize = 512 << 10;
/// Bytes of a block's word.
pub const BLOCK_WORD_LEN: usize = 4;
const STORED: u32 = 1 << 31;

/// zstd level of `-z` without `--compress-level`: fast (about 500 MB/s a
/// core on text), most of the gain of higher levels on typical data.
pub const DEFAULT_LEVEL: i32 = 1;
/// Levels a request may ask for: zstd's fast negative levels up to 9
/// (higher ones cost a sender far more CPU than a transfer's gain; the
/// server refuses them, since on a pull its CPU would pay).
pub const MIN_LEVEL: i32 = -50;
pub const MAX_LEVEL: i32 = 9;

/// Whether `level` is one a request may ask for; the error says which are.
pub fn check_level(level: i32) -> Result<(), String> {
    if (MIN_LEVEL..=MAX_LEVEL).contains(&level) && level != 0 {
        return Ok(());
    }
    Err(format!(
        "compression level {level} is out of range: {MIN_LEVEL}..=-1 (fastest) or 1..={MAX_LEVEL}"
    ))
}

/// A block goes compressed only if that saves at least 1/16 (6.25 %) of
/// its raw bytes; otherwise it is stored.
pub const SAVE_AT_LEAST: usize = 16;

/// The raw length of the block that starts `done` bytes into a chunk of
/// `len` bytes.
pub fn block_len(len: u32, done: u64) -> usize {
    (u64::from(len).saturating_sub(done)).min(BLOCK as u64) as usize
}

/// One block's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// The raw bytes follow as they are.
    Stored(u32),
    /// A zstd frame of this many bytes follows.
    Compressed(u32),
}

impl Block {
    pub fn encode(self) -> [u8; BLOCK_WORD_LEN] {
        match self {
            Block::Stored(n) => (n | STORED).to_be_bytes(),
            Block::Compressed(n) => n.to_be_bytes(),
        }
    }

    /// The word of a block of `raw` bytes, checked: a stored block holds
    /// exactly them; a compressed one is not empty and shorter than them.
    pub fn decode(b: [u8; BLOCK_WORD_LEN], raw: usize) -> Result<Block, FrameError> {
        let w = u32::from_be_bytes(b);
        let n = w & !STORED;
        if w & STORED != 0 {
            if n as usize != raw {
                return Err(FrameError("stored block of a length other than its own"));
            }
            return Ok(Block::Stored(n));
        }
        if n == 0 || n as usize >= raw {
            return Err(FrameError(
                "compressed block empty or not shorter than its raw bytes",
            ));
        }
        Ok(Block::Compressed(n))
    }

    /// Bytes that follow the word.
    pub fn wire_len(self) -> usize {
        match self {
            Block::Stored(n) | Block::Compressed(n) => n as usize,
        }
    }
}

/// A sender's compressor: one zstd context, reused block after block.
pub struct Encoder {
    z: zstd::bulk::Compressor<'static>,
    out: Vec<u8>,
}

impl Encoder {
    /// An encoder at `level` (see [`MIN_LEVEL`]..=[`MAX_LEVEL`]).
    pub fn new(level: i32) -> std::io::Result<Encoder> {
        Ok(Encoder {
            z: zstd::bulk::Compressor::new(level)?,
            out: vec![0; BLOCK],
        })
    }

    /// `raw` (at most [`BLOCK`] bytes) compressed, if that saves at least
    /// 1/[`SAVE_AT_LEAST`] of it; None: send it stored.
    pub fn compress(&mut self, raw: &[u8]) -> Option<&[u8]> {
        let room = raw.len() - raw.len() / SAVE_AT_LEAST;
        if raw.len() < SAVE_AT_LEAST || raw.len() > self.out.len() {
            return None;
        }
        // zstd stops with an error once the output does not fit the room.
        let n = self.z.compress_to_buffer(raw, &mut self.out[..room]).ok()?;
        (n > 0 && n < raw.len()).then(|| &self.out[..n])
    }
}

/// A receiver's decompressor: one zstd context, reused.
pub struct Decoder {
    z: zstd::bulk::Decompressor<'static>,
}

impl Decoder {
    pub fn new() -> std::io::Result<Decoder> {
        Ok(Decoder {
            z: zstd::bulk::Decompressor::new()?,
        })
    }

    /// Decodes one compressed block into `out`, which is exactly the
    /// block's raw length: zstd writes into `out` and nowhere else (it
    /// allocates no window of its own for a one-shot decode), so a frame
    /// that would decode to more, whatever its header declares, is an
    /// error, as is one that decodes to less or is not zstd at all.
    pub fn decode(&mut self, wire: &[u8], out: &mut [u8]) -> Result<(), FrameError> {
        match self.z.decompress_to_buffer(wire, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(_) => Err(FrameError(
                "compressed block decodes to fewer bytes than it declares",
            )),
            Err(_) => Err(FrameError(
                "compressed block does not decode within its declared length",
            )),
        }
    }
}

/// Why compression was turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffReason {
    /// A run of blocks saved too little to be sent compressed.
    Incompressible,
    /// Compressing took longer than sending the raw bytes would have, as
    /// measured on this transfer's streams.
    SlowerThanPath,
}

impl OffReason {
    pub fn describe(self) -> &'static str {
        match self {
            OffReason::Incompressible => "the data does not compress",
            OffReason::SlowerThanPath => "the path is faster than the compressor",
        }
    }
}

/// What compression did in a transfer (the source's account; `cp --json`
/// `compression`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompressReport {
    /// The zstd level.
    pub level: i32,
    /// Bytes of chunk frames' payloads sent, raw (as read).
    pub raw_bytes: u64,
    /// What those bytes took on the data streams (compressed and stored
    /// blocks with their words; frame headers and trailers not counted).
    pub wire_bytes: u64,
    /// Of `raw_bytes`, those that went in compressed blocks.
    pub compressed_bytes: u64,
    /// Times compression was turned off (each followed by a probe later).
    #[serde(default)]
    pub times_off: u32,
    /// Why it was turned off the last time, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_reason: Option<OffReason>,
    /// It was off when the transfer ended.
    #[serde(default)]
    pub off_at_end: bool,
}

/// A run of this many raw bytes in stored blocks turns compression off.
pub const INCOMPRESSIBLE_RUN: u64 = 4 << 20;
/// Raw bytes compressed between two judgements of its speed.
pub const SPEED_WINDOW: u64 = 16 << 20;
/// Raw bytes sent plain after compression is first turned off, before it
/// is tried again; doubled at each turn off in a row, up to [`MAX_REST`].
pub const FIRST_REST: u64 = 64 << 20;
pub const MAX_REST: u64 = 4 << 30;

/// Decides, block after block, whether a source compresses (one for all
/// its streams). Compression is on at the start; a run of
/// [`INCOMPRESSIBLE_RUN`] bytes that did not compress, or a window of
/// [`SPEED_WINDOW`] bytes in which compressing and writing took longer
/// than writing the raw bytes would have (the path's rate taken from the
/// window's own writes), turns it off for a rest of raw bytes, after
/// which a probe tries again; each turn off in a row doubles the rest.
#[derive(Debug, Clone)]
pub struct Governor {
    report: CompressReport,
    /// Raw bytes still to send plain before the next probe; 0 while on.
    rest_left: u64,
    next_rest: u64,
    /// Raw bytes of stored blocks in a row.
    stored_run: u64,
    /// The speed window: raw and wire bytes, compress and write time (µs).
    win_raw: u64,
    win_wire: u64,
    win_compress_us: u64,
    win_write_us: u64,
}

impl Governor {
    pub fn new(level: i32) -> Governor {
        Governor {
            report: CompressReport {
                level,
                ..CompressReport::default()
            },
            rest_left: 0,
            next_rest: FIRST_REST,
            stored_run: 0,
            win_raw: 0,
            win_wire: 0,
            win_compress_us: 0,
            win_write_us: 0,
        }
    }

    /// Whether to try compressing the next block (or chunk).
    pub fn trying(&self) -> bool {
        self.rest_left == 0
    }

    /// A block (or a whole chunk) of `raw` bytes sent without trying:
    /// `wire` bytes on the stream.
    pub fn plain(&mut self, raw: u64, wire: u64) {
        self.report.raw_bytes += raw;
        self.report.wire_bytes += wire;
        if self.rest_left > 0 {
            self.rest_left = self.rest_left.saturating_sub(raw.max(1));
        }
    }

    /// A block of `raw` bytes that was tried: `wire` bytes on the stream
    /// (word included), compressed or not, `compress_us` spent
    /// compressing and `write_us` writing it.
    pub fn tried(
        &mut self,
        raw: u64,
        wire: u64,
        compressed: bool,
        compress_us: u64,
        write_us: u64,
    ) {
        self.report.raw_bytes += raw;
        self.report.wire_bytes += wire;
        if compressed {
            self.report.compressed_bytes += raw;
            self.stored_run = 0;
        } else {
            self.stored_run += raw;
            if self.stored_run >= INCOMPRESSIBLE_RUN {
                self.turn_off(OffReason::Incompressible);
                return;
            }
        }
        self.win_raw += raw;
        self.win_wire += wire;
        self.win_compress_us += compress_us;
        self.win_write_us += write_us;
        if self.win_raw >= SPEED_WINDOW {
            // Writing the raw bytes at the rate the window's writes went.
            let raw_write_us = u128::from(self.win_write_us) * u128::from(self.win_raw)
                / u128::from(self.win_wire.max(1));
            let spent = u128::from(self.win_compress_us) + u128::from(self.win_write_us);
            let (saved_some, slower) = (self.win_wire < self.win_raw, spent > raw_write_us);
            self.clear_window();
            if slower || !saved_some {
                self.turn_off(OffReason::SlowerThanPath);
            } else {
                // It pays: a later turn off rests the shortest time again.
                self.next_rest = FIRST_REST;
            }
        }
    }

    fn clear_window(&mut self) {
        self.win_raw = 0;
        self.win_wire = 0;
        self.win_compress_us = 0;
        self.win_write_us = 0;
    }

    fn turn_off(&mut self, why: OffReason) {
        self.report.times_off += 1;
        self.report.off_reason = Some(why);
        self.rest_left = self.next_rest;
        self.next_rest = (self.next_rest * 2).min(MAX_REST);
        self.stored_run = 0;
        self.clear_window();
    }

    /// The account so far.
    pub fn report(&self) -> CompressReport {
        CompressReport {
            off_at_end: !self.trying(),
            ..self.report.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_lies_are_refused() {
        assert_eq!(
            Block::decode(Block::Stored(7).encode(), 7),
            Ok(Block::Stored(7))
        );
        assert_eq!(
            Block::decode(Block::Compressed(3).encode(), 7),
            Ok(Block::Compressed(3))
        );
        assert!(Block::decode(Block::Stored(7).encode(), 8).is_err());
        assert!(Block::decode(Block::Compressed(7).encode(), 7).is_err());
        assert!(Block::decode(Block::Compressed(0).encode(), 7).is_err());
        assert_eq!(block_len(3 << 20, 0), BLOCK);
        assert_eq!(block_len((1 << 20) + 5, 1 << 20), 5);
        assert_eq!(block_len(5, 5), 0);
    }

    #[test]
    fn text_compresses_noise_does_not_and_both_decode_bounded() {
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog\n"
            .iter()
            .cycle()
            .take(BLOCK)
            .copied()
            .collect();
        let mut e = Encoder::new(DEFAULT_LEVEL).unwrap();
        let z = e.compress(&text).expect("text compresses").to_vec();
        assert!(z.len() < text.len() / 10);
        let mut d = Decoder::new().unwrap();
        let mut out = vec![0; text.len()];
        d.decode(&z, &mut out).unwrap();
        assert_eq!(out, text);
        // Declared shorter than it decodes to: an error, nothing written past.
        let mut short = vec![0; text.len() - 1];
        assert!(d.decode(&z, &mut short).is_err());
        // Declared longer: an error too.
        let mut long = vec![0; text.len() + 1];
        assert!(d.decode(&z, &mut long).is_err());
        assert!(d.decode(b"not zstd at all", &mut out).is_err());
        let noise = crate::data::bytes(1, BLOCK);
        assert!(e.compress(&noise).is_none(), "noise is stored");
    }

    #[test]
    fn a_bomb_is_refused_without_growing() {
        // 1 GiB of zeros in a few KiB: decoded into one block's room only.
        let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
        let mut d = Decoder::new().unwrap();
        let mut out = vec![0; BLOCK];
        assert!(d.decode(&bomb, &mut out).is_err());
    }

    #[test]
    fn incompressible_data_turns_it_off_and_a_probe_later_tries_again() {
        let mut g = Governor::new(1);
        let b = BLOCK as u64;
        for _ in 0..INCOMPRESSIBLE_RUN / b - 1 {
            g.tried(b, b + 4, false, 100, 100);
            assert!(g.trying());
        }
        g.tried(b, b + 4, false, 100, 100);
        assert!(!g.trying());
        assert_eq!(g.report().off_reason, Some(OffReason::Incompressible));
        assert!(g.report().off_at_end);
        let mut sent = 0;
        while !g.trying() {
            g.plain(b, b);
            sent += b;
        }
        assert_eq!(sent, FIRST_REST);
        // Still noise: off again, for twice as long.
        for _ in 0..INCOMPRESSIBLE_RUN / b {
            g.tried(b, b + 4, false, 100, 100);
        }
        assert!(!g.trying());
        assert_eq!(g.report().times_off, 2);
        assert_eq!(g.rest_left, 2 * FIRST_REST);
    }

    #[test]
    fn a_compressor_slower_than_the_path_turns_it_off_and_a_slow_path_keeps_it() {
        let b = BLOCK as u64;
        // Fast path: writes of the compressed quarter take 20 µs, the
        // compressor 1000 µs a block: writing raw (80 µs) is faster.
        let mut fast = Governor::new(1);
        for _ in 0..SPEED_WINDOW / b {
            fast.tried(b, b / 4, true, 1000, 20);
        }
        assert!(!fast.trying());
        assert_eq!(fast.report().off_reason, Some(OffReason::SlowerThanPath));
        // Slow path: the quarter takes 4000 µs to write (raw would take
        // 16000), the compressor 1000 µs: it pays, and stays on.
        let mut slow = Governor::new(1);
        for _ in 0..4 * SPEED_WINDOW / b {
            slow.tried(b, b / 4, true, 1000, 4000);
        }
        assert!(slow.trying());
        let r = slow.report();
        assert_eq!((r.times_off, r.off_reason, r.off_at_end), (0, None, false));
        assert_eq!(r.raw_bytes, 4 * SPEED_WINDOW);
        assert_eq!(r.wire_bytes, SPEED_WINDOW);
        assert_eq!(r.compressed_bytes, r.raw_bytes);
    }
}
