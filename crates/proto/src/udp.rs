//! UDP test datagrams and the receiver's loss, order and jitter accounting.
//!
//! Every datagram starts with a 24-byte header (big-endian):
//!
//! ```text
//! 0      4        6       8                16               24
//! | tag  | stream | flags | sequence u64   | send time ns   | payload...
//! ```
//!
//! `tag` is the first 4 bytes of the test token, so stray datagrams are
//! ignored. `flags` bit 0 marks the sender's last datagrams (FIN), bit 1 a
//! registration datagram ([`registration`]), whose payload is the slot's
//! proof of the test's data key (or, a test without one, the token): with
//! it one end tells the other its address before the test. The client
//! registers with the server (`docs/PROTOCOL.md` 8.2), or, where the server
//! can only connect out, the server with the client (8.2.1).

use crate::databind::DataKey;
use crate::params::{Direction, Transport};
use crate::report::UdpRecv;

pub const HEADER_LEN: usize = 24;
pub const FLAG_FIN: u16 = 1;
pub const FLAG_REGISTER: u16 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tag: u32,
    pub stream: u16,
    pub flags: u16,
    pub seq: u64,
    pub send_ns: u64,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`HEADER_LEN`]; callers size datagrams first.
    pub fn write(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&self.tag.to_be_bytes());
        buf[4..6].copy_from_slice(&self.stream.to_be_bytes());
        buf[6..8].copy_from_slice(&self.flags.to_be_bytes());
        buf[8..16].copy_from_slice(&self.seq.to_be_bytes());
        buf[16..24].copy_from_slice(&self.send_ns.to_be_bytes());
    }

    /// Reads a header; `None` if the datagram is too short.
    pub fn read(buf: &[u8]) -> Option<Header> {
        let b = buf.get(..HEADER_LEN)?;
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Header {
            tag: u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")),
            stream: u16_at(4),
            flags: u16_at(6),
            seq: u64_at(8),
            send_ns: u64_at(16),
        })
    }
}

/// The tag of a test: the first 4 bytes of its hex token.
pub fn tag_of(token: &str) -> u32 {
    let mut b = [0u8; 4];
    for (i, c) in token.bytes().take(4).enumerate() {
        b[i] = c;
    }
    u32::from_be_bytes(b)
}

/// The registration datagram of one stream of a test: the header (tag
/// of `token`, `stream`, [`FLAG_REGISTER`], sequence and time 0), then the
/// slot's proof of `key` (64 hex digits), or the token where the test has
/// no key.
pub fn registration(
    token: &str,
    key: Option<&DataKey>,
    stream: u16,
    direction: Direction,
) -> Vec<u8> {
    let payload = match key {
        Some(k) => k.proof(token, Transport::Udp, stream, direction),
        None => token.to_string(),
    };
    let mut d = vec![0u8; HEADER_LEN + payload.len()];
    Header {
        tag: tag_of(token),
        stream,
        flags: FLAG_REGISTER,
        seq: 0,
        send_ns: 0,
    }
    .write(&mut d);
    d[HEADER_LEN..].copy_from_slice(payload.as_bytes());
    d
}

/// True if `d` is the registration of (`stream`, `direction`) of the test
/// `token` ([`registration`]): its tag and flag, and its proof of `key`
/// for that slot (or the token, a test without a key), compared in
/// constant time. Where it came from is the caller's to check.
pub fn is_registration(
    d: &[u8],
    token: &str,
    key: Option<&DataKey>,
    stream: u16,
    direction: Direction,
) -> bool {
    let Some(h) = Header::read(d) else {
        return false;
    };
    if h.tag != tag_of(token) || h.flags & FLAG_REGISTER == 0 {
        return false;
    }
    let payload = &d[HEADER_LEN..];
    match key {
        Some(k) => std::str::from_utf8(payload)
            .is_ok_and(|p| k.verify(token, Transport::Udp, stream, direction, p)),
        // blake3::Hash compares in constant time.
        None => blake3::hash(payload) == blake3::hash(token.as_bytes()),
    }
}

const WINDOW: u64 = 1 << 16;

/// Counts distinct, reordered and duplicated datagrams and the RFC 3550 jitter.
#[derive(Debug, Clone)]
pub struct Receiver {
    counts: UdpRecv,
    seen: Vec<u64>,
    last_transit: Option<i64>,
    jitter_ns: f64,
}

impl Default for Receiver {
    fn default() -> Self {
        Self::new()
    }
}

impl Receiver {
    pub fn new() -> Self {
        Self {
            counts: UdpRecv::default(),
            seen: vec![0; (WINDOW / 64) as usize],
            last_transit: None,
            jitter_ns: 0.0,
        }
    }

    fn bit(&mut self, seq: u64) -> (&mut u64, u64) {
        let i = (seq % WINDOW) as usize;
        (&mut self.seen[i / 64], 1u64 << (i % 64))
    }

    /// Accounts one datagram with sequence `seq`, sent at the sender's
    /// `send_ns` and received at our `recv_ns` (clocks need not agree).
    ///
    /// Sequence `u64::MAX` is never sent (a sender would need 2^64
    /// datagrams) and is ignored, so `expected` cannot overflow.
    pub fn on_datagram(&mut self, seq: u64, send_ns: u64, recv_ns: u64) {
        if seq == u64::MAX {
            return;
        }
        let expected = self.counts.expected;
        if seq >= expected {
            let gap = seq - expected;
            if gap >= WINDOW {
                self.seen.iter_mut().for_each(|w| *w = 0);
            } else {
                for s in expected..seq {
                    let (w, m) = self.bit(s);
                    *w &= !m;
                }
            }
            let (w, m) = self.bit(seq);
            *w |= m;
            self.counts.expected = seq + 1;
        } else if expected - seq <= WINDOW {
            let (w, m) = self.bit(seq);
            if *w & m != 0 {
                self.counts.duplicates += 1;
                return;
            }
            *w |= m;
            self.counts.out_of_order += 1;
        } else {
            self.counts.out_of_order += 1;
        }
        self.counts.packets += 1;
        let transit = recv_ns.wrapping_sub(send_ns) as i64;
        if let Some(last) = self.last_transit {
            let d = (transit.wrapping_sub(last)).unsigned_abs() as f64;
            self.jitter_ns += (d - self.jitter_ns) / 16.0;
        }
        self.last_transit = Some(transit);
        self.counts.jitter_us = (self.jitter_ns / 1000.0) as u64;
    }

