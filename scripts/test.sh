#!/usr/bin/env bash
# Runs the whole test suite (unit, protocol harness, loopback integration).
# Release mode: the integration tests move real data, and debug builds are
# ten times slower at it.
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --release --locked --no-fail-fast "$@"
else
  cargo test --workspace --release --locked --no-fail-fast "$@"
fi
