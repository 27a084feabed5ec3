#!/usr/bin/env bash
# bench/wan-startup.sh - start-up on long paths (issue 15): `longhaul cp` of one big file over
# `longhaul wan` at 0 ms and at a long RTT, alternating, and the ratio of the rates; plus a timeline
# of each copy (when the first data arrived, when the copy reached its full rate, when it ended).
#
# What it does
#   * copies BIN (and OLD_BIN when set) into a run directory (it does not build: build first);
#   * makes one SIZE file of incompressible bytes in /dev/shm (AES-256-CTR keystream of a random key);
#   * starts one emulator, by PID: `longhaul wan up --name NAME --rate RATE --mtu MTU --queue QUEUE`,
#     one longhaul server per binary in host b (`serve --export bench=DST`, TLS, a token), and runs
#     ROUNDS rounds; each round runs every binary at every RTT in RTTS (`wan set --rtt` between runs;
#     the order of the binaries flips every round), `cp --force --json SRC longhaul://B:PORT/bench/`
#     from host a. Before each run the kernel's cached TCP metrics of both hosts are flushed
#     (`ip tcp_metrics flush`), so no run inherits the ssthresh or RTT of the one before.
#   * timeline: while a copy runs, a sampler reads host b's interface counters every 5 ms
#     (/proc/SERVER_PID/net/dev) and reports, from the moment the client was started:
#       first  the first 256 KiB of data received (the handshakes move far less)
#       full   the start of the first 100 ms in which host b received at least 90% of the copy's
#              steady rate (the median of its 100 ms rates between 20% and 80% of the bytes)
#       end    the client's exit
#       lost   end - bytes / steady rate: the seconds this copy lost against running at its steady
#              rate from the first instant (set-up, ramp, the end's round trips)
#       last   the last data byte in (all but 64 KiB of what host b received)
#       tail   last - the time 99% was in, less what the last 1% takes at the steady rate: the
#              streams finishing their last chunks one after another
#       drain  end - last: the receiver working off what sits in its socket buffers (Recv-Q; its
#              windows let it fall far behind on a long path) and the final messages
#     and the CPU seconds (user + system) the client, the server and the emulator used in the run.
#   * prints one line per run and, per binary, the medians and the ratio rate(RTT) / rate(0 ms)
#     for each RTT; with OLD_BIN, both binaries. MB/s = SIZE / the client's wall time (1 MB = 1e6).
#     "round trips more" = (median seconds at RTT - median seconds at the first RTT) / RTT: with a
#     tiny file (SIZE=1K) that is the number of round trips of set-up, handshakes to the last answer.
#   * cleans up on exit by PID (servers, the emulator, the sampler), `wan down`, the data.
#
# How to run (root; build first: cargo build --release)
#   bash bench/wan-startup.sh
#   OLD_BIN=/tmp/longhaul-before ROUNDS=3 bash bench/wan-startup.sh     # before/after, alternating
#   SIZE=1G RTTS="0 120" ROUNDS=1 bash bench/wan-startup.sh              # a quick look
#   SIZE=1K ROUNDS=7 OLD_BIN=... bash bench/wan-startup.sh               # round trips of set-up
# Environment: BIN (target/release/longhaul), OLD_BIN (unset), RATE (2gbit), MTU (9000),
#   QUEUE (50ms), RTTS ("0 120", ms; the first is the reference), ROUNDS (3), SIZE (4G),
#   CP_ARGS (""), OLD_CP_ARGS (CP_ARGS: the old binary's; with OLD_BIN=BIN, an A/B of options),
#   SS (seconds: with KEEP, `ss -tin` of host a's and `ss -tn` of host b's streams every SS s), NAME (lhst<pid>), RUN_TIMEOUT (120 s), KEEP (a directory: keep each run's samples,
#   "seconds bytes" lines, and cp's JSON there).

set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/longhaul}
OLD_BIN=${OLD_BIN:-}
RATE=${RATE:-2gbit}
MTU=${MTU:-9000}
QUEUE=${QUEUE:-50ms}
RTTS=${RTTS:-0 120}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-4G}
CP_ARGS=${CP_ARGS:-}
NAME=${NAME:-lhst$$}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
for c in jq python3 ip openssl timeout setsid; do
    command -v "$c" >/dev/null || { echo "$c is needed" >&2; exit 1; }
done

