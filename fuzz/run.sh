#!/usr/bin/env bash
# Runs every fuzz target under libFuzzer (cargo-fuzz: coverage-guided, with a
# sanitizer, on a nightly toolchain) for SECONDS each (default 30), starting
# from its corpus in fuzz/corpus/<target>/ (which it grows), and prints how
# many inputs each executed. Crashes land in fuzz/artifacts/<target>/; a
# crashing target does not stop the others, but the script then exits 1.
# (CI runs the stable smoke runner instead, fuzz/tests/smoke.rs: see .ci/run.)
#
# Usage: fuzz/run.sh [SECONDS]
set -uo pipefail

secs="${1:-30}"
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || exit 1
fi

# cargo-fuzz needs nightly flags (-Zsanitizer). Use a nightly toolchain when
# rustup has one; otherwise let stable accept them.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

targets=$("${fuzz[@]}" list) || exit 1
"${fuzz[@]}" build --features libfuzzer || exit 1

status=0
summary=()
for t in $targets; do
    log="target/fuzz-$t.log"
    mkdir -p "corpus/$t"
    extra=()
    # Targets that parse control frames start from the message field names.
    case "$t" in
        frame_decoder | server_session | client_session) extra=(-dict="$PWD/frame.dict") ;;
        auth_parsers) extra=(-dict="$PWD/auth.dict") ;;
    esac
    echo "== $t for ${secs}s" >&2
    "${fuzz[@]}" run --features libfuzzer "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ "$rc" -ne 0 ]; then
        status=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        summary+=("$t: FAILED after ${execs:-?} executions; artifact ${artifact:-none}; log fuzz/$log")
        grep -m1 -E "panicked at|ERROR: " "$log" >&2
    else
        summary+=("$t: ${execs:-?} executions in ${secs}s, no crash")
    fi
done

printf '%s\n' "${summary[@]}"
exit "$status"
