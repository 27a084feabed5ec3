#!/usr/bin/env bash
# bench/disk.sh - `longhaul bench disk` against fio, same parameters, same run.
#
# What it does
#   * installs fio and jq with apt-get if missing; builds longhaul (cargo build --release);
#   * for each directory in DIRS (default: /var/tmp and /dev/shm) and each mode in MODES
#     (direct, buffered), for ROUNDS rounds, alternating the two tools within the round:
#         longhaul bench disk DIR --size SIZE --bs BS --threads JOBS [--buffered] --files 0 --json
#         fio --rw=write then --rw=read, --bs BS --size SIZE/JOBS --numjobs JOBS
#             --ioengine=psync --direct=1|0 --group_reporting (buffered: --end_fsync=1 on the
#             write, and the read after dropping the file's pages with --invalidate=1)
#     Before every run: sync and drop the page cache (as root), so that neither tool inherits
#     the memory state the other left (reclaiming 1 GiB of page cache inside a tmpfs write
#     halved it for whichever tool came first).
#     psync with JOBS jobs is the same I/O as longhaul's JOBS threads, each with one
#     request in flight in its own region of the file. fio runs its jobs as threads with
#     --gtod_reduce=1 (throughput only, as longhaul measures): its per-request latency
#     clock reads cost it 15-25% of the O_DIRECT write rate on this VM (measured: 1.49
#     GB/s default, 1.91 with --thread --gtod_reduce=1, longhaul 1.91);
#   * prints a markdown table: median GB/s of each tool and longhaul/fio (issue 6: within
#     10% for 1 MiB sequential reads and writes), and writes the raw lines to
#     bench/results/disk-<date>.tsv.
#
# How to run
#   bash bench/disk.sh                       # ROUNDS=3 SIZE=1G BS=1M JOBS=1
#   DIRS=/var/tmp MODES=direct ROUNDS=5 bash bench/disk.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-1G}
BS=${BS:-1M}
JOBS=${JOBS:-1}
DIRS=${DIRS:-/var/tmp /dev/shm}
MODES=${MODES:-direct buffered}

need=()
command -v fio >/dev/null || need+=(fio)
command -v jq >/dev/null || need+=(jq)
if ((${#need[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >/dev/null
fi
(cd "$ROOT" && cargo build --release --quiet)
LH="$ROOT/target/release/longhaul"

mkdir -p "$ROOT/bench/results"
STAMP=$(date -u +%Y%m%d-%H%M%S)
TSV="$ROOT/bench/results/disk-$STAMP.tsv"
printf 'dir\tmode\ttest\ttool\tround\tGBps\n' >"$TSV"

bytes() { numfmt --from=iec "${1%B}"; }
PER_JOB=$(($(bytes "$SIZE") / JOBS))

run_longhaul() { # dir mode -> "write_GBps read_GBps"
    local flag=()
    [[ $2 == buffered ]] && flag=(--buffered)
    "$LH" bench disk "$1" --size "$SIZE" --bs "$BS" --threads "$JOBS" --files 0 --time 60s \
        "${flag[@]}" --json | jq -r '"\(.write.bytes_per_second / 1e9) \(.read.bytes_per_second / 1e9)"'
}

run_fio() { # dir mode -> "write_GBps read_GBps"
    local direct=1 extra_w=() extra_r=()
    if [[ $2 == buffered ]]; then
        direct=0
        extra_w=(--end_fsync=1)
        extra_r=(--invalidate=1)
    fi
    local common=(--directory="$1" --filename_format='fio-bench.$jobnum' --bs="$BS"
        --size="$PER_JOB" --numjobs="$JOBS" --ioengine=psync --direct=$direct
        --thread --gtod_reduce=1 --group_reporting --output-format=json)
    local w r
    w=$(fio --name=w --rw=write "${extra_w[@]}" "${common[@]}" | jq '.jobs[0].write.bw_bytes / 1e9')
    r=$(fio --name=w --rw=read "${extra_r[@]}" "${common[@]}" | jq '.jobs[0].read.bw_bytes / 1e9')
    rm -f "$1"/fio-bench.*
    echo "$w $r"
}

for dir in $DIRS; do
    for mode in $MODES; do
        for round in $(seq 1 "$ROUNDS"); do
            order=(longhaul fio)
            ((round % 2 == 0)) && order=(fio longhaul)
            for tool in "${order[@]}"; do
                # Each run starts from the same memory state: clean caches
                # (root; otherwise the runs share whatever the last one left).
                sync
                echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
                read -r w r < <("run_$tool" "$dir" "$mode")
                printf '%s\t%s\twrite\t%s\t%s\t%s\n' "$dir" "$mode" "$tool" "$round" "$w" >>"$TSV"
                printf '%s\t%s\tread\t%s\t%s\t%s\n' "$dir" "$mode" "$tool" "$round" "$r" >>"$TSV"
            done
        done
    done
done

echo "bench/disk.sh $(date -u +%F) SIZE=$SIZE BS=$BS JOBS=$JOBS ROUNDS=$ROUNDS (raw: ${TSV#"$ROOT"/})"
echo
echo "| dir | mode | test | longhaul GB/s | fio GB/s | longhaul/fio |"
echo "|---|---|---|---|---|---|"
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
keys = []
for r in rows:
    k = (r["dir"], r["mode"], r["test"])
    if k not in keys:
        keys.append(k)
for k in keys:
    med = {}
    for tool in ("longhaul", "fio"):
        v = [float(r["GBps"]) for r in rows if (r["dir"], r["mode"], r["test"]) == k and r["tool"] == tool]
        med[tool] = statistics.median(v)
    ratio = med["longhaul"] / med["fio"] if med["fio"] else float("nan")
    print(f"| {k[0]} | {k[1]} | {k[2]} | {med['longhaul']:.3f} | {med['fio']:.3f} | {ratio:.2f} |")
EOF
