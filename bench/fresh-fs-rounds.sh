#!/usr/bin/env bash
# bench/fresh-fs-rounds.sh - issue 45's tree of small files, cold, with a fresh ext4 for the destination
# before every run: one `longhaul matrix --runs 1` per tool per round, the tools rotated each round.
# A destination emptied and written again makes ext4's inode allocator scan (BENCHMARKS.md, issue 45
# small files session d, end), and the matrix's runs of one cell share one file system; here every
# tool meets the allocator in the same state. The source tree stays on the disk under test (bind-
# mounted as the matrix's smallfiles data); the destination is an ext4 image on it, loop-mounted, the
# page cache dropped after the mount and (--cold) before the timed run. Needs root.
#
#   ROUNDS=6 TOOLS="lh rsd:W lcp" WORKLOAD=smallfiles bash bench/fresh-fs-rounds.sh
#   TOOLS="lh rsd:W walk" WORKLOAD=smallfiles+same bash bench/fresh-fs-rounds.sh
#
# Environment: TOOLS (tools of TOOLS_FILE, default bench/lib/issue45-tools.toml), WORKLOAD (smallfiles,
# smallfiles+same, smallfiles+changed), NFILES (100000), ROUNDS (6: round 0 is the warm-up), R0 (the
# first round's number, to continue a series), STOP_AT (a time: no round starts that would not end by
# it, ROUND_EST seconds a round), DISK_DIR (/var/tmp/lh-fresh-fs: the tree, the image, the mount),
# IMG_SIZE (3G), OUT (one JSON and one log per run, and HOSTCPU_LOG), LONGHAUL_BIN. Each run's JSON is
# the matrix's document; medians over rounds are taken from them (round 0 left out).
set -u
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "fresh-fs-rounds: run as root (mounts, --cold)" >&2; exit 1; }
L=${LONGHAUL_BIN:-target/release/longhaul} DIR=${DISK_DIR:-/var/tmp/lh-fresh-fs}
NFILES=${NFILES:-100000} WORKLOAD=${WORKLOAD:-smallfiles} ROUNDS=${ROUNDS:-6} R0=${R0:-0}
TOOLS_FILE=${TOOLS_FILE:-bench/lib/issue45-tools.toml} IMG_SIZE=${IMG_SIZE:-3G}
OUT=${OUT:-bench/results/fresh-fs-$(date -u +%Y%m%d-%H%M)} STOP_AT=${STOP_AT:-} ROUND_EST=${ROUND_EST:-180}
SRC=$DIR/tree IMG=$DIR/dst.img MNT=$DIR/mnt
read -r -a tools <<<"${TOOLS:-lh rsd:W lcp}"
mkdir -p "$OUT" "$MNT"
export HOSTCPU_LOG=${HOSTCPU_LOG:-$(realpath "$OUT")/hostcpu.log}
[ -d "$SRC" ] || python3 bench/lib/tree-45.py "$SRC" "$NFILES" || exit 1
cleanup() {
    mountpoint -q "$MNT/data/smallfiles" && umount "$MNT/data/smallfiles"
    mountpoint -q "$MNT" && umount "$MNT"
    rm -f "$IMG"
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
fresh_fs() {
    cleanup
    truncate -s "$IMG_SIZE" "$IMG"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$IMG" || exit 1
    mount -o loop "$IMG" "$MNT" || exit 1
    mkdir -p "$MNT/data/smallfiles"
    mount --bind "$SRC" "$MNT/data/smallfiles" || exit 1
    sync
    echo 3 >/proc/sys/vm/drop_caches
}
n=${#tools[@]}
for ((r = R0; r < ROUNDS; r++)); do
    if [ -n "$STOP_AT" ] && [ $(($(date +%s) + ROUND_EST)) -gt "$(date -d "$STOP_AT" +%s)" ]; then
        echo "fresh-fs-rounds: stopping before round $r ($STOP_AT is near)" | tee -a "$HOSTCPU_LOG" >&2
        break
    fi
    for ((k = 0; k < n; k++)); do
        t=${tools[$(((k + r) % n))]}
        run=$OUT/r$r-${t%%:*}-$WORKLOAD
        fresh_fs
        echo "== round $r tool $t workload $WORKLOAD $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$HOSTCPU_LOG" >&2
        # --size 1M: the matrix's destination-write limit writes min(elephant, 1 GiB) into the work
        # directory first; a small one keeps the fresh file system fresh.
        "$L" matrix --no-archive --runs 1 --paths loopback --tools "$t" --tools-file "$TOOLS_FILE" \
            --workloads "$WORKLOAD" --directions put --cold --files "$NFILES" --work-dir "$MNT" \
            --size 1M --run-timeout 300s --json >"$run.json" 2>"$run.log"
        echo "rc=$? $(grep '^\[' "$run.log" | tail -1 | cut -c1-200)" >&2
    done
done
