//! Parsing and printing of sizes, rates and durations as users write them,
//! and of strings from a peer as logs may show them ([`escaped`]).
//!
//! Sizes are binary (`4M` is 4 MiB, as in iperf3 and nuttcp); rates are
//! decimal bits per second (`2G` and `2gbit` are 2,000,000,000 bit/s).

use std::fmt;

/// A value the user wrote that we could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    pub what: &'static str,
    pub input: String,
    pub expected: &'static str,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} '{}': expected {}",
            self.what, self.input, self.expected
        )
    }
}

impl std::error::Error for UnitError {}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (num, rest) = s.split_at(end);
    let n: f64 = num.parse().ok()?;
    n.is_finite().then_some((n, rest.trim()))
}

const SIZE_HELP: &str =
    "a number with an optional K, M, G, T or P suffix (powers of 1024), like 256K or 4M";

/// Parses a byte size: `65536`, `64K`, `4M`, `1.5G`, `2GiB`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError {
        what: "size",
        input: s.to_string(),
        expected: SIZE_HELP,
    };
    let (n, suffix) = split_number(s).ok_or_else(err)?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => return Err(err()),
    };
    let v = n * mult as f64;
    if v > u64::MAX as f64 || v.fract() != 0.0 {
        return Err(err());
    }
    Ok(v as u64)
}

const RATE_HELP: &str =
    "bits per second with an optional k, m, g or t suffix (powers of 1000), like 500M or 2gbit";

/// Parses a rate in bits/s: `1000000`, `500M`, `2gbit`, `2.5G`, `10gbps`.
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError {
        what: "rate",
        input: s.to_string(),
        expected: RATE_HELP,
    };
    let (n, suffix) = split_number(s).ok_or_else(err)?;
    let lower = suffix.to_ascii_lowercase();
    let unit = lower
        .strip_suffix("bit/s")
        .or_else(|| lower.strip_suffix("bps"))
        .or_else(|| lower.strip_suffix("bit"))
        .unwrap_or(&lower);
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return Err(err()),
    };
    let v = n * mult;
    if v > u64::MAX as f64 {
        return Err(err());
    }
    Ok(v.round() as u64)
}

const DURATION_HELP: &str = "seconds, or numbers each with a unit (us, ms, s, m, h, d, w, y), \
     like 10, 500ms, 1.5s, 90s, 1h30m or 2d";

/// One duration unit's length in seconds (`y` is 365.25 days, as
/// humantime counts it), or None for a word that is no unit.
fn duration_unit(unit: &str) -> Option<f64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        "y" => 31_557_600.0,
        _ => return None,
    })
}

/// Parses a duration, the one grammar of every option that takes a time
/// (docs/GUIDE.md, "Durations"): a bare number is seconds (`10`, `0.25`);
/// otherwise one or more terms of a number and a unit, with or without
/// spaces between them (`500ms`, `1.5s`, `90s`, `1h30m`, `1h 30m`, `2d`).
/// A sign, an exponent, an unknown unit, a term without its unit after
/// another (`1h30`) and a duration `Duration` cannot hold are refused.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, UnitError> {
    let err = || UnitError {
        what: "duration",
        input: s.to_string(),
        expected: DURATION_HELP,
    };
    let term = |n: f64, secs_per: f64| std::time::Duration::try_from_secs_f64(n * secs_per);
    if let Some((n, "")) = split_number(s) {
        return term(n, 1.0).map_err(|_| err());
    }
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(err());
    }
    let mut total = std::time::Duration::ZERO;
    while !rest.is_empty() {
        let (n, after) = split_number(rest).ok_or_else(err)?;
        let unit_end = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, tail) = after.split_at(unit_end);
        let secs_per = duration_unit(unit).ok_or_else(err)?;
        let d = term(n, secs_per).map_err(|_| err())?;
        total = total.checked_add(d).ok_or_else(err)?;
        rest = tail.trim_start();
    }
    Ok(total)
}

/// `9.42 Gbit/s`: decimal, three significant digits.
pub fn format_rate(bits_per_second: f64) -> String {
    let (v, unit) = scale(
        bits_per_second,
        1000.0,
        &["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"],
    );
    format!("{} {unit}", sig3(v))
}

