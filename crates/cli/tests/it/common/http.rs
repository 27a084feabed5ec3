//! Plain HTTP/1.1 as a browser or a scraper would send it, byte for byte
//! (the `Host` header and others as the test chooses), for the dashboard
//! and the metrics endpoint.

use std::io::{Read, Write};
use std::net::ToSocketAddrs;
use std::time::Duration;

/// One `GET path` over a fresh connection to `addr`, naming `host`, with
/// `headers` (each ending in CRLF); the status (0 if there was none) and
/// the whole answer.
pub fn get(addr: impl ToSocketAddrs, path: &str, host: &str, headers: &str) -> (u16, String) {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}
