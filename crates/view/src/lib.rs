//! What people and monitoring systems see of longhaul's runs:
//!
//! - [`dashboard`]: `longhaul dashboard`, a web page served by the binary
//!   (its assets embedded) with the live runs, the history and each run's
//!   graphs, read from the archive.
//! - [`metrics`]: `serve --metrics ADDR`, the server's counters and
//!   histograms in Prometheus' text exposition format.
//! - [`http`]: what both share of HTTP: connection cap, header time
//!   limit, Host check.
//! - [`plot`]: `longhaul plot`, a run's intervals drawn to SVG or PNG.
//!
//! Each is a Cargo feature (`dashboard`, `metrics`, `plot`; all in the
//! default build, `http` with either of the first two), so that a data
//! node's build leaves out the web server and the plotting library.
// Unit tests are scenarios, not shipped functions: only shipped code is held to 100 lines.
#![cfg_attr(test, allow(clippy::too_many_lines))]

#[cfg(feature = "dashboard")]
pub mod dashboard;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "plot")]
pub mod plot;