/// `1.10 GiB`: binary.
pub fn format_bytes(bytes: u64) -> String {
    let (v, unit) = scale(bytes as f64, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"]);
    if unit == "B" {
        format!("{bytes} B")
    } else {
        format!("{} {unit}", sig3(v))
    }
}

fn scale(mut v: f64, step: f64, units: &[&'static str]) -> (f64, &'static str) {
    let mut i = 0;
    while v.abs() >= step && i + 1 < units.len() {
        v /= step;
        i += 1;
    }
    (v, units[i])
}

fn sig3(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A string from a peer, made safe to log or print: written on one line,
/// with no byte a terminal or a log reader would act on.
///
/// Control characters (C0, DEL and C1: newline, carriage return, escape,
/// ...), the Unicode line and paragraph separators and the bidirectional
/// overrides are written as Rust escapes (`\n`, `\u{1b}`); a backslash is
/// doubled, so the escaped text names the original exactly. Everything else
/// is written as it is. Wrap every client-supplied string (software, paths,
/// export names, reasons, error texts that quote them) in a log line with
/// it: `tracing::info!("{} probes {}", peer, escaped(&path))`.
pub fn escaped(s: &str) -> Escaped<'_> {
    Escaped(s)
}

/// See [`escaped`].
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl Escaped<'_> {
    fn needs_escape(c: char) -> bool {
        c == '\\'
            || c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            )
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, Style::Peer)
    }
}

/// Text of our own that may quote a peer's words, made safe for a
/// terminal as a whole: as [`escaped`], except that its line breaks and
/// tabs are kept and a backslash is written as it is (the peer's words in
/// it were [`escaped`] already, and are not escaped twice). Every line the
/// binary prints for people goes through it, so that a terminal control
/// (an escape sequence, a carriage return, a bidirectional override) that
/// reached a message by any way is shown, never acted on.
pub fn terminal_safe(s: &str) -> TerminalSafe<'_> {
    TerminalSafe(s)
}

/// See [`terminal_safe`].
#[derive(Debug, Clone, Copy)]
pub struct TerminalSafe<'a>(pub &'a str);

impl fmt::Display for TerminalSafe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, Style::Terminal)
    }
}

/// A JSON text (one `--json` document) made safe for a terminal: what
/// [`escaped`] escapes that a JSON encoder leaves as it is (DEL, the C1
/// controls, the Unicode separators and bidirectional controls; the
/// others it escapes itself) written as JSON's own `\uXXXX`, which can
/// only stand inside a string there, so the document means exactly what
/// it meant.
pub fn json_safe(s: &str) -> JsonSafe<'_> {
    JsonSafe(s)
}

/// See [`json_safe`].
#[derive(Debug, Clone, Copy)]
pub struct JsonSafe<'a>(pub &'a str);

impl fmt::Display for JsonSafe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, Style::Json)
    }
}

/// How [`write_escaped`] writes.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// [`escaped`]: everything, on one line.
    Peer,
    /// [`terminal_safe`]: line breaks, tabs and backslashes kept.
    Terminal,
    /// [`json_safe`]: as JSON escapes.
    Json,
}

/// The one escaper behind [`escaped`], [`terminal_safe`] and [`json_safe`].
fn write_escaped(f: &mut fmt::Formatter<'_>, s: &str, style: Style) -> fmt::Result {
    let escape = |c: char| {
        Escaped::needs_escape(c) && (style == Style::Peer || !matches!(c, '\n' | '\t' | '\\'))
    };
    let mut rest = s;
    while let Some(i) = rest.find(escape) {
        f.write_str(&rest[..i])?;
        let c = rest[i..].chars().next().expect("a char at a char boundary");
        match (style, c) {
            (Style::Json, c) => write!(f, "\\u{:04x}", u32::from(c))?,
            (_, '\\') => f.write_str("\\\\")?,
            (_, '\n') => f.write_str("\\n")?,
            (_, '\r') => f.write_str("\\r")?,
            (_, '\t') => f.write_str("\\t")?,
            (_, c) => write!(f, "\\u{{{:x}}}", u32::from(c))?,
        }
        rest = &rest[i + c.len_utf8()..];
    }
    f.write_str(rest)
}

/// The sum of counts a peer reported, held at `u64::MAX` rather than
/// wrapping (release) or panicking (debug) on counts chosen to overflow.
pub fn saturating_total(counts: impl IntoIterator<Item = u64>) -> u64 {
    counts.into_iter().fold(0, u64::saturating_add)
}

/// Lowercase hex of bytes (a digest, a key): the one encoder of the
/// project (the `hex` crate's).
pub fn hex(b: &[u8]) -> String {
    hex::encode(b)
}

