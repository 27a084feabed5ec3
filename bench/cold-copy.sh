#!/usr/bin/env bash
# bench/cold-copy.sh - one big file from and to a disk with the page cache dropped before every run
# (disk), or in memory (shm), or a cold tree of small files (small): longhaul (to a server, and over
# ssh reach: no server, `cp SRC HOST:path`) against GridFTP, the rsync daemon and the local copy,
# each peer at its swept best, plus another longhaul build (OLD_BIN) as tools of its own, in the same
# run, alternating, every copy verified, CPU from each end's cgroup. A thin call of `longhaul matrix`
# (bench/lib/matrix.sh says what it measures and prints); --cold needs root.
#
#   bash bench/cold-copy.sh                                   # disk, SIZE=2G, ROUNDS=3
#   SCENARIO=shm SIZE=2G bash bench/cold-copy.sh              # in memory, no cache to drop
#   SCENARIO=small NFILES=100000 bash bench/cold-copy.sh      # issue 45's tree, cold
#   OLD_BIN=path/to/other/longhaul bash bench/cold-copy.sh    # adds longhaul@old, longhaul-ssh@old
#
# Environment: SCENARIO (disk, shm or small), SIZE (2G), NFILES (100000), DISK_DIR
# (/var/tmp/lh-cold-copy: the disk under test; removed after), TOOLS
# (longhaul,longhaul-ssh,gridftp,rsyncd,cp), OLD_BIN, ROUNDS, LONGHAUL_BIN, RESULTS. Extra
# arguments are the matrix's (e.g. --sweep-rounds 1, --directions put, --md). The small tree is
# bench/lib/tree-45.py's (NFILES files of 0.5-8 KiB in NFILES/11 directories), given to the matrix
# as its smallfiles data. The script this replaces, which started the peers itself, is in git
# history at 500ffb9.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
scenario=${SCENARIO:-disk} dir=${DISK_DIR:-/var/tmp/lh-cold-copy}
tools=${TOOLS:-longhaul,longhaul-ssh,gridftp,rsyncd,cp}
extra=()
if [ -n "${OLD_BIN:-}" ]; then
    extra+=(--build "old=$OLD_BIN")
    [ -n "${TOOLS:-}" ] || tools=$tools,longhaul@old,longhaul-ssh@old
fi
case $scenario in
disk) extra+=(--cold --workloads elephant --size "${SIZE:-2G}") ;;
shm) dir=$(mktemp -d /dev/shm/lh-cold-copy.XXXXXX) && extra+=(--workloads elephant --size "${SIZE:-2G}") ;;
small)
    extra+=(--cold --workloads smallfiles --files "${NFILES:-100000}")
    mkdir -p "$dir/data"
    python3 "$(dirname "$0")/lib/tree-45.py" "$dir/data/smallfiles" "${NFILES:-100000}"
    ;;
*) echo "cold-copy: SCENARIO is disk, shm or small, not $scenario" >&2; exit 2 ;;
esac
trap 'rm -rf "$dir"' EXIT
lh_matrix --paths loopback --tools "$tools" --work-dir "$dir" "${extra[@]}" "$@"
