#!/usr/bin/env bash
# A/B of two longhaul builds on the same data, alternating, for a change's
# cost: `cp -r` of a tree of small files (and, with --big, one large file)
# from /dev/shm over TLS on loopback into a /dev/shm export, each build
# against a server of its own build (their protocols may differ).
#
# With --perf SECONDS, also a memory-to-memory `perf` of each build against
# its own server, TLS (the default) and --insecure-plaintext, 4 streams.
# With --disk DIR, the tree and the exports live under DIR instead, and the
# page cache is dropped before each copy (a cold source; needs root); the
# servers sync each file as they do by default.
#
# Usage: bench/ab.sh OLD_BIN NEW_BIN [--rounds N] [--files N] [--big-mib N] [--perf SECONDS]
#                    [--disk DIR]
# Prints each run and, per data set, the medians and NEW/OLD.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,9p' "$0"; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=5 FILES=20000 BIG_MIB=0 PERF=0 DISK=""
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --big-mib) BIG_MIB=$2; shift 2 ;;
    --perf) PERF=$2; shift 2 ;;
    --disk) DISK=$2; shift 2 ;;
    *) echo "ab: unknown argument $1" >&2; exit 2 ;;
    esac
done
WORK=$(mktemp -d /dev/shm/lh-ab.XXXXXX)
DATA=$WORK
[ -n "$DISK" ] && DATA=$(mktemp -d "$DISK/lh-ab.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK" "$DATA"' EXIT

python3 - "$DATA/src" "$FILES" "$BIG_MIB" <<'EOF'
import os, random, sys
root, n, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
for i in range(n):
    d = f"{root}/small/d{i % max(1, n // 100):03d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(rng.randint(1024, 65536)))
if big:
    os.makedirs(f"{root}/big", exist_ok=True)
    block = os.urandom(1 << 20)
    with open(f"{root}/big/big.bin", "wb") as f:
        for i in range(big):
            f.write(i.to_bytes(8, "little") + block[8:])
EOF

port=$((30000 + RANDOM % 20000))
serve() { # name bin -> sets SRV_PORT, TRUST_, TOKEN_
    local st=$WORK/state-$1 ex=$DATA/export-$1
    mkdir -p "$st" "$ex"
    TOKEN_=$("$2" token create --state-dir "$st" --export '*:rw' 2>/dev/null)
    TRUST_=$("$2" id "$st" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
    port=$((port + 1))
    "$2" serve --allow-plaintext --listen "127.0.0.1:$port" --state-dir "$st" --export "data=$ex" >"$WORK/serve-$1.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 50); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.1; done
    SRV_PORT=$port
}
serve a "$A"; PA=$SRV_PORT TA=$TOKEN_ FA=$TRUST_
serve b "$B"; PB=$SRV_PORT TB=$TOKEN_ FB=$TRUST_

run() { # name bin port token trust set -> seconds
    rm -rf "$DATA/export-$1/$6"
    sync
    [ -n "$DISK" ] && echo 3 >/proc/sys/vm/drop_caches
    local t0 t1
    t0=$(date +%s.%N)
    LONGHAUL_TOKEN=$4 LONGHAUL_TRUST=$5 LONGHAUL_KNOWN_HOSTS=$WORK/kh LONGHAUL_PATHS=$WORK/paths \
        "$2" cp -r --force "$DATA/src/$6" "127.0.0.1:$3:data/" >/dev/null 2>"$WORK/cp.err" ||
        { echo "ab: $1 failed: $(tail -n 2 "$WORK/cp.err")" >&2; exit 1; }
    t1=$(date +%s.%N)
    python3 -c "print(round($t1 - $t0, 3))"
}
perf() { # bin port token trust extra -> Gbit/s
    LONGHAUL_TOKEN=$3 LONGHAUL_TRUST=$4 LONGHAUL_KNOWN_HOSTS=$WORK/kh \
        "$1" perf "127.0.0.1:$2" -P 4 -t "$PERF" --json $5 2>"$WORK/perf.err" |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["summary"]["bits_per_second"] / 1e9, 3))' ||
        { echo "ab: perf failed: $(tail -n 2 "$WORK/perf.err")" >&2; exit 1; }
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
sets="small"
[ "$BIG_MIB" -gt 0 ] && sets="small big"
echo "A=$A B=$B rounds=$ROUNDS files=$FILES big=${BIG_MIB}MiB data=$DATA ($(date -u '+%F %H:%M') UTC)"
for set in $sets; do
    : >"$WORK/a.$set"; : >"$WORK/b.$set"
    for r in $(seq "$ROUNDS"); do
        # Which goes first alternates: a copy can leave work (writeback)
        # behind for the next.
        if [ $((r % 2)) = 1 ]; then
            a=$(run a "$A" "$PA" "$TA" "$FA" "$set"); b=$(run b "$B" "$PB" "$TB" "$FB" "$set")
        else
            b=$(run b "$B" "$PB" "$TB" "$FB" "$set"); a=$(run a "$A" "$PA" "$TA" "$FA" "$set")
        fi
        echo "$a" >>"$WORK/a.$set"; echo "$b" >>"$WORK/b.$set"
        echo "$set round $r: A ${a}s B ${b}s"
    done
    ma=$(median <"$WORK/a.$set"); mb=$(median <"$WORK/b.$set")
    echo "$set: median A ${ma}s, B ${mb}s, B/A time $(python3 -c "print(round($mb / $ma, 3))")"
done
[ "$PERF" -gt 0 ] && for mode in tls plain; do
    extra=""; [ $mode = plain ] && extra=--insecure-plaintext
    : >"$WORK/a.$mode"; : >"$WORK/b.$mode"
    for r in $(seq "$ROUNDS"); do
        a=$(perf "$A" "$PA" "$TA" "$FA" "$extra"); echo "$a" >>"$WORK/a.$mode"
        b=$(perf "$B" "$PB" "$TB" "$FB" "$extra"); echo "$b" >>"$WORK/b.$mode"
        echo "perf $mode round $r: A ${a} B ${b} Gbit/s"
    done
    ma=$(median <"$WORK/a.$mode"); mb=$(median <"$WORK/b.$mode")
    echo "perf $mode: median A ${ma}, B ${mb} Gbit/s, B/A rate $(python3 -c "print(round($mb / $ma, 3))")"
done
# The last test above is false without --perf: that is no failure.
exit 0
