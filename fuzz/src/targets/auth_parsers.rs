//! The text parsers for what a user or admin controls: the grants file,
//! `--export-grant NAME[:ro|:rw]`, `--trust SHA256:...` fingerprints and
//! the known-hosts file.
//!
//! Input: `TEXT [\0 HOST [\0 FP]]`, read as UTF-8 (lossily). Every parser
//! sees TEXT; `known_host_in` also looks HOST up in it, and FP is what
//! `add_known_host` would append for HOST.
//!
//! Must never panic. Properties:
//! - an `Ok` fingerprint is canonical: parsing it again gives it back;
//! - an export grant prints back as `NAME:ro|rw` and parses to itself;
//! - grants parse one per non-blank line, and written back the way the
//!   state directory stores them (one JSON object a line), parse to
//!   themselves;
//! - a known-hosts answer is a trimmed, non-empty word for a host that
//!   can be named on a line, and a line appended for a host not yet
//!   listed is what a later lookup finds;
//! - a token proof (what a plaintext client sends for its token) checks
//!   against nothing but the token and the challenge it was made for:
//!   TEXT taken as a token, its proof checks for its challenge and for
//!   no other.

use longhaul_engine::net::tls::{known_host_in, parse_fingerprint};
use longhaul_engine::server::auth::{parse_export_grant, parse_grants};

fn fingerprint(s: &str) {
    if let Ok(fp) = parse_fingerprint(s) {
        assert_eq!(
            parse_fingerprint(&fp).as_deref(),
            Ok(fp.as_str()),
            "fingerprint not canonical"
        );
        let b64 = fp.strip_prefix("SHA256:").expect("SHA256: prefix");
        assert_eq!(b64.len(), 43, "not 32 bytes unpadded: {fp}");
    }
}

fn export_grant(s: &str) {
    if let Ok(g) = parse_export_grant(s) {
        assert!(!g.name.is_empty() && !g.name.contains('/'), "{g:?}");
        let printed = format!("{}:{}", g.name, if g.write { "rw" } else { "ro" });
        assert_eq!(parse_export_grant(&printed).as_ref(), Ok(&g), "{printed}");
        if !s.contains(':') {
            assert_eq!((g.name.as_str(), g.write), (s, false));
        }
    }
}

fn grants(s: &str) {
    if let Ok(gs) = parse_grants(s) {
        let lines = s.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(gs.len(), lines, "one grant per non-blank line");
        let mut stored = String::new();
        for g in &gs {
            stored.push_str(&serde_json::to_string(g).expect("grant serializes"));
            stored.push('\n');
        }
        assert_eq!(parse_grants(&stored).as_ref(), Ok(&gs), "{stored}");
    }
}

fn known_hosts(text: &str, host: &str, fp: &str) {
    let found = known_host_in(text, host);
    if let Some(f) = &found {
        assert!(!f.is_empty() && f.trim() == f, "untrimmed answer {f:?}");
        assert!(
            !host.is_empty() && !host.contains(char::is_whitespace) && !host.starts_with('#'),
            "found an entry for an unwritable host {host:?}"
        );
    }
    // What `add_known_host` appends for a new host is found afterwards.
    let fp = fp.trim();
    let writable = !host.is_empty()
        && !host.contains(char::is_whitespace)
        && !host.starts_with('#')
        && !fp.is_empty()
        && !fp.contains('\n');
    if found.is_none() && writable {
        let mut t = text.to_string();
        if !t.is_empty() && !t.ends_with('\n') {
            t.push('\n');
        }
        t.push_str(&format!("{host} {fp}\n"));
        assert_eq!(
            known_host_in(&t, host).as_deref(),
            Some(fp),
            "appended entry not found in {t:?}"
        );
    }
}

fn proof(s: &str) {
    use longhaul_proto::tokenproof::{key_of, parse_challenge, prove, token_id, verify};
    // TEXT as a proof for a fixed challenge: never accepted for a token
    // it was not made from.
    let challenge = [9u8; 32];
    assert!(!verify(&key_of("lh1_other_token"), "other", &challenge, s));
    let _ = parse_challenge(s);
    // TEXT as a token: its proof checks for its challenge, and for no other.
    if let Some(made) = prove(s, &challenge) {
        let id = token_id(s).expect("a provable token has an id");
        assert!(verify(&key_of(s), id, &challenge, &made), "{made}");
        assert!(!verify(&key_of(s), id, &[8u8; 32], &made), "{made}");
    }
}

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let mut parts = input.splitn(3, '\0');
    let text = parts.next().unwrap_or("");
    let host = parts.next().unwrap_or("");
    let fp = parts.next().unwrap_or("");

    fingerprint(text);
    export_grant(text);
    grants(text);
    known_hosts(text, host, fp);
    proof(text);
    // Command-line values arrive one at a time: every line on its own too.
    for line in text.lines().take(16) {
        fingerprint(line);
        export_grant(line);
    }
});
