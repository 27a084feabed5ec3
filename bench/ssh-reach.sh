#!/usr/bin/env bash
# bench/ssh-reach.sh - issue 45 item 3: `longhaul cp SRC HOST:DIR/` over ssh (no server there: the far
# end is a one-shot server ssh starts) against `longhaul cp SRC longhaul://HOST:PORT/data/` to a
# running server, over one `longhaul wan` path (RTT 80 ms by default), in the same run, alternating;
# and `ssh HOST true` (what logging in costs) and a 1 KiB copy each way (the set-up alone).
#
#   bash bench/ssh-reach.sh [LONGHAUL_BINARY]                    # as root (network namespaces)
#   RTT=80ms SIZE_MIB=1024 RATE=2gbit ROUNDS=5 OLD_BIN=/tmp/longhaul-before bash bench/ssh-reach.sh
#
# Tools (TOOLS, rotated every round; WARMUP=1 round first, not counted, then ROUNDS):
#   server      cp SRC to `longhaul serve` in host b (TLS, verified, --no-sync)
#   ssh         cp SRC to 198.18.0.2:DIR/ over a private sshd in host b (its far end --no-sync too:
#               the destination is shm, so sync costs nothing either way)
#   ssh-old     the same with OLD_BIN (an A/B of two builds)
#   server-1k, ssh-1k   the same with a 1 KiB file: set-up and finish alone
#   ssh-mux     `ssh` with the user's ssh multiplexing (ControlMaster=auto, ControlPersist): the
#               warm-up run leaves a master connection, later copies log in over it
#   ssh-true    `ssh 198.18.0.2 true` through the same sshd
#   ssh-tree, server-tree, ssh-tree-old   a tree of TREE_FILES files (TREE_DIRS directories, 1-8 KiB)
#               on its own ext4 file system (an image under TREE_DIR, default /var/tmp, on a loop
#               device with direct I/O), unmounted and mounted again before each run: its walk and
#               its files cold, and nothing else's (ssh's and sshd's binaries stay cached)
# TRACE=1: instead, one 1 KiB copy over ssh with `ssh -v` and `longhaul -vv`, each line of their
# output stamped with the milliseconds since the start (where each round trip of the set-up goes).
# Prints each run (seconds, rate) and the medians, ssh / server ratios, and the seconds ssh mode
# costs over the server in round trips of the path.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
RTT=${RTT:-80ms} RATE=${RATE:-2gbit} SIZE_MIB=${SIZE_MIB:-1024} ROUNDS=${ROUNDS:-5} WARMUP=${WARMUP:-1}
TOOLS=${TOOLS:-"server ssh server-1k ssh-1k ssh-true"}
BIN=${1:-target/release/longhaul}
NAME=lhsr$$
WORK=$(mktemp -d /dev/shm/lh-ssh-reach.XXXXXX)
LH=$WORK/longhaul
cp "$BIN" "$LH"
OLD=$WORK/longhaul-old
[ -n "${OLD_BIN:-}" ] && cp "$OLD_BIN" "$OLD"
PIDS=()
cleanup() {
    # Every step may fail (set -e is off here): a step left undone would keep a server, and with it
    # the inherited descriptors of whatever the caller holds (a lock), alive after the run.
    set +e
    [ -n "${MUX:-}" ] && "$LH" --no-archive wan exec --name "$NAME" a -- $MUX -O exit "$B" >/dev/null 2>&1
    # `wan exec` runs its command as a child: end those first, or a server outlives the run.
    for p in "${PIDS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    sleep 1
    umount "$WORK/treefs" 2>/dev/null
    [ -n "${LOOP:-}" ] && losetup -d "$LOOP"
    "$LH" wan down --name "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
in_a() { "$LH" --no-archive wan exec --name "$NAME" a -- "$@"; }
in_b() { "$LH" --no-archive wan exec --name "$NAME" b -- "$@"; }

"$LH" --no-archive wan up --name "$NAME" --rtt "$RTT" --rate "$RATE" --json >"$WORK/wan.json" 2>"$WORK/wan.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/wan.json" ] && break; sleep 0.1; done
[ -s "$WORK/wan.json" ] || { echo "ssh-reach: the emulator did not come up: $(cat "$WORK/wan.log")" >&2; exit 1; }
B=198.18.0.2

