#!/usr/bin/env bash
# bench/perf-one-stream.sh - one TCP stream on loopback: longhaul perf (its defaults: plaintext
# data streams, TLS control) against iperf3 -l 1M, alternating, under each congestion control.
#
# What it does
#   * builds longhaul (`cargo build --release -p longhaul`, skipped with SKIP_BUILD=1);
#   * makes a server identity and token in a temporary state directory, starts `longhaul serve`
#     (TLS only: perf's plaintext data streams need no --allow-plaintext) and `iperf3 -s` on
#     127.0.0.1, both by PID, and stops them by PID when it exits;
#   * for each congestion control in CCS sets net.ipv4.tcp_congestion_control (the original value
#     is put back when the script exits, also on failure or Ctrl-C), then for ROUNDS rounds runs
#     every row for DURATION seconds, one stream, the order rotated every round, so that drift
#     in the machine's load falls on every row alike:
#         longhaul           longhaul perf -P 1 (defaults), plus any VARIANTS
#         iperf3 -l 1M       iperf3 -c -P 1 -l 1M
#     Throughput is what the receiver got (longhaul summary.bits_per_second, iperf3
#     end.sum_received.bits_per_second); sender CPU is each tool's own figure.
#   * prints, per congestion control, the median of each row, its spread (min..max) and its
#     ratio to iperf3, and writes every run to bench/results/perf1-<date>.tsv.
#
# Environment
#   ROUNDS (5)  DURATION (5, seconds)  GAP (1, seconds between runs)  CCS ("bbr cubic")
#   VARIANTS: extra longhaul rows, `name=args` separated by `;`, e.g.
#             VARIANTS='tls=--tls;copy=--copy;l128k=-l 128K' bash bench/perf-one-stream.sh
#   IPERF3_VARIANTS: extra iperf3 rows, likewise (IPERF3_VARIANTS='-Z=-Z -l 1M')
#   PORT (47410; iperf3 uses PORT+1)  SKIP_BUILD=1  LONGHAUL_BIN (use this binary)
#   VETH_MTU: instead of loopback, run over a veth pair between two network namespaces made for
#             the run (clients in one at 198.18.0.1, servers in the other at 198.18.0.2, offloads at
#             their defaults) with this MTU, e.g. VETH_MTU=1500 or 9000; the congestion control is
#             set inside both namespaces, which are deleted when the script exits. Loopback's
#             64 KB MTU and shortcuts do not apply there (BENCHMARKS.md, "perf one stream under
#             BBR: cause and fix").
# Needs root for the sysctl (CCS="" leaves it alone and runs under the current one), jq, iperf3.

set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
GAP=${GAP:-1}
CCS=${CCS-bbr cubic}
PORT=${PORT:-47410}
VARIANTS=${VARIANTS:-}
IPERF3_VARIANTS=${IPERF3_VARIANTS:-}
HOST=127.0.0.1
VETH_MTU=${VETH_MTU:-}
SRV=() # command prefix for the servers (and ss), CLI=() for the clients
CLI=()
NETNS=()
WHERE=loopback

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$ROOT/bench/results"
TSV=$ROOT/bench/results/perf1-$STAMP.tsv
LOGDIR=$ROOT/bench/results/perf1-$STAMP.logs
mkdir -p "$LOGDIR"

