//! Cutting a manifest into units of work (pure, property-tested).
