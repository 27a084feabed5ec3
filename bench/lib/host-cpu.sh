#!/bin/bash
# bench/lib/host-cpu.sh TAG CMD...: runs CMD and appends "TAG START END BUSY_TICKS rc=RC ARG" to
# $HOSTCPU_LOG (default /dev/null): the whole host's busy time (/proc/stat: all but idle and iowait,
# in USER_HZ ticks) over CMD's run. Reads /proc/stat with builtins only, so it adds no CPU of its own.
tag=$1; shift
read -r _ u n s i w q sq st _ < /proc/stat; t0=$EPOCHREALTIME
"$@"; rc=$?
read -r _ u2 n2 s2 i2 w2 q2 sq2 st2 _ < /proc/stat; t1=$EPOCHREALTIME
busy=$(( (u2+n2+s2+q2+sq2+st2) - (u+n+s+q+sq+st) ))
echo "$tag $t0 $t1 $busy rc=$rc ${*: -2:1}" >> "${HOSTCPU_LOG:-/dev/null}"
exit $rc
