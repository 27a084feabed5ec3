#!/usr/bin/env bash
# bench/elephant.sh - one big file, longhaul cp (TLS and BLAKE3 verification on, its defaults) against
# GridFTP and a local dd of the same file, in the same run, alternating (issue 15, part 3).
#
#   bash bench/elephant.sh [LONGHAUL_BINARY]        # default: target/release/longhaul (built if absent)
#   WARMUP=1 ROUNDS=3 SIZE_GIB=2 SCENARIOS="shm disk" TOOLS="lh lh-nosync lh-plain gridftp dd dd-sync" bash bench/elephant.sh
#
# Scenarios: shm = /dev/shm -> /dev/shm; disk = DISK_DIR -> DISK_DIR (same filesystem), caches dropped
# (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every run. Tools, in an order rotated every round:
#   lh          longhaul cp --force SRC longhaul://127.0.0.1:PORT/data/  (TLS 1.3, server fdatasyncs)
#   lh-nosync   the same against `longhaul serve --no-sync` (no fsync, like the peers)
#   lh-plain    lh-nosync with --insecure-plaintext: no TLS, BLAKE3 still on (what TLS costs)
#   lh-tls      lh-nosync with LONGHAUL_DATA_FRAMES=tls: TLS's own records instead of sealed frames
#   lh-nostages lh-nosync with LONGHAUL_STAGE_CPU=off at both ends: what counting CPU by stage costs
#   lh-old      lh-nosync with OLD_BIN, another build (client and its own server): an A/B of two builds
#   gridftp     globus-url-copy -p 4 -tcp-bs 4M (no encryption, no hashing; $PEERS/servers.sh)
#   dd          dd if=SRC of=DEST bs=1M: the local-copy ceiling (buffered, no fsync)
#   dd4         four dd at once, each a quarter of SRC into its place in one DEST (GridFTP's -p 4 writes
#               one file from four streams this way): the host's ceiling for parallel writers, unpinned
#   dd-sync     dd ... conv=fdatasync: the ceiling for a copy that is made durable
# WARMUP=1 (the default) runs a round 0 of every tool first, not counted (lines in <tsv>.warm).
# Every copy is checked with cmp. For each run: wall seconds, Gbit/s (1e9 bits) and the CPU-seconds per
# GiB moved of the tool's own processes, both ends (client and server, each tool's in a cpuacct cgroup
# of its own, so other load on the host is not counted; the kernel's softirq work done on behalf of the
# sockets is counted where it runs, mostly in the processes). PIN=1 puts every client on CPU 0 and
# every server on CPU 1 (`taskset`), as two DTNs would each have their own cores.
# longhaul's runs also say where each end's CPU went (`cp --json`'s cpu_stages): medians per GiB by
# stage are printed for each lh tool, and the lines go to bench/results/elephant-stages-<date>.tsv.
# Prints medians and the ratios the issue sets: lh / dd >= 0.85, lh / gridftp >= 1.0, CPU per GiB
# lh / gridftp <= 1.2. The same per GiB as whole-host busy time (/proc/stat: user, nice, system,
# irq, softirq, steal of every CPU) is printed beside it: it also counts what the kernel does for
# nobody's cgroup (writeback, reclaim) and other load on the host, so read it with the load average.
# Lines go to bench/results/elephant-<date>.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} SIZE_GIB=${SIZE_GIB:-2} SCENARIOS=${SCENARIOS:-"shm disk"}
TOOLS=${TOOLS:-"lh lh-nosync lh-plain lh-tls gridftp dd dd4 dd-sync"} DISK_DIR=${DISK_DIR:-/var/tmp/lh-elephant}
PIN=${PIN:-0} WARMUP=${WARMUP:-1}
# Where the peers' set-up and start scripts are (setup.sh, servers.sh).
PEERS=${PEERS:-../shared/peers}
BIN=${1:-target/release/longhaul}
[ -x "$BIN" ] || cargo build --release --quiet
for c in globus-url-copy globus-gridftp-server; do
    command -v $c >/dev/null || bash $PEERS/setup.sh >/dev/null
