#!/usr/bin/env bash
# bench/small-sync.sh - a tree of small files, cold disk -> disk, against the rsync daemon: the first
# copy, a no-change sync and a sync with 1% of the files changed, in the same run, alternating (tools
# in a rotated order each round, a warm-up round not counted, then medians of ROUNDS). Issue 45's
# three small-file targets; bench/cold-copy.sh's `small` scenario is the first copy alone.
#
#   NFILES=100000 ROUNDS=5 TOOLS="lh lh-old rsyncd" OLD_BIN=path/to/other/longhaul \
#       bash bench/small-sync.sh [LONGHAUL_BINARY]
#
# The tree: NFILES files of 0.5-8 KiB in NFILES/11 directories (bench/lib/tree-45.py). Tools:
#   lh       longhaul cp -a / sync -a to `longhaul serve` at its defaults (TLS, verified, durable)
#   lh-old   the same with OLD_BIN (client and its own server): an A/B of two builds
#   rsyncd   rsync -a -W (whole files, no compression) to an rsync daemon started here
# Each tool, each round: its destination removed; the page cache dropped before each of the three
# steps: `first` (the copy into an empty destination), `same` (the sync again, nothing changed),
# `changed` (1% of the source's files rewritten, 1-8 KiB, a new mtime; then the sync). The result
# is checked (diff -r) after each step. CPU: the CPU-seconds of the tool's own cpuacct cgroup (its
# server and client), and whole-host busy time from /proc/stat. Prints medians and the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5} NFILES=${NFILES:-100000} WARMUP=${WARMUP:-1}
TOOLS=${TOOLS:-"lh rsyncd"} DISK_DIR=${DISK_DIR:-/var/tmp/lh-small-sync}
BIN=${1:-target/release/longhaul}
[ -x "$BIN" ] || cargo build --release --quiet -p longhaul
WORK=$(mktemp -d /dev/shm/lh-small-sync.XXXXXX)
mkdir -p "$DISK_DIR/src" "$DISK_DIR/dst" bench/results
LH=$WORK/longhaul OLD=$WORK/longhaul-old
cp "$BIN" "$LH"
[ -n "${OLD_BIN:-}" ] && cp "$OLD_BIN" "$OLD"
PIDS=()
CG=/sys/fs/cgroup/cpuacct/lh-small-sync-$$
mkdir -p "$CG/lh" "$CG/rsyncd"
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.5
    rm -rf "$WORK" "$DISK_DIR"
    for g in "$CG"/*/; do
        while read -r p; do kill "$p" 2>/dev/null || true; done <"$g/cgroup.procs"
    done
    sleep 0.5
    rmdir "$CG"/* "$CG" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
TSV=bench/results/small-sync-$(date -u +%Y%m%d-%H%M).tsv
printf 'step\tround\ttool\tseconds\tfiles_per_s\tcpu_s\thost_cpu_s\n' >"$TSV"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
    echo "small-sync: nothing listens on $1" >&2
    exit 1
}
start_in() { # group log cmd...: a server in the group's cgroup
    local g=$1 log=$2
    shift 2
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$g" "$@" >"$log" 2>&1 &
    PIDS+=($!)
}
in_group() {
    local g=$1
    shift
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$g" "$@"
}
group_of() { case $1 in lh*) echo lh ;; *) echo "$1" ;; esac; }
cpu_ns() { cat "$CG/$1/cpuacct.usage"; }
host_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

STATE=$WORK/state
mkdir -p "$STATE"
TOKEN=$("$LH" token create --state-dir "$STATE" --export '*:rw' 2>/dev/null)
TRUST=$("$LH" id "$STATE" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
DEST=$DISK_DIR/dst
chmod 777 "$DEST"
P1=$(free_port) PR=$(free_port)
start_in lh "$WORK/serve1.log" "$LH" --no-archive serve --listen "127.0.0.1:$P1" --state-dir "$STATE" --export "data=$DEST"
if [ -n "${OLD_BIN:-}" ]; then
    P3=$(free_port)
    start_in lh "$WORK/serve3.log" "$OLD" --no-archive serve --listen "127.0.0.1:$P3" --state-dir "$STATE" --export "data=$DEST"
    wait_port "$P3"
fi
printf 'use chroot = no\nuid = root\ngid = root\nread only = no\n[data]\n  path = %s\n' "$DEST" >"$WORK/rsyncd.conf"
start_in rsyncd "$WORK/rsyncd.log" rsync --daemon --no-detach --address=127.0.0.1 --port="$PR" --config="$WORK/rsyncd.conf"
wait_port "$P1"
wait_port "$PR"

run_tool() { # tool step src out: copies (first) or syncs (same, changed) the tree src into out
    local tool=$1 step=$2 src=$3 out=$4 verb=sync
    [ "$step" = first ] && verb=cp
    local lh_env=(env LONGHAUL_TRUST="$TRUST" LONGHAUL_TOKEN="$TOKEN")
    case $tool in
    lh) in_group lh "${lh_env[@]}" "$LH" --no-archive "$verb" -a "$src" "longhaul://127.0.0.1:$P1/data/$out/" ;;
    lh-old) in_group lh "${lh_env[@]}" "$OLD" --no-archive "$verb" -a "$src" "longhaul://127.0.0.1:$P3/data/$out/" ;;
    rsyncd) in_group rsyncd rsync -a -W "$src" "rsync://127.0.0.1:$PR/data/$out/" ;;
    *) echo "small-sync: unknown tool $tool" >&2; exit 2 ;;
    esac
}

TREE="python3 bench/lib/tree-45.py"
$TREE "$DISK_DIR/src/tree" "$NFILES"
SRC=$DISK_DIR/src/tree
read -ra tools <<<"$TOOLS"
for r in $(seq $((1 - WARMUP)) "$ROUNDS"); do
    n=${#tools[@]}
    for i in $(seq 0 $((n - 1))); do
        tool=${tools[$(((i + r) % n))]}
        rm -rf "${DEST:?}/$tool"
        mkdir -p "$DEST/$tool"
        for step in first same changed; do
            [ "$step" = changed ] && $TREE "$SRC" "$NFILES" --change "$r-$tool"
            sync
            echo 3 >/proc/sys/vm/drop_caches
            g=$(group_of "$tool")
            c0=$(cpu_ns "$g") h0=$(host_busy) t0=$(date +%s.%N)
            if ! run_tool "$tool" "$step" "$SRC" "$tool" >"$WORK/out" 2>&1; then
                echo "small-sync: $tool $step failed: $(tail -3 "$WORK/out")" >&2
                continue 2
            fi
            t1=$(date +%s.%N) c1=$(cpu_ns "$g") h1=$(host_busy)
            if ! diff -rq "$SRC" "$DEST/$tool/tree" >/dev/null; then
                echo "small-sync: $tool's copy differs after $step" >&2
                continue 2
            fi
            [ "$r" -le 0 ] && continue
            awk -v step="$step" -v r="$r" -v tool="$tool" -v t0="$t0" -v t1="$t1" -v c="$((c1 - c0))" \
                -v h="$((h1 - h0))" -v n="$NFILES" 'BEGIN {
                    s = t1 - t0
                    printf "%s\t%s\t%s\t%.2f\t%.0f\t%.2f\t%.2f\n", step, r, tool, s, n / s, c / 1e9, h / 100 }' \
                >>"$TSV"
            tail -1 "$TSV"
        done
        rm -rf "${DEST:?}/$tool"
    done
done

echo
echo "# small-sync, $NFILES files, $ROUNDS rounds, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for step in dict.fromkeys(r["step"] for r in rows):
    med = {}
    print(f"\n{step}: tool | seconds median (min-max) | files/s | CPU-s own cgroup | host busy CPU-s")
    for tool in dict.fromkeys(r["tool"] for r in rows if r["step"] == step):
        mine = [r for r in rows if r["step"] == step and r["tool"] == tool]
        col = lambda k: [float(r[k]) for r in mine]
        m = med[tool] = {k: statistics.median(col(k)) for k in ("seconds", "files_per_s", "cpu_s", "host_cpu_s")}
        s = col("seconds")
        print(f"  {tool:8} {m['seconds']:7.2f} ({min(s):.2f}-{max(s):.2f}) {m['files_per_s']:8.0f} {m['cpu_s']:7.2f} {m['host_cpu_s']:7.2f}  (n={len(mine)})")
    for a, b in (("lh", "rsyncd"), ("lh-old", "rsyncd"), ("lh", "lh-old")):
        if a in med and b in med:
            print(f"  {a} / {b}: rate {med[b]['seconds'] / med[a]['seconds']:.2f}, CPU {med[a]['cpu_s'] / med[b]['cpu_s']:.2f}")
EOF
echo "(lines: $TSV)"
