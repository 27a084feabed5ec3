//! The reporter.
