#!/usr/bin/env bash
# Cold trees (issue 15): how fast the source reads a tree that is not in
# the page cache, by the source's prefetch mode, against the device's own
# references at queue depth 16 and 1. Same tree as the old bench/smallfiles.sh: N
# files of 1-64 KiB (uniform) in 100 directories.
#
#   source: DISK_DIR (page cache dropped before each run: `sync; echo 3 >
#           /proc/sys/vm/drop_caches`), destination /dev/shm (the write
#           side is not the limit), `longhaul cp` to `longhaul serve
#           --no-sync` on 127.0.0.1 (TLS on)
#   modes:  LONGHAUL_PREFETCH=off|pool in the source's environment (off:
#           each sender opens and reads its files one at a time, the walker
#           stats one at a time; pool, the default: 16 threads stat the
#           walk's entries and fadvise(WILLNEED) the files queued, ahead;
#           an io_uring mode was measured and removed, BENCHMARKS.md)
#   refs:   xargs16: `find | xargs -0 -P16 -n64 cat >/dev/null` (depth 16)
#           tar1:    `tar cf - | cat >/dev/null` (one reader, depth 1)
#
# Usage: bench/cold-read.sh [--bin LONGHAUL] [--files N] [--rounds N]
#                           [--disk DIR] [--modes "off pool xargs16 tar1"]
# Needs root (drop_caches) and GNU time. Runs alternate within each round;
# prints each run, then the medians in files/s and the ratios to off and
# to xargs16; for longhaul also the medians of the senders' read time
# (summed over the streams, from `cp --json`: bytes / source_read_bps)
# and of the client's CPU time (user + sys).
set -euo pipefail
BIN=${BIN:-$(dirname "$0")/../target/release/longhaul}
FILES=20000 ROUNDS=3 DISK=/var/tmp MODES="off pool xargs16 tar1"
while [ $# -gt 0 ]; do
    case $1 in
    --bin) BIN=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --disk) DISK=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    *) sed -n '2,24p' "$0"; exit 2 ;;
    esac
done
BIN=$(realpath "$BIN")
SHM=$(mktemp -d /dev/shm/lh-cold.XXXXXX)
DSK=$(mktemp -d "$DISK/lh-cold.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait; rm -rf "$SHM" "$DSK" || true' EXIT

python3 "$(dirname "$0")/lib/small-tree.py" "$DSK/src" "$FILES"
mkdir -p "$SHM/dst"
sync

port=$((30000 + RANDOM % 20000))
wait_port() { for _ in $(seq 50); do ss -ltn "sport = :$1" | grep -q LISTEN && return; sleep 0.1; done; }
mkdir -p "$SHM/state"
TOKEN=$("$BIN" token create --state-dir "$SHM/state" --export '*:rw' 2>/dev/null)
TRUST=$("$BIN" id "$SHM/state" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
"$BIN" serve --listen "127.0.0.1:$port" --state-dir "$SHM/state" --no-sync \
    --export "shm=$SHM/dst" >"$SHM/serve.log" 2>&1 &
PIDS+=($!)
wait_port "$port"

# mode -> seconds (and, for longhaul, "read_s cpu_s" into $SHM/more.$1)
run() {
    rm -rf "$SHM/dst/small"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    local t0 t1 src=$DSK/src
    t0=$(date +%s.%N)
    case $1 in
    off | pool)
        LONGHAUL_PREFETCH=$1 LONGHAUL_TOKEN=$TOKEN LONGHAUL_TRUST=$TRUST \
            LONGHAUL_KNOWN_HOSTS=$SHM/kh LONGHAUL_PATHS=$SHM/paths \
            /usr/bin/time -f '%U %S' -o "$SHM/time" \
            "$BIN" cp --json -r --force "$src/small" "127.0.0.1:$port:shm/" >"$SHM/cp.json" 2>"$SHM/cp.err" ||
            { echo "cold-read: longhaul failed: $(tail -n 2 "$SHM/cp.err")" >&2; exit 1; }
        ;;
    xargs16) find "$src/small" -type f -print0 | xargs -0 -P16 -n64 cat >/dev/null ;;
    tar1) tar -C "$src" -cf - small | cat >/dev/null ;;
    esac
    t1=$(date +%s.%N)
    case $1 in
    off | pool)
        local n
        n=$(find "$SHM/dst/small" -type f | wc -l)
        [ "$n" -eq "$FILES" ] || { echo "cold-read: $1 left $n of $FILES files" >&2; exit 1; }
        python3 - "$SHM/cp.json" "$SHM/time" >>"$SHM/more.$1" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
print("%.3f %.2f" % (j["bytes"] / j["source_read_bps"], u + s))
EOF
        ;;
    esac
    python3 -c "print(round($t1 - $t0, 3))"
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "cold-read: $FILES files, $ROUNDS rounds, $DISK -> /dev/shm, $BIN ($(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
for m in $MODES; do : >"$SHM/runs.$m"; : >"$SHM/more.$m"; done
for r in $(seq "$ROUNDS"); do
    line="round $r:"
    for m in $MODES; do
        s=$(run "$m"); echo "$s" >>"$SHM/runs.$m"
        line="$line $m ${s}s"
    done
    echo "$line"
done
for m in $MODES; do
    med=$(median <"$SHM/runs.$m")
    echo "$m $(python3 -c "print(round($FILES / $med))") $med" >>"$SHM/medians"
    more=""
    [ -s "$SHM/more.$m" ] && more=", read $(cut -d' ' -f1 "$SHM/more.$m" | median)s, cpu $(cut -d' ' -f2 "$SHM/more.$m" | median)s"
    echo "$m: median ${med}s, $(python3 -c "print(round($FILES / $med))") files/s$more (runs: $(tr '\n' ' ' <"$SHM/runs.$m"))"
done
python3 - "$SHM/medians" <<'EOF'
import sys
fps = {m: int(f) for m, f, _ in (l.split() for l in open(sys.argv[1]))}
for base in ("off", "xargs16"):
    if base in fps:
        print(f"ratios to {base}: " + ", ".join(f"{m} {v / fps[base]:.2f}" for m, v in fps.items()))
EOF
