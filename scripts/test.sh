#!/usr/bin/env bash
# Runs the whole test suite (unit, protocol harness, loopback integration).
# The `ci` profile (Cargo.toml): optimised, since the integration tests move real
# data and debug builds are ten times slower at it, but without release's LTO and
# debug info, which only cost compile time here.
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --cargo-profile ci --locked --no-fail-fast "$@"
else
  cargo test --workspace --profile ci --locked --no-fail-fast "$@"
fi
