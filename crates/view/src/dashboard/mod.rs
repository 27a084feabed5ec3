//! The dashboard.
