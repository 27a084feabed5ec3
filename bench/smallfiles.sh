#!/usr/bin/env bash
# bench/smallfiles.sh - lots of small files on loopback: longhaul cp against the rsync daemon,
# GridFTP, tar through a socket and a local copy, N files of 1-64 KiB, put and get, in the same run,
# alternating, every copy verified. A thin call of `longhaul matrix` (bench/lib/matrix.sh says what
# it measures and prints); files/s = MB/s / the mean file size (32.5 KiB).
#
#   bash bench/smallfiles.sh                     # ROUNDS=3 NFILES=20000
#   ROUNDS=5 NFILES=20000 bash bench/smallfiles.sh --md
#
# Environment: ROUNDS (3), NFILES (20000), TOOLS (longhaul,rsyncd,gridftp,tar-socket,cp),
# LONGHAUL_BIN, RESULTS. Cold sources (page cache dropped): bench/cold-read.sh. The script this
# replaces is in git history at 3a98b22.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
lh_matrix --paths loopback --workloads smallfiles \
    --tools "${TOOLS:-longhaul,rsyncd,gridftp,tar-socket,cp}" --files "${NFILES:-20000}" "$@"
