#!/usr/bin/env bash
# A CPU and disk load beside whatever runs next: the test suite must pass
# with it (issue 13, "tests that hold on a busy machine").
#
#   scripts/load.sh start [--cpu N] [--disk DIR]   starts N CPU burners (default:
#                                                  one per core) and a disk writer
#                                                  (1 GiB files written, fsynced,
#                                                  deleted, in a loop, in DIR;
#                                                  default /var/tmp), in the background
#   scripts/load.sh stop                           ends them (by the PIDs it recorded)
#   scripts/load.sh run [--cpu N] [--disk DIR] -- CMD...
#                                                  CMD with the load beside it; the
#                                                  load ends when CMD does; CMD's exit code
#
# The burners run at normal priority: they take the cores from the tests.
set -euo pipefail

PIDFILE=${LOAD_PIDFILE:-/tmp/longhaul-load.pids}
CPU=$(nproc)
DISK=/var/tmp

start() {
    [ -e "$PIDFILE" ] && { echo "load: already running (see $PIDFILE); stop it first" >&2; exit 1; }
    local pids=() dir
    for _ in $(seq "$CPU"); do
        # A busy loop in a shell of its own: no fork per iteration.
        bash -c 'while :; do :; done' &
        pids+=($!)
    done
    dir=$(mktemp -d "$DISK/longhaul-load.XXXXXX")
    bash -c '
        trap "rm -rf \"$1\"; exit 0" TERM
        while :; do
            dd if=/dev/zero of="$1/f" bs=1M count=1024 conv=fsync status=none 2>/dev/null || sleep 1
            rm -f "$1/f"
        done' load-disk "$dir" &
    pids+=($!)
    printf '%s\n' "${pids[@]}" >"$PIDFILE"
    echo "load: $CPU CPU burner(s) and a disk writer in $dir (PIDs ${pids[*]})"
}

stop() {
    [ -e "$PIDFILE" ] || return 0
    while read -r p; do kill -TERM "$p" 2>/dev/null || true; done <"$PIDFILE"
    while read -r p; do wait "$p" 2>/dev/null || true; done <"$PIDFILE"
    rm -f "$PIDFILE"
    echo "load: stopped"
}

cmd=${1:-}
[ -n "$cmd" ] && shift
while [ $# -gt 0 ]; do
    case $1 in
    --cpu) CPU=$2; shift 2 ;;
    --disk) DISK=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
case $cmd in
start) start ;;
stop) stop ;;
run)
    [ $# -gt 0 ] || { echo "load: run needs a command after --" >&2; exit 2; }
    start
    trap stop EXIT
    rc=0
    "$@" || rc=$?
    exit $rc
    ;;
*) sed -n '2,16p' "$0"; exit 2 ;;
esac
