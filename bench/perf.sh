#!/usr/bin/env bash
# bench/perf.sh - memory to memory on loopback: longhaul perf against iperf3, iperf2 and nuttcp, each
# at its defaults and at its best (swept from each tool's grid in
# crates/cli/src/cmd/matrix/tools.toml on the path at hand), put and get, in the same run,
# alternating. A thin call of `longhaul matrix` (bench/lib/matrix.sh says what it measures and prints).
#
#   bash bench/perf.sh                              # ROUNDS=3 DURATION=10
#   ROUNDS=1 DURATION=3 bash bench/perf.sh --md
#   PATHS=loopback,80ms bash bench/perf.sh          # also over an emulated path (root)
#
# Environment: ROUNDS (3), DURATION (10 s per run), TOOLS (longhaul-perf,iperf3,iperf2,nuttcp;
# NAME:SETTINGS picks one settings), PATHS (loopback), LONGHAUL_BIN, RESULTS.
# One stream under each congestion control, against iperf3 -l 1M (what perf-one-stream.sh measured):
#   TOOLS=longhaul-perf:one-stream-bbr,longhaul-perf:one-stream-cubic,iperf3:one-stream-bbr,iperf3:one-stream-cubic \
#   PATHS=loopback,lan bash bench/perf.sh
# The script this replaces (TLS against plaintext data streams, GNU time cross-checks) is in git
# history at 3a98b22.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
lh_matrix --workloads mem --tools "${TOOLS:-longhaul-perf,iperf3,iperf2,nuttcp}" \
    --paths "${PATHS:-loopback}" --seconds "${DURATION:-10}" "$@"