/// `N` bytes from `2 * N` hex digits (either case); None for anything else.
pub fn from_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_peers_counts_that_would_overflow_are_held_at_the_maximum() {
        assert_eq!(super::saturating_total([u64::MAX, 2, 3]), u64::MAX);
        assert_eq!(super::saturating_total([1, 2, 3]), 6);
        assert_eq!(super::saturating_total(std::iter::empty()), 0);
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn hex_both_ways() {
        assert_eq!(hex(&[0x00, 0x9f, 0xff]), "009fff");
        assert_eq!(hex(b""), "");
        assert_eq!(from_hex::<3>("009fff"), Some([0x00, 0x9f, 0xff]));
        assert_eq!(from_hex::<3>("009FFF"), Some([0x00, 0x9f, 0xff]));
        for bad in ["009ff", "009fff00", "00 fff", "zz9fff", "+09fff"] {
            assert_eq!(from_hex::<3>(bad), None, "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        for bad in ["10Q", "", "M", "-1", "1.5", "1e3", "99999999999T"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.to_string().contains("invalid size"), "{bad}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("2gbit"), Ok(2_000_000_000));
        assert_eq!(parse_rate("500M"), Ok(500_000_000));
        assert_eq!(parse_rate("1.5g"), Ok(1_500_000_000));
        assert_eq!(parse_rate("10Gbps"), Ok(10_000_000_000));
        assert_eq!(parse_rate("100"), Ok(100));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("1x").is_err());
    }

    #[test]
    fn durations_in_one_grammar() {
        for (s, want) in [
            ("10", Duration::from_secs(10)),
            ("0.25", Duration::from_millis(250)),
            ("0", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("80ms", Duration::from_millis(80)),
            ("500ms", Duration::from_millis(500)),
            ("250us", Duration::from_micros(250)),
            ("1.5s", Duration::from_millis(1500)),
            ("90s", Duration::from_secs(90)),
            ("10sec", Duration::from_secs(10)),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("0.5h", Duration::from_secs(1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h 30m", Duration::from_secs(5400)),
            ("1H30M", Duration::from_secs(5400)),
            ("1s500ms", Duration::from_millis(1500)),
            ("2d", Duration::from_secs(2 * 86_400)),
            ("2d12h", Duration::from_secs(60 * 3600)),
            ("2w", Duration::from_secs(14 * 86_400)),
            ("1y", Duration::from_secs(31_557_600)),
            (" 7d ", Duration::from_secs(7 * 86_400)),
        ] {
            assert_eq!(parse_duration(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn durations_refused_say_the_forms() {
        for bad in [
            "",
            "  ",
            "soon",
            "s",
            "ms10",
            "-1s",
            "+1s",
            "-5",
            "1e3s",
            "1e3",
            "5x",
            "5 minutes",
            "1h30",
            "1h-30m",
            "1h,30m",
            "1..5s",
            "1.5.s",
            "99999999999999999999y",
            "inf",
            "NaN",
        ] {
            let e = parse_duration(bad).unwrap_err();
            let said = e.to_string();
            assert!(
                said.contains("invalid duration") && said.contains("1h30m"),
                "{bad:?}: {said}"
            );
        }
    }

    #[test]
    fn printing() {
        assert_eq!(format_rate(9.42e9), "9.42 Gbit/s");
        assert_eq!(format_rate(123.4e6), "123 Mbit/s");
        assert_eq!(format_rate(0.0), "0.00 bit/s");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }

    #[test]
    fn escaped_keeps_a_peer_string_on_one_harmless_line() {
        let evil = "evil\n2026 FAKE LOG LINE\x1b[31m\r\t\u{7f}\u{85}\u{202e}\\n ok é";
        let e = escaped(evil).to_string();
        assert_eq!(
            e,
            "evil\\n2026 FAKE LOG LINE\\u{1b}[31m\\r\\t\\u{7f}\\u{85}\\u{202e}\\\\n ok é"
        );
        assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
        assert_eq!(escaped("data/run7/f1.dat").to_string(), "data/run7/f1.dat");
        assert_eq!(escaped("").to_string(), "");
    }

    /// A line for people keeps its own line breaks and tabs and a peer's
    /// words escaped already, and shows every other control.
    #[test]
    fn terminal_safe_shows_controls_and_keeps_lines() {
        let said = format!("refused: {}", escaped("a\nb\x1b]0;t\x07"));
        let line = format!("{said}\nnext\tcol\x1b[2J\r\u{9b}1m\u{202e}x");
        assert_eq!(
            terminal_safe(&line).to_string(),
            "refused: a\\nb\\u{1b}]0;t\\u{7}\nnext\tcol\\u{1b}[2J\\r\\u{9b}1m\\u{202e}x"
        );
        assert_eq!(terminal_safe(&said).to_string(), said);
    }

    /// A JSON document stays the same document: what a JSON encoder
    /// leaves raw is written as its own escape, inside the string.
    #[test]
    fn json_safe_is_the_same_json() {
        let v = serde_json::json!({"name": "a\u{7f}\u{9b}\u{202e}\\b\n\x1b"});
        let text = v.to_string();
        let safe = json_safe(&text).to_string();
        assert!(
            !safe.chars().any(|c| Escaped::needs_escape(c) && c != '\\'),
            "{safe}"
        );
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), v);
    }
}
