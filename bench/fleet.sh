#!/usr/bin/env bash
# bench/fleet.sh - one transfer across N DTN pairs (issue 17): each pair is two network namespaces
# joined by `longhaul wan` with a 1 Gbit/s bottleneck (RATE) and RTT; all servers write into one
# shared destination directory (the namespaces share the file system: the "parallel file system").
#
# What it does, per case, in the same run, alternating with its physical limit:
#   * limit: N `longhaul perf 198.18.0.2 -t PERF_SECONDS` at once, one in each pair, against the
#     pair's own server, summed (summary.bits_per_second): what the N links carry memory to memory
#     (how the peers fare on one pair's path is the matrix's to say: `longhaul matrix --paths
#     RTT/0/RATE --workloads mem`);
#   * fleet: N ranks at once, rank i in pair i's host a:
#       longhaul cp -r --rank i --size N --run-dir RUN [--queue URL] --json SRC/ longhaul://198.18.0.2:5310/data/outK/
#     against `longhaul serve` in each host b exporting the one destination; wall time from the start
#     of the ranks to the end of the last one (the final check included); rate = dataset bytes / wall.
# Cases: balanced (FILES files of FILE_MIB MiB) for each N in PAIRS: fleet / (N x RATE) (target >=
# 0.9) and fleet / perf-sum; skewed (one BIG_GIB GiB file + SMALL files of 1-16 KiB) on the
# largest N, static shares and (if PostgreSQL is installed) the queue: time / ideal, where ideal =
# bytes / perf-sum of the same run (target <= 1.1); and, when the balanced case ran on the same
# N just before, time / (bytes at the balanced set's rate): what the skew itself costs.
# Data in /dev/shm (made once, incompressible); the destination in /dev/shm too, emptied per run.
# A PostgreSQL server for the queue runs as the postgres user in a temp dir, reached by a unix socket
# (namespaces share the file system, not the loopback).
#
# How to run (root; build first):   bash bench/fleet.sh
# Environment: BIN (target/release/longhaul), PAIRS ("1 2 4"), RATE (1gbit), RTT (2ms), FILES (16),
#   FILE_MIB (128), BIG_GIB (4), SMALL (20000), PERF_SECONDS (8), SKEWED (1), BALANCED (1),
#   MODES ("static queue": the skewed case's modes), PLAINTEXT (0: TLS),
#   LH_ARGS (more `cp` arguments for every rank, e.g. "--chunk 4M").
# Output: one line per run (on stderr: each rank's time, MiB, files, units, sessions); TSV in
# bench/results/fleet-DATE.tsv. Cleans up on exit
# (trap): every process it started, by PID; the namespaces (`wan down`); the data.

set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/longhaul}
PAIRS=${PAIRS:-1 2 4}
RATE=${RATE:-1gbit}
RTT=${RTT:-2ms}
FILES=${FILES:-16}
FILE_MIB=${FILE_MIB:-128}
BIG_GIB=${BIG_GIB:-4}
SMALL=${SMALL:-20000}
PERF_SECONDS=${PERF_SECONDS:-8}
SKEWED=${SKEWED:-1}
BALANCED=${BALANCED:-1}
read -r -a MODES <<<"${MODES:-static queue}"
PLAINTEXT=${PLAINTEXT:-0}
read -r -a LH_ARGS <<<"${LH_ARGS:-}" || true
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
RATE_BPS=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower()); print(int(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]]))" "$RATE")

RUN=$(mktemp -d /tmp/lh-fleet.XXXXXX)
SHM=$(mktemp -d /dev/shm/lh-fleet.XXXXXX)
chmod 755 "$RUN"
cp "$BIN" "$RUN/longhaul"
LH="$RUN/longhaul"
mkdir -p bench/results
TSV=bench/results/fleet-$(date -u +%Y%m%d-%H%M).tsv
declare -a PIDS=()
NAMES=()
PG_PID=''
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    for n in "${NAMES[@]}"; do "$LH" wan down --name "$n" >/dev/null 2>&1 || true; done
    [ -n "$PG_PID" ] && kill -QUIT "$PG_PID" 2>/dev/null && wait "$PG_PID" 2>/dev/null
    rm -rf "$SHM" "$RUN"
}
trap cleanup EXIT INT TERM
log() { echo "$*" >&2; }

