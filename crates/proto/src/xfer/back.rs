//! The lines a client writes on a far end's ssh channel to have it
//! connect back (PROTOCOL.md 16.1), and the far end's reader of them.
//!
//! Two lines exist, each ASCII, its words separated by one space, ending
//! in `\n`:
//!
//! - `connect-back ADDR:PORT TICKET`: connect to `ADDR:PORT` and write
//!   `TICKET` ([`TICKET_LEN`] bytes: [`TICKET_PREFIX`] and the unpadded
//!   base64url of 32 random bytes);
//! - `connect-back-allow IP COUNT`: the far end may also connect to `IP`,
//!   `COUNT` more times (a third-party copy's source, which listens for
//!   the far end in the client's place: 13.9).
//!
//! The far end ([`Reader`]) acts on a line only if it is exactly one of
//! these; a line longer than [`LINE_MAX`] is dropped whole, never read in
//! pieces. It connects only to the address its client's ssh came from
//! (which it learnt from ssh, not from a line) or to one an allowance
//! named, at most that allowance's count: a line that names anything else
//! is refused and said, never dialled. Sans I/O: bytes in, [`Event`]s out.

use std::net::{IpAddr, SocketAddr};

/// What every connect-back ticket starts with.
pub const TICKET_PREFIX: &str = "lh1b_";
/// A ticket's length: the prefix and 43 characters of unpadded base64url
/// (32 bytes).
pub const TICKET_LEN: usize = 48;
/// The word that starts a request to connect back.
pub const REQUEST_WORD: &str = "connect-back";
/// The word that starts an allowance.
pub const ALLOW_WORD: &str = "connect-back-allow";
/// The longest line the far end reads (with its `\n`); a longer one is
/// dropped whole.
pub const LINE_MAX: usize = 512;
/// The most connections one allowance (or several for one address,
/// added up) lets the far end open to its address: what a third-party
/// copy may ask for (its check, its push's control connection and data
/// streams, over its retries).
pub const ALLOW_MAX: u32 = 4096;
/// The most addresses the far end keeps allowances for; an allowance for
/// one more is refused.
pub const ALLOWED_ADDRESSES_MAX: usize = 64;

