#!/usr/bin/env bash
# bench/transfer.sh - files on loopback: longhaul cp against GridFTP, XRootD, the rsync daemon, rsync
# over ssh, scp, tar through a socket and a local copy, one big file, many small files and a mixed
# tree, put and get, each tool at its defaults and best settings, in the same run, alternating, every
# copy verified, with the same-run limits (memory to memory, the local copy, the destination's write
# rate). A thin call of `longhaul matrix` (bench/lib/matrix.sh says what it measures and prints).
#
#   bash bench/transfer.sh                                  # ROUNDS=3 SIZE=4G NFILES=20000
#   ROUNDS=1 SIZE=256M NFILES=2000 bash bench/transfer.sh   # a smoke run
#   WORK_DIR=/var/tmp/lh-bench bash bench/transfer.sh       # data and copies on disk, not in /tmp
#
# Environment: ROUNDS (3), SIZE (4G: the big file), NFILES (20000 small files of 1-64 KiB; the tree
# has a tenth as many, of mixed sizes), TOOLS (longhaul,gridftp,xrootd,rsyncd,rsync-ssh,scp,
# tar-socket,cp,iperf3), WORKLOADS (elephant,smallfiles,tree), WORK_DIR, LONGHAUL_BIN, RESULTS.
# Cold-cache reads: bench/cold-read.sh. One big file against GridFTP and a local copy in memory (what
# elephant.sh measured; its dd-sync ceiling is the matrix's destination-write limit):
#   WORKLOADS=elephant TOOLS=longhaul,gridftp,cp WORK_DIR=/dev/shm/lh-bench SIZE=2G bash bench/transfer.sh
# The script this replaces (cold-cache disk scenarios, fio ceilings, peak RSS) is in git history at
# 3a98b22.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
extra=()
[ -n "${WORK_DIR:-}" ] && extra+=(--work-dir "$WORK_DIR")
lh_matrix --paths loopback \
    --tools "${TOOLS:-longhaul,gridftp,xrootd,rsyncd,rsync-ssh,scp,tar-socket,cp,iperf3}" \
    --workloads "${WORKLOADS:-mem,elephant,smallfiles,tree}" \
    --size "${SIZE:-4G}" --files "${NFILES:-20000}" --seconds 5 "${extra[@]}" "$@"