# ----------------------------------------------------------------- data ----
make_file() { # path MiB
    head -c "$(( $2 << 20 ))" /dev/urandom >"$1"
}
mkdir -p "$SHM/balanced" "$SHM/skewed/small" "$SHM/dst"
for i in $(seq "$FILES"); do make_file "$SHM/balanced/f$i.bin" "$FILE_MIB"; done
if [ "$SKEWED" = 1 ]; then
    make_file "$SHM/skewed/huge.bin" $(( BIG_GIB * 1024 ))
    python3 - "$SHM/skewed/small" "$SMALL" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(17)
for i in range(n):
    d = f"{root}/d{i % 100:02d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(rng.randint(1024, 16384)))
EOF
fi
bytes_of() { du -sb --apparent-size "$1" | cut -f1; }

# ----------------------------------------------------- identity, token ----
STATE="$RUN/state"
mkdir -p "$STATE"
FP=$("$LH" id "$STATE")
TOKEN=$("$LH" token create --state-dir "$STATE" --export '*:rw' --note bench/fleet.sh)
export LONGHAUL_TRUST=$FP LONGHAUL_TOKEN=$TOKEN LONGHAUL_ARCHIVE="$RUN/archive.db"
export LONGHAUL_KNOWN_HOSTS="$RUN/known_hosts"
SEC=()
SRV_SEC=()
if [ "$PLAINTEXT" = 1 ]; then SEC=(--insecure-plaintext); SRV_SEC=(--allow-plaintext); fi

# ------------------------------------------------------------ PostgreSQL ----
PG_URL=''
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -n "$PGBIN" ] && [ "$SKEWED" = 1 ]; then
    mkdir -p "$RUN/pg/sock"
    chown -R postgres:postgres "$RUN/pg"
    setpriv --reuid=postgres --regid=postgres --clear-groups -- "$PGBIN/initdb" -D "$RUN/pg/data" \
        -A trust -U postgres --no-sync >/dev/null
    setpriv --reuid=postgres --regid=postgres --clear-groups -- "$PGBIN/postgres" -D "$RUN/pg/data" \
        -k "$RUN/pg/sock" -c listen_addresses= -c fsync=off -c max_connections=100 \
        >"$RUN/pg.log" 2>&1 &
    PG_PID=$!
    for _ in $(seq 100); do [ -S "$RUN/pg/sock/.s.PGSQL.5432" ] && break; sleep 0.1; done
    PG_URL="postgresql://postgres@$(python3 -c 'import urllib.parse,sys; print(urllib.parse.quote(sys.argv[1], safe=""))' "$RUN/pg/sock")/postgres"
fi

# --------------------------------------------------------------- pairs ----
up_pairs() { # N: emulators lhf1..N, a server in each host b
    local n=$1 i
    for i in $(seq "$n"); do
        local name="lhf$i"
        NAMES+=("$name")
        "$LH" wan up --name "$name" --rate "$RATE" --rtt "$RTT" --json >"$RUN/wan$i.out" 2>"$RUN/wan$i.err" &
        PIDS+=($!)
        for _ in $(seq 100); do grep -q hosts "$RUN/wan$i.out" 2>/dev/null && break; sleep 0.1; done
        grep -q hosts "$RUN/wan$i.out" || { log "wan $name did not come up: $(cat "$RUN/wan$i.err")"; exit 1; }
        ip netns exec "$name-b" "$LH" serve --listen 198.18.0.2:5310 --state-dir "$STATE" \
            --export "data=$SHM/dst" --no-archive "${SRV_SEC[@]}" >"$RUN/serve$i.log" 2>&1 &
        PIDS+=($!)
    done
    sleep 1
}
down_pairs() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
    for n in "${NAMES[@]}"; do "$LH" wan down --name "$n" >/dev/null 2>&1 || true; done
    NAMES=()
}