done
WORK=$(mktemp -d /dev/shm/lh-elephant.XXXXXX)
mkdir -p "$DISK_DIR" bench/results
LH=$WORK/longhaul
cp "$BIN" "$LH"
OLD=$WORK/longhaul-old
[ -n "${OLD_BIN:-}" ] && cp "$OLD_BIN" "$OLD"
PIDS=()
CG=/sys/fs/cgroup/cpuacct/lh-elephant-$$
mkdir -p "$CG/lh" "$CG/gridftp" "$CG/dd"
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    bash $PEERS/servers.sh stop "$WORK/peers" >/dev/null 2>&1 || true
    rm -rf "$WORK" "$DISK_DIR"
    sleep 0.5
    rmdir "$CG"/* "$CG" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
TSV=bench/results/elephant-$(date -u +%Y%m%d-%H%M).tsv
printf 'scenario\tround\ttool\tseconds\tgbps\tcpu_s_per_gib\thost_cpu_s_per_gib\n' >"$TSV"
STAGES=bench/results/elephant-stages-$(date -u +%Y%m%d-%H%M).tsv
printf 'scenario\tround\ttool\tend\tstage\tcpu_s_per_gib\n' >"$STAGES"

make_file() { # path: SIZE_GIB GiB of incompressible bytes
    python3 - "$1" "$SIZE_GIB" <<'EOF'
import os, sys
block = os.urandom(1 << 20)
with open(sys.argv[1], "wb") as f:
    for i in range(int(sys.argv[2]) * 1024):
        f.write(i.to_bytes(8, "little") + block[8:])
EOF
}


STATE=$WORK/state
mkdir -p "$STATE"
TOKEN=$("$LH" token create --state-dir "$STATE" --export '*:rw' 2>/dev/null)
TRUST=$("$LH" id "$STATE" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
group_of() { case $1 in lh*) echo lh ;; gridftp) echo gridftp ;; *) echo dd ;; esac; }
pin() { [ "$PIN" = 1 ] && echo "taskset -c $1"; }
in_group() { # group cpu cmd... : runs cmd in the tool group's cgroup (pinned to cpu with PIN=1)
    local g=$1 cpu=$2
    shift 2
    # shellcheck disable=SC2046
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$g" $(pin "$cpu") "$@"
}
cpu_ns() { cat "$CG/$1/cpuacct.usage"; }
host_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; } # in USER_HZ (1/100 s)
start_lh() { # port dest [flags]
    local port=$1 dest=$2 bin=${SERVE_BIN:-$LH}
    shift 2
    # A bash of its own (not a subshell of this one), so that $! is the server once it execs.
    # shellcheck disable=SC2046
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/lh" $(pin 1) \
        "$bin" serve --allow-plaintext --listen "127.0.0.1:$port" --state-dir "$STATE" --export "data=$dest" "$@" \
        >"$WORK/serve-$port.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do ss -ltn "sport = :$port" | grep -q LISTEN && return; sleep 0.1; done
    echo "elephant: longhaul serve on $port did not start" >&2
    exit 1
}

run_tool() { # tool src destdir -> runs it, leaving destdir/big.bin
    local tool=$1 src=$2 dst=$3
    case $tool in
    lh) LONGHAUL_TRUST=$TRUST LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$LH" cp --json --force "$src" "longhaul://127.0.0.1:$P1/data/" ;;
    lh-nosync) LONGHAUL_TRUST=$TRUST LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$LH" cp --json --force "$src" "longhaul://127.0.0.1:$P2/data/" ;;
    lh-plain) LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$LH" cp --json --insecure-plaintext --force "$src" "longhaul://127.0.0.1:$P2/data/" ;;
    lh-nostages) LONGHAUL_STAGE_CPU=off LONGHAUL_TRUST=$TRUST LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$LH" cp --json --force "$src" "longhaul://127.0.0.1:$P4/data/" ;;
    lh-old) LONGHAUL_TRUST=$TRUST LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$OLD" cp --json --force "$src" "longhaul://127.0.0.1:$P3/data/" ;;
    lh-tls) LONGHAUL_DATA_FRAMES=tls LONGHAUL_TRUST=$TRUST LONGHAUL_TOKEN=$TOKEN in_group lh 0 "$LH" cp --json --force "$src" "longhaul://127.0.0.1:$P2/data/" ;;
    gridftp) in_group gridftp 0 globus-url-copy -p 4 -tcp-bs 4M "file://$src" "ftp://127.0.0.1:2811$dst/big.bin" ;;
    dd) in_group dd 0 dd if="$src" of="$dst/big.bin" bs=1M status=none ;;
    dd4)
        local q=$((SIZE_GIB * 256))
        # shellcheck disable=SC2016
        in_group dd 0,1 bash -c 'for i in 0 1 2 3; do
            dd if="$0" of="$1" bs=1M skip=$((i * $2)) seek=$((i * $2)) count="$2" conv=notrunc status=none &
        done; wait' "$src" "$dst/big.bin" "$q" ;;
    dd-sync) in_group dd 0 dd if="$src" of="$dst/big.bin" bs=1M conv=fdatasync status=none ;;
    esac
}

for sc in $SCENARIOS; do
    case $sc in
    shm) base=$WORK/shm ;;
    disk) base=$DISK_DIR ;;
    *) echo "elephant: unknown scenario $sc" >&2; exit 2 ;;
    esac
    mkdir -p "$base/src" "$base/dst"
    make_file "$base/src/big.bin"
    P1=$((30000 + RANDOM % 20000)) P2=$((P1 + 1))
    start_lh $P1 "$base/dst"
    start_lh $P2 "$base/dst" --no-sync
    P4=$((P1 + 3))
    LONGHAUL_STAGE_CPU=off start_lh $P4 "$base/dst" --no-sync
    if [ -n "${OLD_BIN:-}" ]; then
        P3=$((P1 + 2))
        SERVE_BIN=$OLD start_lh $P3 "$base/dst" --no-sync
    fi
    bash $PEERS/servers.sh start "$base/dst" "$WORK/peers" >/dev/null
    # GridFTP's daemon forks a process per session: they stay in its group.
    echo "$(cat "$WORK/peers/gridftp.pid")" >"$CG/gridftp/cgroup.procs"
    [ "$PIN" = 1 ] && taskset -pc 1 "$(cat "$WORK/peers/gridftp.pid")" >/dev/null
    read -ra tools <<<"$TOOLS"
    for r in $(seq $((1 - WARMUP)) "$ROUNDS"); do
        n=${#tools[@]}
        out=$TSV
        [ "$r" = 0 ] && out=$TSV.warm
        for i in $(seq 0 $((n - 1))); do
            tool=${tools[$(((i + r) % n))]}
            rm -f "$base/dst/big.bin"
            sync
            [ "$sc" = disk ] && echo 3 >/proc/sys/vm/drop_caches
            g=$(group_of "$tool")
            c0=$(cpu_ns "$g") h0=$(host_busy) t0=$(date +%s.%N)
            if ! run_tool "$tool" "$base/src/big.bin" "$base/dst" >"$WORK/out" 2>&1; then
                echo "elephant: $tool failed: $(tail -3 "$WORK/out")" >&2
                printf '%s\t%s\t%s\tNA\tNA\tNA\tNA\n' "$sc" "$r" "$tool" >>"$out"
                continue
            fi
            t1=$(date +%s.%N) c1=$(cpu_ns "$g") h1=$(host_busy)
            if ! cmp -s "$base/src/big.bin" "$base/dst/big.bin"; then
                echo "elephant: $tool's copy differs" >&2
                printf '%s\t%s\t%s\tNA\tNA\tNA\tNA\n' "$sc" "$r" "$tool" >>"$out"
                continue
            fi
            awk -v sc="$sc" -v r="$r" -v tool="$tool" -v t0="$t0" -v t1="$t1" -v c="$((c1 - c0))" -v h="$((h1 - h0))" \
                -v g="$SIZE_GIB" 'BEGIN {
                    s = t1 - t0
                    printf "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\n", sc, r, tool, s, g * 8 * 1.073741824 / s, c / 1e9 / g, h / 100 / g }' \
                >>"$out"
            tail -1 "$out"
            case $r$tool in [1-9]*lh*)
                python3 - "$WORK/out" "$sc" "$r" "$tool" "$SIZE_GIB" >>"$STAGES" <<'EOF'
import json, sys
out, sc, r, tool, gib = sys.argv[1:]
d = json.loads(open(out).read())
for end, st in sorted(d.get("cpu_stages", {}).items()):
    for stage, s in st.items():
        print(f"{sc}\t{r}\t{tool}\t{end}\t{stage}\t{s / float(gib):.4f}")
EOF
                ;;
            esac
        done
    done
    bash $PEERS/servers.sh stop "$WORK/peers" >/dev/null
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    PIDS=()
    rm -rf "$base/src" "$base/dst"
done

echo
echo "# elephant, ${SIZE_GIB} GiB, $ROUNDS rounds, PIN=$PIN, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t") if r["gbps"] != "NA"]
for sc in dict.fromkeys(r["scenario"] for r in rows):
    med = {}
    print(f"\n{sc}: tool | median Gbit/s (min-max) | median CPU-s per GiB (own cgroup) | host-busy CPU-s per GiB")
    for tool in dict.fromkeys(r["tool"] for r in rows if r["scenario"] == sc):
        g = [float(r["gbps"]) for r in rows if r["scenario"] == sc and r["tool"] == tool]
        c = [float(r["cpu_s_per_gib"]) for r in rows if r["scenario"] == sc and r["tool"] == tool]
        h = [float(r["host_cpu_s_per_gib"]) for r in rows if r["scenario"] == sc and r["tool"] == tool]
        med[tool] = (statistics.median(g), statistics.median(c), statistics.median(h))
        print(f"  {tool:10} {med[tool][0]:6.2f} ({min(g):.2f}-{max(g):.2f})  {med[tool][1]:5.2f}  {med[tool][2]:5.2f}")
    def ratio(a, b, i, what):
        if a in med and b in med:
            print(f"  {a} / {b} {what}: {med[a][i] / med[b][i]:.2f}")
    ratio("lh", "dd", 0, "rate (target >= 0.85)")
    ratio("lh", "dd4", 0, "rate: against four parallel local writers")
    ratio("gridftp", "dd4", 0, "rate: GridFTP against four parallel local writers")
    ratio("lh", "dd-sync", 0, "rate")
    ratio("lh-nosync", "dd", 0, "rate")
    ratio("lh", "gridftp", 0, "rate (target >= 1.0)")
    ratio("lh", "gridftp", 1, "CPU per GiB (target <= 1.2)")
    ratio("lh", "gridftp", 2, "host-busy CPU per GiB")
    ratio("lh-nosync", "gridftp", 1, "CPU per GiB")
    ratio("lh-nosync", "gridftp", 2, "host-busy CPU per GiB")
    ratio("lh-plain", "gridftp", 1, "CPU per GiB")
    ratio("lh-nosync", "lh-plain", 0, "rate: TLS / plaintext")
    ratio("lh-nosync", "lh-tls", 1, "CPU per GiB: sealed frames / TLS records")
    ratio("lh-tls", "gridftp", 1, "CPU per GiB")
    ratio("lh-nosync", "lh-nostages", 1, "CPU per GiB: counting stages / not")
    ratio("lh-nostages", "lh-old", 1, "CPU per GiB: this build, stages not counted / OLD_BIN")
    ratio("lh-nosync", "lh-old", 1, "CPU per GiB: this build / OLD_BIN")
    ratio("lh-nosync", "lh-old", 0, "rate: this build / OLD_BIN")
EOF
python3 - "$STAGES" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
keys = dict.fromkeys((r["scenario"], r["tool"], r["end"]) for r in rows)
if keys:
    print("\nwhere longhaul's CPU went, median CPU-s per GiB by stage (cp --json cpu_stages):")
for sc, tool, end in keys:
    mine = [r for r in rows if (r["scenario"], r["tool"], r["end"]) == (sc, tool, end)]
    stages = dict.fromkeys(r["stage"] for r in mine)
    med = {s: statistics.median(float(r["cpu_s_per_gib"]) for r in mine if r["stage"] == s) for s in stages}
    parts = ", ".join(f"{s} {v:.3f}" for s, v in med.items() if v >= 0.001)
    print(f"  {sc} {tool:10} {end:6} total {sum(med.values()):.3f}: {parts}")
EOF
echo "(lines: $TSV, $STAGES)"
