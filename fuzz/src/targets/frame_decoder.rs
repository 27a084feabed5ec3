//! Arbitrary bytes, split into arbitrary chunks, into a control-connection
//! decoder. Must never panic; decoding must not depend on how the bytes were
//! split, nor on how many frames are taken after each push (unread bytes
//! then pile up, and the decoder compacts its buffer around them);
//! `buffered()` always counts exactly the bytes not yet taken; every decoded
//! message must survive a re-encode.

use arbitrary::Arbitrary;
use longhaul_proto::frame::{Decoder, Frame, HEADER_LEN, MAGIC, MAX_FRAME_BODY};
use longhaul_proto::msg::Message;
use longhaul_proto::ProtoError;

#[derive(Arbitrary, Debug)]
struct Input {
    /// Start with the real preamble, so most inputs reach the frames.
    with_magic: bool,
    max_body: u32,
    /// Chunk lengths; the rest of `data` goes in one last push.
    splits: Vec<u8>,
    /// Frames taken after each push in the lazy run (0 takes none until
    /// the end).
    take: u8,
    data: Vec<u8>,
}

/// Feeds `chunks` one by one, taking frames after each, until the first error.
fn decode<'a>(
    max_body: u32,
    chunks: impl Iterator<Item = &'a [u8]>,
) -> (Vec<Frame>, Option<ProtoError>) {
    let mut d = Decoder::expect_magic(max_body);
    let mut frames = Vec::new();
    for chunk in chunks {
        d.push(chunk);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

/// Like [`decode`], but takes at most `take` frames after each push, then
/// the rest at the end; checks the decoder's count of unread bytes.
fn decode_lazily<'a>(
    max_body: u32,
    take: usize,
    chunks: impl Iterator<Item = &'a [u8]>,
) -> (Vec<Frame>, Option<ProtoError>) {
    let mut d = Decoder::expect_magic(max_body);
    let mut frames = Vec::new();
    // Bytes pushed, and bytes the frames taken so far (and the preamble
    // before them) account for.
    let (mut pushed, mut taken) = (0usize, MAGIC.len());
    for chunk in chunks {
        d.push(chunk);
        pushed += chunk.len();
        for _ in 0..take {
            match d.next_frame() {
                Ok(Some(f)) => {
                    taken += HEADER_LEN + f.body.len();
                    frames.push(f);
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
        if !frames.is_empty() {
            assert_eq!(d.buffered(), pushed - taken, "buffered() is off");
        }
    }
    loop {
        match d.next_frame() {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => break,
            Err(e) => return (frames, Some(e)),
        }
    }
    (frames, None)
}

fuzz_target!(|input: Input| {
    let data = if input.with_magic {
        [MAGIC.as_slice(), &input.data].concat()
    } else {
        input.data
    };
    let mut chunks = Vec::new();
    let mut rest = data.as_slice();
    for &s in &input.splits {
        let n = usize::from(s).min(rest.len());
        let (head, tail) = rest.split_at(n);
        chunks.push(head);
        rest = tail;
    }
    chunks.push(rest);

    let (frames, err) = decode(input.max_body, chunks.iter().copied());
    let (whole, whole_err) = decode(input.max_body, std::iter::once(data.as_slice()));
    let (lazy, lazy_err) = decode_lazily(
        input.max_body,
        usize::from(input.take),
        chunks.iter().copied(),
    );
    assert_eq!(frames, whole, "frames depend on the chunking");
    assert_eq!(err, whole_err, "error depends on the chunking");
    assert_eq!(lazy, whole, "frames depend on when they are taken");
    assert_eq!(
        lazy_err, whole_err,
        "error depends on when frames are taken"
    );

    let limit = input.max_body.min(MAX_FRAME_BODY) as usize;
    for f in &frames {
        assert!(
            f.body.len() <= limit,
            "body of {} over limit {limit}",
            f.body.len()
        );
        let Ok(m) = Message::decode(f) else { continue };
        // Relay bodies carry floats, which JSON need not round-trip bit for bit.
        if matches!(m, Message::Relay(_)) {
            continue;
        }
        let mut wire = Vec::new();
        m.encode(&mut wire).expect("a decoded message re-encodes");
        let mut d = Decoder::new(MAX_FRAME_BODY);
        d.push(&wire);
        let again = d
            .next_frame()
            .expect("own frame decodes")
            .expect("whole frame");
        assert_eq!(
            Message::decode(&again).as_ref(),
            Ok(&m),
            "re-encoded message differs"
        );
        assert_eq!(d.buffered(), 0);
    }
});
