#!/usr/bin/env bash
# bench/small-sync.sh - a tree of small files, cold disk to disk, against the rsync daemon: the first
# copy, a sync with nothing changed and a sync with 1% of the files changed (issue 45's three
# small-file targets), the page cache dropped before every run, in the same run, alternating, every
# result verified, CPU from each end's cgroup. With OLD_BIN, another longhaul build beside this one
# (an A/B). A thin call of `longhaul matrix` (bench/lib/matrix.sh says what it measures and prints):
# the workloads smallfiles, smallfiles+same and smallfiles+changed, puts; --cold needs root.
#
#   NFILES=100000 ROUNDS=5 bash bench/small-sync.sh
#   OLD_BIN=path/to/other/longhaul NFILES=100000 bash bench/small-sync.sh   # longhaul@old too
#
# Environment: NFILES (100000), WORKLOADS (the three; `smallfiles`: the first copy only),
# DISK_DIR (/var/tmp/lh-small-sync: the disk under test; removed after), TOOLS
# (longhaul:defaults,rsyncd, with OLD_BIN also longhaul@old:defaults: longhaul at its defaults as
# a user runs it, rsyncd at its defaults and its swept best), OLD_BIN, ROUNDS,
# LONGHAUL_BIN, RESULTS; extra arguments are the matrix's (e.g. --sweep-rounds 1). The tree is
# bench/lib/tree-45.py's (NFILES files of 0.5-8 KiB in NFILES/11 directories), given to the matrix
# as its smallfiles data; a sync's first copy is the tool's own, before its clock, and `changed`
# rewrites 1% of that copy's files (new bytes, an old time). The script this replaces, which
# started the peers itself, is in git history at 500ffb9.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
dir=${DISK_DIR:-/var/tmp/lh-small-sync} nfiles=${NFILES:-100000}
tools=${TOOLS:-longhaul:defaults,rsyncd}
extra=()
if [ -n "${OLD_BIN:-}" ]; then
    extra+=(--build "old=$OLD_BIN")
    [ -n "${TOOLS:-}" ] || tools=$tools,longhaul@old:defaults
fi
mkdir -p "$dir/data"
trap 'rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/lib/tree-45.py" "$dir/data/smallfiles" "$nfiles"
lh_matrix --paths loopback --workloads "${WORKLOADS:-smallfiles,smallfiles+same,smallfiles+changed}" \
    --directions put --cold --tools "$tools" --files "$nfiles" --work-dir "$dir" "${extra[@]}" "$@"
