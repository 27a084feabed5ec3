//! What the fleet's tests share.

pub mod pg;
