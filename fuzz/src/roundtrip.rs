//! The check every session fuzz target makes of what a machine queues: it
//! encodes into exactly one frame, and that frame decodes back unchanged.

use longhaul_proto::frame::{Decoder, Frame, MAX_FRAME_BODY};
use longhaul_proto::msg::Message;

/// Panics unless `m` round-trips through one frame.
pub fn assert_roundtrip(m: &Message) {
    let mut wire = Vec::new();
    m.encode(&mut wire).expect("a queued message encodes");
    let mut d = Decoder::new(MAX_FRAME_BODY);
    d.push(&wire);
    let f: Frame = d
        .next_frame()
        .expect("own frame decodes")
        .expect("whole frame");
    assert_eq!(d.buffered(), 0, "one message, one frame");
    assert_eq!(Message::decode(&f).as_ref(), Ok(m));
}
