//! What the work queue costs: publishes a run of UNITS units into a
//! throwaway PostgreSQL server, then drains it with
//! WORKERS workers leasing BATCH units a round trip, and prints units/s
//! and round trips per unit (the figures of docs/SCALE.md).
//!
//! cargo run --release -p longhaul-fleet --example queue_cost -- [UNITS] [WORKERS] [BATCH]

use longhaul_testkit::pg;

use std::time::{Duration, Instant};

use longhaul_fleet::queue::Queue;
use longhaul_fleet::shard::Unit;

fn main() {
    let mut args = std::env::args().skip(1);
    let units: u32 = args.next().map_or(20_000, |a| a.parse().expect("UNITS"));
    let workers: u32 = args.next().map_or(4, |a| a.parse().expect("WORKERS"));
    let batch: u32 = args.next().map_or(1, |a| a.parse().expect("BATCH"));
    let pg = pg::TempPostgres::start().expect("PostgreSQL");
    let url = pg.url();
    let all: Vec<Unit> = (0..units)
        .map(|i| Unit {
            first: i,
            end: i + 1,
            chunks: None,
            bytes: 256 << 20,
        })
        .collect();
    let mut q = Queue::connect(&url, "cost").expect("connect");
    let t = Instant::now();
    q.publish("h", &vec![b'x'; 1 << 20], &all).expect("publish");
    let publish = t.elapsed();
    let publish_trips = q.round_trips();
    let t = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut q = Queue::connect(&url, "cost").expect("connect");
                let before = q.round_trips();
                let me = format!("w{w}");
                let mut done = 0u64;
                loop {
                    let got = q.lease(&me, batch, Duration::from_secs(60)).expect("lease");
                    if got.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = got.iter().map(|l| l.id).collect();
                    q.renew(&me, &ids, Duration::from_secs(60)).expect("renew");
                    q.done(&me, &ids).expect("done");
                    done += ids.len() as u64;
                }
                (done, q.round_trips() - before)
            })
        })
        .collect();
    let (mut done, mut trips) = (0u64, 0u64);
    for th in threads {
        let (d, r) = th.join().expect("worker");
        done += d;
        trips += r;
    }
    let drain = t.elapsed();
    println!(
        "publish   {units} units in {:.3} s ({:.0} units/s, {publish_trips} round trips)",
        publish.as_secs_f64(),
        f64::from(units) / publish.as_secs_f64()
    );
    println!(
        "drain     {done} units, {workers} workers, batch {batch}: {:.3} s ({:.0} units/s), {:.2} round trips a unit (lease, one renewal, done)",
        drain.as_secs_f64(),
        done as f64 / drain.as_secs_f64(),
        trips as f64 / done.max(1) as f64
    );
}
