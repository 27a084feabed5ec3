//! A far end's ssh channel (`proto::xfer::back::Reader`): arbitrary bytes,
//! fed in pieces, as its client (or anything on the channel) writes them.
//! Input: one byte of settings (bit 0: the far end knows its client's
//! address, 192.0.2.1; the rest: the size of each piece, 1 to 128), then
//! the channel's bytes.
//!
//! Must never panic. Properties, against a model kept here of what the
//! module documents (each complete line of at most `LINE_MAX - 1` bytes
//! read with `parse_line`; allowances counted, capped and spent):
//! - every line is heard, and the events are exactly the model's: a dial
//!   only to the client's address or one allowed before, never more often
//!   than allowed; a refusal for anything else;
//! - every dial's ticket is of the exact form, and its request line reads
//!   back to the same dial.

use std::collections::HashMap;
use std::net::IpAddr;

use longhaul_proto::xfer::back::{
    is_ticket, parse_line, request_line, Event, Line, Reader, ALLOWED_ADDRESSES_MAX, ALLOW_MAX,
    LINE_MAX,
};

/// What the far end should do with `channel`, line by line.
fn model(client: Option<IpAddr>, channel: &[u8]) -> Vec<Event> {
    let mut allowed: HashMap<IpAddr, u32> = HashMap::new();
    let mut out = Vec::new();
    let mut lines = channel.split(|&b| b == b'\n').collect::<Vec<_>>();
    // The bytes after the last line break are no line yet.
    lines.pop();
    for line in lines {
        out.push(Event::Heard);
        if line.len() > LINE_MAX - 1 {
            continue;
        }
        match parse_line(line) {
            Line::Allow { ip, count } if Some(ip) != client => {
                let room = allowed.len() < ALLOWED_ADDRESSES_MAX;
                match allowed.get_mut(&ip) {
                    Some(n) => *n = n.saturating_add(count).min(ALLOW_MAX),
                    None if room => {
                        allowed.insert(ip, count.min(ALLOW_MAX));
                    }
                    None => {}
                }
            }
            Line::Request { to, ticket } => {
                let left = allowed.get_mut(&to.ip());
                if Some(to.ip()) == client {
                    out.push(Event::Dial { to, ticket });
                } else if let Some(n) = left.filter(|n| **n > 0) {
                    *n -= 1;
                    out.push(Event::Dial { to, ticket });
                } else {
                    out.push(Event::Refused { to, why: "" });
                }
            }
            _ => {}
        }
    }
    out
}

/// Events with the refusal's words left out (the model does not word them).
fn shape(events: Vec<Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(|e| match e {
            Event::Refused { to, .. } => Event::Refused { to, why: "" },
            e => e,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&settings, channel)) = data.split_first() else {
        return;
    };
    let client = (settings & 1 == 1).then(|| IpAddr::from([192, 0, 2, 1]));
    let piece = usize::from(settings >> 1) + 1;
    let mut r = Reader::new(client);
    let mut events = Vec::new();
    for chunk in channel.chunks(piece) {
        events.extend(r.feed(chunk));
    }
    for e in &events {
        if let Event::Dial { to, ticket } = e {
            assert!(is_ticket(ticket), "{ticket:?}");
            let line = request_line(*to, ticket).expect("a dial's request line");
            assert_eq!(
                parse_line(line.as_bytes()),
                Line::Request {
                    to: *to,
                    ticket: ticket.clone()
                }
            );
        }
    }
    assert_eq!(shape(events), model(client, channel));
});
