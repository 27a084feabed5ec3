//! Where a listener keeps the connections it accepted that have not yet
//! proven anything (sent their cookie, ticket or hello): at most so many
//! from one address, at most so many in all; when a new one comes and
//! there is no room, the idlest goes (the one that has sent nothing for
//! the longest, from the same address when that address is over its
//! share), never the newcomer. So a peer that opens idle connections by
//! the dozen loses its own, and everyone else still gets in. Each
//! connection also has its listener's one deadline to prove itself.

use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Connections waiting to prove themselves (see the module's
/// documentation).
#[derive(Debug)]
pub struct Lobby {
    per_address: usize,
    total: usize,
    /// What [`Waiting::quiet`] is counted from.
    epoch: Instant,
    waiting: Mutex<Vec<Waiting>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Waiting {
    id: u64,
    ip: IpAddr,
    /// When it last sent a byte (or was accepted), microseconds since the
    /// lobby's epoch.
    heard: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
    /// Another handle of its socket, to shut it down when it is dropped.
    socket: TcpStream,
}

/// A connection's place in the [`Lobby`]; leaves it when dropped (it
/// proved itself, or it is closed).
#[derive(Debug)]
pub struct Seat {
    lobby: Arc<Lobby>,
    id: u64,
    heard: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
}

/// Why a connection was let in: plain, or in place of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// There was room.
    Room,
    /// The idlest connection from this `IpAddr` (over its share) or of all
    /// was closed to make room.
    Dropped(IpAddr),
}

impl Lobby {
    /// A lobby for at most `per_address` connections from one address and
    /// `total` in all (each at least 1).
    pub fn new(per_address: usize, total: usize) -> Arc<Lobby> {
        Arc::new(Lobby {
            per_address: per_address.max(1),
            total: total.max(1),
            epoch: Instant::now(),
            waiting: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Seats `socket`, accepted from `ip`, making room if there is none;
    /// an error only when its socket cannot be kept (out of descriptors).
    pub fn enter(
        self: &Arc<Lobby>,
        socket: &TcpStream,
        ip: IpAddr,
    ) -> std::io::Result<(Seat, Entered)> {
        let handle = socket.try_clone()?;
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let mine = w.iter().filter(|x| x.ip == ip).count();
        let entered = if mine >= self.per_address {
            self.drop_idlest(&mut w, Some(ip))
        } else if w.len() >= self.total {
            self.drop_idlest(&mut w, None)
        } else {
            Entered::Room
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let heard = Arc::new(AtomicU64::new(self.now()));
        let dropped = Arc::new(AtomicBool::new(false));
        w.push(Waiting {
            id,
            ip,
            heard: heard.clone(),
            dropped: dropped.clone(),
            socket: handle,
        });
        let seat = Seat {
            lobby: self.clone(),
            id,
            heard,
            dropped,
        };
        Ok((seat, entered))
    }

    /// Closes the connection that has been quiet longest (of `ip`'s, or of
    /// all), and says whose it was.
    fn drop_idlest(&self, w: &mut Vec<Waiting>, of: Option<IpAddr>) -> Entered {
        let idlest = w
            .iter()
            .enumerate()
            .filter(|(_, x)| of.is_none_or(|ip| x.ip == ip))
            .min_by_key(|(_, x)| x.heard.load(Ordering::Relaxed))
            .map(|(i, _)| i);
        match idlest {
            Some(i) => {
                let x = w.swap_remove(i);
                x.dropped.store(true, Ordering::SeqCst);
                let _ = x.socket.shutdown(std::net::Shutdown::Both);
                Entered::Dropped(x.ip)
            }
            None => Entered::Room,
        }
    }

    /// Connections waiting now (from `ip`, or in all).
    pub fn waiting(&self, ip: Option<IpAddr>) -> usize {
        let w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.iter().filter(|x| ip.is_none_or(|ip| x.ip == ip)).count()
    }
}

impl Seat {
    /// A byte came: the connection is not idle.
    pub fn heard(&self) {
        self.heard.store(self.lobby.now(), Ordering::Relaxed);
    }

    /// Whether it was closed to make room for another.
    pub fn dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut w = self.lobby.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|x| x.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// Accepted connections from `n` clients bound to `ip`.
    fn accepted(l: &TcpListener, ip: &str, n: usize) -> Vec<(TcpStream, TcpStream)> {
        (0..n)
            .map(|_| {
                let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                c.bind(
                    &format!("{ip}:0")
                        .parse::<std::net::SocketAddr>()
                        .unwrap()
                        .into(),
                )
                .unwrap();
                c.connect(&l.local_addr().unwrap().into()).unwrap();
                let (s, _) = l.accept().unwrap();
                (s, c.into())
            })
            .collect()
    }

    /// The attacker holds one address's share with idle connections: the
    /// next from that address takes the place of its idlest, a stranger
    /// from elsewhere gets in while there is room, and when the whole
    /// lobby is full the idlest of all goes.
    #[test]
    fn attacker_idle_connections_make_room_idlest_first() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let lobby = Lobby::new(4, 6);
        let me: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        let mut seats = Vec::new();
        let mut conns = accepted(&l, "127.0.0.1", 5);
        for (s, _) in &conns {
            seats.push(lobby.enter(s, me).unwrap());
        }
        // The fifth from one address took the first's place.
        assert_eq!(seats[4].1, Entered::Dropped(me));
        assert!(seats[0].0.dropped());
        assert_eq!(lobby.waiting(Some(me)), 4);
        // The dropped one's peer sees its connection closed.
        let mut b = [0u8; 1];
        conns[0]
            .1
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        assert!(!matches!(conns[0].1.read(&mut b), Ok(1)));
        // Two of them send a byte (later than the others were accepted):
        // they are no longer the idlest.
        std::thread::sleep(std::time::Duration::from_millis(2));
        seats[1].0.heard();
        seats[2].0.heard();
        let more = accepted(&l, "127.0.0.1", 1);
        let (s, e) = lobby.enter(&more[0].0, me).unwrap();
        assert_eq!(e, Entered::Dropped(me));
        assert!(
            seats[3].0.dropped() != seats[4].0.dropped(),
            "one of the quiet ones goes"
        );
        assert!(
            !seats[1].0.dropped() && !seats[2].0.dropped(),
            "not those heard from"
        );
        seats.push((s, e));
        // Others come in while there is room, then take the idlest of all.
        let strangers = accepted(&l, "127.0.0.2", 3);
        let mut entered: Vec<_> = strangers
            .iter()
            .map(|(s, _)| lobby.enter(s, other).unwrap())
            .collect();
        assert_eq!(entered[0].1, Entered::Room);
        assert_eq!(entered[1].1, Entered::Room);
        assert_eq!(entered[2].1, Entered::Dropped(me));
        assert_eq!(lobby.waiting(None), 6);
        // A seat given back makes room.
        entered.truncate(1);
        assert_eq!(lobby.waiting(Some(other)), 1);
        conns.clear();
    }
}
