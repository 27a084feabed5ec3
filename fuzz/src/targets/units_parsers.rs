//! What a user (or a job's stored options, or a tools file) writes for a
//! duration, a size or a rate (`proto::units`): arbitrary text, read
//! lossily.
//!
//! Must never panic. Properties:
//! - a refusal names what it refused and the forms it takes (the
//!   duration's error shows `1h30m`);
//! - spaces around a value never change what it reads as;
//! - a duration of several terms reads as the sum of its terms read alone,
//!   whether written with spaces between them or not.

use longhaul_proto::units::{parse_duration, parse_rate, parse_size};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let padded = format!("  {text} ");
    match parse_duration(&text) {
        Ok(d) => {
            assert_eq!(parse_duration(&padded), Ok(d), "{text:?} padded");
            let spaced = spaced_terms(&text);
            assert_eq!(parse_duration(&spaced), Ok(d), "{text:?} as {spaced:?}");
        }
        Err(e) => {
            let said = e.to_string();
            assert!(
                said.contains("invalid duration") && said.contains("1h30m"),
                "{said}"
            );
        }
    }
    for (what, parsed, again) in [
        ("size", parse_size(&text), parse_size(&padded)),
        ("rate", parse_rate(&text), parse_rate(&padded)),
    ] {
        match parsed {
            Ok(v) => assert_eq!(again, Ok(v), "{what} {text:?} padded"),
            Err(e) => assert!(e.to_string().contains(what), "{e}"),
        }
    }
});

/// `1h30m` as `1h 30m`: a space after each unit that a number follows.
fn spaced_terms(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    let mut prev_alpha = false;
    for c in s.chars() {
        if prev_alpha && (c.is_ascii_digit() || c == '.') {
            out.push(' ');
        }
        prev_alpha = c.is_ascii_alphabetic();
        out.push(c);
    }
    out
}