perf_sum() { # N -> bits/s summed over the pairs, each pair's longhaul perf at once
    local n=$1 i pids=()
    for i in $(seq "$n"); do
        ip netns exec "lhf$i-a" "$LH" --no-archive perf 198.18.0.2 -p 5310 -t "$PERF_SECONDS" -i 0 --json \
            >"$RUN/perf-$i.json" 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    python3 - "$RUN" "$n" <<'EOF'
import json, sys
run, n = sys.argv[1], int(sys.argv[2])
total = 0
for i in range(1, n + 1):
    try:
        total += json.load(open(f"{run}/perf-{i}.json"))["summary"]["bits_per_second"]
    except Exception:
        pass
print(int(total))
EOF
}

cpu_ticks() { # -> "busy total steal" from /proc/stat (all CPUs; steal: taken by the host)
    awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8; t = b + $5 + $6 + $9; print b, t, $9 }' /proc/stat
}

fleet() { # N SRC MODE(static|queue) -> "seconds verified resent"
    local n=$1 src=$2 mode=$3 i pids=() k
    # The export's root stays (the servers hold it open); what landed goes.
    rm -rf "$SHM/dst/out" "$RUN/rundir"
    local extra=(--run-dir "$RUN/rundir")
    if [ "$mode" = queue ]; then extra=(--queue "$PG_URL" --run-id "bench-$RANDOM$RANDOM"); fi
    local t0 t1 c0 c1
    c0=$(cpu_ticks)
    t0=$(date +%s.%N)
    for i in $(seq "$n"); do
        k=$((i - 1))
        ip netns exec "lhf$i-a" "$LH" cp -r --rank "$k" --size "$n" "${extra[@]}" --json "${SEC[@]}" ${LH_ARGS[@]+"${LH_ARGS[@]}"} \
            "$src/" longhaul://198.18.0.2:5310/data/out/ >"$RUN/rank$k.json" 2>"$RUN/rank$k.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    t1=$(date +%s.%N)
    c1=$(cpu_ticks)
    log "  CPU during the run: $(echo "$c0 $c1" | awk '{ printf "%.0f%% busy, %.0f%% stolen by the host, of %d cores", 100 * ($4 - $1) / ($5 - $2), 100 * ($6 - $3) / ($5 - $2), '"$(nproc)"' }')"
    for i in $(seq 0 $((n - 1))); do
        grep -q '^longhaul: error' "$RUN/rank$i.err" && log "rank $i: $(grep '^longhaul: error' "$RUN/rank$i.err")"
    done
    python3 - "$RUN" "$n" "$t0" "$t1" <<'EOF'
import json, sys, glob
run, n, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
doc = None
for i in range(n):
    for line in open(f"{run}/rank{i}.json"):
        if line.startswith("{"):
            doc = json.loads(line)
if doc is None:
    print(f"{t1 - t0:.2f} NA NA")
else:
    print(f"{t1 - t0:.2f} {str(doc['verified']).lower()} {doc['final_check']['resent_files']}")
    ranks = " ".join(f"r{r['rank']}:{r['seconds']:.1f}s/{r['bytes'] / 2**20:.0f}MiB/{r['files']}f/{r['units']}u/{r['sessions']}s" for r in doc["per_rank"])
    print(f"  ranks {ranks}; ranks' span {doc['seconds']:.2f} s; final check {doc['final_check']['seconds']:.2f} s", file=sys.stderr)
EOF
}