    /// Records the kernel's cumulative count of datagrams dropped for a full
    /// socket buffer (SO_RXQ_OVFL).
    pub fn set_rcvbuf_drops(&mut self, drops: u64) {
        self.counts.rcvbuf_drops = drops;
    }

    pub fn counts(&self) -> UdpRecv {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trip_and_short_datagram() {
        let h = Header {
            tag: tag_of("deadbeef"),
            stream: 3,
            flags: FLAG_FIN,
            seq: 1 << 40,
            send_ns: 42,
        };
        let mut buf = [0u8; 30];
        h.write(&mut buf);
        assert_eq!(Header::read(&buf), Some(h));
        assert_eq!(Header::read(&buf[..23]), None);
    }

    /// The attacker: a registration for another slot, test or key, with
    /// the wrong flag, or cut short, is no registration of this slot.
    #[test]
    fn attacker_a_registration_is_its_slots_alone() {
        const TOKEN: &str = "00112233445566778899aabbccddeeff";
        let key = DataKey::from_bytes([9; crate::databind::KEY_LEN]);
        let d = registration(TOKEN, Some(&key), 1, Direction::Down);
        assert_eq!(d.len(), HEADER_LEN + 64);
        let h = Header::read(&d).unwrap();
        assert_eq!(
            (h.tag, h.stream, h.flags),
            (tag_of(TOKEN), 1, FLAG_REGISTER)
        );
        assert!(is_registration(&d, TOKEN, Some(&key), 1, Direction::Down));
        assert!(!is_registration(&d, TOKEN, Some(&key), 0, Direction::Down));
        assert!(!is_registration(&d, TOKEN, Some(&key), 1, Direction::Up));
        let other = DataKey::from_bytes([8; crate::databind::KEY_LEN]);
        assert!(!is_registration(
            &d,
            TOKEN,
            Some(&other),
            1,
            Direction::Down
        ));
        assert!(!is_registration(&d, TOKEN, None, 1, Direction::Down));
        assert!(!is_registration(
            &d[..d.len() - 1],
            TOKEN,
            Some(&key),
            1,
            Direction::Down
        ));
        let mut fin = d.clone();
        fin[6..8].copy_from_slice(&FLAG_FIN.to_be_bytes());
        assert!(!is_registration(
            &fin,
            TOKEN,
            Some(&key),
            1,
            Direction::Down
        ));
        let mut data = d.clone();
        data[24..].fill(b'0');
        assert!(!is_registration(
            &data,
            TOKEN,
            Some(&key),
            1,
            Direction::Down
        ));
        // Without a key, the token; and nothing else.
        let t = registration(TOKEN, None, 0, Direction::Up);
        assert!(is_registration(&t, TOKEN, None, 0, Direction::Up));
        assert!(!is_registration(&t, TOKEN, Some(&key), 0, Direction::Up));
        assert!(!is_registration(
            &t[..HEADER_LEN],
            TOKEN,
            None,
            0,
            Direction::Up
        ));
    }

    #[test]
    fn loss_reorder_duplicate() {
        let mut r = Receiver::new();
        for seq in [0, 1, 3, 2, 2, 5] {
            r.on_datagram(seq, 0, 0);
        }
        let c = r.counts();
        assert_eq!(c.packets, 5);
        assert_eq!(c.expected, 6);
        assert_eq!(c.out_of_order, 1);
        assert_eq!(c.duplicates, 1);
        assert_eq!(c.expected - c.packets, 1, "seq 4 lost");
    }

    #[test]
    fn last_sequence_number_cannot_overflow() {
        let mut r = Receiver::new();
        r.on_datagram(u64::MAX, 335_057_748_224, 0);
        r.on_datagram(u64::MAX - 1, 0, 0);
        assert_eq!(r.counts().expected, u64::MAX);
        assert_eq!(r.counts().packets, 1);
    }

    #[test]
    fn jitter_follows_rfc3550() {
        let mut r = Receiver::new();
        // Transit alternates 1 ms and 3 ms: |D| = 2 ms every packet after the first.
        for seq in 0..1000u64 {
            let transit = if seq % 2 == 0 { 1_000_000 } else { 3_000_000 };
            r.on_datagram(seq, seq * 10_000_000, seq * 10_000_000 + transit);
        }
        let j = r.counts().jitter_us;
        assert!((1990..=2000).contains(&j), "jitter {j}");
    }

    proptest! {
        #[test]
        fn counts_are_consistent(seqs in proptest::collection::vec(0u64..5000, 0..2000)) {
            let mut r = Receiver::new();
            for &s in &seqs {
                r.on_datagram(s, 0, 0);
            }
            let c = r.counts();
            let distinct: std::collections::BTreeSet<_> = seqs.iter().collect();
            prop_assert_eq!(c.packets, distinct.len() as u64);
            prop_assert_eq!(c.duplicates, (seqs.len() - distinct.len()) as u64);
            prop_assert_eq!(c.expected, seqs.iter().max().map_or(0, |m| m + 1));
        }
    }
}
