#!/usr/bin/env bash
# bench/perf.sh - loopback throughput/CPU comparison: longhaul (TLS 1.3 and plaintext) vs iperf3,
# iperf2, nuttcp.
#
# What it does
#   * installs iperf3, iperf (iperf2), nuttcp, GNU time and jq with apt-get if any is
#     missing (noninteractive; iperf3's "start a daemon" question is preseeded to false);
#   * builds longhaul with `cargo build --release` (a no-op when it is up to date);
#   * makes a longhaul server identity and an access token in a temporary state directory
#     (`longhaul id DIR`, `longhaul token create --state-dir DIR --export '*:rw'`) and
#     exports LONGHAUL_TRUST (the identity's fingerprint) and LONGHAUL_TOKEN for the clients;
#   * starts, by PID, a longhaul server (`--allow-plaintext`, so that TLS and plaintext
#     clients use the same server), `iperf3 -s`, `iperf -s` and `nuttcp -S --nofork` on
#     127.0.0.1 on non-default ports, and kills them by PID when the script exits;
#   * for ROUNDS rounds runs every (tool, setting) at 1 and at 4 streams for DURATION
#     seconds each, interleaved within the round (the order is rotated every round):
#         longhaul --tls          data streams over TLS 1.3 (`perf --tls`), pinned with --trust,
#                                 token auth; 1 MiB writes. The data is encrypted and decrypted
#                                 in user space, so the zero-copy send (splice) and the
#                                 MSG_TRUNC discarding receive do not apply.
#         longhaul-plain defaults `perf` at its defaults since issue 15: plaintext data streams
#                                 (TLS control connection), with the zero-copy splice send and
#                                 MSG_TRUNC receive
#         iperf3 defaults | iperf3 -l 1M | iperf2 defaults | iperf2 -l 1M
#         nuttcp defaults | nuttcp -l1m
#     Throughput is what the receiver got (iperf3: end.sum_received); sender CPU is the
#     tool's own figure where it has one (longhaul cpu_sender_percent, iperf3
#     host_total, nuttcp tx_cpu) and otherwise (iperf2) the client's (user+sys)/wall
#     from GNU time. Every client also runs under GNU time, kept as a cross-check.
#     100% CPU = one core fully busy. A run that fails or cannot be parsed is NA.
#   * writes one line per run to bench/results/perf-<date>.tsv (raw tool outputs in
#     bench/results/perf-<date>.logs/) and prints a markdown table of medians with
#     longhaul/iperf3 and longhaul/best-peer ratios (longhaul = the TLS row), and the
#     TLS / plaintext ratio (issue 4: target >= 0.8 for throughput) at 1 and 4 streams.
#
# How to run (from anywhere; takes about ROUNDS * 16 * (DURATION + ~2) seconds with all TOOLS)
#   bash bench/perf.sh                      # ROUNDS=3 DURATION=10
#   ROUNDS=1 DURATION=2 bash bench/perf.sh  # quick smoke run
#   TOOLS="longhaul longhaul-plain" bash bench/perf.sh   # TLS vs plaintext only
# Environment
#   ROUNDS (3)  DURATION (10, seconds per run)  GAP (1, seconds of pause between runs)
#   TOOLS ("longhaul longhaul-plain iperf3 iperf2 nuttcp": which rows to run; only the
#   servers of these tools are started)
#   PORT_BASE (47310; 8 consecutive ports are used, moved up if any is taken)
#   LONGHAUL_BIN (use this binary, skip the build)  SKIP_BUILD=1 (use target/release as is)
# Run it on an otherwise idle machine: on loopback sender and receiver share the CPUs.

set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
GAP=${GAP:-1}
PORT_BASE=${PORT_BASE:-47310}
TOOLS=${TOOLS:-longhaul longhaul-plain iperf3 iperf2 nuttcp}
HOST=127.0.0.1
STREAM_COUNTS=(1 4)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RESULTS_DIR=$ROOT/bench/results
STAMP=$(date +%Y%m%d-%H%M%S)
TSV=$RESULTS_DIR/perf-$STAMP.tsv
LOGDIR=$RESULTS_DIR/perf-$STAMP.logs

