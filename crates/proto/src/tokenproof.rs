//! Proof of a token without the token, answering a challenge of the
//! server: what a control connection in plaintext (`--insecure-plaintext`)
//! presents instead of its credential, since anyone on the path reads
//! every byte.
//!
//! A token is `lh1_ID_SECRET`; a server keeps only `BLAKE3(token)`. The
//! client names the grant (`Hello.token_id` = ID), the server answers with
//! a [`crate::msg::Challenge`] of 32 bytes from its CSPRNG, fresh for this
//! connection, and the client answers with a [`crate::msg::Proof`]:
//! `BLAKE3-keyed(key = BLAKE3(token), CONTEXT 0x00 ID 0x00 CHALLENGE)`
//! (`docs/PROTOCOL.md` section 1.2 gives the bytes). The proof is good for
//! the one connection whose challenge it answers: replayed on another
//! connection, to another server sharing the grant, or to the same server
//! after a restart, it meets another challenge and is refused, with no
//! replay cache and no clock. The plaintext path has no server identity to
//! bind to (no certificate, no TLS exporter); the challenge is what makes
//! the proof unique, and a live man in the middle, who can take the session
//! over anyway, is outside what plaintext protects.
//!
//! The proofs of earlier clients (`lh1p_ID_TIME_NONCE_MAC` in
//! `Hello.token`, bound to nothing but a time window) are refused: see
//! [`OLD_PROOF_PREFIX`].

use crate::units::{from_hex, hex};

/// Domain separation of the proof's input.
pub const CONTEXT: &[u8] = b"longhaul token proof v2";

/// Bytes of a server's challenge.
pub const CHALLENGE_LEN: usize = 32;

/// How the replayable proofs of clients before challenges began
/// (`lh1p_ID_TIME_NONCE_MAC` in `Hello.token`); a server refuses them.
pub const OLD_PROOF_PREFIX: &str = "lh1p_";

/// The longest grant id a `Hello.token_id` may carry.
pub const MAX_ID_LEN: usize = 64;

/// The grant id of a token `lh1_ID_SECRET`: None for a string that is not
/// of that form (and so cannot be proven).
pub fn token_id(token: &str) -> Option<&str> {
    let id = token.strip_prefix("lh1_")?.split_once('_')?.0;
    valid_id(id).then_some(id)
}

/// Whether `id` can name a grant: 1 to [`MAX_ID_LEN`] ASCII letters and
/// digits.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A challenge, 64 lowercase hex digits, as `Challenge.challenge` carries it.
pub fn challenge_hex(challenge: &[u8; CHALLENGE_LEN]) -> String {
    hex(challenge)
}

/// A challenge from its 64 hex digits; None for anything else.
pub fn parse_challenge(s: &str) -> Option<[u8; CHALLENGE_LEN]> {
    from_hex(s)
}

/// The input of the MAC, byte for byte.
pub fn message(id: &str, challenge: &[u8; CHALLENGE_LEN]) -> Vec<u8> {
    let hex = challenge_hex(challenge);
    let mut m = Vec::with_capacity(CONTEXT.len() + id.len() + hex.len() + 2);
    m.extend_from_slice(CONTEXT);
    m.push(0);
    m.extend_from_slice(id.as_bytes());
    m.push(0);
    m.extend_from_slice(hex.as_bytes());
    m
}

/// The key of a token's proofs: what the server stores of it.
pub fn key_of(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// The proof of `token` (`lh1_ID_SECRET`) for `challenge`: 64 lowercase
/// hex digits; None for a string that is not a token.
pub fn prove(token: &str, challenge: &[u8; CHALLENGE_LEN]) -> Option<String> {
    let id = token_id(token)?;
    let mac = blake3::keyed_hash(&key_of(token), &message(id, challenge));
    Some(mac.to_hex().to_string())
}

/// True if `proof` is the proof for `challenge` of the token of grant `id`
/// whose stored hash is `key`, compared in constant time.
pub fn verify(key: &[u8; 32], id: &str, challenge: &[u8; CHALLENGE_LEN], proof: &str) -> bool {
    let Ok(given) = blake3::Hash::from_hex(proof) else {
        return false;
    };
    // blake3::Hash compares in constant time.
    blake3::keyed_hash(key, &message(id, challenge)) == given
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "lh1_ab12cd34_0123456789abcdefghijklmnopqrstuvwxyzABCD";

    #[test]
    fn a_proof_answers_its_challenge_only() {
        let (c1, c2) = ([7u8; 32], [8u8; 32]);
        let p = prove(TOKEN, &c1).unwrap();
        assert_eq!(p.len(), 64);
        assert!(!p.contains("0123456789abcdef"), "{p}");
        let key = key_of(TOKEN);
        assert!(verify(&key, "ab12cd34", &c1, &p));
        // Another challenge (another connection, server, or a restart).
        assert!(!verify(&key, "ab12cd34", &c2, &p));
        // Another grant, another token.
        assert!(!verify(&key, "ab12cd35", &c1, &p));
        assert!(!verify(&key_of("lh1_ab12cd34_other"), "ab12cd34", &c1, &p));
        for bad in ["", "zz", &p[..63], &format!("{p}0")] {
            assert!(!verify(&key, "ab12cd34", &c1, bad), "{bad}");
        }
    }

    #[test]
    fn the_bytes_of_the_mac_input() {
        let m = message("ab12cd34", &[0xab; 32]);
        let mut want = b"longhaul token proof v2\0ab12cd34\0".to_vec();
        want.extend_from_slice("ab".repeat(32).as_bytes());
        assert_eq!(m, want);
    }

    #[test]
    fn only_tokens_have_ids_and_challenges_parse_back() {
        assert_eq!(token_id(TOKEN), Some("ab12cd34"));
        for bad in [
            "",
            "lh1_",
            "lh1__x",
            "lh1_a-b_x",
            "lh1p_ab_1",
            "not a token",
        ] {
            assert_eq!(token_id(bad), None, "{bad}");
            assert_eq!(prove(bad, &[0; 32]), None, "{bad}");
        }
        assert!(!valid_id(&"a".repeat(MAX_ID_LEN + 1)));
        let c = [0x5a; 32];
        assert_eq!(parse_challenge(&challenge_hex(&c)), Some(c));
        assert_eq!(parse_challenge("5a"), None);
    }
}

#[cfg(test)]
mod vector {
    /// The worked example of `docs/PROTOCOL.md` section 1.2.
    #[test]
    fn the_documented_example() {
        let token = "lh1_7e570000_testsecret-testsecret-testsecret-0123";
        let challenge: [u8; 32] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            super::challenge_hex(&challenge),
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
        );
        assert_eq!(
            super::prove(token, &challenge).unwrap(),
            "f53c17921758d323923cc61d9cbd7be7d71257e2b047c3e4ad46c55317ba9cfd"
        );
    }
}
