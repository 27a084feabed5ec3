#!/usr/bin/env bash
# Fault soak (issue 13): a mixed tree (one big file, many small files, links,
# empty files and directories) copied by `longhaul cp` while faults strike:
#   kills   N times: SIGKILL of the client or of the server (chosen at random) at
#           a random point of the copy; then the end is restarted and the copy run
#           again (it resumes) until it completes;
#   outage  a 10 s outage of the link on `longhaul wan` in the middle of a copy
#           (needs root): the copy rides it out with its retries, or a rerun ends it;
#   full    a destination (a tmpfs of fixed size) that fills up during the copy,
#           and is then freed: the copy fails cleanly, the rerun completes.
# After every fault, and again after every completed rerun, the destination is
# checked: no file under a final name is ever anything but the source's bytes
# (half-written data only ever sits in .NAME.lhpart files), and after the rerun
# the tree is identical to the source (types, sizes, bytes, link targets, empty
# directories). The peak RSS of the client and the server is recorded.
#
# Usage: [LONGHAUL_BIN=PATH] bench/soak.sh [--kills N] [--big-mib N] [--small N] [--only kills|outage|full]
#                      [--work DIR] [--keep]
# Prints one line per run and a summary; exit 0 only if every run ended identical.
# Runs on loopback (and in namespaces of its own for the outage).
set -euo pipefail
cd "$(dirname "$0")/.."

KILLS=20 BIG_MIB=2048 SMALL=20000 ONLY="" KEEP=0
WORK=/dev/shm/lh-soak.$$
while [ $# -gt 0 ]; do
    case $1 in
    --kills) KILLS=$2; shift 2 ;;
    --big-mib) BIG_MIB=$2; shift 2 ;;
    --small) SMALL=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "soak: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }
die() { echo "soak: $*" >&2; exit 1; }

# LONGHAUL_BIN: a binary to soak instead of building this checkout's.
if [ -n "${LONGHAUL_BIN:-}" ]; then
    LH=$LONGHAUL_BIN
else
    cargo build --release --locked -q -p longhaul
    LH=$PWD/target/release/longhaul
