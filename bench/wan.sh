#!/usr/bin/env bash
# bench/wan.sh - longhaul against its peers over the WAN emulator (`longhaul wan`), issue 5:
# memory-to-memory and file transfers at one bottleneck rate R across RTT / loss conditions, every
# tool in the same run, alternating, with the issue's targets computed from the table.
#
# What it does
#   * copies target/release/longhaul (or LONGHAUL_BIN) into a run directory at the start, so a
#     rebuild during the run cannot change the binary under it (it does NOT build: build first);
#   * makes the data once, in /dev/shm: one SIZE file of incompressible bytes (AES-256-CTR keystream
#     of a random key; /dev/urandom without openssl) and a tree of NFILES files of 1-64 KiB (uniform,
#     random content) in NFILES/100 directories (1..100);
#   * for every condition in CONDITIONS starts one emulator, by PID:
#         longhaul wan up --name WAN_NAME --rtt RTT --loss LOSS --rate RATE --mtu MTU --queue QUEUE --json
#     (hosts a = 198.18.0.1 and b = 198.18.0.2, addresses taken from its JSON line), starts the
#     servers in host b, runs ROUNDS rounds in which every tool runs once from host a to host b (the
#     order rotated every round and every condition, so drift hits all tools alike), then stops the
#     servers and the emulator (SIGTERM by PID; `wan down` if its namespaces outlive it). A fresh
#     emulator per condition means each condition starts with an empty queue and its own parameters.
#     Conditions: NAME = RTTms or RTTms-LOSS (e.g. 80ms, 80ms-1e-5, 200ms-1e-3; loss per direction),
#     and `sat` = 540 ms, loss 1e-4 (a geostationary satellite hop).
#   * tools (client in host a with `ip netns exec`; servers in host b):
#       lh-perf       longhaul perf HOSTB -t PERF_SECONDS --json LH_PERF_ARGS     (default `-P auto`)
#                     MB/s = summary.bits_per_second (what the receiver got) / 8e6; seconds = the
#                     tool's own. Before the first run the arguments are tried against nothing (in a
#                     fresh empty network namespace): if the binary refuses them (exit 2, a usage
#                     error), every lh-perf run is NA with clap's message and the summary says so.
#       lh-cp         longhaul cp --force --json LH_CP_ARGS SHM/src/big.bin longhaul://HOSTB:5310/bench/
#                     (SIZE file, /dev/shm -> /dev/shm); MB/s = SIZE / wall time of the client
#       lh-cp-rate    the same with `--rate RATE`: told the path's rate, cp sizes its streams for it
#                     (instead of for 10 Gbit/s) and paces each to its share
#       lh-losf       longhaul cp -r --force --json LH_CP_ARGS SHM/src/small longhaul://HOSTB:5310/bench/
#                     (the tree); MB/s = tree bytes / wall; files/s kept in the TSV and a table
#       iperf3-1      iperf3 -c HOSTB -t PERF_SECONDS -J           (1 stream, the system's default CC)
#       iperf3-P8     iperf3 -c HOSTB -t PERF_SECONDS -J -P 8
#       iperf3-cubic  iperf3 -c HOSTB -t PERF_SECONDS -J -C cubic  (1 CUBIC stream, the issue's reference)
#                     iperf3 MB/s = end.sum_received.bits_per_second / 8e6 (receiver side); a fresh
#                     one-off server (`iperf3 -s -1`) per run
#       gridftp       globus-url-copy GUC_ARGS file://SHM/src/big.bin ftp://HOSTB:2811/SHM/dst/big.bin
#                     GUC_ARGS default `-p 4 -tcp-bs 4M`: 4 parallel streams and the 4 MiB TCP buffer
#                     that ../shared/peers/servers.sh lists for its GridFTP client (SO_SNDBUF/RCVBUF set
#                     explicitly turns the kernel's autotuning off for those sockets; set GUC_ARGS=
#                     "-p 4" to compare with autotuning). Server as in servers.sh: globus-gridftp-server
#                     -aa -anonymous-user root -allow-root, control and data interface = HOSTB. It needs
#                     its own address to resolve, which nothing does inside the namespace, so it runs
#                     under `unshare -m` with a copy of /etc/hosts naming HOSTA/HOSTB bind-mounted on
#                     /etc/hosts (the host's /etc/hosts is not touched).
#       gridftp-losf  globus-url-copy GUC_ARGS -r -cd -pp -cc 4 file://SHM/src/small/ ftp://HOSTB:2811/SHM/dst/small/
#                     (the tree, as servers.sh suggests for trees: pipelining, 4 files at once)
#       rsync-losf    rsync -a RSYNC_ARGS SHM/src/small rsync://HOSTB:8730/data/   (the tree)
#       rsync         rsync -a RSYNC_ARGS SHM/src/big.bin rsync://HOSTB:8730/data/  (daemon as in
#                     servers.sh: --no-detach, module `data` = SHM/dst, no chroot, uid/gid root)
#     The longhaul server (one per condition) is `longhaul serve --listen HOSTB:5310 --state-dir DIR
#     --export bench=SHM/dst`, TLS 1.3 with the defaults (it fdatasyncs every file; on tmpfs that is
#     cheap). Its identity and a token are made once (`longhaul id DIR`, `longhaul token create
#     --state-dir DIR --export '*:rw'`) and given to the clients as LONGHAUL_TRUST / LONGHAUL_TOKEN,
#     as in bench/transfer.sh. If the server has died before a longhaul run it is restarted (noted).
#   * every run is wrapped in `timeout RUN_TIMEOUT`; a run that times out, exits non-zero or fails its
#     check is NA. Checks: lh-cp/gridftp/rsync: size and `cmp` of the destination (and longhaul's own
#     verified=true, no failures); lh-losf: the list of relative paths and sizes equals the source's
#     (stray temp files fail it), `cmp` of 20 sample files, verified=true. The destination is emptied
#     before and after every run.
#   * TSV `seconds`: the tool's own test time for lh-perf/iperf3, the client's wall time for copies.
#   * per run, also: the forwarder's CPU use during the run (fwd_cpu_pct, 100 = one core: if it is
#     near 100-200 the emulator, not the tool, may be the limit), and in the note the min RTT,
#     retransmits and (longhaul) the stream count and limit verdict the tool reported.
#   * one TSV line per run: bench/results/wan-<date>.tsv; tool outputs, server and emulator logs in
#     bench/results/wan-<date>.logs/; the summary (also printed) in bench/results/wan-<date>.md:
#     a table of medians (rows = tools, columns = conditions, MB/s, 1 MB = 1e6 bytes), lh-losf files/s,
#     and the issue's targets, computed from the table:
#       lh-cp at 80ms-1e-5 / R                           >= 0.9
#       lh-cp at 120ms / lh-cp at 0ms                    >= 0.95
#       lh-cp (and lh-perf) at sat / iperf3-cubic at sat >= 10  (one CUBIC stream, as the issue
#                                                        says; iperf3-1 uses the system default CC,
#                                                        shown too)
#     plus the emulator's own counters (packets, losses, queue drops) per condition.
#   * socket buffer caps: the run uses the host's net.core.rmem_max / wmem_max and net.ipv4.tcp_rmem /
#     tcp_wmem as they are (new namespaces copy tcp_rmem/tcp_wmem from the host when they are made);
#     both the host's values and those in effect inside the namespaces go into the header. With
#     RAISE_BUFFERS=1 the host's four are raised to 256 MiB (tcp_*: "4096 131072|16384 268435456")
#     before the first emulator (rmem_max/wmem_max are global; tcp_rmem/tcp_wmem are set inside each
#     namespace too) and restored on exit.
#   * cleans up on exit, error or Ctrl-C (trap): every process it started, by PID (servers run under
#     setsid and are stopped as their own process group, which takes forked session children with
#     them), the emulator, its namespaces, the data in /dev/shm, the run directory; and the buffer
#     sysctls if it raised them. It never kills by name.
#
# How to run (root; build first: cargo build --release)
#   bash bench/wan.sh                        # everything: 7 conditions x 8 tools, ROUNDS=1, ~20-30 min
#   DRY_RUN=1 bash bench/wan.sh              # only the time estimate for these settings
#   ROUNDS=3 CONDITIONS="80ms-1e-5 sat" TOOLS="lh-cp iperf3-cubic" bash bench/wan.sh
#   RATE=500mbit SIZE=200M NFILES=200 PERF_SECONDS=3 CONDITIONS="0ms 80ms-1e-5" LH_PERF_ARGS='-P 4' \
#     bash bench/wan.sh                      # smoke run, ~2 minutes
# The time estimate is printed at the start (long RTTs need seconds of slow start; single-stream tools
# are bounded by tcp_wmem's max / RTT, so rsync at `sat` will usually hit RUN_TIMEOUT and be NA).
#
# Environment
#   RATE (2gbit: bottleneck per direction, decimal; k/m/g/t with optional `bit`)  MTU (9000)
#   QUEUE (50ms: drop-tail queue as time at RATE)  WAN_EXTRA (more `wan up` options, e.g. "--jitter 1ms")
#   CONDITIONS ("0ms 0ms-1e-5 80ms 80ms-1e-5 120ms 120ms-1e-5 sat")
#   TOOLS ("lh-perf lh-cp lh-cp-rate lh-losf iperf3-1 iperf3-P8 iperf3-cubic gridftp gridftp-losf rsync
#          rsync-losf")
#   ROUNDS (1)  PERF_SECONDS (15)  SIZE (2G: binary, K/M/G/T or bytes)  NFILES (2000)
#   RUN_TIMEOUT (120, seconds per run)  GAP (1, seconds of pause before each run)
#   LH_PERF_ARGS (-P auto)  LH_CP_ARGS ("")  GUC_ARGS (-p 4 -tcp-bs 4M)  RSYNC_ARGS ("")
#   RAISE_BUFFERS (0; 1 = socket buffer caps to 256 MiB for the run, restored on exit)
#   WAN_NAME (lhw<pid>: the namespaces are WAN_NAME-a and WAN_NAME-b; at most 12 characters)
#   LONGHAUL_BIN (the binary to copy; default target/release/longhaul)
#   PEERS_DIR (../shared/peers relative to the repository: setup.sh installs missing peers)
#   DRY_RUN=1 (print the time estimate and stop before making data or starting anything)