RUN=$(mktemp -d /tmp/lh-startup.XXXXXX)
SHM=$(mktemp -d /dev/shm/lh-startup.XXXXXX)
mkdir -p "$SHM/src" "$SHM/dst" "$RUN/state"
chmod 700 "$RUN/state"
cp "$BIN" "$RUN/new"
BINS=(new)
if [ -n "$OLD_BIN" ]; then cp "$OLD_BIN" "$RUN/old"; BINS=(new old); fi
declare -A PORT=([new]=5310 [old]=5311)
declare -A SRV=()
WAN_PID=''
SAMPLER=''

stop_pid() { # pid: TERM, up to 5 s, then KILL
    local pid=$1 i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    trap - EXIT INT TERM
    stop_pid "$SAMPLER"
    local b
    for b in "${!SRV[@]}"; do stop_pid "${SRV[$b]}"; done
    stop_pid "$WAN_PID"
    "$RUN/new" wan down --name "$NAME" >/dev/null 2>&1 || true
    rm -rf "$RUN" "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bytes_of() { numfmt --from=iec "$1"; }
BYTES=$(bytes_of "$SIZE")
openssl enc -aes-256-ctr -pass "pass:$RANDOM$RANDOM$RANDOM" -nosalt -pbkdf2 </dev/zero 2>/dev/null |
    head -c "$BYTES" >"$SHM/src/big.bin" || true
[ "$(stat -c %s "$SHM/src/big.bin")" = "$BYTES" ] || { echo "could not make the $SIZE file" >&2; exit 1; }

"$RUN/new" wan up --name "$NAME" --rate "$RATE" --mtu "$MTU" --queue "$QUEUE" --json \
    >"$RUN/wan.out" 2>"$RUN/wan.err" </dev/null &
WAN_PID=$!
for _ in $(seq 300); do grep -q '"hosts"' "$RUN/wan.out" 2>/dev/null && break; sleep 0.1; done
grep -q '"hosts"' "$RUN/wan.out" || { echo "emulator did not come up: $(cat "$RUN/wan.err")" >&2; exit 1; }
HOST_B=$(jq -r '.hosts.b' "$RUN/wan.out")

export LONGHAUL_TRUST LONGHAUL_TOKEN
LONGHAUL_TRUST=$("$RUN/new" id "$RUN/state")
LONGHAUL_TOKEN=$("$RUN/new" token create --state-dir "$RUN/state" --export '*:rw' --note wan-startup 2>/dev/null)
for b in "${BINS[@]}"; do
    setsid ip netns exec "$NAME-b" "$RUN/$b" serve --listen "$HOST_B:${PORT[$b]}" --state-dir "$RUN/state" \
        --export "bench=$SHM/dst" >"$RUN/server-$b.log" 2>&1 </dev/null &
    SRV[$b]=$!
done
for b in "${BINS[@]}"; do
    for _ in $(seq 100); do
        [ -n "$(ip netns exec "$NAME-b" ss -Htln "( sport = :${PORT[$b]} )")" ] && break
        sleep 0.1
    done
done

# The sampler: host b's received bytes every 5 ms until told to stop (SIGTERM), then the timeline.
cat >"$RUN/sampler.py" <<'EOF'
import signal, sys, time
pid, t0, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def rx():
    best = 0
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f.readlines()[2:]:
            name, rest = line.split(":", 1)
            if name.strip() != "lo":
                best = max(best, int(rest.split()[0]))
    return best
samples, stop = [], []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
base = rx()
while not stop:
    samples.append((time.time() - t0, rx() - base))
    time.sleep(0.005)
with open(out, "w") as f:
    for t, b in samples:
        f.write(f"{t:.4f} {b}\n")
EOF
cat >"$RUN/timeline.py" <<'EOF'
import sys
path, end = sys.argv[1], float(sys.argv[2])
try:
    s = [tuple(map(float, l.split())) for l in open(path)]
except OSError:  # a copy that ended before the sampler was up
    s = []
total = s[-1][1] if s else 0
first = next((t for t, b in s if b >= 256 * 1024), float("nan"))
# 100 ms rates
rates, j = [], 0
for i, (t, b) in enumerate(s):
    while j < len(s) and s[j][0] < t + 0.1:
        j += 1
    if j >= len(s):
        break
    rates.append((t, b, (s[j][1] - b) / (s[j][0] - t)))
mid = sorted(r for t, b, r in rates if 0.2 * total <= b <= 0.8 * total)
steady = mid[len(mid) // 2] if mid else float("nan")
if steady != steady or steady <= 0:
    print("nan nan nan nan nan nan nan")
    sys.exit(0)
full = next((t for t, b, r in rates if r >= 0.9 * steady), float("nan"))
lost = end - total / steady if steady == steady and steady > 0 else float("nan")
# The end: t99 = 99% of the bytes in; last = all but 64 KiB in; tail = t99 to last less what
# the last 1% takes at the steady rate; drain = last to the client's exit (the receiver's
# backlog in its socket buffers, the final messages).
t99 = next(t for t, b in s if b >= 0.99 * total)
last = next(t for t, b in s if b >= total - 65536)
tail = (last - t99) - (total - next(b for t, b in s if t >= t99)) / steady
print(f"{first:.3f} {full:.3f} {steady * 8 / 1e9:.3f} {lost:.3f} {last:.3f} {tail:.3f} {end - last:.3f}")
EOF

# CPU seconds (user + system) of a process, in clock ticks; the client's from bash's `time`.
HZ=$(getconf CLK_TCK)
cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
TIMEFORMAT='%U %S'
median() { tr ' ' '\n' | grep -v -e '^$' -e NA -e nan | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
read -r -a XARGS_new <<<"$CP_ARGS" || true
read -r -a XARGS_old <<<"${OLD_CP_ARGS-$CP_ARGS}" || true
declare -A MBS SECS FIRST FULL LOST TAIL DRAIN
echo "# wan start-up, $(date -u '+%Y-%m-%d %H:%M') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')," \
    "wan up --rate $RATE --mtu $MTU --queue $QUEUE, RTTs $RTTS ms, $SIZE file /dev/shm -> /dev/shm, $ROUNDS round(s), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# buffers: rmem_max $(sysctl -n net.core.rmem_max) wmem_max $(sysctl -n net.core.wmem_max) tcp_rmem '$(sysctl -n net.ipv4.tcp_rmem | tr '\t' ' ')' tcp_wmem '$(sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ')'"
echo "# bin rtt: MB/s seconds | first-data full-rate (s from start) | steady Gbit/s | lost s | streams"
for r in $(seq "$ROUNDS"); do
    order=("${BINS[@]}")
    if [ $((r % 2)) -eq 0 ] && [ ${#BINS[@]} -eq 2 ]; then order=(old new); fi
    for b in "${order[@]}"; do
        for rtt in $RTTS; do
            "$RUN/new" wan set --name "$NAME" --rtt "${rtt}ms" >/dev/null
            ip netns exec "$NAME-a" ip tcp_metrics flush all 2>/dev/null || true
            ip netns exec "$NAME-b" ip tcp_metrics flush all 2>/dev/null || true
            rm -rf "${SHM:?}/dst/"* "$SHM"/dst/.[!.]* 2>/dev/null || true
            sleep 1
            rm -f "$RUN/samples"
            t0=$(date +%s.%N)
            python3 "$RUN/sampler.py" "${SRV[$b]}" "$t0" "$RUN/samples" &
            SAMPLER=$!
            SSPID=''
            if [ -n "${KEEP:-}" ] && [ -n "${SS:-}" ]; then
                mkdir -p "$KEEP"
                ( while :; do
                    echo "@ $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')"
                    ip netns exec "$NAME-a" ss -Htin "( dport = :${PORT[$b]} )"
                    echo "@b"
                    ip netns exec "$NAME-b" ss -Htn "( sport = :${PORT[$b]} )"
                    sleep "$SS"
                done ) >"$KEEP/$b-${rtt}ms-r$r.ss" 2>/dev/null &
                SSPID=$!
            fi
            XA=(${XARGS_new[@]+"${XARGS_new[@]}"})
            [ "$b" = new ] || XA=(${XARGS_old[@]+"${XARGS_old[@]}"})
            s0=$(cpu_of "${SRV[$b]}"); w0=$(cpu_of "$WAN_PID")
            rc=0
            { time timeout "$RUN_TIMEOUT" ip netns exec "$NAME-a" "$RUN/$b" cp --force --json ${XA[@]+"${XA[@]}"} \
                "$SHM/src/big.bin" "longhaul://$HOST_B:${PORT[$b]}/bench/" >"$RUN/cp.json" 2>"$RUN/cp.err" || rc=$?; } 2>"$RUN/cp.time"
            cpu_s=$(awk -v a="$s0" -v b="$(cpu_of "${SRV[$b]}")" -v hz="$HZ" 'BEGIN { printf "%.2f", (b - a) / hz }')
            cpu_w=$(awk -v a="$w0" -v b="$(cpu_of "$WAN_PID")" -v hz="$HZ" 'BEGIN { printf "%.2f", (b - a) / hz }')
            cpu_c=$(awk '{ printf "%.2f", $1 + $2 }' "$RUN/cp.time")
            t1=$(date +%s.%N)
            stop_pid "$SAMPLER"; SAMPLER=''
            [ -z "$SSPID" ] || stop_pid "$SSPID"
            [ -f "$RUN/samples" ] || : >"$RUN/samples"
            wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
            if [ "$rc" -ne 0 ] || ! cmp -s "$SHM/src/big.bin" "$SHM/dst/big.bin"; then
                echo "$b ${rtt}ms: NA (exit $rc: $(tail -n 2 "$RUN/cp.err" | tr '\n' ' '))"
                continue
            fi
            if [ -n "${KEEP:-}" ]; then
                mkdir -p "$KEEP"
                cp "$RUN/samples" "$KEEP/$b-${rtt}ms-r$r.samples"
                cp "$RUN/cp.json" "$KEEP/$b-${rtt}ms-r$r.json"
                cp "$RUN/cp.err" "$KEEP/$b-${rtt}ms-r$r.err"
                cp "$RUN/server-$b.log" "$KEEP/$b-${rtt}ms-r$r.server.log" 2>/dev/null || true
            fi
            read -r first full steady lost last tail drain < <(python3 "$RUN/timeline.py" "$RUN/samples" "$wall")
            mbs=$(awk -v n="$BYTES" -v s="$wall" 'BEGIN { printf "%.1f", n / s / 1e6 }')
            streams=$(jq -r '.. | .streams? // empty' "$RUN/cp.json" 2>/dev/null | head -n1)
            echo "$b ${rtt}ms: $mbs MB/s ${wall}s | first $first full $full | steady $steady | lost $lost | last byte $last tail $tail drain $drain | streams ${streams:-?} | CPU s client $cpu_c server $cpu_s wan $cpu_w"
            MBS[$b,$rtt]="${MBS[$b,$rtt]:-} $mbs"
            SECS[$b,$rtt]="${SECS[$b,$rtt]:-} $wall"
            FIRST[$b,$rtt]="${FIRST[$b,$rtt]:-} $first"
            FULL[$b,$rtt]="${FULL[$b,$rtt]:-} $full"
            LOST[$b,$rtt]="${LOST[$b,$rtt]:-} $lost"
            TAIL[$b,$rtt]="${TAIL[$b,$rtt]:-} $tail"
            DRAIN[$b,$rtt]="${DRAIN[$b,$rtt]:-} $drain"
        done
    done
done
echo
echo "| binary | RTT | MB/s (median) | runs | seconds (median) | round trips more than at ${RTTS%% *} ms | first data (s) | full rate (s) | lost (s) | tail (s) | drain (s) | rate / rate at ${RTTS%% *} ms |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
ref=${RTTS%% *}
for b in "${BINS[@]}"; do
    base=$(echo "${MBS[$b,$ref]:-}" | median)
    base_s=$(echo "${SECS[$b,$ref]:-}" | median)
    for rtt in $RTTS; do
        m=$(echo "${MBS[$b,$rtt]:-}" | median)
        secs=$(echo "${SECS[$b,$rtt]:-}" | median)
        ratio=$(awk -v m="$m" -v z="$base" 'BEGIN { if (z > 0 && m > 0) printf "%.3f", m / z; else print "NA" }')
        trips=$(awk -v s="$secs" -v z="$base_s" -v r="$rtt" 'BEGIN { if (r > 0 && s > 0 && z > 0) printf "%.1f", (s - z) / (r / 1000); else print "-" }')
        echo "| $b | $rtt ms | $m | ${MBS[$b,$rtt]:-} | $secs | $trips | $(echo "${FIRST[$b,$rtt]:-}" | median) | $(echo "${FULL[$b,$rtt]:-}" | median) | $(echo "${LOST[$b,$rtt]:-}" | median) | $(echo "${TAIL[$b,$rtt]:-}" | median) | $(echo "${DRAIN[$b,$rtt]:-}" | median) | $ratio |"
    done
done