head -c $((SIZE_MIB << 20)) /dev/urandom >"$WORK/big.bin"
head -c 1024 /dev/urandom >"$WORK/small.bin"
TREE_FILES=${TREE_FILES:-10000} TREE_DIRS=${TREE_DIRS:-100}
IMAGE=${TREE_DIR:-/var/tmp}/lh-ssh-reach-tree-$TREE_FILES.ext4
TREE=$WORK/treefs/tree
remount_tree() {
    umount "$WORK/treefs" 2>/dev/null || true
    mount -o ro "$LOOP" "$WORK/treefs"
}
if [[ " $TOOLS " == *-tree* ]]; then
    mkdir -p "$WORK/treefs"
    if [ ! -s "$IMAGE" ]; then
        truncate -s $((TREE_FILES * 16 + 65536))K "$IMAGE.new"
        mkfs.ext4 -q -F "$IMAGE.new"
        mount -o loop "$IMAGE.new" "$WORK/treefs"
        python3 - "$TREE" "$TREE_FILES" "$TREE_DIRS" <<'PY'
import os, random, sys
root, files, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(45)
for i in range(files):
    d = os.path.join(root, f"d{i % dirs:03}", f"e{i % 7}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:06}"), "wb") as f:
        f.write(rng.randbytes(rng.randint(1024, 8192)))
PY
        umount "$WORK/treefs"
        mv "$IMAGE.new" "$IMAGE"
    fi
    LOOP=$(losetup -f --show -r --direct-io=on "$IMAGE")
    remount_tree
fi
mkdir -p "$WORK/dst" "$WORK/state"
TOKEN=$("$LH" token create --state-dir "$WORK/state" --export '*:rw' 2>/dev/null)
TRUST=$("$LH" id "$WORK/state" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
PORT=5999 SSHPORT=2299
in_b "$LH" --no-archive serve --listen "$B:$PORT" --state-dir "$WORK/state" --export "data=$WORK/dst" --no-sync \
    >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
ssh-keygen -q -t ed25519 -N '' -f "$WORK/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/userkey"
cp "$WORK/userkey.pub" "$WORK/authorized_keys"
mkdir -p /run/sshd
printf 'Port %s\nListenAddress %s\nHostKey %s/hostkey\nPidFile %s/sshd.pid\nAuthorizedKeysFile %s/authorized_keys\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n' \
    "$SSHPORT" "$B" "$WORK" "$WORK" "$WORK" >"$WORK/sshd_config"
in_b /usr/sbin/sshd -D -e -f "$WORK/sshd_config" >"$WORK/sshd.log" 2>&1 &
PIDS+=($!)
RSH="ssh -p $SSHPORT -i $WORK/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
MUX="$RSH -o ControlMaster=auto -o ControlPath=$WORK/mux-%C -o ControlPersist=300"
for _ in $(seq 100); do in_a bash -c "exec 3<>/dev/tcp/$B/$PORT && exec 4<>/dev/tcp/$B/$SSHPORT" 2>/dev/null && break; sleep 0.2; done

run_tool() { # tool
    local lh=(env LONGHAUL_TRUST="$TRUST" LONGHAUL_TOKEN="$TOKEN")
    local ssh=(env LONGHAUL_RSH="$RSH")
    case $1 in
    server) in_a "${lh[@]}" "$LH" --no-archive cp --force "$WORK/big.bin" "longhaul://$B:$PORT/data/" ;;
    server-1k) in_a "${lh[@]}" "$LH" --no-archive cp --force "$WORK/small.bin" "longhaul://$B:$PORT/data/" ;;
    ssh) in_a "${ssh[@]}" "$LH" --no-archive cp --force --remote-path "$LH" "$WORK/big.bin" "$B:$WORK/dst/" ;;
    ssh-mux) in_a env LONGHAUL_RSH="$MUX" "$LH" --no-archive cp --force --remote-path "$LH" "$WORK/big.bin" "$B:$WORK/dst/" ;;
    ssh-old) in_a "${ssh[@]}" "$OLD" --no-archive cp --force --remote-path "$OLD" "$WORK/big.bin" "$B:$WORK/dst/" ;;
    ssh-1k) in_a "${ssh[@]}" "$LH" --no-archive cp --force --remote-path "$LH" "$WORK/small.bin" "$B:$WORK/dst/" ;;
    ssh-1k-old) in_a "${ssh[@]}" "$OLD" --no-archive cp --force --remote-path "$OLD" "$WORK/small.bin" "$B:$WORK/dst/" ;;
    ssh-true) in_a $RSH "$B" true ;;
    server-tree) in_a "${lh[@]}" "$LH" --no-archive cp -r --force "$TREE/" "longhaul://$B:$PORT/data/tree/" ;;
    ssh-tree) in_a "${ssh[@]}" "$LH" --no-archive cp -r --force --remote-path "$LH" "$TREE/" "$B:$WORK/dst/tree/" ;;
    ssh-tree-old) in_a "${ssh[@]}" "$OLD" --no-archive cp -r --force --remote-path "$OLD" "$TREE/" "$B:$WORK/dst/tree/" ;;
    *) echo "ssh-reach: unknown tool $1" >&2; exit 2 ;;
    esac
}
if [ "${TRACE:-0}" = 1 ]; then
    echo "# ssh-reach trace, RTT $RTT, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
    for bin in "$LH" ${OLD_BIN:+"$OLD"}; do
        echo "## $bin: a 1 KiB copy over ssh"
        in_a env LONGHAUL_RSH="$RSH -v" python3 -c '
