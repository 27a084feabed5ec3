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
# Each data set and mode starts with a warm-up run of each build, not counted.
# As root (cgroup v1 cpuacct), each build's client and server run in a cgroup
# of their own, and each run also prints the CPU both ends of that build used
# (seconds of CPU time, all threads): its medians and their ratio too.
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
CG=/sys/fs/cgroup/cpuacct/lh-ab-$$
mkdir -p "$CG/a" "$CG/b" 2>/dev/null || CG=""
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK" "$DATA"; [ -z "$CG" ] || { sleep 0.5; rmdir "$CG"/* "$CG" 2>/dev/null || true; }' EXIT
# in_cg NAME CMD...: CMD in build NAME's cgroup (when there are cgroups).
in_cg() {
    local name=$1
    shift
    if [ -n "$CG" ]; then
        bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$name" "$@"
    else
        "$@"
    fi
}
cpu_ns() { if [ -n "$CG" ]; then cat "$CG/$1/cpuacct.usage"; else echo 0; fi; }

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
    in_cg "$1" "$2" serve --allow-plaintext --listen "127.0.0.1:$port" --state-dir "$st" --export "data=$ex" >"$WORK/serve-$1.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 50); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.1; done
    SRV_PORT=$port
}
serve a "$A"; PA=$SRV_PORT TA=$TOKEN_ FA=$TRUST_
serve b "$B"; PB=$SRV_PORT TB=$TOKEN_ FB=$TRUST_

run() { # name bin port token trust set -> "seconds cpu-seconds"
    rm -rf "$DATA/export-$1/$6"
    sync
    [ -n "$DISK" ] && echo 3 >/proc/sys/vm/drop_caches
    local t0 t1 c0 c1
    c0=$(cpu_ns "$1")
    t0=$(date +%s.%N)
    LONGHAUL_TOKEN=$4 LONGHAUL_TRUST=$5 LONGHAUL_KNOWN_HOSTS=$WORK/kh LONGHAUL_PATHS=$WORK/paths \
        in_cg "$1" "$2" cp -r --force "$DATA/src/$6" "127.0.0.1:$3:data/" >/dev/null 2>"$WORK/cp.err" ||
        { echo "ab: $1 failed: $(tail -n 2 "$WORK/cp.err")" >&2; exit 1; }
    t1=$(date +%s.%N)
    c1=$(cpu_ns "$1")
    python3 -c "print(round($t1 - $t0, 3), round(($c1 - $c0) / 1e9, 3))"
}
perf() { # name bin port token trust extra -> "Gbit/s cpu-seconds"
    local c0 c1 rate
    c0=$(cpu_ns "$1")
    rate=$(LONGHAUL_TOKEN=$4 LONGHAUL_TRUST=$5 LONGHAUL_KNOWN_HOSTS=$WORK/kh \
        in_cg "$1" "$2" perf "127.0.0.1:$3" -P 4 -t "$PERF" --json $6 2>"$WORK/perf.err" |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["summary"]["bits_per_second"] / 1e9, 3))') ||
        { echo "ab: perf failed: $(tail -n 2 "$WORK/perf.err")" >&2; exit 1; }
    c1=$(cpu_ns "$1")
    python3 -c "print($rate, round(($c1 - $c0) / 1e9, 3))"
}
# report WHAT UNIT RATIO-NAME: the medians of a.* and b.* (first column, then CPU) and B/A.
report() {
    local ma mb ca cb
    ma=$(cut -d' ' -f1 <"$WORK/a.$1" | median); mb=$(cut -d' ' -f1 <"$WORK/b.$1" | median)
    ca=$(cut -d' ' -f2 <"$WORK/a.$1" | median); cb=$(cut -d' ' -f2 <"$WORK/b.$1" | median)
    local cpu=""
    [ -n "$CG" ] && cpu=", CPU median A ${ca}s, B ${cb}s, B/A CPU $(python3 -c "print(round($cb / max($ca, 1e-9), 3))")"
    echo "$2: median A ${ma}$3, B ${mb}$3, B/A $4 $(python3 -c "print(round($mb / $ma, 3))")$cpu"
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
sets="small"
[ "$BIG_MIB" -gt 0 ] && sets="small big"
echo "A=$A B=$B rounds=$ROUNDS files=$FILES big=${BIG_MIB}MiB data=$DATA ($(date -u '+%F %H:%M') UTC)"
for set in $sets; do
    : >"$WORK/a.$set"; : >"$WORK/b.$set"
    run a "$A" "$PA" "$TA" "$FA" "$set" >/dev/null; run b "$B" "$PB" "$TB" "$FB" "$set" >/dev/null
    for r in $(seq "$ROUNDS"); do
        # Which goes first alternates: a copy can leave work (writeback)
        # behind for the next.
        if [ $((r % 2)) = 1 ]; then
            a=$(run a "$A" "$PA" "$TA" "$FA" "$set"); b=$(run b "$B" "$PB" "$TB" "$FB" "$set")
        else
            b=$(run b "$B" "$PB" "$TB" "$FB" "$set"); a=$(run a "$A" "$PA" "$TA" "$FA" "$set")
        fi
        echo "$a" >>"$WORK/a.$set"; echo "$b" >>"$WORK/b.$set"
        echo "$set round $r: A ${a% *}s B ${b% *}s (CPU A ${a#* }s B ${b#* }s)"
    done
    report "$set" "$set" s time
done
[ "$PERF" -gt 0 ] && for mode in tls plain; do
    extra=""; [ $mode = plain ] && extra=--insecure-plaintext
    : >"$WORK/a.$mode"; : >"$WORK/b.$mode"
    perf a "$A" "$PA" "$TA" "$FA" "$extra" >/dev/null; perf b "$B" "$PB" "$TB" "$FB" "$extra" >/dev/null
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then
            a=$(perf a "$A" "$PA" "$TA" "$FA" "$extra"); b=$(perf b "$B" "$PB" "$TB" "$FB" "$extra")
        else
            b=$(perf b "$B" "$PB" "$TB" "$FB" "$extra"); a=$(perf a "$A" "$PA" "$TA" "$FA" "$extra")
        fi
        echo "$a" >>"$WORK/a.$mode"; echo "$b" >>"$WORK/b.$mode"
        echo "perf $mode round $r: A ${a% *} B ${b% *} Gbit/s (CPU A ${a#* }s B ${b#* }s)"
    done
    report "$mode" "perf $mode" " Gbit/s" rate
done
# The last test above is false without --perf: that is no failure.
exit 0