set -euo pipefail

RATE=${RATE:-2gbit}
MTU=${MTU:-9000}
QUEUE=${QUEUE:-50ms}
WAN_EXTRA=${WAN_EXTRA:-}
CONDITIONS=${CONDITIONS:-0ms 0ms-1e-5 80ms 80ms-1e-5 120ms 120ms-1e-5 sat}
TOOLS=${TOOLS:-lh-perf lh-cp lh-cp-rate lh-losf iperf3-1 iperf3-P8 iperf3-cubic gridftp gridftp-losf rsync rsync-losf}
ROUNDS=${ROUNDS:-1}
PERF_SECONDS=${PERF_SECONDS:-15}
SIZE=${SIZE:-2G}
NFILES=${NFILES:-2000}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
GAP=${GAP:-1}
LH_PERF_ARGS=${LH_PERF_ARGS--P auto}
LH_CP_ARGS=${LH_CP_ARGS:-}
GUC_ARGS=${GUC_ARGS--p 4 -tcp-bs 4M}
RSYNC_ARGS=${RSYNC_ARGS:-}
RAISE_BUFFERS=${RAISE_BUFFERS:-0}
WAN_NAME=${WAN_NAME:-lhw$$}
LH_PORT=5310 I3_PORT=5201 GFTP_PORT=2811 RSYNC_PORT=8730
BIG_BUF=268435456

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-$(cd "$ROOT/.." && pwd)/shared/peers}
RESULTS_DIR=$ROOT/bench/results
STAMP=$(date +%Y%m%d-%H%M%S)
TSV=$RESULTS_DIR/wan-$STAMP.tsv
LOGDIR=$RESULTS_DIR/wan-$STAMP.logs
SUMMARY=$RESULTS_DIR/wan-$STAMP.md

log() { printf '[wan] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
now() { date +%s.%N; }

# ------------------------------------------------------------ arguments ----
ALL_TOOLS="lh-perf lh-cp lh-cp-rate lh-losf iperf3-1 iperf3-P8 iperf3-cubic gridftp gridftp-losf rsync rsync-losf"
[ "$(id -u)" -eq 0 ] || die "run as root (network namespaces)"
{ is_uint "$ROUNDS" && [ "$ROUNDS" -ge 1 ]; } || die "ROUNDS must be a positive integer"
{ is_uint "$NFILES" && [ "$NFILES" -ge 1 ]; } || die "NFILES must be a positive integer"
{ is_uint "$PERF_SECONDS" && [ "$PERF_SECONDS" -ge 1 ]; } || die "PERF_SECONDS must be a positive integer"
{ is_uint "$RUN_TIMEOUT" && [ "$RUN_TIMEOUT" -ge 1 ]; } || die "RUN_TIMEOUT must be a positive integer"
is_uint "$MTU" || die "MTU must be an integer"
[[ $GAP =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "GAP must be a number of seconds"
[[ $WAN_NAME =~ ^[A-Za-z0-9_]{1,12}$ ]] || die "WAN_NAME must be 1-12 letters, digits or _"
[ "$RUN_TIMEOUT" -gt $((PERF_SECONDS + 10)) ] ||
    log "warning: RUN_TIMEOUT ($RUN_TIMEOUT s) leaves little room over PERF_SECONDS ($PERF_SECONDS s)"
for t in $TOOLS; do case " $ALL_TOOLS " in *" $t "*) ;; *) die "TOOLS: unknown tool '$t' (known: $ALL_TOOLS)" ;; esac; done
[ -n "${TOOLS// /}" ] || die "TOOLS is empty"
want() { case " $TOOLS " in *" $1 "*) return 0 ;; esac; return 1; }
want_any() { local t; for t in "$@"; do want "$t" && return 0; done; return 1; }

