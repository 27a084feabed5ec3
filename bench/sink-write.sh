#!/usr/bin/env bash
# bench/sink-write.sh - the sink's write mode on loopback, a warm 256 MiB elephant (issue 46 session g,
# BENCHMARKS.md): longhaul with the sink's writes O_DIRECT (an older build, OLD_BIN: before a770726
# every file of 8 MiB or more on ext4/XFS was written so), the same build with every file buffered
# (LONGHAUL_DIRECT=off at both ends), this build (buffered while the page cache can hold a file a
# copy does not sync), this build at -P 2 and -P 4 and without the cipher (--insecure-plaintext),
# GridFTP at its loopback sweep's winner and the local copy, alternating, in one `longhaul matrix`
# run. Both longhaul servers with --no-sync and the clients with --no-sync, as no peer syncs.
#
#   OLD_BIN=/path/to/an/older/longhaul bash bench/sink-write.sh          # ROUNDS=7 SIZE=256M
#   bash bench/sink-write.sh                                             # this build's variants only
#
# Environment: OLD_BIN (optional), ROUNDS (7), SIZE (256M), WORK_DIR (a directory on the ext4 or XFS
# disk to test: O_DIRECT does not apply on tmpfs), LONGHAUL_BIN, RESULTS.
set -euo pipefail
. "$(dirname "$0")/lib/matrix.sh"
tools_file=$(mktemp --suffix=.toml)
trap 'rm -f "$tools_file"' EXIT
lh_tool() { # name, bin, server env, client args (TOML list items), about
    cat <<TOML
[[tool]]
name = "$1"
bin = "$2"
about = "$5"
version = ["{bin}", "--version"]
kind = "files"
keeps = { empty_dirs = true, symlinks = true, modes = true }
put = ["{bin}", "--no-archive", "cp", "-a", "--force", "{args}", "{src}", "longhaul://{host}:{port}/m/{dstdir_rel}/"]
get = ["{bin}", "--no-archive", "cp", "-a", "--force", "{args}", "longhaul://{host}:{port}/m/{src_rel}", "{dstdir}/"]
server = { argv = ["env", $3, "{bin}", "--no-archive", "serve", "--no-sync", "--allow-plaintext", "--listen", "{host}:{port}", "--state-dir", "{state}", "--export", "m={root}"] }
env = [
  { var = "LONGHAUL_TRUST", argv = ["{bin}", "id", "{state}"] },
  { var = "LONGHAUL_TOKEN", argv = ["{bin}", "token", "create", "--state-dir", "{state}", "--export", "*:rw", "--note", "sink-write"] },
]
settings = [{ name = "defaults", why = "$5", args = [$4] }]

TOML
}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${LONGHAUL_BIN:-$root/target/release/longhaul}")
tools=()
if [ -n "${OLD_BIN:-}" ]; then
    old=$(realpath "$OLD_BIN")
    lh_tool lh-old "$old" '"LONGHAUL_DIRECT=on"' '"--no-sync", "-P", "1"' "the older build: O_DIRECT writes" >> "$tools_file"
    lh_tool lh-old-buffered "$old" '"LONGHAUL_DIRECT=off"' '"env:LONGHAUL_DIRECT=off", "--no-sync", "-P", "1"' "the older build, every file buffered" >> "$tools_file"
    tools+=(lh-old lh-old-buffered)
fi
lh_tool lh "$bin" '"LONGHAUL_DIRECT=on"' '"--no-sync", "-P", "1"' "this build, -P 1" >> "$tools_file"
lh_tool lh-p2 "$bin" '"LONGHAUL_DIRECT=on"' '"--no-sync", "-P", "2"' "this build, -P 2" >> "$tools_file"
lh_tool lh-p4 "$bin" '"LONGHAUL_DIRECT=on"' '"--no-sync", "-P", "4"' "this build, -P 4" >> "$tools_file"
lh_tool lh-plain "$bin" '"LONGHAUL_DIRECT=on"' '"--no-sync", "-P", "1", "--insecure-plaintext"' "this build, -P 1, no cipher" >> "$tools_file"
cat >> "$tools_file" <<'TOML'
[[tool]]
name = "gftp"
about = "globus-url-copy at its loopback sweep's winner (issue 46 session g)"
version = [["globus-url-copy", "-version"]]
kind = "files"
needs = ["globus-url-copy", "globus-gridftp-server"]
keeps = { empty_dirs = true }
report = "globus-url-copy"
put = ["globus-url-copy", "-r", "-cd", "-vb", "{args}", "file://{src}/", "ftp://{host}:{port}{dst}/"]
get = ["globus-url-copy", "-r", "-cd", "-vb", "{args}", "ftp://{host}:{port}{src}/", "file://{dst}/"]
server = { hosts_file = true, argv = ["globus-gridftp-server", "-aa", "-anonymous-user", "root", "-allow-root", "-p", "{port}", "-control-interface", "{host}", "-data-interface", "{host}", "-d", "error,warn"] }
settings = [{ name = "defaults", why = "-p 1 -tcp-bs 1250000 -fast", args = ["-p", "1", "-tcp-bs", "1250000", "-fast"] }]
TOML
tools+=(lh lh-p2 lh-p4 lh-plain gftp cp)
extra=()
[ -n "${WORK_DIR:-}" ] && extra+=(--work-dir "$WORK_DIR")
ROUNDS=${ROUNDS:-7} lh_matrix --tools-file "$tools_file" --tools "$(IFS=,; echo "${tools[*]}")" \
    --paths loopback --workloads elephant --size "${SIZE:-256M}" "${extra[@]}" "$@"
