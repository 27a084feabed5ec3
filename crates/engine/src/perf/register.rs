//! UDP streams joining their test: one end sends each stream's
//! registration datagram ([`udp::registration`]) until the test starts,
//! the other takes the first one from the control connection's host that
//! proves its slot and connects its socket to where it came from. The
//! client registers with the server (`docs/PROTOCOL.md` 8.2), or, where the
//! server opened the control connection itself because nothing new gets
//! in to it, the server with the client (8.2.1): its firewall then lets the
//! client's datagrams in as replies.

use std::net::{IpAddr, SocketAddr, UdpSocket};

use longhaul_proto::databind::DataKey;
use longhaul_proto::msg::Direction;
use longhaul_proto::udp;

/// How often registrations are sent until the test starts.
pub const EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// What one stream's registration proves.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    /// The test's token (`TestAccept.token`).
    pub token: &'a str,
    /// The test's data key; None (an older server): the token is the proof.
    pub key: Option<&'a DataKey>,
    pub stream: u16,
    pub direction: Direction,
}

impl Slot<'_> {
    /// Sends this slot's registration on `u` (connected to the other end);
    /// a datagram lost is sent again [`EVERY`] so often, so errors are
    /// ignored.
    pub fn send(&self, u: &UdpSocket) {
        let _ = u.send(&udp::registration(
            self.token,
            self.key,
            self.stream,
            self.direction,
        ));
    }
}

/// Datagrams a socket waiting for its registration turned away.
#[derive(Debug, Default)]
pub struct Strangers {
    /// From a host other than the control connection's.
    pub elsewhere: u64,
    /// From that host, but not this slot's registration.
    pub unproven: u64,
}

/// Reads what waits on `u` (non-blocking) until it finds the registration
/// of `slot` sent from `peer` (the control connection's host, compared
/// without IPv4-mapping); connects `u` to its source, makes `u` blocking
/// again for the stream's worker, and returns the source. Everything else
/// read is counted in `strangers` and dropped; None if nothing proved the
/// slot yet. Once connected the kernel drops datagrams from anywhere else.
pub fn take(
    u: &UdpSocket,
    peer: IpAddr,
    slot: &Slot,
    strangers: &mut Strangers,
) -> Option<SocketAddr> {
    let peer = peer.to_canonical();
    // A registration is a header and 64 hex digits; anything longer is not one.
    let mut buf = [0u8; 128];
    while let Ok((n, from)) = u.recv_from(&mut buf) {
        if from.ip().to_canonical() != peer {
            strangers.elsewhere += 1;
            if strangers.elsewhere == 1 {
                tracing::warn!(
                    "ignoring a UDP datagram from {from}: only {peer}, the test's control connection's host, may register its streams"
                );
            }
            continue;
        }
        if !udp::is_registration(&buf[..n], slot.token, slot.key, slot.stream, slot.direction) {
            strangers.unproven += 1;
            continue;
        }
        if u.connect(from).is_ok() {
            let _ = u.set_nonblocking(false);
            return Some(from);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TOKEN: &str = "00112233445566778899aabbccddeeff";

    fn bound(ip: &str) -> UdpSocket {
        UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap()
    }

    /// Waits until `u` has a datagram queued, so that `take` sees it.
    fn queued(u: &UdpSocket) {
        u.set_nonblocking(false).unwrap();
        u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        u.peek_from(&mut b).unwrap();
        u.set_nonblocking(true).unwrap();
    }

    /// The attacker: before the true registration, one from another host
    /// (127.0.0.2 stands for it) carrying the slot's very proof, and one
    /// from the right host with another slot's proof, or a forged one:
    /// neither captures the socket. The true one does; after it, a
    /// stranger's datagram with the test's tag never reaches the socket's
    /// reader, so no worker counts it.
    #[test]
    fn attacker_a_spoofed_or_unproven_registration_does_not_capture_the_socket() {
        let key = DataKey::from_bytes([5; longhaul_proto::databind::KEY_LEN]);
        let slot = Slot {
            token: TOKEN,
            key: Some(&key),
            stream: 1,
            direction: Direction::Down,
        };
        let mine = bound("127.0.0.1");
        mine.set_nonblocking(true).unwrap();
        let to = mine.local_addr().unwrap();
        let far = bound("127.0.0.1");
        let Ok(stranger) = UdpSocket::bind("127.0.0.2:0") else {
            panic!("this host's loopback takes 127.0.0.2 (Linux's does)");
        };
        let right = udp::registration(TOKEN, Some(&key), 1, Direction::Down);
        let other_slot = udp::registration(TOKEN, Some(&key), 0, Direction::Down);
        let mut forged = right.clone();
        forged[udp::HEADER_LEN..].fill(b'a');
        let mut strangers = Strangers::default();

        stranger.send_to(&right, to).unwrap();
        queued(&mine);
        assert_eq!(
            take(&mine, far.local_addr().unwrap().ip(), &slot, &mut strangers),
            None
        );
        assert_eq!(strangers.elsewhere, 1);
        for d in [&other_slot, &forged] {
            far.send_to(d, to).unwrap();
            queued(&mine);
            assert_eq!(
                take(&mine, "127.0.0.1".parse().unwrap(), &slot, &mut strangers),
                None
            );
        }
        assert_eq!(strangers.unproven, 2);

        far.send_to(&right, to).unwrap();
        queued(&mine);
        let got = take(
            &mine,
            "::ffff:127.0.0.1".parse().unwrap(),
            &slot,
            &mut strangers,
        );
        assert_eq!(got, Some(far.local_addr().unwrap()));
        assert_eq!(mine.peer_addr().unwrap(), far.local_addr().unwrap());

        // During the test: the stranger's datagram with the test's tag is
        // dropped by the kernel; the far end's arrives.
        let mut data = vec![0u8; 100];
        udp::Header {
            tag: udp::tag_of(TOKEN),
            stream: 1,
            flags: 0,
            seq: 0,
            send_ns: 1,
        }
        .write(&mut data);
        stranger.send_to(&data, to).unwrap();
        data[8..16].copy_from_slice(&7u64.to_be_bytes());
        far.send_to(&data, to).unwrap();
        mine.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 200];
        let n = mine.recv(&mut b).unwrap();
        assert_eq!(
            udp::Header::read(&b[..n]).unwrap().seq,
            7,
            "the stranger's came through"
        );
        mine.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        assert!(
            mine.recv(&mut b).is_err(),
            "a stranger's datagram reached the reader"
        );
    }
}
