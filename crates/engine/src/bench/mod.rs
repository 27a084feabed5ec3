//! Benchmarks of this host's own parts: the storage ([`disk`]).

pub mod disk;