# RATE -> bits/s (decimal), SIZE -> bytes (binary), as longhaul reads them
RATE_BPS=$(awk -v r="$RATE" 'BEGIN {
    if (match(tolower(r), /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
    n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1)); sub(/(bit|bps|b)$/, "", u)
    m = (u == "") ? 1 : (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : (u == "t") ? 1e12 : -1
    if (m < 0) exit 1
    printf "%.0f", n * m }') || die "RATE: cannot read '$RATE' (e.g. 2gbit, 500mbit, 1.5G)"
[ "$RATE_BPS" -gt 0 ] || die "RATE must be above 0"
BYTES=$(awk -v s="$SIZE" 'BEGIN {
    if (match(s, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
    n = substr(s, 1, RLENGTH); u = toupper(substr(s, RLENGTH + 1)); sub(/I?B$/, "", u)
    m = (u == "") ? 1 : (u == "K") ? 1024 : (u == "M") ? 1048576 : (u == "G") ? 1073741824 : (u == "T") ? 1099511627776 : -1
    if (m < 0) exit 1
    printf "%.0f", n * m }') || die "SIZE: cannot read '$SIZE' (e.g. 2G, 200M, 1073741824)"
[ "$BYTES" -ge 1048576 ] || die "SIZE must be at least 1M"
R_MBPS=$(awk -v b="$RATE_BPS" 'BEGIN { printf "%.3f", b / 8e6 }')

cond_params() { # condition -> "RTT_MS LOSS", or fails
    case $1 in
        sat) echo "540 1e-4" ;;
        *)
            [[ $1 =~ ^([0-9]+(\.[0-9]+)?)ms(-([0-9]+(\.[0-9]+)?([eE]-?[0-9]+)?))?$ ]] || return 1
            echo "${BASH_REMATCH[1]} ${BASH_REMATCH[4]:-0}" ;;
    esac
}
for c in $CONDITIONS; do cond_params "$c" >/dev/null || die "CONDITIONS: cannot read '$c' (RTTms, RTTms-LOSS or sat)"; done
[ -n "${CONDITIONS// /}" ] || die "CONDITIONS is empty"

# ---------------------------------------------------------------- tools ----
need_setup=0
have() { command -v "$1" >/dev/null 2>&1; }
if want_any iperf3-1 iperf3-P8 iperf3-cubic && ! have iperf3; then need_setup=1; fi
if want_any gridftp gridftp-losf && ! { have globus-url-copy && have globus-gridftp-server; }; then need_setup=1; fi
if want_any rsync rsync-losf && ! have rsync; then need_setup=1; fi
if [ $need_setup = 1 ]; then
    [ -f "$PEERS_DIR/setup.sh" ] || die "peers missing and no $PEERS_DIR/setup.sh"
    log "installing peers with $PEERS_DIR/setup.sh"
    bash "$PEERS_DIR/setup.sh" >&2
fi
for c in jq python3 ip ss timeout setsid unshare cmp; do
    command -v "$c" >/dev/null 2>&1 || {
        log "installing $c"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "$(case $c in cmp) echo diffutils ;; timeout) echo coreutils ;; setsid | unshare) echo util-linux ;; ip | ss) echo iproute2 ;; *) echo "$c" ;; esac)" >&2
    }
done

LH_SRC_BIN=${LONGHAUL_BIN:-$ROOT/target/release/longhaul}
[ -x "$LH_SRC_BIN" ] || die "no longhaul binary at $LH_SRC_BIN (build it first: cargo build --release)"

for ns in "$WAN_NAME-a" "$WAN_NAME-b"; do
    ip netns list | awk '{ print $1 }' | grep -qx -- "$ns" &&
        die "namespace $ns exists already (another run? else: longhaul wan down --name $WAN_NAME), or set WAN_NAME"
done

# --------------------------------------------------------------- state ----
mkdir -p "$RESULTS_DIR" "$LOGDIR"
RUN=$(mktemp -d /tmp/longhaul-wan.XXXXXX)  # binary copy, longhaul state, peer configs
SHM=$(mktemp -d /dev/shm/longhaul-wan.XXXXXX) # src/big.bin, src/small/, dst/ (served by everyone)
chmod 755 "$RUN" "$SHM"
LONGHAUL=$RUN/longhaul
cp "$LH_SRC_BIN" "$LONGHAUL"
LH_STATE=$RUN/lh-state
mkdir -p "$LH_STATE" "$SHM/src" "$SHM/dst"
chmod 700 "$LH_STATE"
chmod 777 "$SHM/dst"
SRC_BIG=$SHM/src/big.bin SRC_SMALL=$SHM/src/small DST=$SHM/dst MANIFEST=$RUN/small.manifest

NS_A=$WAN_NAME-a NS_B=$WAN_NAME-b
WAN_PID=''       # the current emulator
CUR_PID=''       # the current client (a `timeout` process: killing it takes its group down)
declare -A SRV   # server name -> PID (each the leader of its own process group, via setsid)
SYSCTL_SAVED=()  # "key=value" to restore (RAISE_BUFFERS=1)
NOTES=()         # printed under the tables

kill_pid() { # pid: TERM (its process group too when it leads one), wait up to 3 s, then KILL
    local pid=$1 grp=0 i
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ] && grp=1
    if [ $grp = 1 ]; then kill -TERM -- "-$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
    for i in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        if [ $grp = 1 ]; then kill -KILL -- "-$pid" 2>/dev/null || true; else kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    wait "$pid" 2>/dev/null || true
}
ns_exists() { ip netns list | awk '{ print $1 }' | grep -qx -- "$1"; }
servers_stop() {
    local n
    for n in "${!SRV[@]}"; do kill_pid "${SRV[$n]}"; unset "SRV[$n]"; done
}
wan_stop() { # stop the emulator by PID (it prints its counters to its log as it stops); then any leftovers
    local i
    if [ -n "$WAN_PID" ]; then
        kill -TERM "$WAN_PID" 2>/dev/null || true
        for i in $(seq 150); do kill -0 "$WAN_PID" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$WAN_PID" 2>/dev/null; then
            log "warning: emulator (pid $WAN_PID) still up 15 s after SIGTERM: killing it"
            kill -KILL "$WAN_PID" 2>/dev/null || true
        fi
        wait "$WAN_PID" 2>/dev/null || true
        WAN_PID=''
    fi
    if ns_exists "$NS_A" || ns_exists "$NS_B"; then
        "$LONGHAUL" wan down --name "$WAN_NAME" >>"$LOGDIR/wan-down.log" 2>&1 || true
    fi
}
restore_sysctls() {
    local kv
    for kv in ${SYSCTL_SAVED[@]+"${SYSCTL_SAVED[@]}"}; do
        sysctl -q -w "${kv%%=*}=${kv#*=}" >/dev/null 2>&1 || log "warning: could not restore ${kv%%=*} to '${kv#*=}'"
    done
    SYSCTL_SAVED=()
}
cleanup() {
    trap - EXIT INT TERM
    kill_pid "$CUR_PID"; CUR_PID=''
    servers_stop
    wan_stop
    if ns_exists "$NS_A" || ns_exists "$NS_B"; then
        log "warning: namespaces of $WAN_NAME still listed; removing them with ip netns delete"
        ip netns delete "$NS_A" 2>/dev/null || true
        ip netns delete "$NS_B" 2>/dev/null || true
    fi
    [ ${#SYSCTL_SAVED[@]} -gt 0 ] && { log "restoring the socket buffer sysctls"; restore_sysctls; }
    rm -rf "$RUN" "$SHM"
    rmdir "$LOGDIR" 2>/dev/null || true # only if nothing was run
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------ socket buffers ----
BUF_KEYS="net.core.rmem_max net.core.wmem_max net.ipv4.tcp_rmem net.ipv4.tcp_wmem"
bufs_of() { # [ip netns exec NS] -> "key = value; ..."
    local k out=''
    for k in $BUF_KEYS net.ipv4.tcp_congestion_control; do
        out="$out${out:+; }${k#net.*.} = $("$@" sysctl -n "$k" 2>/dev/null | tr -s '\t ' ' ' || echo '?')"
    done
    printf '%s' "$out"
}
HOST_BUFS=$(bufs_of env)
raise_buffers() { # [ip netns exec NS]; net.core.*mem_max are global (a namespace refuses them)
    [ "$1" = env ] && { sysctl -q -w "net.core.rmem_max=$BIG_BUF" "net.core.wmem_max=$BIG_BUF" >/dev/null || return 1; }
    "$@" sysctl -q -w "net.ipv4.tcp_rmem=4096 131072 $BIG_BUF" "net.ipv4.tcp_wmem=4096 16384 $BIG_BUF" >/dev/null
}
if [ "$RAISE_BUFFERS" = 1 ]; then
    for k in $BUF_KEYS; do SYSCTL_SAVED+=("$k=$(sysctl -n "$k" | tr -s '\t ' ' ')"); done
    raise_buffers env || die "could not raise the socket buffer caps"
    log "RAISE_BUFFERS=1: socket buffer caps raised to 256 MiB for this run (restored on exit)"
fi
WMEM_MAX=$(sysctl -n net.ipv4.tcp_wmem | awk '{ print $3 }')

# ------------------------------------------------------------- estimate ----
LOSF_MEAN=33280 # bytes: the mean of uniform 1024..65536
EST=$(awk -v conds="$(for c in $CONDITIONS; do cond_params "$c" | cut -d' ' -f1; done | paste -sd' ' -)" \
    -v tools="$TOOLS" -v rounds="$ROUNDS" -v ps="$PERF_SECONDS" -v T="$RUN_TIMEOUT" -v gap="$GAP" \
    -v Bps="$(awk -v b="$RATE_BPS" 'BEGIN { print b / 8 }')" -v big="$BYTES" \
    -v losf="$((NFILES * LOSF_MEAN))" -v nf="$NFILES" -v wmem="$WMEM_MAX" '
function min(a, b) { return a < b ? a : b }
BEGIN {
    nc = split(conds, C, " "); nt = split(tools, X, " ")
    est = 0; worst = 0
    for (c = 1; c <= nc; c++) {
        rtt = C[c] / 1000; est += 4; worst += 4
        for (t = 1; t <= nt; t++) {
            x = X[t]
            if (x == "lh-perf" || x ~ /^iperf3/) s = ps + 1.5 + 5 * rtt
            else if (x ~ /losf$/) s = losf / Bps + 1 + 20 * rtt + (x == "gridftp-losf" ? nf * rtt / 4 : 0)
            else {
                r = Bps
                if (x == "rsync" && rtt > 0) r = min(Bps, wmem / rtt) # one stream: window-bound
                s = big / r + 1 + 20 * rtt + big / 1.5e9 # + cmp
            }
            est += rounds * (min(s, T) + gap + 0.5); worst += rounds * (T + gap + 0.5)
        }
    }
    printf "%d %d", est, worst
}')
read -r EST_S WORST_S <<<"$EST"
fmt_dur() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }
log "estimate: about $(fmt_dur "$EST_S") ($(wc -w <<<"$CONDITIONS") conditions x $(wc -w <<<"$TOOLS") tools x $ROUNDS round(s)); at most $(fmt_dur "$WORST_S") if every run hits RUN_TIMEOUT=${RUN_TIMEOUT}s"
[ "${DRY_RUN:-0}" = 1 ] && { log "DRY_RUN=1: stopping here"; exit 0; }

# ----------------------------------------------------------------- data ----
shm_avail=$(df -B1 --output=avail /dev/shm | tail -n1 | tr -d ' ')
mem_avail=$(awk '/^MemAvailable:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo)
need=$((2 * BYTES + 2 * NFILES * 66000 + 536870912))
{ [ "$shm_avail" -ge "$need" ] && [ "$mem_avail" -ge "$need" ]; } ||
    die "/dev/shm: $(numfmt --to=iec "$shm_avail") free, $(numfmt --to=iec "$mem_avail") RAM available: need $(numfmt --to=iec "$need") (two copies of SIZE and the tree); lower SIZE"

keystream() { # bytes > stdout: incompressible
    if command -v openssl >/dev/null 2>&1; then
        openssl enc -aes-256-ctr -nosalt -pbkdf2 -pass "pass:$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
            </dev/zero 2>/dev/null | head -c "$1"
    else
        head -c "$1" /dev/urandom
    fi
}
if want_any lh-cp lh-cp-rate gridftp rsync; then
    log "making $SRC_BIG ($BYTES bytes, incompressible)"
    keystream "$BYTES" >"$SRC_BIG" || true # the generator dies of SIGPIPE when head is done
    [ "$(stat -c %s "$SRC_BIG")" = "$BYTES" ] || die "could not make $SRC_BIG"
fi
SMALL_BYTES=0 SAMPLE=''
if want_any lh-losf gridftp-losf rsync-losf; then
    NDIRS=$(((NFILES + 99) / 100)); [ "$NDIRS" -gt 100 ] && NDIRS=100
    log "making $SRC_SMALL: $NFILES files of 1-64 KiB in $NDIRS directories"
    python3 - "$SRC_SMALL" "$NFILES" "$NDIRS" <<'EOF'
import os, random, sys
root, n, ndirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(5)
for d in range(ndirs):
    os.makedirs(f"{root}/d{d:03d}", exist_ok=True)
for i in range(n):
    with open(f"{root}/d{i % ndirs:03d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(rng.randint(1024, 65536)))
EOF
    (cd "$SRC_SMALL" && find . -mindepth 1 -not -type d -printf '%P\t%s\n' | LC_ALL=C sort) >"$MANIFEST"
    [ "$(wc -l <"$MANIFEST")" = "$NFILES" ] || die "the tree $SRC_SMALL is not what was asked for"
    SMALL_BYTES=$(awk -F'\t' '{ s += $2 } END { printf "%d", s }' "$MANIFEST")
    SAMPLE=$(awk -F'\t' -v n="$NFILES" '{ if (NR % int(n / 20 < 1 ? 1 : n / 20) == 0) print $1 }' "$MANIFEST" | head -n 20)
fi

# ------------------------------------------------------ longhaul setup ----
LH_FP=NA
if want_any lh-perf lh-cp lh-cp-rate lh-losf; then
    LH_FP=$("$LONGHAUL" id "$LH_STATE" 2>"$LOGDIR/longhaul-id.log") ||
        die "longhaul id $LH_STATE failed: $(tail -n 2 "$LOGDIR/longhaul-id.log")"
    [[ $LH_FP =~ ^SHA256:[A-Za-z0-9+/=_-]+$ ]] || die "longhaul id printed no fingerprint: '$LH_FP'"
    LH_TOKEN=$("$LONGHAUL" token create --state-dir "$LH_STATE" --export '*:rw' --note bench/wan.sh \
        2>"$LOGDIR/longhaul-token.log") ||
        die "longhaul token create failed: $(tail -n 2 "$LOGDIR/longhaul-token.log")"
    [[ $LH_TOKEN =~ ^[^[:space:]]+$ ]] || die "longhaul token create printed no token"
    export LONGHAUL_TRUST=$LH_FP LONGHAUL_TOKEN=$LH_TOKEN
fi

# Does the binary take the extra arguments? Tried in a fresh, empty network namespace (nothing to
# connect to): exit 2 is a usage error (clap's, or a bad value), anything else means they parsed.
LH_PERF_REJECT='' LH_CP_REJECT=''
read -r -a LH_PERF_XARGS <<<"$LH_PERF_ARGS" || true
read -r -a LH_CP_XARGS <<<"$LH_CP_ARGS" || true
read -r -a GUC_XARGS <<<"$GUC_ARGS" || true
read -r -a RSYNC_XARGS <<<"$RSYNC_ARGS" || true
preflight() { # label cmd... -> prints the usage error, if any
    local rc=0 label=$1
    shift
    unshare -n timeout 5 "$@" >"$LOGDIR/preflight-$label.out" 2>"$LOGDIR/preflight-$label.err" </dev/null || rc=$?
    [ "$rc" = 2 ] && grep -v '^$' "$LOGDIR/preflight-$label.err" | grep -v -e '^Usage:' -e "^For more information" |
        head -n 2 | tr '\n' ' ' | sed 's/ *$//'
    return 0
}
if want lh-perf; then
    LH_PERF_REJECT=$(preflight lh-perf "$LONGHAUL" perf 127.0.0.1:1 -t 1 --json ${LH_PERF_XARGS[@]+"${LH_PERF_XARGS[@]}"})
    if [ -n "$LH_PERF_REJECT" ]; then
        log "ERROR: this longhaul binary refuses LH_PERF_ARGS='$LH_PERF_ARGS': $LH_PERF_REJECT"
        log "ERROR: every lh-perf run will be NA (fix the binary, or set LH_PERF_ARGS, e.g. '-P 4')"
        NOTES+=("**lh-perf NOT RUN: the binary refuses LH_PERF_ARGS='$LH_PERF_ARGS' (exit 2): $LH_PERF_REJECT**")
    fi
fi
if want_any lh-cp lh-cp-rate lh-losf && [ -n "$LH_CP_ARGS" ]; then
    touch "$RUN/preflight.bin"
    LH_CP_REJECT=$(preflight lh-cp "$LONGHAUL" cp --json "${LH_CP_XARGS[@]}" "$RUN/preflight.bin" longhaul://127.0.0.1:1/x/)
    if [ -n "$LH_CP_REJECT" ]; then
        log "ERROR: this longhaul binary refuses LH_CP_ARGS='$LH_CP_ARGS': $LH_CP_REJECT"
        NOTES+=("**lh-cp / lh-losf NOT RUN: the binary refuses LH_CP_ARGS='$LH_CP_ARGS' (exit 2): $LH_CP_REJECT**")
    fi
fi

# ------------------------------------------------------------- emulator ----
HOST_A='' HOST_B=''
wan_start() { # condition rtt_ms loss
    local cond=$1 rtt=$2 loss=$3 i
    local -a extra=()
    [ -n "$WAN_EXTRA" ] && read -r -a extra <<<"$WAN_EXTRA"
    : >"$LOGDIR/$cond-wan.out"
    "$LONGHAUL" wan up --name "$WAN_NAME" --rtt "${rtt}ms" --loss "$loss" --rate "$RATE" --mtu "$MTU" \
        --queue "$QUEUE" ${extra[@]+"${extra[@]}"} --json >"$LOGDIR/$cond-wan.out" 2>"$LOGDIR/$cond-wan.err" </dev/null &
    WAN_PID=$!
    for i in $(seq 300); do
        grep -q '"hosts"' "$LOGDIR/$cond-wan.out" 2>/dev/null && break
        kill -0 "$WAN_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q '"hosts"' "$LOGDIR/$cond-wan.out" 2>/dev/null; then
        log "emulator for $cond did not come up: $(tail -n 3 "$LOGDIR/$cond-wan.err" | tr '\n' ' ')"
        wan_stop
        return 1
    fi
    HOST_A=$(jq -r '.hosts.a' "$LOGDIR/$cond-wan.out" | head -n1)
    HOST_B=$(jq -r '.hosts.b' "$LOGDIR/$cond-wan.out" | head -n1)
    if [ "$RAISE_BUFFERS" = 1 ]; then # they inherit the host's tcp_rmem/wmem; make sure
        raise_buffers ip netns exec "$NS_A" || log "warning: could not raise tcp_rmem/tcp_wmem in $NS_A"
        raise_buffers ip netns exec "$NS_B" || log "warning: could not raise tcp_rmem/tcp_wmem in $NS_B"
    fi
    return 0
}
fwd_ticks() { awk '{ print $14 + $15 }' "/proc/$WAN_PID/stat" 2>/dev/null || echo NA; }
CLK_TCK=$(getconf CLK_TCK)

# -------------------------------------------------------------- servers ----
listening_b() { [ -n "$(ip netns exec "$NS_B" ss -Htln "( sport = :$1 )" 2>/dev/null)" ]; }
srv_start() { # name port cmd... (run in host b, as its own process group)
    local name=$1 port=$2 pid i
    shift 2
    setsid ip netns exec "$NS_B" "$@" >>"$LOGDIR/$COND-server-$name.log" 2>&1 </dev/null &
    pid=$!
    SRV[$name]=$pid
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { log "$name server exited at once: $(tail -n 3 "$LOGDIR/$COND-server-$name.log" | tr '\n' ' ')"; return 1; }
        listening_b "$port" && return 0
        sleep 0.1
    done
    log "$name server (pid $pid) not listening on $port after 10 s"
    return 1
}
srv_alive() { [ -n "${SRV[$1]:-}" ] && kill -0 "${SRV[$1]}" 2>/dev/null; }
srv_stop() { [ -n "${SRV[$1]:-}" ] && kill_pid "${SRV[$1]}"; unset "SRV[$1]"; }
lh_srv_start() {
    srv_start longhaul "$LH_PORT" "$LONGHAUL" serve --listen "$HOST_B:$LH_PORT" --state-dir "$LH_STATE" \
        --export "bench=$DST"
}
gftp_srv_start() {
    # globus-gridftp-server must resolve its own address; inside the namespace nothing can (the
    # host's resolver is unreachable), so give it a private /etc/hosts in its own mount namespace.
    { cat /etc/hosts; printf '%s\t%s\n%s\t%s\n' "$HOST_A" "$WAN_NAME-a" "$HOST_B" "$WAN_NAME-b"; } >"$RUN/hosts"
    # shellcheck disable=SC2016 # $0 and $@ belong to the inner sh
    srv_start gridftp "$GFTP_PORT" unshare -m --propagation private \
        sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$RUN/hosts" \
        globus-gridftp-server -aa -anonymous-user root -allow-root -p "$GFTP_PORT" \
        -control-interface "$HOST_B" -data-interface "$HOST_B" -d error,warn
}
rsync_srv_start() {
    printf 'use chroot = no\nuid = root\ngid = root\nread only = no\n[data]\n  path = %s\n' "$DST" >"$RUN/rsyncd.conf"
    srv_start rsync "$RSYNC_PORT" rsync --daemon --no-detach --address="$HOST_B" --port="$RSYNC_PORT" \
        --config="$RUN/rsyncd.conf"
}

# ------------------------------------------------------------- metadata ----
ver() { "$@" 2>&1 | grep -v '^$' | head -n1 || true; }
{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "longhaul: $LH_SRC_BIN ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && [ -n "$(git status --porcelain -- crates 2>/dev/null)" ] && echo ', crates/ modified'), built $(date -r "$LH_SRC_BIN" '+%F %T')), $(ver "$LONGHAUL" --version)"
    echo "emulator: longhaul wan up --rate $RATE (R = $R_MBPS MB/s) --mtu $MTU --queue $QUEUE${WAN_EXTRA:+ $WAN_EXTRA}, one emulator per condition"
    echo "conditions: $(for c in $CONDITIONS; do read -r r l <<<"$(cond_params "$c")"; printf '%s (rtt %s ms, loss %s) ' "$c" "$r" "$l"; done)"
    echo "BDP at R: $(for c in $CONDITIONS; do r=$(cond_params "$c" | cut -d' ' -f1); printf '%s %s MB; ' "$c" "$(awk -v b="$RATE_BPS" -v r="$r" 'BEGIN { printf "%.1f", b / 8 * r / 1000 / 1e6 }')"; done)"
    echo "socket buffers and CC, host as found: $HOST_BUFS"
    echo "RAISE_BUFFERS=$RAISE_BUFFERS$([ "$RAISE_BUFFERS" = 1 ] && echo " (raised to $BIG_BUF for the run, restored on exit)" || echo " (the host's caps as they are, not raised)")"
    echo "tools: $TOOLS; rounds=$ROUNDS perf/iperf3 -t ${PERF_SECONDS}s; timeout ${RUN_TIMEOUT}s per run; gap ${GAP}s"
    echo "lh-perf: perf -t $PERF_SECONDS --json $LH_PERF_ARGS; lh-cp/lh-losf: cp --force --json${LH_CP_ARGS:+ $LH_CP_ARGS} (TLS 1.3, token; server fdatasyncs each file)"
    echo "gridftp: globus-url-copy $GUC_ARGS ($(ver globus-url-copy -version)); server $(ver globus-gridftp-server -version) -aa -anonymous-user root"
    echo "rsync: rsync -a${RSYNC_ARGS:+ $RSYNC_ARGS} to a daemon ($(ver rsync --version)); iperf3: $(ver iperf3 --version)"
    echo "data, /dev/shm -> /dev/shm: $(want_any lh-cp lh-cp-rate gridftp rsync && echo "big file $BYTES bytes ($SIZE)" || echo "no big file"); $(want_any lh-losf gridftp-losf rsync-losf && echo "tree $NFILES files, $SMALL_BYTES bytes" || echo "no tree")"
} >"$LOGDIR/meta.txt"
sed 's/^/[wan] /' "$LOGDIR/meta.txt" >&2

printf '%s\n' "condition	tool	round	seq	seconds	mbps	bytes	files	files_per_s	fwd_cpu_pct	rc	rtt_ms	loss	rate	note" >"$TSV"

# ----------------------------------------------------------------- runs ----
empty_dir() { find "$1" -mindepth 1 -delete 2>/dev/null || rm -rf "${1:?}"/* "${1:?}"/.[!.]* 2>/dev/null || true; chmod 777 "$1"; }
check_big() { # dst-file -> "" when good, else a reason
    local got
    got=$(stat -c %s "$1" 2>/dev/null || echo missing)
    [ "$got" = "$BYTES" ] || { echo "size $got != $BYTES"; return; }
    cmp -s "$SRC_BIG" "$1" || echo "content differs (cmp)"
}
check_tree() { # dst-root (the copy of small/)
    local d=$1 f
    [ -d "$d" ] || { echo "no $d"; return; }
    if ! (cd "$d" && find . -mindepth 1 -not -type d -printf '%P\t%s\n' | LC_ALL=C sort) | cmp -s - "$MANIFEST"; then
        echo "listing differs: $(find "$d" -type f | wc -l) files (want $NFILES), $(find "$d" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d", s }') bytes (want $SMALL_BYTES)"
        return
    fi
    for f in $SAMPLE; do cmp -s "$SRC_SMALL/$f" "$d/$f" || { echo "content of $f differs"; return; }; done
}
num() { [[ ${1:-} =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
tsv_line() { # condition tool round seconds mbps bytes files fps fwd rc note
    local note=${11//$'\t'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$SEQ" "$4" "$5" "$6" "$7" \
        "$8" "$9" "${10}" "$C_RTT" "$C_LOSS" "$RATE" "${note//$'\n'/ }" >>"$TSV"
}

SEQ=0
run_one() { # condition round tool
    local cond=$1 round=$2 tool=$3
    local tag out err rc=0 t0 t1 secs note='' bytes=NA files=NA mbps=NA fps=NA fwd=NA k0 k1 line
    local -a cmd=()
    SEQ=$((SEQ + 1))
    tag=$(printf '%s-r%d-%03d-%s' "$cond" "$round" "$SEQ" "$tool")
    out=$LOGDIR/$tag.out err=$LOGDIR/$tag.err
    empty_dir "$DST"

    # reasons not to run at all
    case $tool in
        lh-*)
            if [ "$tool" = lh-perf ] && [ -n "$LH_PERF_REJECT" ]; then note="binary refuses LH_PERF_ARGS='$LH_PERF_ARGS': $LH_PERF_REJECT"
            elif [ "$tool" != lh-perf ] && [ -n "$LH_CP_REJECT" ]; then note="binary refuses LH_CP_ARGS='$LH_CP_ARGS': $LH_CP_REJECT"
            elif ! srv_alive longhaul; then
                if [ -n "${SRV[longhaul]:-}" ]; then
                    log "  longhaul server died (see ${LOGDIR#"$ROOT"/}/$cond-server-longhaul.log): restarting it"
                    NOTES+=("($cond) the longhaul server had died before run $SEQ ($tool) and was restarted")
                    srv_stop longhaul
                fi
                lh_srv_start || { note="longhaul server not running"; srv_stop longhaul; }
            fi ;;
        gridftp) srv_alive gridftp || note="gridftp server not running" ;;
        rsync) srv_alive rsync || note="rsync daemon not running" ;;
        iperf3-*) srv_start iperf3 "$I3_PORT" iperf3 -s -1 -B "$HOST_B" -p "$I3_PORT" || { note="iperf3 server did not start"; srv_stop iperf3; } ;;
    esac
    if [ -n "$note" ]; then
        log "  $cond $tool: NA ($note)"
        tsv_line "$cond" "$tool" "$round" NA NA NA NA NA NA NA "$note"
        return 0
    fi

    case $tool in
        lh-perf) cmd=("$LONGHAUL" perf "$HOST_B" -p "$LH_PORT" -t "$PERF_SECONDS" --json ${LH_PERF_XARGS[@]+"${LH_PERF_XARGS[@]}"}) ;;
        lh-cp) cmd=("$LONGHAUL" cp --force --json ${LH_CP_XARGS[@]+"${LH_CP_XARGS[@]}"} "$SRC_BIG" "longhaul://$HOST_B:$LH_PORT/bench/")
            bytes=$BYTES files=1 ;;
        lh-cp-rate) cmd=("$LONGHAUL" cp --force --json --rate "$RATE" ${LH_CP_XARGS[@]+"${LH_CP_XARGS[@]}"} "$SRC_BIG" "longhaul://$HOST_B:$LH_PORT/bench/")
            bytes=$BYTES files=1 ;;
        lh-losf) cmd=("$LONGHAUL" cp -r --force --json ${LH_CP_XARGS[@]+"${LH_CP_XARGS[@]}"} "$SRC_SMALL" "longhaul://$HOST_B:$LH_PORT/bench/")
            bytes=$SMALL_BYTES files=$NFILES ;;
        iperf3-1) cmd=(iperf3 -c "$HOST_B" -p "$I3_PORT" -t "$PERF_SECONDS" -J) ;;
        iperf3-P8) cmd=(iperf3 -c "$HOST_B" -p "$I3_PORT" -t "$PERF_SECONDS" -J -P 8) ;;
        iperf3-cubic) cmd=(iperf3 -c "$HOST_B" -p "$I3_PORT" -t "$PERF_SECONDS" -J -C cubic) ;;
        gridftp) cmd=(globus-url-copy ${GUC_XARGS[@]+"${GUC_XARGS[@]}"} "file://$SRC_BIG" "ftp://$HOST_B:$GFTP_PORT$DST/big.bin")
            bytes=$BYTES files=1 ;;
        gridftp-losf) cmd=(globus-url-copy ${GUC_XARGS[@]+"${GUC_XARGS[@]}"} -r -cd -pp -cc 4 "file://$SRC_SMALL/" "ftp://$HOST_B:$GFTP_PORT$DST/small/")
            bytes=$SMALL_BYTES files=$NFILES ;;
        rsync-losf) cmd=(rsync -a ${RSYNC_XARGS[@]+"${RSYNC_XARGS[@]}"} "$SRC_SMALL" "rsync://$HOST_B:$RSYNC_PORT/data/")
            bytes=$SMALL_BYTES files=$NFILES ;;
        rsync) cmd=(rsync -a ${RSYNC_XARGS[@]+"${RSYNC_XARGS[@]}"} "$SRC_BIG" "rsync://$HOST_B:$RSYNC_PORT/data/")
            bytes=$BYTES files=1 ;;
    esac
    printf '%s\n' "ip netns exec $NS_A ${cmd[*]}" >"$LOGDIR/$tag.cmd"
    sleep "$GAP"

    k0=$(fwd_ticks)
    t0=$(now)
    timeout -k 5 "$RUN_TIMEOUT" ip netns exec "$NS_A" "${cmd[@]}" >"$out" 2>"$err" </dev/null &
    CUR_PID=$!
    wait "$CUR_PID" || rc=$?
    CUR_PID=''
    t1=$(now)
    k1=$(fwd_ticks)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    num "$k0" && num "$k1" && fwd=$(awk -v a="$k0" -v b="$k1" -v s="$secs" -v h="$CLK_TCK" 'BEGIN { printf "%.0f", (b - a) / h / s * 100 }')
    [[ $tool == iperf3-* ]] && srv_stop iperf3

    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        note="timed out after ${RUN_TIMEOUT}s"
    elif [ "$rc" != 0 ]; then
        note="exit $rc: $(grep -v '^$' "$err" 2>/dev/null | tail -n 2 | tr '\t\n' '  ' | head -c 250)"
        [ "$rc" = 2 ] && [[ $tool == lh-* ]] && note="usage error (exit 2), the binary refuses the arguments: $(grep -v -e '^$' -e '^Usage:' -e '^For more information' "$err" | head -n 2 | tr '\n' ' ' | head -c 250)"
        if [[ $tool == lh-* ]] && ! grep -q . "$err" 2>/dev/null; then
            note="exit $rc: $(jq -r '.error.message // empty' "$out" 2>/dev/null | head -c 250)"
        fi
    else
        case $tool in
            lh-perf)
                line=$(jq -r 'if .error != null or .summary == null then empty else .summary as $s | [
                        ($s.bits_per_second // "NA"), ($s.seconds // "NA"),
                        (($s.streams // []) | length), (.start.params.streams // "NA"),
                        ($s.directions[0].min_rtt_us // $s.min_rtt_us // "NA"), ($s.retransmits // "NA"),
                        ($s.limit.kind // "NA")] | map(tostring) | join(" ") end' "$out" 2>/dev/null || true)
                if [ -n "$line" ]; then
                    local bps s n np rtt retr lim
                    read -r bps s n np rtt retr lim <<<"$line"
                    if num "$bps"; then
                        mbps=$(awk -v b="$bps" 'BEGIN { printf "%.1f", b / 8e6 }')
                        num "$s" && secs=$s
                        bytes=$(jq -r '.summary.bytes // "NA"' "$out")
                        note="P=$n (asked $np) min_rtt=$(awk -v r="$rtt" 'BEGIN { printf (r ~ /^[0-9.]+$/ ? "%.1fms" : "NA"), r / 1000 }') retr=$retr limit=$lim"
                    else note="no bits_per_second in the summary"; fi
                else
                    note="no summary: $(jq -c '.error // .summary.error' "$out" 2>/dev/null | head -c 200)"
                fi ;;
            iperf3-*)
                line=$(jq -r 'if .error != null or .end.sum_received == null then empty else [
                        (.end.sum_received.bits_per_second // "NA"), (.end.sum_received.seconds // "NA"),
                        (.end.sum_received.bytes // "NA"), ([.end.streams[].sender.min_rtt // empty] | min // "NA"),
                        (.end.sum_sent.retransmits // "NA"), (.end.sender_tcp_congestion // "NA")]
                        | map(tostring) | join(" ") end' "$out" 2>/dev/null || true)
                if [ -n "$line" ]; then
                    local bps s b rtt retr cc
                    read -r bps s b rtt retr cc <<<"$line"
                    if num "$bps"; then
                        mbps=$(awk -v x="$bps" 'BEGIN { printf "%.1f", x / 8e6 }')
                        num "$s" && secs=$s
                        bytes=$b
                        note="min_rtt=$(awk -v r="$rtt" 'BEGIN { printf (r ~ /^[0-9.]+$/ ? "%.1fms" : "NA"), r / 1000 }') retr=$retr cc=$cc"
                    else note="no sum_received"; fi
                else
                    note="no iperf3 result: $(jq -r '.error // empty' "$out" 2>/dev/null | head -c 200)"
                fi ;;
            lh-cp | lh-cp-rate | lh-losf | gridftp | gridftp-losf | rsync | rsync-losf)
                if [[ $tool == lh-* ]]; then
                    [ "$(jq -r '.verified == true and ((.failed // []) | length) == 0' "$out" 2>/dev/null)" = true ] ||
                        note="longhaul: not verified or failures: $(jq -c '.failed' "$out" 2>/dev/null | head -c 200)"
                fi
                if [ -z "$note" ]; then
                    if [[ $tool == *losf ]]; then note=$(check_tree "$DST/small"); else note=$(check_big "$DST/big.bin"); fi
                fi
                if [ -z "$note" ]; then
                    mbps=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.1f", b / s / 1e6 }')
                    fps=$(awk -v n="$files" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
                    note="copy checked"
                    [[ $tool == lh-* ]] && note="checked; longhaul's own rate $(jq -r '.bits_per_second / 8e6 | . * 10 | round / 10' "$out" 2>/dev/null) MB/s, streams $(jq -r '.streams' "$out" 2>/dev/null), attempts $(jq -r '.attempts' "$out" 2>/dev/null)"
                else
                    note="check failed: $note"
                fi ;;
        esac
    fi
    if [ "$mbps" = NA ]; then
        fps=NA
        log "  $cond $tool: NA ($note) - see ${out#"$ROOT"/} ${err#"$ROOT"/}"
    else
        log "  $cond $tool: $mbps MB/s in ${secs}s$([[ $tool == *losf ]] && echo ", $fps files/s"), forwarder CPU ${fwd}%; $note"
    fi
    tsv_line "$cond" "$tool" "$round" "$secs" "$mbps" "$bytes" "$files" "$fps" "$fwd" "$rc" "$note"
    empty_dir "$DST"
}

T_START=$(date +%s)
read -r -a TOOL_LIST <<<"$TOOLS"
NT=${#TOOL_LIST[@]}
CI=0
NS_BUFS=''
for COND in $CONDITIONS; do
    read -r C_RTT C_LOSS <<<"$(cond_params "$COND")"
    log "condition $COND: rtt ${C_RTT} ms, loss $C_LOSS, rate $RATE, mtu $MTU, queue $QUEUE"
    if ! wan_start "$COND" "$C_RTT" "$C_LOSS"; then
        NOTES+=("($COND) the emulator did not start: every run NA (see ${LOGDIR#"$ROOT"/}/$COND-wan.err)")
        for round in $(seq "$ROUNDS"); do for t in "${TOOL_LIST[@]}"; do
            SEQ=$((SEQ + 1)); tsv_line "$COND" "$t" "$round" NA NA NA NA NA NA NA "emulator did not start"
        done; done
        CI=$((CI + 1))
        continue
    fi
    [ -z "$NS_BUFS" ] && NS_BUFS=$(bufs_of ip netns exec "$NS_A")
    echo "$COND: hosts $HOST_A -> $HOST_B; in host a: $(bufs_of ip netns exec "$NS_A")" >>"$LOGDIR/ns-sysctls.txt"
    if { want lh-perf && [ -z "$LH_PERF_REJECT" ]; } || { want_any lh-cp lh-cp-rate lh-losf && [ -z "$LH_CP_REJECT" ]; }; then
        lh_srv_start || { log "WARNING: longhaul server did not start for $COND"; srv_stop longhaul; }
    fi
    if want_any gridftp gridftp-losf; then
        gftp_srv_start || { log "WARNING: gridftp server did not start for $COND"; NOTES+=("($COND) gridftp server did not start"); srv_stop gridftp; }
    fi
    if want_any rsync rsync-losf; then
        rsync_srv_start || { log "WARNING: rsync daemon did not start for $COND"; NOTES+=("($COND) rsync daemon did not start"); srv_stop rsync; }
    fi
    for round in $(seq "$ROUNDS"); do
        log "($COND) round $round/$ROUNDS"
        for i in $(seq 0 $((NT - 1))); do
            run_one "$COND" "$round" "${TOOL_LIST[$(((i + round - 1 + CI) % NT))]}"
        done
    done
    servers_stop
    wan_stop
    counters=$(grep -h 'link down' "$LOGDIR/$COND-wan.err" 2>/dev/null | tail -n1 | sed 's/^longhaul: //')
    echo "$COND	${counters:-no counters (see $COND-wan.err)}" >>"$LOGDIR/wan-counters.tsv"
    CI=$((CI + 1))
done
T_END=$(date +%s)
echo "socket buffers and CC inside the namespaces (host a, first condition): ${NS_BUFS:-not read}" >>"$LOGDIR/meta.txt"

# -------------------------------------------------------------- summary ----
{
    echo
    echo "### wan: longhaul vs peers over \`longhaul wan\` at R = $RATE (MB/s, 1 MB = 1e6 bytes; medians of $ROUNDS round(s); $(fmt_dur $((T_END - T_START))) of runs)"
    echo
    sed 's/^/    /' "$LOGDIR/meta.txt"
    echo
    for n in ${NOTES[@]+"${NOTES[@]}"}; do case $n in '**'*) echo "- $n" ;; esac; done
    awk -F'\t' -v conds="$CONDITIONS" -v tools="$TOOLS" -v R="$R_MBPS" -v rate="$RATE" -v ncpu="$(nproc)" '
    function median(list,    a, n, i, j, t) {
        n = split(list, a, " ")
        if (n == 0) return "NA"
        for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return (n % 2) ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function isnum(x) { return x ~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
    function cell(t, c, v) {
        if (!runs[t, c]) return "-"
        v = M[t, c]
        if (v == "NA") return "NA"
        return sprintf("%.1f", v) (ok[t, c] < runs[t, c] ? sprintf(" (%d/%d ok)", ok[t, c], runs[t, c]) : "")
    }
    function has(t, c) { return (t, c) in M && M[t, c] != "NA" }
    function miss(t, c) { return !runs[t, c] ? t " at " c " not run" : t " at " c " NA (every run failed)" }
    function verdict(x, target) { return (x + 0 >= target) ? "met" : "NOT met" }
    NR == 1 { next }
    {
        k = $2 SUBSEP $1; runs[k]++
        if (isnum($6)) { ok[k]++; v[k] = v[k] " " $6 }
        if (isnum($9)) fps[k] = fps[k] " " $9
        if (isnum($10)) fwd[k] = fwd[k] " " $10
    }
    END {
        nc = split(conds, C, " "); nt = split(tools, T, " ")
        for (i = 1; i <= nt; i++) for (j = 1; j <= nc; j++) {
            M[T[i], C[j]] = median(v[T[i], C[j]]); F[T[i], C[j]] = median(fps[T[i], C[j]])
            W[T[i], C[j]] = median(fwd[T[i], C[j]])
        }
        label["lh-perf"] = "longhaul perf (memory)"
        label["lh-cp"] = "longhaul cp, big file"
        label["lh-cp-rate"] = "longhaul cp --rate R, big file"
        label["lh-losf"] = "longhaul cp -r, small files"
        label["iperf3-1"] = "iperf3, 1 stream (memory)"
        label["iperf3-P8"] = "iperf3 -P 8 (memory)"
        label["iperf3-cubic"] = "iperf3 -C cubic, 1 stream (memory)"
        label["gridftp"] = "globus-url-copy (GridFTP), big file"
        label["rsync"] = "rsync daemon, big file"
        label["gridftp-losf"] = "globus-url-copy -r -cc 4, small files"
        label["rsync-losf"] = "rsync daemon, small files"
        printf "| tool |"; for (j = 1; j <= nc; j++) printf " %s |", C[j]; print ""
        printf "|---|"; for (j = 1; j <= nc; j++) printf "---:|"; print ""
        for (i = 1; i <= nt; i++) {
            printf "| %s (%s) |", label[T[i]], T[i]
            for (j = 1; j <= nc; j++) printf " %s |", cell(T[i], C[j])
            print ""
        }
        printf "| R (the emulated bottleneck, %s) |", rate; for (j = 1; j <= nc; j++) printf " %.1f |", R; print ""
        nl = 0
        for (i = 1; i <= nt; i++) if (T[i] ~ /losf$/) {
            if (!nl++) {
                print ""
                printf "| small files, files/s |"; for (j = 1; j <= nc; j++) printf " %s |", C[j]; print ""
                printf "|---|"; for (j = 1; j <= nc; j++) printf "---:|"; print ""
            }
            printf "| %s |", T[i]
            for (j = 1; j <= nc; j++) printf " %s |", (F[T[i], C[j]] == "NA" ? (runs[T[i], C[j]] ? "NA" : "-") : sprintf("%.0f", F[T[i], C[j]]))
            print ""
        }
        print ""
        print "Targets (issue 5), from the table above:"
        if (has("lh-cp", "80ms-1e-5")) {
            x = M["lh-cp", "80ms-1e-5"] / R
            printf "- lh-cp at 80ms-1e-5 / R: %.1f / %.1f = **%.2f** (target >= 0.9: %s)\n", M["lh-cp", "80ms-1e-5"], R, x, verdict(x, 0.9)
        } else printf "- lh-cp at 80ms-1e-5 / R: n/a (%s)\n", miss("lh-cp", "80ms-1e-5")
        if (has("lh-cp", "120ms") && has("lh-cp", "0ms") && M["lh-cp", "0ms"] > 0) {
            x = M["lh-cp", "120ms"] / M["lh-cp", "0ms"]
            printf "- lh-cp at 120ms / lh-cp at 0ms: %.1f / %.1f = **%.2f** (target >= 0.95: %s)\n", M["lh-cp", "120ms"], M["lh-cp", "0ms"], x, verdict(x, 0.95)
        } else printf "- lh-cp at 120ms / lh-cp at 0ms: n/a (%s)\n", !has("lh-cp", "120ms") ? miss("lh-cp", "120ms") : miss("lh-cp", "0ms")
        split("lh-cp lh-perf", L, " ")
        for (l = 1; l <= 2; l++) {
            t = L[l]
            if (!runs[t, "sat"] && t == "lh-perf") continue
            if (has(t, "sat") && has("iperf3-cubic", "sat") && M["iperf3-cubic", "sat"] > 0) {
                x = M[t, "sat"] / M["iperf3-cubic", "sat"]
                printf "- %s at sat / iperf3-cubic at sat (one CUBIC stream): %.1f / %.1f = **%.1fx** (target >= 10x: %s)", t, M[t, "sat"], M["iperf3-cubic", "sat"], x, verdict(x, 10)
                if (has("iperf3-1", "sat") && M["iperf3-1", "sat"] > 0) printf "; vs iperf3-1 (system default CC): %.1fx", M[t, "sat"] / M["iperf3-1", "sat"]
                print ""
            } else printf "- %s at sat / iperf3-cubic at sat: n/a (%s)\n", t, !has(t, "sat") ? miss(t, "sat") : miss("iperf3-cubic", "sat")
        }
        print ""
        printf "Forwarder (`wan up`) CPU %% during the runs (median; 100 = one core, the host has %d CPUs):", ncpu
        printf "\n\n| tool |"; for (j = 1; j <= nc; j++) printf " %s |", C[j]; print ""
        printf "|---|"; for (j = 1; j <= nc; j++) printf "---:|"; print ""
        for (i = 1; i <= nt; i++) {
            printf "| %s |", T[i]
            for (j = 1; j <= nc; j++) printf " %s |", (W[T[i], C[j]] == "NA" ? "-" : sprintf("%.0f", W[T[i], C[j]]))
            print ""
        }
    }' "$TSV"
    echo
    echo "Emulator counters per condition (from \`wan up\` as it stopped):"
    while IFS=$'\t' read -r c line; do echo "- $c: $line"; done <"$LOGDIR/wan-counters.tsv" 2>/dev/null || true
    for n in ${NOTES[@]+"${NOTES[@]}"}; do case $n in '**'*) ;; *) echo "- note: $n" ;; esac; done
    echo
    echo "MB/s: perf tools = what the receiver got over the test (lh-perf summary.bits_per_second, iperf3"
    echo "end.sum_received); copies = bytes / wall time of the client (connection set-up included), checked"
    echo "with cmp (tree: paths, sizes and a sample cmp). NA = failed, timed out (${RUN_TIMEOUT}s) or failed its check;"
    echo "\"(k/n ok)\" = median of the k good runs out of n; \"-\" = not run. Min RTT, retransmits and what"
    echo "longhaul chose per run are in the note column of the TSV."
    echo "Raw results: ${TSV#"$ROOT"/} (tool outputs, server and emulator logs in ${LOGDIR#"$ROOT"/}/)"
} | tee "$SUMMARY"
