//! One transfer across many data transfer nodes.
//!
//! A launcher the site already runs (Slurm, MPI, a Kubernetes indexed Job)
//! starts the same `longhaul cp` on every node; each process learns its
//! rank ([`ranks`]), reads the run's one manifest ([`manifest`]) and moves
//! its share: a fixed one cut by byte prefix sums ([`shard`]), or units it
//! leases from a PostgreSQL work queue (`queue`) so that skew and lost
//! nodes even out. Every rank's result joins one aggregate ([`run`]).
//!
//! Ranges of one large file are moved by several ranks at once; the
//! servers write them into one shared partial file and the last range in
//! renames it into place (`docs/PROTOCOL.md`, "parts").
//!
//! A manifest is read from a place others may write (the run directory,
//! the queue's tables): a rank reads only what resolves beneath its own
//! sources ([`confine`]), and the run directory must be its user's alone.
//!
//! The queue and its PostgreSQL client (`queue`, `feed`, `dbauth`,
//! `dbtls`) are the Cargo feature `queue` (default); without it a rank
//! takes static shares only, and `--queue` says which feature it needs.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod confine;
#[cfg(feature = "queue")]
pub mod dbauth;
#[cfg(feature = "queue")]
mod dbtls;
#[cfg(feature = "queue")]
pub mod feed;
pub mod manifest;
#[cfg(feature = "queue")]
pub mod queue;
pub mod ranks;
pub mod run;
pub mod shard;
