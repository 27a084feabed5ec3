//! The forwarder: per direction, a reader thread takes packets from one
//! TUN device and asks the link model what happens to each; a writer
//! thread writes the delivered ones to the other device when they are due.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::model::{Link, LinkParams, LinkStats, Verdict};
use super::net::Hosts;
use crate::EngineError;

/// Packets waiting for their time, earliest first (ties in arrival order).
type Due = BinaryHeap<Reverse<(Duration, u64, Vec<u8>)>>;

/// Bytes one direction may hold in flight (delay x rate) before it drops.
const MAX_IN_FLIGHT: u64 = 1 << 30;

/// A direction's waiting packets, and whether the writer is writing one
/// it has taken out (so the reader must not overtake it).
#[derive(Default)]
struct Queue {
    heap: Due,
    writing: bool,
}

struct Direction {
    link: Mutex<Link>,
    due: Mutex<Queue>,
    wake: Condvar,
    in_flight: AtomicU64,
    /// Arrival order, for packets due at the same instant.
    seq: AtomicU64,
}

/// A running forwarder; stops when dropped.
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    dirs: [Arc<Direction>; 2],
    threads: Vec<JoinHandle<()>>,
}

impl Forwarder {
    /// Starts forwarding between the hosts' devices: `a_to_b` for packets
    /// host a sends, `b_to_a` for the others.
    pub fn start(
        hosts: &Hosts,
        a_to_b: LinkParams,
        b_to_a: LinkParams,
        seed: u64,
    ) -> Result<Forwarder, EngineError> {
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let clone = |t: &super::net::Tun| {
            t.file
                .try_clone()
                .map_err(|e| EngineError::io("failed to clone a TUN descriptor".into(), e))
        };
        let mut threads = Vec::new();
        let mk = |p: LinkParams, s: u64| {
            Arc::new(Direction {
                link: Mutex::new(Link::new(p, s)),
                due: Mutex::new(Queue::default()),
                wake: Condvar::new(),
                in_flight: AtomicU64::new(0),
                seq: AtomicU64::new(0),
            })
        };
        let dirs = [mk(a_to_b, seed), mk(b_to_a, seed ^ 0x5555_5555)];
        for (i, (from, to)) in [
            (clone(&hosts.tun_a)?, clone(&hosts.tun_b)?),
            (clone(&hosts.tun_b)?, clone(&hosts.tun_a)?),
        ]
        .into_iter()
        .enumerate()
        {
            let (d, s) = (dirs[i].clone(), stop.clone());
            let name = if i == 0 { "a->b" } else { "b->a" };
            let direct = to
                .try_clone()
                .map_err(|e| EngineError::io("failed to clone a TUN descriptor".into(), e))?;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("lh-wan-rx {name}"))
                    .spawn(move || read_side(from, direct, &d, &s, epoch))
                    .map_err(|e| EngineError::io("failed to start a forwarder".into(), e))?,
            );
            let (d, s) = (dirs[i].clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("lh-wan-tx {name}"))
                    .spawn(move || write_side(to, &d, &s, epoch))
                    .map_err(|e| EngineError::io("failed to start a forwarder".into(), e))?,
            );
        }
        Ok(Forwarder {
            stop,
            dirs,
            threads,
        })
    }

    /// Counters of a->b and b->a.
    pub fn stats(&self) -> [LinkStats; 2] {
        [0, 1].map(|i| self.dirs[i].link.lock().expect("poisoned").stats())
    }

    /// New parameters for the packets from now on.
    pub fn set(&self, a_to_b: LinkParams, b_to_a: LinkParams) {
        self.dirs[0].link.lock().expect("poisoned").set(a_to_b);
        self.dirs[1].link.lock().expect("poisoned").set(b_to_a);
    }

    /// Stops the writers; the readers end when the devices go away (the
    /// hosts are removed) or with the next packet.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for d in &self.dirs {
            d.wake.notify_all();
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop();
        // Readers may sit in read(2) until the device is removed: do not
        // wait for them here.
        for t in self.threads.drain(..) {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Takes packets from `from`; one that is due at once with nothing ahead
/// of it goes straight out through `direct` (the other device), the rest
/// to the writer's queue.
fn read_side(
    mut from: std::fs::File,
    mut direct: std::fs::File,
    d: &Direction,
    stop: &AtomicBool,
    epoch: Instant,
) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let now = epoch.elapsed();
        let verdict = d.link.lock().expect("poisoned").arrive(now, n);
        let Verdict::Deliver { at, flip_bit } = verdict else {
            continue;
        };
        if d.in_flight.load(Ordering::Relaxed) + n as u64 > MAX_IN_FLIGHT {
            continue;
        }
        if let Some(bit) = flip_bit {
            buf[(bit / 8) as usize] ^= 0x80 >> (bit % 8);
        }
        let mut due = d.due.lock().expect("poisoned");
        if due.heap.is_empty() && !due.writing && at <= epoch.elapsed() {
            // Nothing to keep order with: no hand-off, no copy. The lock is
            // held so the writer cannot start on a later packet meanwhile.
            let _ = direct.write(&buf[..n]);
            continue;
        }
        d.in_flight.fetch_add(n as u64, Ordering::Relaxed);
        let seq = d.seq.fetch_add(1, Ordering::Relaxed);
        let first = due.heap.peek().is_none_or(|Reverse((t, _, _))| at < *t);
        due.heap.push(Reverse((at, seq, buf[..n].to_vec())));
        drop(due);
        if first {
            d.wake.notify_one();
        }
    }
}

fn write_side(mut to: std::fs::File, d: &Direction, stop: &AtomicBool, epoch: Instant) {
    let mut due = d.due.lock().expect("poisoned");
    while !stop.load(Ordering::Relaxed) {
        let wait = match due.heap.peek() {
            None => Duration::from_millis(100),
            Some(Reverse((at, _, _))) => {
                let now = epoch.elapsed();
                if *at > now {
                    *at - now
                } else {
                    let Some(Reverse((_, _, pkt))) = due.heap.pop() else {
                        continue;
                    };
                    due.writing = true;
                    drop(due);
                    d.in_flight.fetch_sub(pkt.len() as u64, Ordering::Relaxed);
                    // A packet the far side's kernel refuses is lost, as on a wire.
                    let _ = to.write(&pkt);
                    due = d.due.lock().expect("poisoned");
                    due.writing = false;
                    continue;
                }
            }
        };
        due = d.wake.wait_timeout(due, wait).expect("poisoned").0;
    }
}
