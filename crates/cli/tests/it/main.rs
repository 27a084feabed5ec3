//! The end-to-end tests of the `longhaul` binary: one test binary with a
//! module per surface (one link of the engine instead of one per file,
//! which is most of CI's build time). nextest still runs every test in its
//! own process; `cargo nextest run -p longhaul --test it -E 'test(/^cp::/)'`
//! runs one module.

// Test scenarios are held to no length: only shipped code is (clippy.toml).
#![allow(clippy::too_many_lines)]
mod common;

mod archive;
mod archive_privacy;
mod busy;
mod compress;
mod cp;
mod credentials;
#[cfg(feature = "dashboard")]
mod dashboard;
mod dist;
mod doctor;
mod doctor_cpu;
mod edges;
mod endgame;
#[cfg(feature = "queue")]
mod fleet;
mod habits;
mod iperf3;
mod jobs;
mod matrix;
#[cfg(feature = "metrics")]
mod metrics;
mod partials;
mod paths;
mod perf;
#[cfg(feature = "plot")]
mod plot;
mod portable;
mod sealed;
mod security;
mod ssh;
mod third_party_copy;
mod trust;
mod wan;
