//! Admission: the server's test slots (`--max-tests`), the queue that
//! waits for them, and the token data streams present to join the test or
//! transfer that holds a slot.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use longhaul_proto::msg::*;

use super::{auth, client_key, peer_ip, Attach, Shared};
use crate::net::conn::FramedConn;

/// Frees the test's slot and token however the test ends.
pub(super) struct TestGuard {
    shared: Arc<Shared>,
    pub(super) token: String,
    _slot: SlotGuard,
}

impl Drop for TestGuard {
    fn drop(&mut self) {
        self.shared
            .registry
            .lock()
            .expect("poisoned")
            .remove(&self.token);
    }
}

fn new_token() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source");
    longhaul_proto::units::hex(&b)
}

/// Takes a slot for a test or transfer (waiting its turn in the queue) and
/// a token its data streams present; both are given back when the guard
/// drops.
pub(super) fn register(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    access: &auth::Access,
) -> Result<(TestGuard, Receiver<Attach>), (RefuseCode, String)> {
    let slot = take_slot(shared, conn, access)?;
    let guard = TestGuard {
        shared: shared.clone(),
        token: new_token(),
        _slot: slot,
    };
    let (tx, rx) = mpsc::channel();
    shared
        .registry
        .lock()
        .expect("poisoned")
        .insert(guard.token.clone(), (tx, false));
    Ok((guard, rx))
}

/// Marks a registered test as one whose data streams join with proofs of
/// its data key (`Role::PerfData`) and never with the token alone.
pub(super) fn join_by_proof(shared: &Shared, token: &str) {
    if let Some(e) = shared.registry.lock().expect("poisoned").get_mut(token) {
        e.1 = true;
    }
}

/// Who a slot is shared out to: one grant, or every anonymous client
/// together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claimant {
    key: String,
    anonymous: bool,
}

impl Claimant {
    pub(super) fn of(access: &auth::Access) -> Claimant {
        Claimant {
            key: access.who.clone(),
            anonymous: access.is_anonymous(),
        }
    }
}

/// A claimant's waiting requests, in arrival order: (ticket, client).
struct Waiting {
    claimant: Claimant,
    tickets: VecDeque<(u64, IpAddr)>,
}

#[derive(Default)]
struct SlotState {
    running: usize,
    anonymous_running: usize,
    next_ticket: u64,
    /// Claimants with requests waiting, the next to be served first.
    queue: VecDeque<Waiting>,
    waiting: usize,
    /// Tickets given a slot whose waiter has not yet taken it, and
    /// whether the claimant is anonymous.
    granted: HashMap<u64, bool>,
}

/// The server's test slots (`--max-tests`) and the queue for them. A slot
/// that frees goes to the claimant at the head of a round robin (each
/// grant, and the anonymous clients together, served in turn; one
/// claimant's requests in arrival order); anonymous clients together hold
/// at most half the slots, rounded up, so that they cannot lock out every
/// token holder.
pub(super) struct Slots {
    max: usize,
    anonymous_max: usize,
    max_queued: usize,
    state: Mutex<SlotState>,
    changed: Condvar,
}

/// Where a waiting request stands.
enum Turn {
    Granted,
    Waiting(Queued),
}

impl Slots {
    pub(super) fn new(max: usize, max_queued: usize) -> Slots {
        Slots {
            max,
            anonymous_max: max.div_ceil(2),
            max_queued,
            state: Mutex::new(SlotState::default()),
            changed: Condvar::new(),
        }
    }

    /// (running, limit)
    pub(super) fn load(&self) -> (usize, usize) {
        (self.state.lock().expect("poisoned").running, self.max)
    }

    /// Hands free slots to the waiting requests, round robin.
    fn dispatch(&self, st: &mut SlotState) {
        while st.running < self.max {
            let anonymous_full = st.anonymous_running >= self.anonymous_max;
            let Some(i) = st
                .queue
                .iter()
                .position(|w| !(w.claimant.anonymous && anonymous_full))
            else {
                break;
            };
            let mut w = st.queue.remove(i).expect("found");
            let (ticket, _) = w.tickets.pop_front().expect("never empty");
            st.waiting -= 1;
            st.running += 1;
            if w.claimant.anonymous {
                st.anonymous_running += 1;
            }
            st.granted.insert(ticket, w.claimant.anonymous);
            if !w.tickets.is_empty() {
                st.queue.push_back(w);
            }
            self.changed.notify_all();
        }
    }

