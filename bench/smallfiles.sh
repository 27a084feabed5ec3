#!/usr/bin/env bash
# Small files (issue 15): longhaul vs an rsync daemon vs local `tar | tar`,
# in the same run, alternating, on the same tree of N files of 1-64 KiB
# (uniform) in 100 directories.
#
#   shm:  /dev/shm -> /dev/shm over loopback, TLS on (longhaul), warm source
#   disk: DISK_DIR -> DISK_DIR, page cache dropped before each run (cold
#         source); `tar-warm` is the destination's own ceiling (warm
#         source, tar | tar into the same directory)
#
# longhaul runs against `serve` as is (fdatasync of every file, grouped)
# and, on disk, also against `serve --no-sync`. Times are to the command's
# exit (what rsync and tar report too: none of them syncs).
#
# Usage: bench/smallfiles.sh [--bin LONGHAUL] [--files N] [--rounds N]
#                            [--disk DIR] [--only shm|disk]
# Needs root for drop_caches (cold runs) and rsync for the daemon. Prints
# each run, then per scenario the medians in files/s and the ratios.
set -euo pipefail
BIN=${BIN:-$(dirname "$0")/../target/release/longhaul}
FILES=20000 ROUNDS=3 DISK=/var/tmp ONLY=""
while [ $# -gt 0 ]; do
    case $1 in
    --bin) BIN=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --disk) DISK=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) sed -n '2,19p' "$0"; exit 2 ;;
    esac
done
BIN=$(realpath "$BIN")
SHM=$(mktemp -d /dev/shm/lh-small.XXXXXX)
DSK=$(mktemp -d "$DISK/lh-small.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait; rm -rf "$SHM" "$DSK" || true' EXIT

python3 "$(dirname "$0")/lib/small-tree.py" "$SHM/src" "$FILES"
cp -a "$SHM/src" "$DSK/src"
mkdir -p "$SHM/dst" "$DSK/dst"

port=$((30000 + RANDOM % 20000))
wait_port() { for _ in $(seq 50); do ss -ltn "sport = :$1" | grep -q LISTEN && return; sleep 0.1; done; }
serve() { # name extra... -> sets SRV_PORT TOKEN_ TRUST_
    local st=$SHM/state-$1; shift
    mkdir -p "$st"
    TOKEN_=$("$BIN" token create --state-dir "$st" --export '*:rw' 2>/dev/null)
    TRUST_=$("$BIN" id "$st" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
    port=$((port + 1))
    "$BIN" serve --listen "127.0.0.1:$port" --state-dir "$st" \
        --export "shm=$SHM/dst" --export "disk=$DSK/dst" "$@" >"$SHM/serve-$port.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port"
    SRV_PORT=$port
}
serve sync; P1=$SRV_PORT T1=$TOKEN_ F1=$TRUST_
serve nosync --no-sync; P2=$SRV_PORT T2=$TOKEN_ F2=$TRUST_
RPORT=$((port + 1))
printf 'use chroot = no\nuid = root\ngid = root\nread only = no\n[shm]\n  path = %s\n[disk]\n  path = %s\n' \
    "$SHM/dst" "$DSK/dst" >"$SHM/rsyncd.conf"
rsync --daemon --no-detach --address=127.0.0.1 --port=$RPORT --config="$SHM/rsyncd.conf" \
    --log-file="$SHM/rsyncd.log" &
PIDS+=($!)
wait_port "$RPORT"

# tool where -> seconds
run() {
    local src dst
    if [ "$2" = shm ]; then src=$SHM/src dst=$SHM/dst; else src=$DSK/src dst=$DSK/dst; fi
    rm -rf "$dst/small"
    sync
    if [ "$2" = disk ] && [ "$1" != tar-warm ]; then
        echo 3 >/proc/sys/vm/drop_caches
    elif [ "$1" = tar-warm ]; then
        tar -C "$src" -cf - small >/dev/null
    fi
    local t0 t1
    t0=$(date +%s.%N)
    case $1 in
    longhaul | longhaul-nosync)
        local p=$P1 t=$T1 f=$F1
        [ "$1" = longhaul-nosync ] && p=$P2 t=$T2 f=$F2
        LONGHAUL_TOKEN=$t LONGHAUL_TRUST=$f LONGHAUL_KNOWN_HOSTS=$SHM/kh LONGHAUL_PATHS=$SHM/paths \
            "$BIN" cp -r --force "$src/small" "127.0.0.1:$p:$2/" >/dev/null 2>"$SHM/cp.err" ||
            { echo "smallfiles: longhaul failed: $(tail -n 2 "$SHM/cp.err")" >&2; exit 1; }
        ;;
    rsync) rsync -a "$src/small" "rsync://127.0.0.1:$RPORT/$2/" ;;
    tar | tar-warm) tar -C "$src" -cf - small | tar -C "$dst" -xf - ;;
    esac
    t1=$(date +%s.%N)
    local n
    n=$(find "$dst/small" -type f | wc -l)
    [ "$n" -eq "$FILES" ] || { echo "smallfiles: $1 $2 left $n of $FILES files" >&2; exit 1; }
    python3 -c "print(round($t1 - $t0, 3))"
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "smallfiles: $FILES files, $ROUNDS rounds, $BIN ($(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
for where in shm disk; do
    [ -n "$ONLY" ] && [ "$ONLY" != "$where" ] && continue
    tools="longhaul rsync tar"
    [ "$where" = disk ] && tools="longhaul longhaul-nosync rsync tar tar-warm"
    for t in $tools; do : >"$SHM/$where.$t"; done
    for r in $(seq "$ROUNDS"); do
        line="$where round $r:"
        for t in $tools; do
            s=$(run "$t" "$where"); echo "$s" >>"$SHM/$where.$t"
            line="$line $t ${s}s"
        done
        echo "$line"
    done
    for t in $tools; do
        m=$(median <"$SHM/$where.$t")
        eval "fps_${t//-/_}=$(python3 -c "print(round($FILES / $m))")"
        echo "$where $t: median ${m}s, $(python3 -c "print(round($FILES / $m))") files/s (runs: $(tr '\n' ' ' <"$SHM/$where.$t"))"
    done
    python3 -c "print('$where ratios: longhaul/rsync %.2f, longhaul/tar %.2f' % ($fps_longhaul / $fps_rsync, $fps_longhaul / $fps_tar))"
    [ "$where" = disk ] && python3 -c "print('disk ratios: longhaul/tar-warm %.2f, longhaul-nosync/rsync %.2f, longhaul-nosync/tar-warm %.2f' % ($fps_longhaul / $fps_tar_warm, $fps_longhaul_nosync / $fps_rsync, $fps_longhaul_nosync / $fps_tar_warm))"
done
