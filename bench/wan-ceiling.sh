#!/usr/bin/env bash
# bench/wan-ceiling.sh - the WAN emulator's own ceiling (issue 5): bits/s through `longhaul wan up`
# with no impairment (0 ms, no loss, no rate limit), iperf3 -P 2 from host a to host b, at MTU 9000
# and 65000. This is the top rate of every WAN benchmark on this machine.
#
# What it does: for ROUNDS rounds, for each MTU in MTUS, for each binary (BIN, and OLD_BIN if set,
# alternating so drift hits both alike): start `wan up --mtu M --json` (by PID), `iperf3 -s -1` in
# host b, `iperf3 -c 198.18.0.2 -P 2 -t SECONDS -J` in host a, read end.sum_received, stop the
# emulator (SIGTERM by PID). Prints one line per run and the medians; with OLD_BIN, the ratio.
# The issue's reference: a single-threaded C forwarder between two TUN devices moves about 8 Gbit/s
# at MTU 9000 and 18 Gbit/s at MTU 65000 on this machine.
#
# How to run (root, idle machine; build first):
#   bash bench/wan-ceiling.sh
#   OLD_BIN=/tmp/longhaul-before ROUNDS=3 bash bench/wan-ceiling.sh    # A/B against another build
# Environment: BIN (target/release/longhaul), OLD_BIN (unset), MTUS ("9000 65000"), ROUNDS (3),
#   SECONDS_PER_RUN (5), NAME (lhceil).

set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/longhaul}
OLD_BIN=${OLD_BIN:-}
MTUS=${MTUS:-9000 65000}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_RUN:-5}
NAME=${NAME:-lhceil}
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 is needed (apt-get install iperf3)" >&2; exit 1; }
RUN=$(mktemp -d /tmp/lh-ceiling.XXXXXX)
cp "$BIN" "$RUN/new"
BINS=(new)
if [ -n "$OLD_BIN" ]; then cp "$OLD_BIN" "$RUN/old"; BINS=(new old); fi
WAN_PID=''
cleanup() {
    [ -n "$WAN_PID" ] && kill "$WAN_PID" 2>/dev/null && wait "$WAN_PID" 2>/dev/null
    "$RUN/new" wan down --name "$NAME" >/dev/null 2>&1 || true
    rm -rf "$RUN"
}
trap cleanup EXIT INT TERM

one() { # BIN MTU -> Gbit/s on stdout
    "$RUN/$1" wan up --name "$NAME" --mtu "$2" --json >"$RUN/up.out" 2>"$RUN/up.err" &
    WAN_PID=$!
    for _ in $(seq 100); do grep -q hosts "$RUN/up.out" 2>/dev/null && break; sleep 0.1; done
    ip netns exec "$NAME-b" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    ip netns exec "$NAME-a" iperf3 -c 198.18.0.2 -p 5299 -P 2 -t "$SECS" -J >"$RUN/i3.json" || true
    wait "$srv" 2>/dev/null || true
    kill "$WAN_PID"; wait "$WAN_PID" 2>/dev/null || true
    WAN_PID=''
    python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' "$RUN/i3.json" 2>/dev/null || echo NA
}

declare -A RES
echo "# wan ceiling, $(date -u '+%Y-%m-%d %H:%M') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), iperf3 -P 2 -t $SECS, $ROUNDS round(s)"
for r in $(seq "$ROUNDS"); do
    for m in $MTUS; do
        order=("${BINS[@]}")
        if [ $((r % 2)) -eq 0 ] && [ ${#BINS[@]} -eq 2 ]; then order=(old new); fi
        for b in "${order[@]}"; do
            g=$(one "$b" "$m")
            echo "round $r MTU $m $b: $g Gbit/s"
            RES[$b,$m]="${RES[$b,$m]:-} $g"
        done
    done
done
median() { tr ' ' '\n' | grep -v -e '^$' -e NA | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
if [ ${#BINS[@]} -eq 2 ]; then
    echo "| MTU | BIN, Gbit/s (median) | OLD_BIN, Gbit/s (median) | BIN / OLD_BIN |"
    echo "|---|---:|---:|---:|"
else
    echo "| MTU | BIN, Gbit/s (median) |"
    echo "|---|---:|"
fi
for m in $MTUS; do
    line="| $m |"
    for b in "${BINS[@]}"; do line="$line $(echo "${RES[$b,$m]}" | median) |"; done
    if [ ${#BINS[@]} -eq 2 ]; then
        n=$(echo "${RES[new,$m]}" | median); o=$(echo "${RES[old,$m]}" | median)
        line="$line $(awk -v n="$n" -v o="$o" 'BEGIN { if (o > 0) printf "%.2f", n / o; else print "NA" }') |"
    fi
    echo "$line"
done