    /// Queues a request; its slot may be granted at once. Refuses (with
    /// why) when the queue is full.
    fn enqueue(&self, c: &Claimant, client: IpAddr) -> Result<u64, String> {
        if self.max == 0 {
            return Err(
                "this server runs no tests or transfers: its limit is 0 (--max-tests 0)".into(),
            );
        }
        let mut st = self.state.lock().expect("poisoned");
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        match st.queue.iter_mut().find(|w| &w.claimant == c) {
            Some(w) => w.tickets.push_back((ticket, client)),
            None => st.queue.push_back(Waiting {
                claimant: c.clone(),
                tickets: VecDeque::from([(ticket, client)]),
            }),
        }
        st.waiting += 1;
        self.dispatch(&mut st);
        if !st.granted.contains_key(&ticket) && st.waiting > self.max_queued {
            let (running, waiting) = (st.running, st.waiting - 1);
            drop(st);
            self.withdraw(ticket);
            return Err(format!(
                "server is running {running} tests and transfers, its limit (--max-tests {}), and {waiting} more wait, its queue limit (--max-queued {}); try again later",
                self.max, self.max_queued
            ));
        }
        Ok(ticket)
    }

    /// A slot now, or None without queueing.
    pub(super) fn try_take(&self, shared: &Arc<Shared>, c: &Claimant) -> Option<SlotGuard> {
        let ticket = self.enqueue(c, IpAddr::from([0, 0, 0, 0])).ok()?;
        match self.turn(ticket, Duration::ZERO) {
            Turn::Granted => Some(SlotGuard {
                shared: shared.clone(),
                anonymous: c.anonymous,
            }),
            Turn::Waiting(_) => {
                self.withdraw(ticket);
                None
            }
        }
    }

    /// Waits up to `wait` for the ticket's slot; takes it if granted.
    fn turn(&self, ticket: u64, wait: Duration) -> Turn {
        let mut st = self.state.lock().expect("poisoned");
        if !wait.is_zero() && !st.granted.contains_key(&ticket) {
            st = self.changed.wait_timeout(st, wait).expect("poisoned").0;
        }
        if st.granted.remove(&ticket).is_some() {
            return Turn::Granted;
        }
        let mut q = Queued {
            position: 1,
            running: st.running as u32,
            limit: self.max as u32,
            reason: String::new(),
        };
        let mine = st.queue.iter().enumerate().find_map(|(i, w)| {
            let k = w.tickets.iter().position(|t| t.0 == ticket)?;
            Some((i, k, w.claimant.anonymous))
        });
        if let Some((i, k, anonymous)) = mine {
            // Round robin: each claimant ahead in the rotation serves one
            // more than those behind it before this one's turn.
            let ahead: usize = st
                .queue
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(j, w)| w.tickets.len().min(k + usize::from(j < i)))
                .sum();
            q.position = (ahead + k + 1) as u32;
            if anonymous && st.anonymous_running >= self.anonymous_max {
                q.reason = format!(
                    "anonymous clients may hold {} of the {} slots, and do",
                    self.anonymous_max, self.max
                );
            }
        }
        Turn::Waiting(q)
    }

    /// Leaves the queue (or gives back a slot granted meanwhile).
    fn withdraw(&self, ticket: u64) {
        let mut st = self.state.lock().expect("poisoned");
        if let Some(anonymous) = st.granted.remove(&ticket) {
            drop(st);
            self.release(anonymous);
            return;
        }
        for w in st.queue.iter_mut() {
            if let Some(k) = w.tickets.iter().position(|t| t.0 == ticket) {
                w.tickets.remove(k);
                st.waiting -= 1;
                break;
            }
        }
        st.queue.retain(|w| !w.tickets.is_empty());
        self.dispatch(&mut st);
    }

    fn release(&self, anonymous: bool) {
        let mut st = self.state.lock().expect("poisoned");
        st.running = st.running.saturating_sub(1);
        if anonymous {
            st.anonymous_running = st.anonymous_running.saturating_sub(1);
        }
        self.dispatch(&mut st);
        self.changed.notify_all();
    }

    /// Has a client (by [`client_key`]) a request waiting?
    pub(super) fn waiting_from(&self, client: IpAddr) -> bool {
        let st = self.state.lock().expect("poisoned");
        st.queue
            .iter()
            .any(|w| w.tickets.iter().any(|t| t.1 == client))
    }
}

/// A test slot, given back when dropped.
pub(super) struct SlotGuard {
    shared: Arc<Shared>,
    anonymous: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.slots.release(self.anonymous);
    }
}

/// How often a queued client hears that it still waits.
const QUEUE_KEEPALIVE: Duration = Duration::from_secs(2);