fi
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
SRC=$WORK/src STATE=$WORK/state LOG=$WORK/log
mkdir -p "$STATE" "$LOG"
PIDS=()
MOUNTS=()
WAN_PID=""
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    if [ -n "$WAN_PID" ]; then kill -TERM "$WAN_PID" 2>/dev/null || true; wait "$WAN_PID" 2>/dev/null || true; fi
    for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
    [ $KEEP = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT

# ------------------------------------------------------------------ tree ----
python3 - "$SRC" "$BIG_MIB" "$SMALL" <<'EOF'
import os, random, sys
root, big_mib, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(13)
os.makedirs(root, exist_ok=True)
with open(f"{root}/big.bin", "wb") as f:
    block = os.urandom(1 << 20)
    for i in range(big_mib):
        # Every MiB different, cheaply: a counter in its first bytes.
        f.write(i.to_bytes(8, "little") + block[8:])
ndirs = max(1, n // 100)
for i in range(n):
    d = f"{root}/small/d{i % ndirs:03d}"
    os.makedirs(d, exist_ok=True)
    size = 0 if i % 97 == 0 else rng.randint(1, 65536)
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(size))
for i in range(5):
    os.makedirs(f"{root}/empty/e{i}", exist_ok=True)
os.makedirs(f"{root}/odd names", exist_ok=True)
with open(f"{root}/odd names/a b\tc", "wb") as f:
    f.write(b"tab and space\n")
os.symlink("big.bin", f"{root}/link-to-big")
os.symlink("small/d000", f"{root}/link-to-dir")
os.symlink("no/such/target", f"{root}/dangling")
os.symlink("../big.bin", f"{root}/empty/e0/up")
EOF
TREE_BYTES=$(du -sb "$SRC" | cut -f1)
echo "tree: $(find "$SRC" | wc -l) entries, $((TREE_BYTES >> 20)) MiB in $SRC"

# The checker: `final DEST` (no final-named file differs from the source) or
# `same DEST` (the tree is identical to the source).
CHECK=$WORK/check.py
cat >"$CHECK" <<'EOF'
import filecmp, os, stat, sys
mode, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
def partial(name):
    return name.startswith(".") and (name.endswith(".lhpart") or name.endswith(".lhjournal"))
bad = []
seen = set()
for d, dirs, files in os.walk(dst):
    for name in dirs + files:
        p = os.path.join(d, name)
        rel = os.path.relpath(p, dst)
        if partial(name):
            if mode == "same":
                bad.append(f"left over: {rel}")
            continue
        seen.add(rel)
        s = os.path.join(src, rel)
        try:
            ms, md = os.lstat(s), os.lstat(p)
        except FileNotFoundError:
            bad.append(f"not in the source: {rel}")
            continue
        if stat.S_IFMT(ms.st_mode) != stat.S_IFMT(md.st_mode):
            bad.append(f"type differs: {rel}")
        elif stat.S_ISLNK(md.st_mode):
            if os.readlink(s) != os.readlink(p):
                bad.append(f"link target differs: {rel}")
        elif stat.S_ISREG(md.st_mode):
            if ms.st_size != md.st_size or not filecmp.cmp(s, p, shallow=False):
                bad.append(f"HALF-WRITTEN or wrong under its final name: {rel}")
if mode == "same":
    for d, dirs, files in os.walk(src):
        for name in dirs + files:
            rel = os.path.relpath(os.path.join(d, name), src)
            if rel not in seen:
                bad.append(f"missing: {rel}")
for b in bad[:20]:
    print(b)
sys.exit(1 if bad else 0)
EOF

# ---------------------------------------------------------------- server ----
FP=$("$LH" id "$STATE" 2>/dev/null || true)
if [ -z "$FP" ]; then
    # A state directory is made by the first `serve`; start one briefly.
    "$LH" serve --listen 127.0.0.1:0 --state-dir "$STATE" --export "x=$WORK" >"$LOG/first.log" 2>&1 &
    p=$!; sleep 1; kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
    FP=$("$LH" id "$STATE") || die "longhaul id $STATE failed"
fi
TOKEN=$("$LH" token create --state-dir "$STATE" --export '*:rw' --note soak 2>"$LOG/token.log") ||
    die "token create failed: $(cat "$LOG/token.log")"
export LONGHAUL_TRUST=$FP LONGHAUL_TOKEN=$TOKEN
export LONGHAUL_KNOWN_HOSTS=$WORK/known_hosts LONGHAUL_PATHS=$WORK/paths.json
PORT=$((20000 + RANDOM % 20000))
SERVER_PID=""
SERVER_HWM=0
start_server() { # export-dir [listen-address]
    local at=${2:-127.0.0.1}
    "$LH" serve --listen "$at:$PORT" --state-dir "$STATE" --export "data=$1" >>"$LOG/server.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    for _ in $(seq 50); do
        ss -ltn "sport = :$PORT" | grep -q LISTEN && return 0
        sleep 0.1
    done
    die "the server did not listen on $PORT (see $LOG/server.log)"
}
server_hwm() { # records the server's peak RSS while it runs
    local k
    k=$(awk '/VmHWM/ { print $2 }' "/proc/$SERVER_PID/status" 2>/dev/null || echo 0)
    [ "${k:-0}" -gt "$SERVER_HWM" ] && SERVER_HWM=$k
    return 0
}
stop_server() {
    server_hwm
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
}

CLIENT_HWM=0
# Runs the copy to completion (resuming), at most 5 attempts; records the
# client's peak RSS. Returns cp's last exit code.
complete() { # dest-url [cp options...]
    local dest=$1 rc=1 k
    shift
    for _ in 1 2 3 4 5; do
        rc=0
        /usr/bin/time -f %M -o "$LOG/time" "$LH" cp -r --retries 5 "$@" "$SRC" "$dest" \
            >"$LOG/cp.out" 2>"$LOG/cp.err" || rc=$?
        k=$(tail -n 1 "$LOG/time" | tr -dc 0-9)
        [ "${k:-0}" -gt "$CLIENT_HWM" ] && CLIENT_HWM=$k
        [ $rc = 0 ] && return 0
    done
    return $rc
}

FAILS=0
RESULTS=()
record() { # name ok detail
    RESULTS+=("$1 $2")
    printf '%-10s %-4s %s\n' "$1" "$2" "$3"
    [ "$2" = ok ] || FAILS=$((FAILS + 1))
}

# ------------------------------------------------------------------ kills ----
if want kills; then
    DEST=$WORK/dest
    mkdir -p "$DEST"
    start_server "$DEST"
    # The copy's length, for the kill points.
    t0=$(date +%s.%N)
    complete "127.0.0.1:$PORT:data/" || die "the first, unbroken copy failed: $(tail -n 3 "$LOG/cp.err")"
    full_s=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$(date +%s.%N)")
    python3 "$CHECK" same "$SRC" "$DEST/src" || die "the unbroken copy is not identical"
    echo "unbroken copy: ${full_s} s"
    KILLED_CLIENT=0 KILLED_SERVER=0 OK=0
    for i in $(seq "$KILLS"); do
        rm -rf "$DEST/src"
        at=$(python3 -c "import random; print(round(random.uniform(0.05, 0.95) * $full_s, 2))")
        "$LH" cp -r --retries 0 "$SRC" "127.0.0.1:$PORT:data/" >"$LOG/cp.out" 2>"$LOG/cp.err" &
        cp_pid=$!
        PIDS+=("$cp_pid")
        sleep "$at"
        server_hwm
        if [ $((RANDOM % 2)) = 0 ]; then
            victim=client; kill -9 "$cp_pid" 2>/dev/null || true
            KILLED_CLIENT=$((KILLED_CLIENT + 1))
        else
            victim=server; stop_server
            KILLED_SERVER=$((KILLED_SERVER + 1))
        fi
        wait "$cp_pid" 2>/dev/null || true
        detail="killed the $victim at ${at}s"
        if ! python3 "$CHECK" final "$SRC" "$DEST/src" >"$LOG/check" 2>&1; then
            record "kill-$i" FAIL "$detail: $(head -n 3 "$LOG/check" | tr '\n' ';')"
            continue
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || start_server "$DEST"
        if ! complete "127.0.0.1:$PORT:data/"; then
            record "kill-$i" FAIL "$detail; the rerun failed: $(tail -n 2 "$LOG/cp.err" | tr '\n' ';')"
            continue
        fi
        if python3 "$CHECK" same "$SRC" "$DEST/src" >"$LOG/check" 2>&1; then
            OK=$((OK + 1))
            record "kill-$i" ok "$detail; rerun identical"
        else
            record "kill-$i" FAIL "$detail; after the rerun: $(head -n 3 "$LOG/check" | tr '\n' ';')"
        fi
    done
    stop_server
    echo "kills: $OK/$KILLS identical after the rerun ($KILLED_CLIENT client, $KILLED_SERVER server kills)"
    rm -rf "$DEST"
fi

# ----------------------------------------------------------------- outage ----
if want outage; then
    if [ "$(id -u)" != 0 ]; then
        record outage SKIP "needs root for network namespaces"
    else
        NAME=lhsoak$$
        DEST=$WORK/dest-wan
        mkdir -p "$DEST"
        # 1 Gbit/s so that the copy takes long enough; the outage a third
        # of the way in (the client starts about a second after the link).
        OUT_AT=$(( TREE_BYTES * 8 / 3000000000 + 2 ))
        "$LH" wan up --name "$NAME" --rate 1gbit --rtt 2ms --outage "${OUT_AT}s+10s" --json >"$LOG/wan.out" 2>"$LOG/wan.err" &
        WAN_PID=$!
        for _ in $(seq 50); do grep -q hosts "$LOG/wan.out" 2>/dev/null && break; sleep 0.1; done
        "$LH" wan exec b --name "$NAME" -- "$LH" serve --listen 198.18.0.2:$PORT --state-dir "$STATE" \
            --export "data=$DEST" >>"$LOG/server-wan.log" 2>&1 &
        WAN_SERVER=$!
        PIDS+=("$WAN_SERVER")
        sleep 1
        rc=0
        t0=$(date +%s)
        "$LH" wan exec a --name "$NAME" -- "$LH" cp -r --retries 20 "$SRC" "198.18.0.2:$PORT:data/" \
            >"$LOG/cp-wan.out" 2>"$LOG/cp-wan.err" || rc=$?
        took=$(( $(date +%s) - t0 ))
        detail="10 s outage at ${OUT_AT}s: cp exit $rc after ${took}s"
        if [ $rc != 0 ]; then
            "$LH" wan exec a --name "$NAME" -- "$LH" cp -r --retries 5 "$SRC" "198.18.0.2:$PORT:data/" \
                >>"$LOG/cp-wan.out" 2>>"$LOG/cp-wan.err" || true
            detail="$detail, then a rerun"
        fi
        if python3 "$CHECK" same "$SRC" "$DEST/src" >"$LOG/check" 2>&1; then
            record outage ok "$detail; identical"
        else
            record outage FAIL "$detail: $(head -n 3 "$LOG/check" | tr '\n' ';')"
        fi
        kill -9 "$WAN_SERVER" 2>/dev/null || true
        kill -TERM "$WAN_PID" 2>/dev/null || true
        wait "$WAN_PID" 2>/dev/null || true
        WAN_PID=""
        rm -rf "$DEST"
    fi
fi

# ------------------------------------------------------------------- full ----
if want full; then
    if [ "$(id -u)" != 0 ]; then
        record full SKIP "needs root to mount a small tmpfs"
    else
        DEST=$WORK/full
        mkdir -p "$DEST"
        # Room for the tree and 256 MiB, then a ballast that leaves half the tree's room.
        size=$(( (TREE_BYTES >> 20) + 256 ))
        mount -t tmpfs -o "size=${size}m" soak-full "$DEST"
        MOUNTS+=("$DEST")
        mkdir -p "$DEST/data"
        ballast=$(( size - (TREE_BYTES >> 21) ))
        dd if=/dev/zero of="$DEST/ballast" bs=1M count="$ballast" status=none 2>/dev/null || true
        start_server "$DEST/data"
        rc=0
        "$LH" cp -r --retries 0 "$SRC" "127.0.0.1:$PORT:data/" >"$LOG/cp-full.out" 2>"$LOG/cp-full.err" || rc=$?
        why=$(grep -m1 -io "no space[^;]*" "$LOG/cp-full.err" | head -c 120 || true)
        detail="full at ~half the tree: cp exit $rc (${why:-no ENOSPC message})"
        if [ $rc = 0 ]; then
            record full FAIL "$detail: the copy claimed success on a full disk"
        elif ! python3 "$CHECK" final "$SRC" "$DEST/data/src" >"$LOG/check" 2>&1; then
            record full FAIL "$detail: $(head -n 3 "$LOG/check" | tr '\n' ';')"
        else
            rm -f "$DEST/ballast"
            if complete "127.0.0.1:$PORT:data/" && python3 "$CHECK" same "$SRC" "$DEST/data/src" >"$LOG/check" 2>&1; then
                record full ok "$detail; freed, the rerun is identical"
            else
                record full FAIL "$detail; after freeing: $(tail -n 2 "$LOG/cp.err" "$LOG/check" | tr '\n' ';')"
            fi
        fi
        stop_server
    fi
fi

echo "peak RSS: client $((CLIENT_HWM / 1024)) MiB, server $((SERVER_HWM / 1024)) MiB"
echo "soak: ${#RESULTS[@]} runs, $FAILS failed ($(date -u +%F), $(git rev-parse --short HEAD))"
[ $FAILS = 0 ]