local_copy() { # SRC -> bits/s of `cp -r` into a fresh directory of the destination's file system
    rm -rf "$SHM/dst/local"
    local t0 t1
    t0=$(date +%s.%N)
    cp -r "$1" "$SHM/dst/local"
    t1=$(date +%s.%N)
    rm -rf "$SHM/dst/local"
    python3 -c "print(int($(bytes_of "$1")*8/($t1-$t0)))"
}

printf 'case\tpairs\tmode\tseconds\tbytes\tfleet_bps\tperf_sum_bps\tratio_target\tratio_perf\tverified\n' >"$TSV"
echo "# fleet, $(date -u '+%Y-%m-%d %H:%M') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), rate $RATE per pair, RTT $RTT, $([ "$PLAINTEXT" = 1 ] && echo plaintext || echo TLS)"
BAL_BYTES=$(bytes_of "$SHM/balanced")
for n in $PAIRS; do
    [ "$BALANCED" = 1 ] || break
    up_pairs "$n"
    limit=$(perf_sum "$n")
    read -r secs ok resent < <(fleet "$n" "$SHM/balanced" static)
    bps=$(python3 -c "print(int($BAL_BYTES*8/$secs))")
    rt=$(python3 -c "print(f'{$bps/($n*$RATE_BPS):.3f}')")
    ri=$(python3 -c "print(f'{$bps/max($limit,1):.3f}')")
    printf 'balanced\t%s\tstatic\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$secs" "$BAL_BYTES" "$bps" "$limit" "$rt" "$ri" "$ok" >>"$TSV"
    BAL_BPS=$bps
    BAL_N=$n
    echo "balanced  N=$n  $(python3 -c "print(f'{$bps/1e9:.3f}')") Gbit/s in $secs s  (perf x$n: $(python3 -c "print(f'{$limit/1e9:.3f}')") Gbit/s)  fleet/(N x $RATE) = $rt  fleet/perf = $ri  verified=$ok resent=$resent"
    down_pairs
done
if [ "$SKEWED" = 1 ]; then
    n=$(echo "$PAIRS" | tr ' ' '\n' | sort -n | tail -n 1)
    SK_BYTES=$(bytes_of "$SHM/skewed")
    up_pairs "$n"
    limit=$(perf_sum "$n")
    modes=()
    for m in "${MODES[@]}"; do
        if [ "$m" = static ] || [ -n "$PG_URL" ]; then modes+=("$m"); fi
    done
    localbps=$(local_copy "$SHM/skewed")
    echo "skewed    local cp -r of the same data into the destination's file system: $(python3 -c "print(f'{$localbps/1e9:.2f}')") Gbit/s"
    for mode in "${modes[@]}"; do
        read -r secs ok resent < <(fleet "$n" "$SHM/skewed" "$mode")
        ideal=$(python3 -c "print(f'{$SK_BYTES*8/max($limit,1):.2f}')")
        ratio=$(python3 -c "print(f'{$secs/$ideal:.3f}')")
        bps=$(python3 -c "print(int($SK_BYTES*8/$secs))")
        printf 'skewed\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$mode" "$secs" "$SK_BYTES" "$bps" "$limit" "NA" "$ratio" "$ok" >>"$TSV"
        echo "skewed    N=$n  $mode: $secs s vs ideal $ideal s (bytes / perf x$n) = $ratio  verified=$ok resent=$resent"
        if [ -n "${BAL_BPS:-}" ] && [ "${BAL_N:-}" = "$n" ]; then
            # The same bytes at the balanced case's rate on the same pairs, this run.
            even=$(python3 -c "print(f'{$SK_BYTES*8/$BAL_BPS:.2f}')")
            echo "skewed    N=$n  $mode: $secs s vs $even s at the balanced set's rate ($(python3 -c "print(f'{$BAL_BPS/1e9:.3f}')") Gbit/s) = $(python3 -c "print(f'{$secs/$even:.3f}')");  vs the local copy: $(python3 -c "print(f'{$bps/$localbps:.3f}')")x its rate"
        fi
    done
    down_pairs
fi
echo "# TSV: $TSV"
