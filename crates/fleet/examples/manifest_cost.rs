//! What a fleet's manifest costs: walks a tree, then times encoding,
//! decoding, hashing and cutting it into shares and queue units, and
//! prints bytes per entry (the figures of docs/SCALE.md).
//!
//! cargo run --release -p longhaul-fleet --example manifest_cost -- DIR [RANKS]

use std::time::Instant;

use longhaul_fleet::manifest::Manifest;
use longhaul_fleet::shard;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: manifest_cost DIR [RANKS]");
    let ranks: u32 = args.next().map_or(100, |r| r.parse().expect("RANKS"));
    let t = Instant::now();
    let m = Manifest::walk(&[dir], true, None).unwrap_or_else(|f| panic!("walk: {f:?}"));
    let walk = t.elapsed();
    let t = Instant::now();
    let bytes = m.encode();
    let encode = t.elapsed();
    let t = Instant::now();
    let back = Manifest::decode(&bytes).expect("decodes");
    let decode = t.elapsed();
    let t = Instant::now();
    let hash = back.hash();
    let hashed = t.elapsed();
    let items = m.items();
    let t = Instant::now();
    let shares = shard::static_shares(&items, ranks);
    let cut = t.elapsed();
    let t = Instant::now();
    let units = shard::queue_units(&items, 256 << 20, 2_000);
    let unitized = t.elapsed();
    let n = m.entries.len().max(1) as f64;
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n;
    println!("entries            {}", m.entries.len());
    println!(
        "bytes              {} ({:.0} per entry)",
        bytes.len(),
        bytes.len() as f64 / n
    );
    println!(
        "walk               {:.3} s ({:.2} us/entry)",
        walk.as_secs_f64(),
        us(walk)
    );
    println!(
        "encode             {:.3} s ({:.2} us/entry)",
        encode.as_secs_f64(),
        us(encode)
    );
    println!(
        "decode             {:.3} s ({:.2} us/entry)",
        decode.as_secs_f64(),
        us(decode)
    );
    println!("hash               {:.3} s ({hash})", hashed.as_secs_f64());
    println!(
        "static shares      {:.3} s for {ranks} ranks (largest share {} units)",
        cut.as_secs_f64(),
        shares.iter().map(Vec::len).max().unwrap_or(0)
    );
    println!(
        "queue units        {:.3} s: {} units of <= 256 MiB / 2,000 files",
        unitized.as_secs_f64(),
        units.len()
    );
}
