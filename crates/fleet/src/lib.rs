//! One transfer across many data transfer nodes.
//!
//! A launcher the site already runs (Slurm, MPI, a Kubernetes indexed Job)
//! starts the same `longhaul cp` on every node; each process learns its
//! rank ([`ranks`]), reads the run's one manifest ([`manifest`]) and moves
//! its share: a fixed one cut by byte prefix sums ([`shard`]), or units it
//! leases from a PostgreSQL work queue ([`queue`]) so that skew and lost
//! nodes even out. Every rank's result joins one aggregate ([`run`]).
//!
//! Ranges of one large file are moved by several ranks at once; the
//! servers write them into one shared partial file and the last range in
//! renames it into place (`docs/PROTOCOL.md`, "parts").
//!
//! A manifest is read from a place others may write (the run directory,
//! the queue's tables): a rank reads only what resolves beneath its own
//! sources ([`confine`]), and the run directory must be its user's alone.

pub mod confine;
pub mod dbauth;
mod dbtls;
pub mod feed;
pub mod manifest;
pub mod queue;
pub mod ranks;
pub mod run;
pub mod shard;
