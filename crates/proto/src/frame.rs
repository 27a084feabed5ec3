//! Framing: the connection preamble and length-prefixed frames.
//!
//! Every longhaul connection (control or data) starts with the 8-byte magic
//! [`MAGIC`] from the connecting side, then carries frames:
//!
//! ```text
//! +----------------+--------+----------------------+
//! | length: u32 BE | type u8| body (length bytes)  |
//! +----------------+--------+----------------------+
//! ```
//!
//! The length is checked against the decoder's limit before any allocation,
//! so a hostile peer cannot make us reserve more than that limit.

use crate::ProtoError;

/// First bytes on every connection, sent by the side that connected.
pub const MAGIC: [u8; 8] = *b"LONGHAUL";

/// Bytes of a frame header: length (4) and type (1).
pub const HEADER_LEN: usize = 5;

/// Largest body a control frame may carry unless a decoder is configured lower.
pub const MAX_FRAME_BODY: u32 = 1 << 20;

/// A decoded frame: its type byte and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub body: Vec<u8>,
}

/// Appends one encoded frame to `out`.
///
/// Fails only when the body is longer than [`MAX_FRAME_BODY`].
pub fn encode_frame(kind: u8, body: &[u8], out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME_BODY)
        .ok_or(ProtoError::FrameTooLarge {
            len: body.len() as u64,
            max: MAX_FRAME_BODY,
        })?;
    out.reserve(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    Ok(())
}

/// Incremental decoder: feed it bytes as they arrive, take whole frames out.
///
/// It first expects the preamble when built with [`Decoder::expect_magic`].
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    max_body: u32,
    need_magic: bool,
}

impl Decoder {
    /// A decoder for a stream that has already passed its preamble.
    pub fn new(max_body: u32) -> Self {
        Self {
            buf: Vec::new(),
            max_body: max_body.min(MAX_FRAME_BODY),
            need_magic: false,
        }
    }

    /// A decoder that first checks the 8-byte [`MAGIC`] preamble.
    pub fn expect_magic(max_body: u32) -> Self {
        Self {
            need_magic: true,
            ..Self::new(max_body)
        }
    }

    /// Adds received bytes. Call [`Decoder::next_frame`] until it returns `None`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet consumed as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        if self.need_magic {
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                return Err(ProtoError::BadMagic);
            }
            if n < MAGIC.len() {
                return Ok(None);
            }
            self.buf.drain(..MAGIC.len());
            self.need_magic = false;
        }
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        if len > self.max_body {
            return Err(ProtoError::FrameTooLarge {
                len: u64::from(len),
                max: self.max_body,
            });
        }
        let total = HEADER_LEN + len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let kind = self.buf[4];
        let body = self.buf[HEADER_LEN..total].to_vec();
        self.buf.drain(..total);
        Ok(Some(Frame { kind, body }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_split_anywhere() {
        let mut wire = MAGIC.to_vec();
        encode_frame(7, b"hello", &mut wire).unwrap();
        encode_frame(9, b"", &mut wire).unwrap();
        for split in 0..wire.len() {
            let mut d = Decoder::expect_magic(1024);
            d.push(&wire[..split]);
            let mut frames = Vec::new();
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
            d.push(&wire[split..]);
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(frames.len(), 2, "split at {split}");
            assert_eq!(frames[0].kind, 7);
            assert_eq!(frames[0].body, b"hello");
            assert_eq!(frames[1].body, b"");
        }
    }

    #[test]
    fn bad_magic_is_refused_on_first_byte() {
        let mut d = Decoder::expect_magic(1024);
        d.push(b"GET / HTTP/1.1\r\n");
        assert!(matches!(d.next_frame(), Err(ProtoError::BadMagic)));
    }

    #[test]
    fn oversized_length_refused_before_body_arrives() {
        let mut d = Decoder::new(100);
        d.push(&101u32.to_be_bytes());
        d.push(&[1]);
        assert!(matches!(
            d.next_frame(),
            Err(ProtoError::FrameTooLarge { len: 101, max: 100 })
        ));
    }

    #[test]
    fn truncated_frame_waits() {
        let mut wire = Vec::new();
        encode_frame(1, b"abcdef", &mut wire).unwrap();
        let mut d = Decoder::new(100);
        d.push(&wire[..wire.len() - 1]);
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.buffered(), wire.len() - 1);
    }
}
