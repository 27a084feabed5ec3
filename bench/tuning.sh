#!/usr/bin/env bash
# bench/tuning.sh - cp's online tuning against the untuned default and hand-picked settings on an
# emulated long path with loss (issue 6), all in the same run, alternating.
#
# What it does
#   * copies target/release/longhaul (or LONGHAUL_BIN) into a run directory (build first);
#   * makes one SIZE file of random bytes in /dev/shm (WORKLOAD=big), or a tree of NFILES files of
#     FILE_SIZE random bytes in 100-file directories (WORKLOAD=small);
#   * starts `longhaul wan up --rtt RTT --loss LOSS --rate RATE --mtu MTU` (hosts a and b), a server
#     in host b (`serve --no-sync`, export on /dev/shm), identity and token made for the run;
#   * for ROUNDS rounds runs each configuration once, the order rotated every round:
#         tuned      longhaul cp (defaults: streams sized for the path, tuned online)
#         default    longhaul cp --no-tune (the same streams, all carrying chunks all along)
#         P4-rate    longhaul cp -P 4 --rate RATE (the best hand-picked setting found in issue 5)
#         P8         longhaul cp -P 8
#         files-N    longhaul cp --files-in-flight N (small files: a hand-picked count)
#         doctor     longhaul cp after `longhaul doctor` measured the path once, before the rounds
#                    (its remembered rate sizes the streams; the other configs see no memory)
#     MB/s = bytes / the transfer's own seconds (from --json), and files/s; a run that fails is NA;
#   * prints a markdown table of medians and tuned/default, tuned/best-hand-picked, and the streams
#     the tuner ended with; raw lines go to bench/results/tuning-<date>.tsv.
#
# How to run (root; about ROUNDS * 4 * (SIZE/RATE + 4 s))
#   bash bench/tuning.sh                           # 80ms, loss 1e-5, 2gbit, SIZE=4G, ROUNDS=3
#   RTT=80ms LOSS=1e-4 RATE=1gbit SIZE=2G bash bench/tuning.sh
#   WORKLOAD=small RTT=200ms NFILES=20000 CONFIGS="tuned default files-8192" bash bench/tuning.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RTT=${RTT:-80ms}
LOSS=${LOSS:-1e-5}
RATE=${RATE:-2gbit}
MTU=${MTU:-9000}
SIZE=${SIZE:-4G}
WORKLOAD=${WORKLOAD:-big}
NFILES=${NFILES:-20000}
FILE_SIZE=${FILE_SIZE:-2048}
ROUNDS=${ROUNDS:-3}
CONFIGS=${CONFIGS:-tuned default P4-rate P8}
NAME=lhtune$$

RUN=$(mktemp -d /tmp/lh-tuning.XXXX)
cp "${LONGHAUL_BIN:-$ROOT/target/release/longhaul}" "$RUN/longhaul"
LH="$RUN/longhaul"
SHM=/dev/shm/lh-tuning-$$
mkdir -p "$SHM/src" "$SHM/dst" "$RUN/state"
WPID= SPID=
cleanup() {
    [[ -n $SPID ]] && kill "$SPID" 2>/dev/null || true
    [[ -n $WPID ]] && kill "$WPID" 2>/dev/null && wait "$WPID" 2>/dev/null || true
    "$LH" wan down --name "$NAME" >/dev/null 2>&1 || true
    rm -rf "$SHM" "$RUN"
}
trap cleanup EXIT

if [[ $WORKLOAD == small ]]; then
    SRC=$SHM/src/tree
    python3 - "$SRC" "$NFILES" "$FILE_SIZE" <<'EOF'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, f"d{i // 100}")
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(os.urandom(size))
EOF
    BYTES=$((NFILES * FILE_SIZE))
    CP_FLAGS=(-r)
else
    SRC=$SHM/src/big.bin
    head -c "$SIZE" /dev/urandom >"$SRC"
    BYTES=$(stat -c %s "$SRC")
    CP_FLAGS=()
fi
TOKEN=$("$LH" token create --state-dir "$RUN/state" --export '*:rw' 2>/dev/null)
TRUST=$("$LH" id "$RUN/state" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)

"$LH" wan up --name "$NAME" --rtt "$RTT" --loss "$LOSS" --rate "$RATE" --mtu "$MTU" >"$RUN/wan.log" 2>&1 &
WPID=$!
sleep 2
"$LH" wan exec b --name "$NAME" -- "$LH" serve --no-sync --listen 198.18.0.2:5310 \
    --state-dir "$RUN/state" --export "bench=$SHM/dst" >"$RUN/serve.log" 2>&1 &
SPID=$!
sleep 1

