#!/usr/bin/env bash
# bench/wan.sh - longhaul against its peers over the WAN emulator (`longhaul wan`, issue 5): memory to
# memory, one big file and lots of small files, put and get, at one bottleneck rate across RTT and
# loss conditions, every tool at its defaults and best settings, in the same run, alternating. A thin
# call of `longhaul matrix` (bench/lib/matrix.sh says what it measures and prints). Needs root and
# /dev/net/tun.
#
#   bash bench/wan.sh                                    # RATE=2gbit, the conditions below
#   CONDITIONS="0ms 80ms-1e-5" ROUNDS=1 bash bench/wan.sh --md
#
# Environment: RATE (2gbit), CONDITIONS ("0ms 0ms-1e-5 80ms 80ms-1e-5 120ms 120ms-1e-5 sat";
# RTTms or RTTms-LOSS, loss per direction; sat = the satellite preset, 540 ms and 1e-4),
# TOOLS (longhaul,longhaul-perf,iperf3,gridftp,rsyncd), WORKLOADS (mem,elephant,smallfiles),
# SIZE (2G), NFILES (2000), PERF_SECONDS (15), ROUNDS (1), LONGHAUL_BIN, RESULTS.
# Start-up on long paths: bench/wan-startup.sh; the emulator's own ceiling: bench/wan-ceiling.sh.
# The script this replaces is in git history at 3a98b22.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
RATE=${RATE:-2gbit}
paths=()
for c in ${CONDITIONS:-0ms 0ms-1e-5 80ms 80ms-1e-5 120ms 120ms-1e-5 sat}; do
    case $c in
    sat) paths+=(satellite) ;;
    *-*) paths+=("${c%%-*}/${c#*-}/$RATE") ;;
    *) paths+=("$c/0/$RATE") ;;
    esac
done
ROUNDS=${ROUNDS:-1} lh_matrix --paths "$(IFS=,; echo "${paths[*]}")" --rate "$RATE" \
    --tools "${TOOLS:-longhaul,longhaul-perf,iperf3,gridftp,rsyncd}" \
    --workloads "${WORKLOADS:-mem,elephant,smallfiles}" --size "${SIZE:-2G}" \
    --files "${NFILES:-2000}" --seconds "${PERF_SECONDS:-15}" "$@"
