//! Binding a perf test's data streams to their test without a credential
//! on the wire: perf's data streams run in plaintext by default (they
//! measure the path, not the cipher), so whatever they carry is public.
//!
//! The server draws a fresh 32-byte key per test and sends it in
//! `TestAccept`, inside the TLS of the control connection. Each data
//! stream (TCP `Hello`, UDP registration datagram) then carries
//! `proof = BLAKE3-keyed(key, CONTEXT 0x00 TEST 0x00 TRANSPORT STREAM
//! DIRECTION)` (`docs/PROTOCOL.md` section 4.1 gives the bytes): it names
//! one (test, stream, direction) and is worth nothing for any other, the
//! key never leaves TLS, and the server takes each slot once, so a proof
//! read off the wire cannot be replayed into a slot that is already taken.

use crate::params::{Direction, Transport};
use crate::units::{from_hex, hex};

/// Domain separation of the proof's input.
pub const CONTEXT: &[u8] = b"longhaul perf data v1";

/// Bytes of a test's data key.
pub const KEY_LEN: usize = 32;

/// A test's data key: 32 bytes from the server's CSPRNG. Its `Debug`
/// does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKey([u8; KEY_LEN]);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    /// The key from its 64 lowercase hex digits (`TestAccept.data_key`);
    /// None for anything else.
    pub fn parse(hex: &str) -> Option<DataKey> {
        if hex.bytes().any(|c| c.is_ascii_uppercase()) {
            return None;
        }
        from_hex(hex).map(DataKey)
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The input of the proof, byte for byte.
    pub fn message(test: &str, transport: Transport, stream: u16, direction: Direction) -> Vec<u8> {
        let mut m = Vec::with_capacity(CONTEXT.len() + test.len() + 6);
        m.extend_from_slice(CONTEXT);
        m.push(0);
        m.extend_from_slice(test.as_bytes());
        m.push(0);
        m.push(match transport {
            Transport::Tcp => 0,
            Transport::Udp => 1,
        });
        m.extend_from_slice(&stream.to_be_bytes());
        m.push(match direction {
            Direction::Up => 0,
            Direction::Down => 1,
        });
        m
    }

    fn mac(&self, test: &str, transport: Transport, stream: u16, d: Direction) -> blake3::Hash {
        blake3::keyed_hash(&self.0, &Self::message(test, transport, stream, d))
    }

    /// The proof a data stream presents: 64 lowercase hex digits.
    pub fn proof(&self, test: &str, transport: Transport, stream: u16, d: Direction) -> String {
        hex(self.mac(test, transport, stream, d).as_bytes())
    }

    /// True if `proof` is this key's proof for the slot, compared in
    /// constant time.
    pub fn verify(
        &self,
        test: &str,
        transport: Transport,
        stream: u16,
        d: Direction,
        proof: &str,
    ) -> bool {
        let Some(given) = DataKey::parse(proof) else {
            return false;
        };
        // blake3::Hash compares in constant time.
        self.mac(test, transport, stream, d) == blake3::Hash::from(given.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: &str = "00112233445566778899aabbccddeeff";

    fn key() -> DataKey {
        DataKey::from_bytes(std::array::from_fn(|i| i as u8))
    }

    #[test]
    fn key_round_trips_through_hex_and_rejects_anything_else() {
        let k = key();
        assert_eq!(DataKey::parse(&k.to_hex()), Some(k.clone()));
        assert_eq!(k.to_hex().len(), 64);
        assert!(DataKey::parse("").is_none());
        assert!(DataKey::parse(&k.to_hex()[..62]).is_none());
        assert!(DataKey::parse(&k.to_hex().to_uppercase()).is_none());
        assert!(DataKey::parse(&"zz".repeat(32)).is_none());
        assert!(DataKey::parse(&"é".repeat(32)).is_none());
        assert_eq!(format!("{k:?}"), "DataKey(..)");
    }

    #[test]
    fn the_message_is_the_documented_bytes() {
        let m = DataKey::message("ab", Transport::Udp, 0x0102, Direction::Down);
        let mut want = b"longhaul perf data v1".to_vec();
        want.extend_from_slice(&[0, b'a', b'b', 0, 1, 0x01, 0x02, 1]);
        assert_eq!(m, want);
    }

    #[test]
    fn a_proof_verifies_for_its_slot_only() {
        let k = key();
        let p = k.proof(TEST, Transport::Tcp, 3, Direction::Up);
        assert_eq!(p.len(), 64);
        assert!(k.verify(TEST, Transport::Tcp, 3, Direction::Up, &p));
        // Another stream, direction, transport, test or key: refused.
        assert!(!k.verify(TEST, Transport::Tcp, 4, Direction::Up, &p));
        assert!(!k.verify(TEST, Transport::Tcp, 3, Direction::Down, &p));
        assert!(!k.verify(TEST, Transport::Udp, 3, Direction::Up, &p));
        assert!(!k.verify(
            "00112233445566778899aabbccddeefe",
            Transport::Tcp,
            3,
            Direction::Up,
            &p
        ));
        let other = DataKey::from_bytes([7; KEY_LEN]);
        assert!(!other.verify(TEST, Transport::Tcp, 3, Direction::Up, &p));
        // Not a proof at all.
        assert!(!k.verify(TEST, Transport::Tcp, 3, Direction::Up, ""));
        assert!(!k.verify(TEST, Transport::Tcp, 3, Direction::Up, &k.to_hex()));
    }

    #[test]
    fn the_proof_reveals_neither_key_nor_test() {
        let k = key();
        let p = k.proof(TEST, Transport::Tcp, 0, Direction::Up);
        assert!(!p.contains(&k.to_hex()[..16]));
        assert_ne!(p, k.proof(TEST, Transport::Tcp, 1, Direction::Up));
    }
}