log() { printf '[perf1] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for t in jq iperf3; do command -v $t >/dev/null || die "$t is missing"; done

LONGHAUL=${LONGHAUL_BIN:-$ROOT/target/release/longhaul}
if [ -z "${LONGHAUL_BIN:-}" ] && [ "${SKIP_BUILD:-0}" != 1 ]; then
    (cd "$ROOT" && cargo build --release --quiet -p longhaul >&2) || die "build failed"
fi
[ -x "$LONGHAUL" ] || die "no longhaul binary at $LONGHAUL"

STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-perf1.XXXXXX")
PIDS=()
CC_ORIG=$(sysctl -n net.ipv4.tcp_congestion_control)
cleanup() {
    local pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do kill "$pid" 2>/dev/null || true; done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do wait "$pid" 2>/dev/null || true; done
    if [ "$(sysctl -n net.ipv4.tcp_congestion_control)" != "$CC_ORIG" ]; then
        sysctl -q -w net.ipv4.tcp_congestion_control="$CC_ORIG" || log "could not restore cc $CC_ORIG"
    fi
    for ns in ${NETNS[@]+"${NETNS[@]}"}; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$STATE_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

set_cc() { # cc: for the clients and servers
    local ns
    if [ ${#NETNS[@]} -eq 0 ]; then
        sysctl -q -w net.ipv4.tcp_congestion_control="$1"
    else
        for ns in "${NETNS[@]}"; do
            ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$1" || return 1
        done
    fi
}
if [ -n "$VETH_MTU" ]; then
    NETNS=("lh1s-a-$$" "lh1s-b-$$")
    ip netns add "${NETNS[0]}" && ip netns add "${NETNS[1]}" || die "cannot make namespaces"
    ip link add lh1s-va netns "${NETNS[0]}" type veth peer name lh1s-vb netns "${NETNS[1]}" ||
        die "cannot make the veth pair"
    ip -n "${NETNS[0]}" addr add 198.18.0.1/24 dev lh1s-va
    ip -n "${NETNS[1]}" addr add 198.18.0.2/24 dev lh1s-vb
    ip -n "${NETNS[0]}" link set lh1s-va mtu "$VETH_MTU" up
    ip -n "${NETNS[1]}" link set lh1s-vb mtu "$VETH_MTU" up
    ip -n "${NETNS[0]}" link set lo up
    ip -n "${NETNS[1]}" link set lo up
    set_cc "$CC_ORIG" || die "cannot set cc $CC_ORIG in the namespaces"
    HOST=198.18.0.2
    CLI=(ip netns exec "${NETNS[0]}")
    SRV=(ip netns exec "${NETNS[1]}")
    WHERE="veth, MTU $VETH_MTU"
fi

LONGHAUL_TRUST=$("$LONGHAUL" id "$STATE_DIR" 2>/dev/null) || die "longhaul id failed"
LONGHAUL_TOKEN=$("$LONGHAUL" token create --state-dir "$STATE_DIR" --export '*:rw' 2>/dev/null) ||
    die "longhaul token create failed"
export LONGHAUL_TRUST LONGHAUL_TOKEN

wait_listen() { # pid port
    local i
    for i in $(seq 100); do
        kill -0 "$1" 2>/dev/null || die "server pid $1 exited"
        [ -n "$(${SRV[@]+"${SRV[@]}"} ss -Htln "( sport = :$2 )" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    die "nothing listens on $2"
}
${SRV[@]+"${SRV[@]}"} "$LONGHAUL" serve --listen "$HOST:$PORT" --state-dir "$STATE_DIR" >"$LOGDIR/serve.log" 2>&1 &
PIDS+=($!)
wait_listen "$!" "$PORT"
${SRV[@]+"${SRV[@]}"} iperf3 -s -B "$HOST" -p $((PORT + 1)) >"$LOGDIR/iperf3-s.log" 2>&1 &
PIDS+=($!)
wait_listen "$!" $((PORT + 1))

ROWS=("longhaul|")
IFS=';' read -r -a extra <<<"$VARIANTS"
for v in ${extra[@]+"${extra[@]}"}; do [ -n "$v" ] && ROWS+=("longhaul ${v%%=*}|${v#*=}"); done
ROWS+=("iperf3 -l 1M|-l 1M")
IFS=';' read -r -a extra <<<"$IPERF3_VARIANTS"
for v in ${extra[@]+"${extra[@]}"}; do [ -n "$v" ] && ROWS+=("iperf3 ${v%%=*}|${v#*=}"); done

printf 'cc\tround\trow\tgbps\tsender_cpu\treceiver_cpu\tretransmits\n' >"$TSV"
run() { # cc round row args
    local cc=$1 round=$2 row=$3 args=$4 out line
    local -a a=()
    [ -n "$args" ] && read -r -a a <<<"$args"
    out=$LOGDIR/$cc-r$round-${row// /_}.json
    if [[ $row == iperf3* ]]; then
        timeout $((DURATION + 30)) ${CLI[@]+"${CLI[@]}"} iperf3 -c "$HOST" -p $((PORT + 1)) -t "$DURATION" --json \
            ${a[@]+"${a[@]}"} >"$out" 2>&1 || true
        line=$(jq -r '[.end.sum_received.bits_per_second, .end.cpu_utilization_percent.host_total,
            .end.cpu_utilization_percent.remote_total, .end.sum_sent.retransmits]
            | map(tostring) | join("\t")' "$out" 2>/dev/null || echo "NA")
    else
        timeout $((DURATION + 30)) ${CLI[@]+"${CLI[@]}"} "$LONGHAUL" perf "$HOST:$PORT" -t "$DURATION" -i 0 --json \
            ${a[@]+"${a[@]}"} >"$out" 2>"$out.err" || true
        line=$(jq -r '.summary as $s | [$s.bits_per_second, $s.directions[0].cpu_sender_percent,
            $s.directions[0].cpu_receiver_percent, $s.retransmits]
            | map(tostring) | join("\t")' "$out" 2>/dev/null || echo "NA")
    fi
    local gbps
    gbps=$(awk -F'\t' '{ if ($1 ~ /^[0-9.e+]+$/) printf "%.2f", $1 / 1e9; else print "NA" }' <<<"$line")
    log "$cc round $round: $row $gbps Gbit/s"
    printf '%s\t%s\t%s\t%s\t%s\n' "$cc" "$round" "$row" "$gbps" "$(cut -f2- <<<"$line")" >>"$TSV"
}

for cc in ${CCS:-$CC_ORIG}; do
    if [ -n "$CCS" ]; then set_cc "$cc" || die "cannot set cc $cc"; fi
    for round in $(seq "$ROUNDS"); do
        n=${#ROWS[@]}
        for i in $(seq 0 $((n - 1))); do
            IFS='|' read -r row args <<<"${ROWS[$(((i + round) % n))]}"
            run "$cc" "$round" "$row" "$args"
            sleep "$GAP"
        done
    done
done

echo
echo "one stream on $WHERE, $ROUNDS x ${DURATION}s alternating, $(nproc) CPUs, $(date -Is), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "longhaul $(cd "$ROOT" && git rev-parse --short HEAD); $(iperf3 --version | head -n1)"
echo
echo "| cc | row | median Gbit/s | min..max | sender CPU % | receiver CPU % | ratio to iperf3 -l 1M |"
echo "|---|---|---:|---:|---:|---:|---:|"
awk -F'\t' '
function median(s,   a, n, i, j, t) {
    n = split(s, a, " "); if (!n) return "NA"
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    lo[0] = a[1]; hi[0] = a[n]
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
NR > 1 && $4 != "NA" { k = $1 "|" $3; g[k] = g[k] " " $4; s[k] = s[k] " " $5; r[k] = r[k] " " $6
    if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
END {
    for (i = 1; i <= n; i++) { k = order[i]; M[k] = median(g[k]); L[k] = lo[0]; H[k] = hi[0] }
    for (i = 1; i <= n; i++) {
        k = order[i]; split(k, p, "|"); ref = p[1] "|iperf3 -l 1M"
        printf "| %s | %s | %.2f | %.2f..%.2f | %.0f | %.0f | %s |\n", p[1], p[2], M[k], L[k], H[k],
            median(s[k]), median(r[k]), (ref in M && M[ref] > 0) ? sprintf("%.2f", M[k] / M[ref]) : "NA"
    }
}' "$TSV"
echo
echo "(every run: $TSV)"
