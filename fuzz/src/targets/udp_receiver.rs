//! Arbitrary datagram sequences into the UDP receiver's accounting.
//!
//! Only the invariants that survive any reordering are asserted: every
//! datagram is counted once, as a packet or as a duplicate. (`packets <=
//! expected` does not hold: a datagram older than the reorder window is
//! counted again.)

use arbitrary::Arbitrary;
use longhaul_proto::udp::Receiver;

#[derive(Arbitrary, Debug)]
enum Seq {
    /// Relative to the next expected sequence number: reorders, gaps, duplicates.
    Near(i32),
    /// Anywhere: wrap-arounds and jumps past the window.
    Abs(u64),
}

#[derive(Arbitrary, Debug)]
struct Datagram {
    seq: Seq,
    send_ns: u64,
    recv_ns: u64,
}

fuzz_target!(|datagrams: Vec<Datagram>| {
    let mut r = Receiver::new();
    let mut calls = 0u64;
    for d in &datagrams {
        let seq = match d.seq {
            Seq::Near(delta) => r.counts().expected.wrapping_add(i64::from(delta) as u64),
            Seq::Abs(s) => s,
        };
        r.on_datagram(seq, d.send_ns, d.recv_ns);
        // Sequence 2^64-1 is never sent and is ignored by design.
        calls += u64::from(seq != u64::MAX);
        let c = r.counts();
        assert_eq!(c.packets + c.duplicates, calls, "{c:?}");
        assert!(c.out_of_order <= c.packets, "{c:?}");
    }
});
