# bench/lib/matrix.sh - sourced by the bench scripts that are thin calls of `longhaul matrix`
# (issue 30: one harness for every comparison). The matrix starts the peers' servers on free ports
# (in a private namespace as root), alternates the tools run by run, times them, measures the CPU of
# both ends, verifies every file cell (BLAKE3 of every file), measures the same-run limits and prints
# the table with longhaul's ratio to the best peer and to the limit under each workload.
#
#   LONGHAUL_BIN  the binary (default: target/release/longhaul, built when absent)
#   ROUNDS        runs per cell, alternating (default 3); a cell is their median with min and max
#   RESULTS       where the JSON document goes (default bench/results/NAME-DATE.json; --resume
#                 with it continues an interrupted run)
# Extra arguments are the matrix's own (e.g. --json, --md, --dry-run, --paths, --tools).

lh_matrix() {
    local root bin name results
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    bin=${LONGHAUL_BIN:-$root/target/release/longhaul}
    if [ ! -x "$bin" ]; then
        (cd "$root" && cargo build --release -p longhaul) || return 1
    fi
    name=$(basename "$0" .sh)
    results=${RESULTS:-$root/bench/results/$name-$(date -u +%Y%m%d-%H%M).json}
    mkdir -p "$(dirname "$results")"
    echo "bench/$name.sh: $bin matrix --runs ${ROUNDS:-3} $* (cells kept in $results)" >&2
    "$bin" matrix --runs "${ROUNDS:-3}" --resume "$results" "$@"
}
