//! Proof of a token without the token: what a client sends instead of its
//! credential on a plaintext connection (`--insecure-plaintext`), where
//! anyone on the path reads every byte.
//!
//! A token is `lh1_ID_SECRET`; the server keeps only `BLAKE3(token)`. The
//! proof is `lh1p_ID_TIME_NONCE_MAC` with `MAC = BLAKE3-keyed(key =
//! BLAKE3(token), "longhaul token proof v1" 0 ID 0 TIME 0 NONCE)`, TIME
//! the client's clock in Unix seconds and NONCE 16 random bytes (hex). The
//! server recomputes the MAC from the stored hash, accepts a TIME within
//! [`PROOF_WINDOW_S`] of its own clock, and each nonce once: a proof seen
//! on the wire cannot be replayed, and the token itself is never on it.
//! Plaintext still protects nothing else (the session can be read or
//! taken over after it starts): use TLS where the path is not trusted.

use std::collections::HashMap;
use std::sync::Mutex;

/// How far a proof's time may be from the server's clock, seconds.
pub const PROOF_WINDOW_S: u64 = 300;

const PROOF_PREFIX: &str = "lh1p";
const CONTEXT: &[u8] = b"longhaul token proof v1";

fn mac(token_hash: &[u8; 32], id: &str, time: u64, nonce: &str) -> blake3::Hash {
    let mut msg = Vec::with_capacity(CONTEXT.len() + id.len() + nonce.len() + 24);
    msg.extend_from_slice(CONTEXT);
    for part in [id.as_bytes(), time.to_string().as_bytes(), nonce.as_bytes()] {
        msg.push(0);
        msg.extend_from_slice(part);
    }
    blake3::keyed_hash(token_hash, &msg)
}

/// What the server keeps of a token, and the key of its proofs.
pub fn key_of(token: &str) -> blake3::Hash {
    blake3::hash(token.as_bytes())
}

/// The proof of `token` (`lh1_ID_SECRET`) at `time` (Unix seconds) with
/// `nonce` (random bytes, fresh for every connection); None for a string
/// that is not a token.
pub fn prove(token: &str, time: u64, nonce: &[u8; 16]) -> Option<String> {
    let id = token.strip_prefix("lh1_")?.split_once('_')?.0;
    if id.is_empty() {
        return None;
    }
    let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let m = mac(key_of(token).as_bytes(), id, time, &nonce);
    Some(format!("{PROOF_PREFIX}_{id}_{time}_{nonce}_{}", m.to_hex()))
}

/// A proof taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub id: String,
    pub time: u64,
    pub nonce: String,
    pub mac: blake3::Hash,
}

/// Parses `lh1p_ID_TIME_NONCE_MAC`; None if `s` is not a proof (a plain
/// token, say) or is malformed.
pub fn parse(s: &str) -> Option<Proof> {
    let mut parts = s.strip_prefix(PROOF_PREFIX)?.strip_prefix('_')?.split('_');
    let (id, time, nonce, mac) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || id.is_empty()
        || nonce.len() != 32
        || !nonce.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    Some(Proof {
        id: id.to_string(),
        time: time.parse().ok()?,
        nonce: nonce.to_string(),
        mac: blake3::Hash::from_hex(mac).ok()?,
    })
}

/// Why a proof was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Its MAC does not match the grant's token.
    Wrong,
    /// Its time is outside the window around the server's clock.
    Stale,
    /// Its nonce was seen before: a replay.
    Replayed,
}

/// The nonces seen within the window, so that each is accepted once.
#[derive(Default)]
pub struct Replays {
    seen: Mutex<HashMap<(String, String), u64>>,
}

/// The most nonces kept; beyond it the oldest half is forgotten (their
/// proofs are then refused as stale soon anyway).
const MAX_REMEMBERED: usize = 100_000;

impl Replays {
    /// Checks `p` against the grant's stored `token_hash` at `now` (Unix
    /// seconds), and remembers its nonce if it is accepted.
    pub fn check(&self, p: &Proof, token_hash: &blake3::Hash, now: u64) -> Result<(), Rejected> {
        // blake3::Hash compares in constant time.
        if mac(token_hash.as_bytes(), &p.id, p.time, &p.nonce) != p.mac {
            return Err(Rejected::Wrong);
        }
        if p.time.abs_diff(now) > PROOF_WINDOW_S {
            return Err(Rejected::Stale);
        }
        let mut seen = self.seen.lock().expect("poisoned");
        seen.retain(|_, t| t.abs_diff(now) <= PROOF_WINDOW_S);
        if seen.len() >= MAX_REMEMBERED {
            let mut times: Vec<u64> = seen.values().copied().collect();
            times.sort_unstable();
            let cut = times[times.len() / 2];
            seen.retain(|_, t| *t > cut);
        }
        match seen.insert((p.id.clone(), p.nonce.clone()), p.time) {
            Some(_) => Err(Rejected::Replayed),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "lh1_ab12cd34_0123456789abcdefghijklmnopqrstuvwxyzABCD";

    fn hash() -> blake3::Hash {
        blake3::hash(TOKEN.as_bytes())
    }

    #[test]
    fn a_proof_carries_no_part_of_the_secret_and_checks_once() {
        let p = prove(TOKEN, 1_000_000, &[7; 16]).unwrap();
        assert!(!p.contains("0123456789abcdef"), "{p}");
        assert!(!p.contains(&hash().to_hex().to_string()));
        let parsed = parse(&p).unwrap();
        assert_eq!(parsed.id, "ab12cd34");
        let r = Replays::default();
        assert_eq!(r.check(&parsed, &hash(), 1_000_010), Ok(()));
        assert_eq!(
            r.check(&parsed, &hash(), 1_000_020),
            Err(Rejected::Replayed)
        );
    }

    #[test]
    fn wrong_token_stale_time_and_garbage_are_refused() {
        let r = Replays::default();
        let other = blake3::hash(b"lh1_ab12cd34_another");
        let p = parse(&prove(TOKEN, 1_000_000, &[1; 16]).unwrap()).unwrap();
        assert_eq!(r.check(&p, &other, 1_000_000), Err(Rejected::Wrong));
        assert_eq!(
            r.check(&p, &hash(), 1_000_000 + PROOF_WINDOW_S + 1),
            Err(Rejected::Stale)
        );
        // A changed time or nonce breaks the MAC.
        let mut t = p.clone();
        t.time += 1;
        assert_eq!(r.check(&t, &hash(), 1_000_000), Err(Rejected::Wrong));
        for bad in [
            "",
            "lh1p",
            "lh1p_",
            "lh1p_id_notanumber_00000000000000000000000000000000_00",
            "lh1p_id_1_short_00",
            TOKEN,
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(prove("not a token", 1, &[0; 16]), None);
    }
}