log() { printf '[perf] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_uint "$ROUNDS" && [ "$ROUNDS" -ge 1 ] || die "ROUNDS must be a positive integer"
is_uint "$DURATION" && [ "$DURATION" -ge 1 ] || die "DURATION must be a positive integer"
is_uint "$PORT_BASE" || die "PORT_BASE must be an integer"
for t in $TOOLS; do
    case $t in longhaul | longhaul-plain | iperf3 | iperf2 | nuttcp) ;;
    *) die "TOOLS: unknown tool '$t'" ;; esac
done
[ -n "${TOOLS// /}" ] || die "TOOLS is empty"
want() { case " $TOOLS " in *" $1 "*) return 0 ;; esac; return 1; }
want_longhaul() { want longhaul || want longhaul-plain; }

# ---------------------------------------------------------------- tools ----
install_missing() {
    local -a pkgs=()
    command -v iperf3 >/dev/null 2>&1 || pkgs+=(iperf3)
    command -v iperf >/dev/null 2>&1 || pkgs+=(iperf)
    command -v nuttcp >/dev/null 2>&1 || pkgs+=(nuttcp)
    [ -x /usr/bin/time ] || pkgs+=(time)
    command -v jq >/dev/null 2>&1 || pkgs+=(jq)
    command -v ss >/dev/null 2>&1 || pkgs+=(iproute2)
    command -v timeout >/dev/null 2>&1 || pkgs+=(coreutils)
    [ ${#pkgs[@]} -eq 0 ] && return 0
    local sudo=
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    log "installing: ${pkgs[*]}"
    echo 'iperf3 iperf3/start_daemon boolean false' | $sudo debconf-set-selections
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${pkgs[@]}" >&2
}
install_missing

if [ -n "${LONGHAUL_BIN:-}" ]; then
    LONGHAUL=$LONGHAUL_BIN
else
    LONGHAUL=$ROOT/target/release/longhaul
    if [ "${SKIP_BUILD:-0}" != 1 ]; then
        log "cargo build --release -p longhaul"
        if ! (cd "$ROOT" && cargo build --release --quiet -p longhaul >&2); then
            [ -x "$LONGHAUL" ] || die "build failed and there is no $LONGHAUL"
            log "warning: build failed; benchmarking the existing $LONGHAUL"
        fi
    fi
fi
[ -x "$LONGHAUL" ] || die "no longhaul binary at $LONGHAUL"

# ----------------------------------------------------------- servers ----
mkdir -p "$RESULTS_DIR" "$LOGDIR"
STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-bench-state.XXXXXX")
SERVER_PIDS=()

cleanup() {
    local pid
    for pid in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do
        kill "$pid" 2>/dev/null || true
    done
    sleep 0.3
    for pid in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$STATE_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_in_use() { [ -n "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]; }

# longhaul, iperf3, iperf2, nuttcp control, nuttcp data (x4: -N 4 uses 4 ports)
pick_ports() {
    local base=$PORT_BASE try p busy
    for try in $(seq 0 30); do
        busy=0
        for p in $(seq "$base" $((base + 7))); do
            if port_in_use "$p"; then busy=1; break; fi
        done
        if [ $busy = 0 ]; then
            LH_PORT=$base I3_PORT=$((base + 1)) I2_PORT=$((base + 2))
            NT_CTL_PORT=$((base + 3)) NT_DATA_PORT=$((base + 4))
            return 0
        fi
        base=$((base + 10))
    done
    die "no 8 free consecutive ports from $PORT_BASE"
}
pick_ports

start_server() { # name port cmd...
    local name=$1 port=$2 pid i
    shift 2
    "$@" >"$LOGDIR/server-$name.log" 2>&1 &
    pid=$!
    SERVER_PIDS+=("$pid")
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || {
            cat "$LOGDIR/server-$name.log" >&2
            die "$name server exited at once"
        }
        [ -n "$(ss -Htln "( sport = :$port )" 2>/dev/null)" ] && {
            log "$name server pid $pid on port $port"
            return 0
        }
        sleep 0.1
    done
    die "$name server (pid $pid) is not listening on $port after 10 s"
}

LH_FP=NA
if want_longhaul; then
    # The server's identity (made in STATE_DIR on first use) and a token for every export;
    # the clients pin the fingerprint and present the token (both through the environment).
    LH_FP=$("$LONGHAUL" id "$STATE_DIR" 2>"$LOGDIR/longhaul-id.log") ||
        die "longhaul id $STATE_DIR failed: $(tail -n 2 "$LOGDIR/longhaul-id.log")"
    [[ $LH_FP =~ ^SHA256:[A-Za-z0-9+/=_-]+$ ]] || die "longhaul id printed no fingerprint: '$LH_FP'"
    LH_TOKEN=$("$LONGHAUL" token create --state-dir "$STATE_DIR" --export '*:rw' --note bench/perf.sh \
        2>"$LOGDIR/longhaul-token.log") ||
        die "longhaul token create failed: $(tail -n 2 "$LOGDIR/longhaul-token.log")"
    [[ $LH_TOKEN =~ ^[^[:space:]]+$ ]] || die "longhaul token create printed no token"
    export LONGHAUL_TRUST=$LH_FP LONGHAUL_TOKEN=$LH_TOKEN
    # TLS only: perf's plaintext data streams (the longhaul-plain rows) need no --allow-plaintext
    start_server longhaul "$LH_PORT" "$LONGHAUL" serve --listen "$HOST:$LH_PORT" --state-dir "$STATE_DIR"
fi
want iperf3 && start_server iperf3 "$I3_PORT" iperf3 -s -B "$HOST" -p "$I3_PORT"
want iperf2 && start_server iperf2 "$I2_PORT" iperf -s -B "$HOST" -p "$I2_PORT"
# nuttcp cannot bind its server to one address; --nofork keeps it in the foreground so
# that $! is the server. The clients pick the data ports (-p), on loopback only.
want nuttcp && start_server nuttcp "$NT_CTL_PORT" nuttcp -S --nofork -P "$NT_CTL_PORT"

{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm), $(nproc) CPUs, cc $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo '?')"
    echo "longhaul: $LONGHAUL ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && [ -n "$(git status --porcelain -- crates 2>/dev/null)" ] && echo ', crates/ modified'))"
    echo "longhaul server: TLS only, identity $LH_FP; rows: longhaul = perf --tls (TLS 1.3 data), longhaul-plain = perf defaults (plaintext data, TLS control)"
    echo "iperf3: $(iperf3 --version 2>&1 | head -n1)"
    echo "iperf2: $(iperf -v 2>&1 | head -n1)"
    echo "nuttcp: $(nuttcp -V 2>&1 | head -n1)"
    echo "rounds=$ROUNDS duration=${DURATION}s gap=${GAP}s tools='$TOOLS' ports=$LH_PORT..$((NT_DATA_PORT + 3))"
} >"$LOGDIR/meta.txt"
sed 's/^/[perf] /' "$LOGDIR/meta.txt" >&2

# -------------------------------------------------------------- runs ----
# tool|setting label|extra client arguments
# (longhaul-plain follows longhaul, so that in every round the two run next to each other)
ALL_CONFIGS=(
    "longhaul|--tls|--tls"
    "longhaul-plain|defaults|"
    "iperf3|defaults|"
    "iperf3|-l 1M|-l 1M"
    "iperf2|defaults|"
    "iperf2|-l 1M|-l 1M"
    "nuttcp|defaults|"
    "nuttcp|-l1m|-l1m"
)
CONFIGS=()
for c in "${ALL_CONFIGS[@]}"; do want "${c%%|*}" && CONFIGS+=("$c"); done

printf '%s\n' "round	seq	tool	setting	streams	duration_s	gbps	sender_cpu_pct	sender_cpu_source	receiver_cpu_pct	client_cpu_pct_gnutime	retransmits	rc	log" >"$TSV"

num_or_na() { # print $1 if it is a finite number, else NA
    if [[ ${1:-} =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then printf '%s' "$1"; else printf NA; fi
}

SEQ=0
run_one() { # round tool setting extra streams
    local round=$1 tool=$2 setting=$3 extra=$4 p=$5
    local tag out err tf rc=0
    local -a cmd=() xargs=()
    SEQ=$((SEQ + 1))
    tag=$(printf 'r%d-%02d-%s-%s-P%d' "$round" "$SEQ" "$tool" "${setting//[^A-Za-z0-9]/}" "$p")
    out=$LOGDIR/$tag.out err=$LOGDIR/$tag.err tf=$LOGDIR/$tag.time
    [ -n "$extra" ] && read -r -a xargs <<<"$extra"
    case $tool in
        longhaul | longhaul-plain) cmd=("$LONGHAUL" perf "$HOST:$LH_PORT" -t "$DURATION" -P "$p" --json) ;;
        iperf3) cmd=(iperf3 -c "$HOST" -p "$I3_PORT" -t "$DURATION" -P "$p" --json) ;;
        iperf2) cmd=(iperf -c "$HOST" -p "$I2_PORT" -t "$DURATION" -P "$p" -y C) ;;
        nuttcp)
            cmd=(nuttcp -P "$NT_CTL_PORT" -p "$NT_DATA_PORT" -T "$DURATION" -fparse)
            [ "$p" -gt 1 ] && cmd+=(-N "$p")
            ;;
    esac
    cmd+=(${xargs[@]+"${xargs[@]}"})
    [ "$tool" = nuttcp ] && cmd+=("$HOST")
    printf '%s\n' "${cmd[*]}" >"$LOGDIR/$tag.cmd"

    # timeout kills the whole process group (time and the client) if a run hangs
    timeout -k 5 $((DURATION + 30)) /usr/bin/time -o "$tf" -f '%U %S %e' \
        "${cmd[@]}" >"$out" 2>"$err" </dev/null || rc=$?

    local gbps=NA cpu=NA src=NA rcpu=NA tcpu=NA retr=NA line
    # GNU time: last line "user sys elapsed" (a "Command exited..." line may precede it)
    line=$(tail -n1 "$tf" 2>/dev/null || true)
    tcpu=$(awk '$1 ~ /^[0-9.]+$/ && $2 ~ /^[0-9.]+$/ && $3 > 0 { printf "%.1f", ($1 + $2) / $3 * 100 }' <<<"$line" 2>/dev/null || true)
    tcpu=$(num_or_na "$tcpu")

    if [ "$rc" -eq 0 ]; then
        case $tool in
            longhaul | longhaul-plain)
                line=$(jq -r 'if .error != null or .summary == null then "NA NA NA NA" else
                    .summary as $s | [($s.bits_per_second // "NA"),
                     ($s.directions[0].cpu_sender_percent // $s.cpu_local_percent // "NA"),
                     ($s.directions[0].cpu_receiver_percent // $s.cpu_remote_percent // "NA"),
                     ($s.retransmits // "NA")] | map(tostring) | join(" ") end' "$out" 2>/dev/null || true)
                src=longhaul
                ;;
            iperf3)
                line=$(jq -r 'if .error != null or .end.sum_received == null then "NA NA NA NA" else
                    [(.end.sum_received.bits_per_second // "NA"),
                     (.end.cpu_utilization_percent.host_total // "NA"),
                     (.end.cpu_utilization_percent.remote_total // "NA"),
                     (.end.sum_sent.retransmits // "NA")] | map(tostring) | join(" ") end' "$out" 2>/dev/null || true)
                src=iperf3
                ;;
            iperf2)
                # CSV: date,src,sport,dst,dport,id,interval,bytes,bits_per_second.
                # Use the sum line (id -1) if there is one, else add up the streams.
                line=$(awk -F, 'NF >= 9 && $NF ~ /^[0-9]+$/ {
                        if ($6 == -1) { sum = $NF; have = 1 } else if (!have) { tot += $NF; n++ } }
                    END { if (have) print sum; else if (n) print tot; else print "NA" }' "$out" 2>/dev/null || true)
                line="$line $tcpu NA NA"
                src=gnutime
                ;;
            nuttcp)
                line=$(awk '/rate_Mbps=/ { r = c = x = t = "NA"
                        for (i = 1; i <= NF; i++) { split($i, kv, "=")
                            if (kv[1] == "rate_Mbps") r = kv[2] * 1e6
                            else if (kv[1] == "tx_cpu") c = kv[2]
                            else if (kv[1] == "rx_cpu") x = kv[2]
                            else if (kv[1] == "retrans") t = kv[2] }
                        res = r " " c " " x " " t }
                    END { print (res == "" ? "NA NA NA NA" : res) }' "$out" 2>/dev/null || true)
                src=nuttcp
                ;;
        esac
        local bps c x t
        read -r bps c x t <<<"${line:-NA NA NA NA}" || true
        bps=$(num_or_na "${bps:-}")
        [ "$bps" != NA ] && gbps=$(awk -v b="$bps" 'BEGIN { printf "%.3f", b / 1e9 }')
        cpu=$(num_or_na "${c:-}")
        [ "$cpu" != NA ] && cpu=$(awk -v c="$cpu" 'BEGIN { printf "%.1f", c }')
        rcpu=$(num_or_na "${x:-}")
        [ "$rcpu" != NA ] && rcpu=$(awk -v c="$rcpu" 'BEGIN { printf "%.1f", c }')
        retr=$(num_or_na "${t:-}")
    fi
    [ "$cpu" = NA ] && src=NA
    if [ "$gbps" = NA ]; then
        log "  FAILED $tool $setting P=$p (rc=$rc); see $out / $err:"
        tail -n 3 "$err" 2>/dev/null | sed 's/^/[perf]     /' >&2 || true
    else
        log "  $tool $setting P=$p: $gbps Gbit/s, sender CPU $cpu% ($src), client CPU by time $tcpu%"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$round" "$SEQ" "$tool" "$setting" "$p" "$DURATION" "$gbps" "$cpu" "$src" "$rcpu" \
        "$tcpu" "$retr" "$rc" "${out#"$ROOT"/}" >>"$TSV"
}

NCONF=${#CONFIGS[@]}
for round in $(seq "$ROUNDS"); do
    log "round $round/$ROUNDS"
    for i in $(seq 0 $((NCONF - 1))); do
        IFS='|' read -r tool setting extra <<<"${CONFIGS[$(((i + round - 1) % NCONF))]}"
        counts=("${STREAM_COUNTS[@]}")
        # alternate which stream count goes first, too
        [ $(((round + i) % 2)) -eq 0 ] && counts=("${STREAM_COUNTS[1]}" "${STREAM_COUNTS[0]}")
        for p in "${counts[@]}"; do
            run_one "$round" "$tool" "$setting" "$extra" "$p"
            sleep "$GAP"
        done
    done
done

# ----------------------------------------------------------- summary ----
ROWS=$(printf '%s\n' "${CONFIGS[@]}" | cut -d'|' -f1,2 | paste -sd';' -)

echo
echo "### longhaul (TLS and plaintext) vs iperf3 / iperf2 / nuttcp on loopback (${ROUNDS} round(s) x ${DURATION}s, medians)"
echo
sed 's/^/    /' "$LOGDIR/meta.txt"
echo
awk -F'\t' -v rows="$ROWS" '
function median(list,    a, n, i, j, t) {
    n = split(list, a, " ")
    if (n == 0) return "NA"
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
}
function f(x, fmt) { return (x == "NA") ? "NA" : sprintf(fmt, x) }
function ratio(a, b) { return (a == "NA" || b == "NA" || b + 0 == 0) ? "NA" : a / b }
function isnum(x) { return x ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
NR == 1 { next }
{
    k = $3 "|" $4 "|" $5
    runs[k]++
    if (isnum($7)) { ok[k]++; g[k] = g[k] " " $7 }
    if (isnum($8)) c[k] = c[k] " " $8
    if (isnum($11)) tc[k] = tc[k] " " $11
    if (isnum($7) && isnum($8) && $7 > 0) cpg[k] = cpg[k] " " ($8 / $7)
    if (isnum($7) && isnum($10) && $7 > 0) rpg[k] = rpg[k] " " ($10 / $7)
}
function at(A, r, s) { return r ? A[r, s] : "NA" } # NA for a row that was not run (r = 0)
function met(x, t) { return (x == "NA") ? "" : (x + 0 >= t ? " (met)" : " (NOT met)") }
END {
    nr = split(rows, R, ";")
    for (r = 1; r <= nr; r++) for (s = 1; s <= 2; s++) {
        k = R[r] "|" (s == 1 ? 1 : 4)
        G[r, s] = median(g[k]); C[r, s] = median(c[k]); T[r, s] = median(tc[k]); P[r, s] = median(cpg[k])
        RP[r, s] = median(rpg[k])
        O[r, s] = (ok[k] + 0) "/" (runs[k] + 0)
    }
    # rows by name (only the selected TOOLS are there): lh = longhaul (TLS), lhp = longhaul-plain,
    # i3 = iperf3 -l 1M, i3d = iperf3 defaults; 0 = not run
    lh = lhp = i3 = i3d = 0
    for (r = 1; r <= nr; r++) {
        split(R[r], tv, "|")
        if (tv[1] == "longhaul") lh = r
        if (tv[1] == "longhaul-plain") lhp = r
        if (tv[1] == "iperf3" && tv[2] == "-l 1M") i3 = r
        if (tv[1] == "iperf3" && tv[2] == "defaults") i3d = r
    }
    label["longhaul|--tls"] = "longhaul --tls (TLS 1.3 data)"
    label["longhaul-plain|defaults"] = "longhaul defaults (plaintext data, TLS control, zero-copy)"
    print "| tool, setting | 1 stream Gbit/s | 4 streams Gbit/s | sender CPU % (1 / 4) | sender CPU % per Gbit/s (1 / 4) | ratio to longhaul TLS (1 / 4) | client CPU % by GNU time (1 / 4) | runs ok (1 / 4) |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|"
    for (r = 1; r <= nr; r++) {
        split(R[r], tv, "|")
        name = (R[r] in label) ? label[R[r]] : tv[1] " " tv[2]
        printf "| %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s |\n", name,
            f(G[r, 1], "%.2f"), f(G[r, 2], "%.2f"), f(C[r, 1], "%.0f"), f(C[r, 2], "%.0f"),
            f(P[r, 1], "%.2f"), f(P[r, 2], "%.2f"),
            f(ratio(G[r, 1], at(G, lh, 1)), "%.2f"), f(ratio(G[r, 2], at(G, lh, 2)), "%.2f"),
            f(T[r, 1], "%.0f"), f(T[r, 2], "%.0f"), O[r, 1], O[r, 2]
    }
    print ""
    if (lh && lhp) {
        t1 = ratio(G[lh, 1], G[lhp, 1]); t4 = ratio(G[lh, 2], G[lhp, 2])
        printf "- throughput TLS / plaintext (longhaul / longhaul-plain, issue 4 target >= 0.8): 1 stream **%s**%s, 4 streams **%s**%s\n",
            f(t1, "%.2fx"), met(t1, 0.8), f(t4, "%.2fx"), met(t4, 0.8)
        printf "- sender CPU %% per Gbit/s, TLS / plaintext: 1 stream %s / %s = **%s**, 4 streams %s / %s = **%s**\n",
            f(P[lh, 1], "%.2f"), f(P[lhp, 1], "%.2f"), f(ratio(P[lh, 1], P[lhp, 1]), "%.2fx"),
            f(P[lh, 2], "%.2f"), f(P[lhp, 2], "%.2f"), f(ratio(P[lh, 2], P[lhp, 2]), "%.2fx")
        printf "- receiver (server) CPU %% per Gbit/s, TLS / plaintext: 1 stream %s / %s = **%s**, 4 streams %s / %s = **%s**\n",
            f(RP[lh, 1], "%.2f"), f(RP[lhp, 1], "%.2f"), f(ratio(RP[lh, 1], RP[lhp, 1]), "%.2fx"),
            f(RP[lh, 2], "%.2f"), f(RP[lhp, 2], "%.2f"), f(ratio(RP[lh, 2], RP[lhp, 2]), "%.2fx")
    }
    if (lh && i3) {
        printf "- throughput longhaul TLS / iperf3 -l 1M: 1 stream **%s**, 4 streams **%s**",
            f(ratio(G[lh, 1], G[i3, 1]), "%.2fx"), f(ratio(G[lh, 2], G[i3, 2]), "%.2fx")
        if (lhp) printf " (plaintext: %s, %s)", f(ratio(G[lhp, 1], G[i3, 1]), "%.2fx"), f(ratio(G[lhp, 2], G[i3, 2]), "%.2fx")
        print ""
    }
    npeer = 0
    for (s = 1; s <= 2; s++) {
        best[s] = "NA"; bn[s] = "none"
        for (r = 1; r <= nr; r++) {
            if (R[r] ~ /^longhaul/) continue
            if (s == 1) npeer++
            if (G[r, s] != "NA" && (best[s] == "NA" || G[r, s] > best[s])) { best[s] = G[r, s]; bn[s] = R[r]; gsub(/\|/, " ", bn[s]) }
        }
    }
    if (lh && npeer)
        printf "- throughput longhaul TLS / best peer at its best setting: 1 stream **%s** (vs %s, %s Gbit/s), 4 streams **%s** (vs %s, %s Gbit/s)\n",
            f(ratio(G[lh, 1], best[1]), "%.2fx"), bn[1], f(best[1], "%.2f"),
            f(ratio(G[lh, 2], best[2]), "%.2fx"), bn[2], f(best[2], "%.2f")
    if (lh && i3 && i3d)
        printf "- sender CPU per Gbit/s longhaul TLS / iperf3 -l 1M: 1 stream **%s**, 4 streams **%s** (vs iperf3 defaults: %s, %s; below 1 = longhaul cheaper)\n",
            f(ratio(P[lh, 1], P[i3, 1]), "%.2fx"), f(ratio(P[lh, 2], P[i3, 2]), "%.2fx"),
            f(ratio(P[lh, 1], P[i3d, 1]), "%.2fx"), f(ratio(P[lh, 2], P[i3d, 2]), "%.2fx")
}' "$TSV"
echo
echo "Medians over rounds; CPU % per Gbit/s is the median of per-run ratios; 100% CPU = one core."
echo "Sender CPU: longhaul/iperf3/nuttcp report their own, iperf2 is GNU time of the client."
echo "longhaul = perf --tls, TLS 1.3 data (encryption in user space: no zero-copy send or MSG_TRUNC receive);"
echo "longhaul-plain = perf at its defaults: plaintext data streams (zero-copy), TLS control, same server."
echo "Raw results: ${TSV#"$ROOT"/} (tool outputs in ${LOGDIR#"$ROOT"/}/)"
