#!/usr/bin/env bash
# bench/cold-copy.sh - issue 45's comparisons the matrix cannot make: one big file with the page cache
# dropped before every run (disk) or in memory (shm), and a tree of small files cold, longhaul against
# GridFTP at several settings, the rsync daemon and the local copy, plus longhaul over ssh reach (no
# server: `cp SRC HOST:path`) and another longhaul build (OLD_BIN, an A/B), in the same run.
#
#   SCENARIOS="shm disk" TOOLS="lh lh-ssh g-p4 g-p4-bs4 dd" bash bench/cold-copy.sh [LONGHAUL_BINARY]
#   SCENARIOS=small NFILES=100000 TOOLS="lh rsyncd cp" bash bench/cold-copy.sh
#
# Scenarios: shm (/dev/shm -> /dev/shm), disk (DISK_DIR -> DISK_DIR, the page cache dropped before
# every run), small (NFILES files of 0.5-8 KiB in NFILES/11 directories, disk -> disk, cold).
# Tools, in an order rotated every round, WARMUP=1 rounds first (not counted), then ROUNDS (5):
#   lh          longhaul cp (-a for a tree) to `longhaul serve` (TLS 1.3, sealed frames, fdatasync)
#   lh-nosync   the same to a server with --no-sync (no fsync, like the peers)
#   lh-ssh      longhaul cp to 127.0.0.1:DIR over ssh (a private sshd): the far end is a one-shot
#               server started by ssh; the data goes on its own TLS streams, as with lh
#   lh-old      lh-nosync with OLD_BIN (client and its own server): an A/B of two builds
#   g-p1 g-p4 g-p8 g-p4-bs4 g-p4-bs1 g-p8-bs4   globus-url-copy -p N -tcp-bs 4M [-bs 4M|1M] to a
#               globus-gridftp-server started here (anonymous, plaintext, no hashing); trees -r -cd -fast
#   rsyncd      rsync -a -W (whole files, no compression) to an rsync daemon started here
#   ssh-true    `ssh 127.0.0.1 true` through the same sshd: what logging in costs (its seconds)
#   dd          dd bs=1M (buffered, no sync): the local-copy ceiling for one file
#   cp          cp -a of the tree: the local ceiling for a tree
# Every copy is checked (cmp, or diff -r for the tree). For each run: seconds, rate, and the
# CPU-seconds of the tool's own processes at both ends (each tool's servers and clients in a cpuacct
# cgroup of their own), and whole-host busy time from /proc/stat. Prints medians and the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5} SIZE_GIB=${SIZE_GIB:-2} SCENARIOS=${SCENARIOS:-"shm disk"} NFILES=${NFILES:-100000}
TOOLS=${TOOLS:-"lh lh-ssh g-p4 g-p4-bs4 dd"} DISK_DIR=${DISK_DIR:-/var/tmp/lh-cold-copy} WARMUP=${WARMUP:-1}
BIN=${1:-target/release/longhaul}
[ -x "$BIN" ] || cargo build --release --quiet -p longhaul
WORK=$(mktemp -d /dev/shm/lh-cold-copy.XXXXXX)
mkdir -p "$DISK_DIR" bench/results
LH=$WORK/longhaul
cp "$BIN" "$LH"
OLD=$WORK/longhaul-old
[ -n "${OLD_BIN:-}" ] && cp "$OLD_BIN" "$OLD"
PIDS=()
CG=/sys/fs/cgroup/cpuacct/lh-cold-copy-$$
mkdir -p "$CG/lh" "$CG/gridftp" "$CG/rsyncd" "$CG/local"
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.5
    rm -rf "$WORK" "$DISK_DIR"
    for g in "$CG"/*/; do
        while read -r p; do kill "$p" 2>/dev/null || true; done <"$g/cgroup.procs"
    done
    sleep 0.5
    rmdir "$CG"/* "$CG" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
STAMP=$(date -u +%Y%m%d-%H%M)
TSV=bench/results/cold-copy-$STAMP.tsv
printf 'scenario\tround\ttool\tseconds\tgbps\tcpu_s\tcpu_s_per_gib\thost_cpu_s_per_gib\n' >"$TSV"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
    echo "cold-copy: nothing listens on $1" >&2
    exit 1
}
# group log cmd...: a server in the group's cgroup (a bash of its own, so that $! is the server).
start_in() {
    local g=$1 log=$2
    shift 2
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$g" "$@" >"$log" 2>&1 &
    PIDS+=($!)
}
in_group() {
    local g=$1
    shift
    bash -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG/$g" "$@"
}
group_of() { case $1 in lh*) echo lh ;; g-*) echo gridftp ;; rsyncd) echo rsyncd ;; *) echo local ;; esac; }
cpu_ns() { cat "$CG/$1/cpuacct.usage"; }
host_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
guc_args() {
    case $1 in
    g-p1) echo "-p 1 -tcp-bs 4M" ;; g-p4) echo "-p 4 -tcp-bs 4M" ;; g-p8) echo "-p 8 -tcp-bs 4M" ;;
    g-p4-bs4) echo "-p 4 -tcp-bs 4M -bs 4M" ;; g-p4-bs1) echo "-p 4 -tcp-bs 4M -bs 1M" ;;
    g-p8-bs4) echo "-p 8 -tcp-bs 4M -bs 4M" ;;
    *) echo "cold-copy: unknown tool $1" >&2; exit 2 ;;
    esac
}

STATE=$WORK/state
mkdir -p "$STATE"
TOKEN=$("$LH" token create --state-dir "$STATE" --export '*:rw' 2>/dev/null)
TRUST=$("$LH" id "$STATE" 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -1)
ssh-keygen -q -t ed25519 -N '' -f "$WORK/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/userkey"
cp "$WORK/userkey.pub" "$WORK/authorized_keys"
mkdir -p /run/sshd
RSH="ssh -p PORT -i $WORK/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"

start_servers() { # dest
    local dest=$1
    P1=$(free_port) P2=$(free_port) PG=$(free_port) PR=$(free_port) PS=$(free_port)
    start_in lh "$WORK/serve1.log" "$LH" --no-archive serve --listen "127.0.0.1:$P1" --state-dir "$STATE" --export "data=$dest"
    start_in lh "$WORK/serve2.log" "$LH" --no-archive serve --listen "127.0.0.1:$P2" --state-dir "$STATE" --export "data=$dest" --no-sync
    if [ -n "${OLD_BIN:-}" ]; then
        P3=$(free_port)
        start_in lh "$WORK/serve3.log" "$OLD" --no-archive serve --listen "127.0.0.1:$P3" --state-dir "$STATE" --export "data=$dest" --no-sync
        wait_port "$P3"
    fi
    start_in gridftp "$WORK/gridftp.log" globus-gridftp-server -aa -anonymous-user root -allow-root -p "$PG" \
        -control-interface 127.0.0.1 -data-interface 127.0.0.1 -d error,warn
    printf 'use chroot = no\nuid = root\ngid = root\nread only = no\n[data]\n  path = %s\n' "$dest" >"$WORK/rsyncd.conf"
    start_in rsyncd "$WORK/rsyncd.log" rsync --daemon --no-detach --address=127.0.0.1 --port="$PR" --config="$WORK/rsyncd.conf"
    printf 'Port %s\nListenAddress 127.0.0.1\nHostKey %s/hostkey\nPidFile %s/sshd.pid\nAuthorizedKeysFile %s/authorized_keys\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n' \
        "$PS" "$WORK" "$WORK" "$WORK" >"$WORK/sshd_config"
    # In longhaul's group: the one-shot far ends it starts are longhaul's CPU.
    start_in lh "$WORK/sshd.log" /usr/sbin/sshd -D -e -f "$WORK/sshd_config"
    for p in $P1 $P2 $PG $PR $PS; do wait_port "$p"; done
}

run_tool() { # tool src dest: copies src (a file, or a tree's directory) into dest
    local tool=$1 src=$2 dst=$3 r=()
    [ -d "$src" ] && r=(-a)
    local lh_env=(env LONGHAUL_TRUST="$TRUST" LONGHAUL_TOKEN="$TOKEN")
    case $tool in
    lh) in_group lh "${lh_env[@]}" "$LH" --no-archive cp "${r[@]}" --force "$src" "longhaul://127.0.0.1:$P1/data/${dst#"$DEST_ROOT"/}/" ;;
    lh-nosync) in_group lh "${lh_env[@]}" "$LH" --no-archive cp "${r[@]}" --force "$src" "longhaul://127.0.0.1:$P2/data/${dst#"$DEST_ROOT"/}/" ;;
    lh-old) in_group lh "${lh_env[@]}" "$OLD" --no-archive cp "${r[@]}" --force "$src" "longhaul://127.0.0.1:$P3/data/${dst#"$DEST_ROOT"/}/" ;;
    lh-ssh) in_group lh env LONGHAUL_RSH="${RSH/PORT/$PS}" "$LH" --no-archive cp "${r[@]}" --force --remote-path "$LH" "$src" "127.0.0.1:$dst/" ;;
    g-*)
        # shellcheck disable=SC2046
        if [ -d "$src" ]; then
            in_group gridftp globus-url-copy -r -cd -fast $(guc_args "$tool") "file://$src/" "ftp://127.0.0.1:$PG$dst/$(basename "$src")/"
        else
            in_group gridftp globus-url-copy $(guc_args "$tool") "file://$src" "ftp://127.0.0.1:$PG$dst/$(basename "$src")"
        fi ;;
    rsyncd) in_group rsyncd rsync -a -W "$src" "rsync://127.0.0.1:$PR/data/${dst#"$DEST_ROOT"/}/" ;;
    ssh-true) in_group local ${RSH/PORT/$PS} 127.0.0.1 true ;;
    dd) in_group local dd if="$src" of="$dst/$(basename "$src")" bs=1M status=none ;;
    cp) in_group local cp -a "$src" "$dst/" ;;
    *) echo "cold-copy: unknown tool $tool" >&2; exit 2 ;;
    esac
}

make_file() { # path: SIZE_GIB GiB of incompressible bytes
    python3 - "$1" "$SIZE_GIB" <<'EOF'
import os, sys
block = os.urandom(1 << 20)
with open(sys.argv[1], "wb") as f:
    for i in range(int(float(sys.argv[2]) * 1024)):
        f.write(i.to_bytes(8, "little") + block[8:])
EOF
}
make_tree() { python3 bench/lib/tree-45.py "$1" "$NFILES"; } # NFILES files of 0.5-8 KiB in NFILES/11 dirs
same() { # src copy
    if [ -d "$1" ]; then diff -rq "$1" "$2" >/dev/null; else cmp -s "$1" "$2"; fi
}

for sc in $SCENARIOS; do
    case $sc in
    shm) base=$WORK/shm ;;
    disk | small) base=$DISK_DIR ;;
    *) echo "cold-copy: unknown scenario $sc" >&2; exit 2 ;;
    esac
    mkdir -p "$base/src" "$base/dst"
    chmod 777 "$base/dst"
    DEST_ROOT=$base/dst
    if [ "$sc" = small ]; then
        make_tree "$base/src/tree"
        item=$base/src/tree
        gib=$(du -sk --apparent-size "$item" | awk '{print $1 / 1048576}')
    else
        make_file "$base/src/big.bin"
        item=$base/src/big.bin
        gib=$SIZE_GIB
    fi
    start_servers "$base/dst"
    read -ra tools <<<"$TOOLS"
    for r in $(seq $((1 - WARMUP)) "$ROUNDS"); do
        n=${#tools[@]}
        for i in $(seq 0 $((n - 1))); do
            tool=${tools[$(((i + r) % n))]}
            out=$base/dst/$tool
            rm -rf "$out"
            mkdir -p "$out"
            sync
            [ "$sc" != shm ] && echo 3 >/proc/sys/vm/drop_caches
            g=$(group_of "$tool")
            c0=$(cpu_ns "$g") h0=$(host_busy) t0=$(date +%s.%N)
            if ! run_tool "$tool" "$item" "$out" >"$WORK/out" 2>&1; then
                echo "cold-copy: $tool failed: $(tail -3 "$WORK/out")" >&2
                continue
            fi
            t1=$(date +%s.%N) c1=$(cpu_ns "$g") h1=$(host_busy)
            if [ "$tool" != ssh-true ] && ! same "$item" "$out/$(basename "$item")"; then
                echo "cold-copy: $tool's copy differs" >&2
                continue
            fi
            # Gone before the next run: copies left in memory would make the later runs of a
            # round pay for a fuller page cache (on shm, for memory itself).
            rm -rf "$out"
            [ "$r" -le 0 ] && continue
            awk -v sc="$sc" -v r="$r" -v tool="$tool" -v t0="$t0" -v t1="$t1" -v c="$((c1 - c0))" -v h="$((h1 - h0))" \
                -v g="$gib" 'BEGIN {
                    s = t1 - t0
                    printf "%s\t%s\t%s\t%.2f\t%.3f\t%.2f\t%.3f\t%.3f\n", sc, r, tool, s, g * 8 * 1.073741824 / s, c / 1e9, c / 1e9 / g, h / 100 / g }' \
                >>"$TSV"
            tail -1 "$TSV"
        done
    done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    PIDS=()
    sleep 0.5
    rm -rf "$base/src" "$base/dst"
done

echo
echo "# cold-copy, $ROUNDS rounds, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for sc in dict.fromkeys(r["scenario"] for r in rows):
    med = {}
    print(f"\n{sc}: tool | seconds | Gbit/s median (min-max) | CPU-s own cgroups | CPU-s/GiB own cgroups | CPU-s/GiB host busy")
    for tool in dict.fromkeys(r["tool"] for r in rows if r["scenario"] == sc):
        mine = [r for r in rows if r["scenario"] == sc and r["tool"] == tool]
        col = lambda k: [float(r[k]) for r in mine]
        med[tool] = {k: statistics.median(col(k)) for k in ("seconds", "gbps", "cpu_s", "cpu_s_per_gib", "host_cpu_s_per_gib")}
        g = col("gbps")
        m = med[tool]
        print(f"  {tool:10} {m['seconds']:7.2f} {m['gbps']:7.3f} ({min(g):.3f}-{max(g):.3f}) {m['cpu_s']:7.2f} {m['cpu_s_per_gib']:6.3f} {m['host_cpu_s_per_gib']:6.3f}  (n={len(mine)})")
    peers = [t for t in med if t.startswith("g-") or t == "rsyncd"]
    if peers:
        best = max(peers, key=lambda t: med[t]["gbps"])
        print(f"  the best peer by rate: {best}")
        for t in med:
            if t.startswith("lh"):
                print(f"  {t} / {best}: rate {med[t]['gbps'] / med[best]['gbps']:.2f}, CPU {med[t]['cpu_s'] / med[best]['cpu_s']:.2f}")
    for a, b in (("lh-ssh", "lh"), ("lh-nosync", "lh-old"), ("lh", "dd"), ("lh", "cp")):
        if a in med and b in med:
            print(f"  {a} / {b}: rate {med[a]['gbps'] / med[b]['gbps']:.2f}, CPU {med[a]['cpu_s'] / med[b]['cpu_s']:.2f}")
EOF
echo "(lines: $TSV)"