/// Takes a slot for this connection's request, waiting in the queue while
/// none is free: the client is told it waits (and reminded every few
/// seconds); a client that closes its connection leaves the queue.
pub(super) fn take_slot(
    shared: &Arc<Shared>,
    conn: &mut FramedConn,
    access: &auth::Access,
) -> Result<SlotGuard, (RefuseCode, String)> {
    let claimant = Claimant::of(access);
    let client = peer_ip(conn).map_or(IpAddr::from([0, 0, 0, 0]), client_key);
    let ticket = shared
        .slots
        .enqueue(&claimant, client)
        .map_err(|m| (RefuseCode::Busy, m))?;
    let granted = || SlotGuard {
        shared: shared.clone(),
        anonymous: claimant.anonymous,
    };
    let mut told: Option<Instant> = None;
    let mut wait = Duration::ZERO;
    loop {
        match shared.slots.turn(ticket, wait) {
            Turn::Granted => {
                if told.is_some() {
                    tracing::info!("{} got its slot", conn.peer());
                }
                return Ok(granted());
            }
            Turn::Waiting(q) if told.is_none_or(|t| t.elapsed() >= QUEUE_KEEPALIVE) => {
                if told.is_none() {
                    tracing::info!(
                        "{} ({}) waits for a slot: position {}, {} running, limit {}",
                        conn.peer(),
                        access.who,
                        q.position,
                        q.running,
                        q.limit
                    );
                }
                told = Some(Instant::now());
                if let Err(e) = conn.send(&Message::Queued(q)) {
                    shared.slots.withdraw(ticket);
                    return Err((RefuseCode::ServerError, format!("left the queue: {e}")));
                }
            }
            Turn::Waiting(_) => {}
        }
        wait = Duration::from_millis(100);
        // The client says nothing while it waits: anything else is the
        // connection closing (or a broken client), and ends the wait.
        let gone = match conn.recv(Duration::from_millis(1)) {
            Ok(None) => None,
            Ok(Some(m)) => Some((
                RefuseCode::Protocol,
                format!("unexpected {} message while queued", m.name()),
            )),
            Err(e) => Some((RefuseCode::ServerError, format!("left the queue: {e}"))),
        };
        if let Some(e) = gone {
            shared.slots.withdraw(ticket);
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(key: &str, anonymous: bool) -> Claimant {
        Claimant {
            key: key.into(),
            anonymous,
        }
    }

    fn granted(s: &Slots, t: u64) -> bool {
        matches!(s.turn(t, Duration::ZERO), Turn::Granted)
    }

    #[test]
    fn slots_go_round_robin_between_grants_and_in_order_within_one() {
        let s = Slots::new(1, 64);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let first = s.enqueue(&who("a", false), ip).unwrap();
        assert!(granted(&s, first));
        let a: Vec<u64> = (0..3)
            .map(|_| s.enqueue(&who("a", false), ip).unwrap())
            .collect();
        let b = s.enqueue(&who("b", false), ip).unwrap();
        // b arrived after three of a's, but a grant is served in turn.
        let Turn::Waiting(q) = s.turn(b, Duration::ZERO) else {
            panic!("b has no slot yet")
        };
        assert_eq!(q.position, 2);
        let mut order = Vec::new();
        for _ in 0..4 {
            s.release(false);
            let next = a.iter().chain([&b]).copied().find(|&t| granted(&s, t));
            order.push(next.expect("one granted per release"));
        }
        assert_eq!(order, vec![a[0], b, a[1], a[2]]);
    }

    #[test]
    fn anonymous_clients_hold_at_most_half_the_slots() {
        let s = Slots::new(2, 64);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let anon: Vec<u64> = (0..3)
            .map(|_| s.enqueue(&who("anonymous", true), ip).unwrap())
            .collect();
        assert!(granted(&s, anon[0]));
        let Turn::Waiting(q) = s.turn(anon[1], Duration::ZERO) else {
            panic!("a second anonymous request got the other slot")
        };
        assert!(q.reason.contains("anonymous"), "{}", q.reason);
        let token = s.enqueue(&who("token 1", false), ip).unwrap();
        assert!(
            granted(&s, token),
            "the token holder waits behind anonymous ones"
        );
        // A withdrawn waiter leaves; the queue cap counts only waiters.
        s.withdraw(anon[2]);
        assert!(s.waiting_from(ip));
        s.withdraw(anon[1]);
        assert!(!s.waiting_from(ip));
        let full = Slots::new(1, 1);
        let t = full.enqueue(&who("a", false), ip).unwrap();
        assert!(granted(&full, t));
        full.enqueue(&who("a", false), ip).unwrap();
        let e = full.enqueue(&who("b", false), ip).unwrap_err();
        assert!(e.contains("--max-queued 1"), "{e}");
    }
}