# Remembered path rates: only the doctor config sees the doctor's.
PATHS_ON=$RUN/paths.json
PATHS_OFF=$RUN/no-paths.json
if [[ " $CONFIGS " == *" doctor "* ]]; then
    LONGHAUL_TOKEN=$TOKEN LONGHAUL_TRUST=$TRUST LONGHAUL_PATHS=$PATHS_ON timeout 120 \
        "$LH" wan exec a --name "$NAME" -- "$LH" doctor longhaul://198.18.0.2:5310/bench/ --no-copy \
        --json >"$RUN/doctor.json" 2>/dev/null || true
    echo "doctor: verdict $(jq -r '.verdict.stage // "none"' "$RUN/doctor.json" 2>/dev/null)," \
        "remembered $(jq -r '.remembered.bits_per_second // "nothing"' "$RUN/doctor.json" 2>/dev/null) bit/s" >&2
fi

args_of() {
    case $1 in
        tuned) echo "" ;;
        doctor) echo "" ;;
        default) echo "--no-tune" ;;
        P4-rate) echo "-P 4 --rate $RATE" ;;
        P8) echo "-P 8" ;;
        files-*) echo "--files-in-flight ${1#files-}" ;;
        *) echo "unknown config $1" >&2; exit 2 ;;
    esac
}

mkdir -p "$ROOT/bench/results"
TSV="$ROOT/bench/results/tuning-$(date -u +%Y%m%d-%H%M%S).tsv"
printf 'config\tround\tMBps\tfinal_streams\tfiles_per_s\tfiles_in_flight\n' >"$TSV"
read -ra configs <<<"$CONFIGS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#configs[@]}
    for k in $(seq 0 $((n - 1))); do
        c=${configs[$(((k + round) % n))]}
        rm -rf "${SHM:?}/dst/"*
        # shellcheck disable=SC2046
        paths=$PATHS_OFF
        [[ $c == doctor ]] && paths=$PATHS_ON
        out=$(LONGHAUL_TOKEN=$TOKEN LONGHAUL_TRUST=$TRUST LONGHAUL_PATHS=$paths timeout 300 \
            "$LH" wan exec a --name "$NAME" -- "$LH" cp "${CP_FLAGS[@]}" --force --json $(args_of "$c") \
            "$SRC" longhaul://198.18.0.2:5310/bench/ 2>/dev/null) || out=
        mbps=$(jq -r --argjson b "$BYTES" 'if .verified then ($b / .seconds / 1e6) else "NA" end' <<<"$out" 2>/dev/null || echo NA)
        fps=$(jq -r 'if .verified then (.files / .seconds) else "NA" end' <<<"$out" 2>/dev/null || echo NA)
        streams=$(jq -r '.tuning.final_streams // "NA"' <<<"$out" 2>/dev/null || echo NA)
        flight=$(jq -r '.tuning.files_in_flight // "NA"' <<<"$out" 2>/dev/null || echo NA)
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$round" "${mbps:-NA}" "$streams" "${fps:-NA}" "$flight" >>"$TSV"
        echo "round $round $c: ${mbps:-NA} MB/s, ${fps:-NA} files/s (streams at the end: $streams, files in flight: $flight)" >&2
    done
done

what="SIZE=$SIZE"
[[ $WORKLOAD == small ]] && what="WORKLOAD=small NFILES=$NFILES FILE_SIZE=$FILE_SIZE"
echo "bench/tuning.sh $(date -u +%F): RTT=$RTT LOSS=$LOSS RATE=$RATE MTU=$MTU $what ROUNDS=$ROUNDS (raw: ${TSV#"$ROOT"/})"
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med, fin, fps, fl = {}, {}, {}, {}
for r in rows:
    if r["MBps"] != "NA":
        med.setdefault(r["config"], []).append(float(r["MBps"]))
        fps.setdefault(r["config"], []).append(float(r["files_per_s"]))
    fin.setdefault(r["config"], []).append(r["final_streams"])
    fl.setdefault(r["config"], []).append(r["files_in_flight"])
print()
print("| config | median MB/s | median files/s | runs | streams at the end | files in flight at the end |")
print("|---|---|---|---|---|---|")
for c in med:
    print(f"| {c} | {statistics.median(med[c]):.1f} | {statistics.median(fps[c]):.0f} | {len(med[c])} | {' '.join(fin[c])} | {' '.join(fl[c])} |")
m = {c: statistics.median(v) for c, v in med.items()}
if "tuned" in m and "default" in m:
    print(f"\ntuned / default: {m['tuned'] / m['default']:.2f}")
hand = [c for c in m if c not in ("tuned", "default", "doctor")]
if "doctor" in m and "default" in m:
    print(f"after doctor / default: {m['doctor'] / m['default']:.2f}")
if "tuned" in m and hand:
    best = max(hand, key=lambda c: m[c])
    print(f"tuned / best hand-picked ({best}): {m['tuned'] / m[best]:.2f}")
EOF
