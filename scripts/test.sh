#!/usr/bin/env bash
# Runs the whole test suite (unit, protocol harness, loopback integration).
# The `ci` profile (Cargo.toml): optimised, since the integration tests move real
# data and debug builds are ten times slower at it, but without release's LTO and
# debug info, which only cost compile time here (the workspace's own crates at
# opt-level 1, their dependencies at 3). Tests run three at a time, those that
# measure a rate or a time alone (.config/nextest.toml, docs/TESTING.md); every
# test's time is in target/nextest/default/junit.xml afterwards.
#
# A test that lacks something this host does not have (root, a tool, a device)
# skips, unless CI's LONGHAUL_REQUIRE_<NEED>=1 makes that a failure; the run ends
# by saying how many skipped and why, so that "N passed" is not read as all of
# them having run. Arguments go to nextest (or cargo test), e.g. -E 'test(/^cp::/)'.
set -euo pipefail
cd "$(dirname "$0")/.."

skips=$(mktemp)
trap 'rm -f "$skips"' EXIT
export LONGHAUL_SKIP_LOG=$skips
status=0
started=$SECONDS
# nextest keeps its reports under the workspace's target/nextest whatever
# CARGO_TARGET_DIR says (its `store.dir`).
junit=target/nextest/default/junit.xml
if cargo nextest --version >/dev/null 2>&1; then
  rm -f "$junit"
  cargo nextest run --workspace --cargo-profile ci --locked --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --profile ci --locked --no-fail-fast "$@" || status=$?
fi
# The run's time, building and testing apart (the tests' from nextest's
# report): a first run compiles every dependency too (docs/TESTING.md).
took=$((SECONDS - started))
tested=$({ sed -n 's/.*<testsuites [^>]* time="\([0-9]*\)[.0-9]*".*/\1/p' "$junit" 2>/dev/null || true; } | head -n 1)
echo
if [ -n "$tested" ]; then
  echo "took ${took}s: building $((took - tested))s, the tests ${tested}s (each test's time: $junit)"
else
  echo "took ${took}s"
fi
if [ -s "$skips" ]; then
  echo
  echo "$(cut -f3 "$skips" | sort -u | wc -l) test(s) skipped for want of something this host lacks" \
    "(they passed without testing it; CI sets LONGHAUL_REQUIRE_* so that none can):"
  cut -f1,2 "$skips" | sort | uniq -c | sort -rn |
    awk -F'\t' '{ split($1, n, " "); printf "  %3d  %s: %s (LONGHAUL_REQUIRE_%s=1 makes it a failure)\n", n[1], n[2], $2, n[2] }'
fi
exit "$status"