import subprocess, sys, time
t0 = time.monotonic()
p = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, errors="replace")
for line in p.stderr:
    print(f"{(time.monotonic() - t0) * 1000:8.1f} ms  {line.rstrip()[:200]}")
print(f"{(time.monotonic() - t0) * 1000:8.1f} ms  exit {p.wait()}")
' "$bin" -vv --no-archive cp --force --remote-path "$bin" "$WORK/small.bin" "$B:$WORK/dst/"
    done
    exit 0
fi
TSV=$WORK/runs.tsv
read -ra tools <<<"$TOOLS"
for r in $(seq $((1 - WARMUP)) "$ROUNDS"); do
    n=${#tools[@]}
    for i in $(seq 0 $((n - 1))); do
        tool=${tools[$(((i + r) % n))]}
        rm -rf "$WORK/dst/big.bin" "$WORK/dst/small.bin" "$WORK/dst/tree"
        mkdir "$WORK/dst/tree"
        [[ $tool == *-tree* ]] && remount_tree
        t0=$(date +%s.%N)
        run_tool "$tool" >"$WORK/out" 2>&1 || { echo "ssh-reach: $tool failed: $(tail -3 "$WORK/out")" >&2; continue; }
        t1=$(date +%s.%N)
        case $tool in
        *1k*) cmp -s "$WORK/small.bin" "$WORK/dst/small.bin" || { echo "ssh-reach: $tool's copy differs" >&2; continue; } ;;
        ssh-true) ;;
        *-tree*) diff -r -q "$TREE" "$WORK/dst/tree" >/dev/null || { echo "ssh-reach: $tool's tree differs" >&2; continue; } ;;
        *) cmp -s "$WORK/big.bin" "$WORK/dst/big.bin" || { echo "ssh-reach: $tool's copy differs" >&2; continue; } ;;
        esac
        [ "$r" -le 0 ] && continue
        printf '%s\t%s\t%s\n' "$r" "$tool" "$(echo "$t1 - $t0" | bc)" | tee -a "$TSV"
    done
done
echo
echo "# ssh-reach, RTT $RTT, rate $RATE, $SIZE_MIB MiB, $ROUNDS rounds, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$TSV" "$SIZE_MIB" "$RTT" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
mib, rtt = int(sys.argv[2]), float(sys.argv[3].rstrip("ms")) / 1000
med = {}
for tool in dict.fromkeys(r[1] for r in rows):
    s = [float(r[2]) for r in rows if r[1] == tool]
    med[tool] = statistics.median(s)
    rate = "" if "1k" in tool or "tree" in tool or tool == "ssh-true" else f"  {mib * 8 * 1.048576 / med[tool] / 1000:.3f} Gbit/s"
    print(f"  {tool:10} {med[tool]:7.3f} s ({min(s):.3f}-{max(s):.3f}){rate}  (n={len(s)})")
for a, b in (("ssh", "server"), ("ssh-mux", "server"), ("ssh-old", "server"), ("ssh-1k", "server-1k"), ("ssh-1k-old", "server-1k"), ("ssh-tree", "server-tree"), ("ssh-tree-old", "server-tree"), ("ssh-tree", "ssh-tree-old")):
    if a in med and b in med:
        d = med[a] - med[b]
        print(f"  {a} / {b}: rate {med[b] / med[a]:.3f}, {d:+.3f} s = {d / rtt:+.1f} round trips")
if "ssh-true" in med:
    print(f"  ssh login: {med['ssh-true']:.3f} s = {med['ssh-true'] / rtt:.1f} round trips")
PY
