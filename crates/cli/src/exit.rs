//! Exit codes of the `longhaul` binary. Documented in docs/GUIDE.md ("Exit codes"); scripts rely on them.

/// Everything worked.
pub const OK: i32 = 0;
/// An internal error not covered below.
pub const INTERNAL: i32 = 1;
/// The command line was wrong (clap also exits with 2).
pub const USAGE: i32 = 2;
/// The server could not be reached (resolve, connect, handshake).
pub const CONNECT: i32 = 3;
/// The server refused (busy, over a limit, version, bad request).
pub const REFUSED: i32 = 4;
/// The test started but failed before it completed.
pub const FAILED: i32 = 5;
/// The transfer finished but some files failed (listed in the output).
pub const PARTIAL: i32 = 6;
/// The server's identity could not be verified (unknown, changed key, no
/// TLS); nothing was sent to it.
pub const UNTRUSTED: i32 = 7;
/// `jobs wait`: the job was cancelled.
pub const CANCELLED: i32 = 8;
/// `jobs wait --timeout`: the time ran out and the job has not ended (it
/// goes on); not a failure, which is 5.
pub const NOT_ENDED: i32 = 9;
/// Interrupted by the user (Ctrl-C); results so far were reported.
pub const INTERRUPTED: i32 = 130;