/// Whether `t` is a ticket of the exact form: [`TICKET_PREFIX`], then the
/// base64url alphabet only, [`TICKET_LEN`] bytes in all.
pub fn is_ticket(t: &str) -> bool {
    t.len() == TICKET_LEN
        && t.starts_with(TICKET_PREFIX)
        && t[TICKET_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The request line for `to` and `ticket` (without its `\n`); None unless
/// the ticket is of the exact form and `to` has a port.
pub fn request_line(to: SocketAddr, ticket: &str) -> Option<String> {
    (is_ticket(ticket) && to.port() != 0).then(|| format!("{REQUEST_WORD} {to} {ticket}"))
}

/// The allowance line for `count` more connections to `ip` (without its
/// `\n`).
pub fn allow_line(ip: IpAddr, count: u32) -> String {
    format!("{ALLOW_WORD} {ip} {}", count.min(ALLOW_MAX))
}

/// One line of the channel, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `connect-back ADDR:PORT TICKET`.
    Request { to: SocketAddr, ticket: String },
    /// `connect-back-allow IP COUNT`.
    Allow { ip: IpAddr, count: u32 },
    /// Anything else (`alive`, a later version's line, garbage): it only
    /// says the client is there.
    Other,
}

/// Reads one line (without its `\n`): exactly a request or an allowance,
/// each word as its writer writes it; anything else is [`Line::Other`].
pub fn parse_line(line: &[u8]) -> Line {
    let Ok(text) = std::str::from_utf8(line) else {
        return Line::Other;
    };
    let words: Vec<&str> = text.split(' ').collect();
    match words.as_slice() {
        [REQUEST_WORD, to, ticket] => match to.parse::<SocketAddr>() {
            Ok(to) if request_line(to, ticket).as_deref() == Some(text) => Line::Request {
                to,
                ticket: ticket.to_string(),
            },
            _ => Line::Other,
        },
        [ALLOW_WORD, ip, count] => match (ip.parse::<IpAddr>(), count.parse::<u32>()) {
            (Ok(ip), Ok(count)) if allow_line(ip, count) == text => Line::Allow { ip, count },
            _ => Line::Other,
        },
        _ => Line::Other,
    }
}

/// What the far end does with what it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A line came: the client is there.
    Heard,
    /// Connect to `to` and write `ticket`.
    Dial { to: SocketAddr, ticket: String },
    /// A request for an address the client did not name, or past its
    /// allowance: not dialled (the far end says why on its stderr).
    Refused { to: SocketAddr, why: &'static str },
}

/// The far end's reader of its ssh channel (see the module's
/// documentation).
#[derive(Debug)]
pub struct Reader {
    line: Vec<u8>,
    /// The current line went past [`LINE_MAX`]: dropped up to its `\n`.
    overlong: bool,
    /// The address the client's ssh came from: always allowed.
    client: Option<IpAddr>,
    /// Other addresses the client allowed, with the connections left.
    allowed: Vec<(IpAddr, u32)>,
}

impl Reader {
    /// A reader for a far end whose client's ssh came from `client`.
    pub fn new(client: Option<IpAddr>) -> Reader {
        Reader {
            line: Vec::new(),
            overlong: false,
            client,
            allowed: Vec::new(),
        }
    }

    /// Takes `bytes` from the channel; what to do, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() < LINE_MAX - 1 {
                    self.line.push(b);
                } else {
                    self.overlong = true;
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            out.push(Event::Heard);
            if std::mem::take(&mut self.overlong) {
                continue;
            }
            match parse_line(&line) {
                Line::Request { to, ticket } => out.push(self.decide(to, ticket)),
                Line::Allow { ip, count } => self.allow(ip, count),
                Line::Other => {}
            }
        }
        out
    }

    /// Connections the far end may still open to `ip` beyond its client's
    /// own address (None: unbounded, the client's).
    pub fn allowed(&self, ip: IpAddr) -> Option<u32> {
        if self.client == Some(ip) {
            return None;
        }
        Some(
            self.allowed
                .iter()
                .find(|(a, _)| *a == ip)
                .map_or(0, |(_, n)| *n),
        )
    }

    fn allow(&mut self, ip: IpAddr, count: u32) {
        if self.client == Some(ip) {
            return;
        }
        let room = self.allowed.len() < ALLOWED_ADDRESSES_MAX;
        match self.allowed.iter_mut().find(|(a, _)| *a == ip) {
            Some((_, n)) => *n = n.saturating_add(count).min(ALLOW_MAX),
            None if room => self.allowed.push((ip, count.min(ALLOW_MAX))),
            None => {}
        }
    }

    fn decide(&mut self, to: SocketAddr, ticket: String) -> Event {
        if self.client == Some(to.ip()) {
            return Event::Dial { to, ticket };
        }
        match self.allowed.iter_mut().find(|(a, _)| *a == to.ip()) {
            Some((_, n)) if *n > 0 => {
                *n -= 1;
                Event::Dial { to, ticket }
            }
            Some(_) => Event::Refused {
                to,
                why: "the client's allowance for that address is spent",
            },
            None => Event::Refused {
                to,
                why: "not an address the client named (neither where its ssh came from nor one it allowed)",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "lh1b_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    const U: &str = "lh1b_BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSY";

    fn dials(events: &[Event]) -> Vec<SocketAddr> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Dial { to, .. } => Some(*to),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_ticket_is_of_its_exact_form_only() {
        assert!(is_ticket(T) && is_ticket(U));
        for bad in [
            "",
            "lh1b_",
            &T[..47],
            &format!("{T}A"),
            &T.replace("lh1b_", "lh1c_"),
            &format!("{}\n", &T[..47]),
            &format!("{} ", &T[..47]),
            &format!("{}=", &T[..47]),
            &format!("{}\u{e9}", &T[..46]),
        ] {
            assert!(!is_ticket(bad), "{bad:?}");
        }
        let to: SocketAddr = "198.51.100.4:41234".parse().unwrap();
        assert_eq!(
            request_line(to, &format!("{T}\nconnect-back 10.0.0.1:22 {U}")),
            None
        );
        assert_eq!(request_line("198.51.100.4:0".parse().unwrap(), T), None);
    }

    /// Recorded lines: what a client writes reads back; a request with
    /// anything more or less (a second line's words, two spaces, a tab, a
    /// `\r`, a short ticket) is no request.
    #[test]
    fn lines_read_back_exactly_or_not_at_all() {
        let to: SocketAddr = "198.51.100.4:41234".parse().unwrap();
        let line = request_line(to, T).unwrap();
        assert_eq!(
            parse_line(line.as_bytes()),
            Line::Request {
                to,
                ticket: T.into()
            }
        );
        let v6: SocketAddr = "[2001:db8::1]:5000".parse().unwrap();
        assert!(matches!(
            parse_line(request_line(v6, T).unwrap().as_bytes()),
            Line::Request { .. }
        ));
        let ip: IpAddr = "198.51.100.4".parse().unwrap();
        assert_eq!(
            parse_line(allow_line(ip, 64).as_bytes()),
            Line::Allow { ip, count: 64 }
        );
        for bad in [
            format!("{line} connect-back 10.0.0.1:22 {U}"),
            format!("{line}\r"),
            format!("connect-back  198.51.100.4:41234 {T}"),
            format!("connect-back\t198.51.100.4:41234 {T}"),
            format!("connect-back 198.51.100.4:41234 {}", &T[..47]),
            format!("connect-back 198.51.100.4:0 {T}"),
            format!("connect-back 198.51.100.4 {T}"),
            format!("connect-back internal.example:80 {T}"),
            format!("connect-back-allow 198.51.100.4 {}", ALLOW_MAX + 1),
            "connect-back-allow 198.51.100.4 +5".into(),
            "connect-back-allow 198.51.100.4 05".into(),
            format!(
                "connect-back 198.51.100.4:41234 {}",
                T.replace("lh1b_", "lh1o_")
            ),
            format!("connect-back localhost:41234 {T}"),
            format!("connect-forward 198.51.100.4:41234 {T}"),
            "\r".into(),
            "alive".into(),
        ] {
            assert_eq!(parse_line(bad.as_bytes()), Line::Other, "{bad:?}");
        }
        assert_eq!(parse_line(b"\xff\xfe connect-back"), Line::Other);
    }

    /// The attack of issue 40: a relayed "ticket" carrying a second line.
    /// Written as one line, it is no request; and the far end dials only
    /// its client's address or one the client allowed, at most as often
    /// as allowed, whatever the lines say.
    #[test]
    fn attacker_the_far_end_dials_only_what_its_client_named() {
        let client: IpAddr = "192.0.2.1".parse().unwrap();
        let source: IpAddr = "198.51.100.4".parse().unwrap();
        let mut r = Reader::new(Some(client));
        let injected =
            format!("connect-back 198.51.100.4:41234 {T} connect-back 10.0.0.1:22 {U}\n");
        assert!(dials(&r.feed(injected.as_bytes())).is_empty());
        // A request for an address nobody allowed, then for the source
        // before and after its allowance, then past it.
        let req = |a: &str| format!("connect-back {a} {T}\n");
        let e = r.feed(req("10.0.0.1:22").as_bytes());
        assert!(
            matches!(e[..], [Event::Heard, Event::Refused { .. }]),
            "{e:?}"
        );
        assert!(dials(&r.feed(req("198.51.100.4:41234").as_bytes())).is_empty());
        r.feed(format!("{}\n", allow_line(source, 2)).as_bytes());
        assert_eq!(r.allowed(source), Some(2));
        let three = [
            req("198.51.100.4:41234"),
            req("198.51.100.4:41235"),
            req("198.51.100.4:41236"),
        ]
        .concat();
        assert_eq!(dials(&r.feed(three.as_bytes())).len(), 2);
        assert_eq!(r.allowed(source), Some(0));
        // The client's own address: always, and fed a byte at a time.
        let mut n = 0;
        for b in req("192.0.2.1:4000").bytes() {
            n += dials(&r.feed(&[b])).len();
        }
        assert_eq!(n, 1);
    }

    /// A line longer than [`LINE_MAX`] is dropped whole: no piece of it
    /// is read as a request of its own.
    #[test]
    fn attacker_an_overlong_line_is_dropped_whole() {
        let mut r = Reader::new(Some("192.0.2.1".parse().unwrap()));
        let tail = format!("connect-back 192.0.2.1:22 {T}");
        let line = format!("{}{tail}\n", "x".repeat(LINE_MAX - 1));
        assert!(dials(&r.feed(line.as_bytes())).is_empty());
        assert_eq!(dials(&r.feed(format!("{tail}\n").as_bytes())).len(), 1);
    }
}
