#!/usr/bin/env bash
# What archiving costs a transfer: the same binary, the same data, runs
# alternating between `--no-archive` and archiving into a fresh archive
# (the default: every run, its intervals, and for cp each file in the
# catalogue). Data sets: a tree of small files (catalogue-heavy) and one
# large file, `cp -r` over TLS on loopback from /dev/shm into a /dev/shm
# export; and a memory-to-memory `perf` (intervals every 0.1 s, 4 streams).
#
# Usage: bench/archive-cost.sh BIN [--rounds N] [--files N] [--big-mib N] [--perf SECONDS]
# Prints each run and, per data set, the medians and ARCHIVED/NOT (1.00: no cost).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
BIN=$1
shift
ROUNDS=5 FILES=20000 BIG_MIB=2048 PERF=5
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --big-mib) BIG_MIB=$2; shift 2 ;;
    --perf) PERF=$2; shift 2 ;;
    *) echo "archive-cost: unknown argument $1" >&2; exit 2 ;;
    esac
done
WORK=$(mktemp -d /dev/shm/lh-arch.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

python3 "$(dirname "$0")/lib/small-tree.py" "$WORK/src" "$FILES"
mkdir -p "$WORK/src/big"
head -c $((BIG_MIB << 20)) /dev/urandom >"$WORK/src/big/big.bin"

st=$WORK/state ex=$WORK/export
mkdir -p "$st" "$ex"
export LONGHAUL_TOKEN LONGHAUL_TRUST LONGHAUL_KNOWN_HOSTS=$WORK/kh LONGHAUL_PATHS=$WORK/paths
LONGHAUL_TOKEN=$("$BIN" token create --state-dir "$st" --export '*:rw' 2>/dev/null)
LONGHAUL_TRUST=$("$BIN" id "$st" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
port=$((30000 + RANDOM % 20000))
"$BIN" --no-archive serve --listen "127.0.0.1:$port" --public-perf --state-dir "$st" --export "data=$ex" >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.1; done

archive_flag() { # mode -> the flag
    if [ "$1" = on ]; then echo "--archive=$WORK/archive.db"; else echo "--no-archive"; fi
}
copy() { # mode set -> Gbit/s
    rm -rf "${ex:?}/$2"
    sync
    local t0 t1 bytes
    bytes=$(du -sb "$WORK/src/$2" | cut -f1)
    t0=$(date +%s.%N)
    "$BIN" "$(archive_flag "$1")" cp -r --force "$WORK/src/$2" "127.0.0.1:$port:data/" >/dev/null 2>"$WORK/cp.err" ||
        { echo "archive-cost: cp failed: $(tail -n 2 "$WORK/cp.err")" >&2; exit 1; }
    t1=$(date +%s.%N)
    python3 -c "print(round($bytes * 8 / ($t1 - $t0) / 1e9, 3))"
}
perf() { # mode -> Gbit/s
    "$BIN" "$(archive_flag "$1")" perf "127.0.0.1:$port" -t "$PERF" -P 4 -i 0.1 --json 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["summary"]["bits_per_second"]/1e9, 3))'
}

declare -A R
for set in small big perf; do R[$set-off]="" R[$set-on]=""; done
for r in $(seq "$ROUNDS"); do
    for mode in off on; do
        [ $((r % 2)) -eq 0 ] && mode=$([ "$mode" = off ] && echo on || echo off)
        s=$(copy "$mode" small) b=$(copy "$mode" big) p=$(perf "$mode")
        echo "round $r archive=$mode: small $s Gbit/s, big $b Gbit/s, perf $p Gbit/s"
        R[small-$mode]+=" $s" R[big-$mode]+=" $b" R[perf-$mode]+=" $p"
    done
done
runs=$("$BIN" --archive="$WORK/archive.db" history --json -n 0 | python3 -c 'import json,sys; d=json.load(sys.stdin)["runs"]; print(len(d), sum(r["lost"] for r in d))')
echo "archived runs, rows lost: $runs"
for set in small big perf; do
    python3 - "$set" "${R[$set-off]}" "${R[$set-on]}" <<'EOF'
import statistics, sys
name, off, on = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mo, ma = statistics.median(off), statistics.median(on)
print(f"{name:6s} not archived {mo:8.3f} Gbit/s  archived {ma:8.3f} Gbit/s  archived/not {ma / mo:.3f}")
EOF
done
