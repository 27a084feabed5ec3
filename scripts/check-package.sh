#!/usr/bin/env bash
# The release check (CI's packaging phase; root):
#   1. bash scripts/release.sh: the portable archive and the Debian package under target/dist/;
#   2. the tests of what it made (crates/cli/tests/it/portable.rs: the GLIBC ceiling and a run
#      here, the archive's contents and checksums, --copy-binary sending the portable build to
#      a far host with an older glibc), required to run (LONGHAUL_REQUIRE_DIST=1);
#   3. the Debian package in a clean root: a minbase Debian made once by mmdebstrap (bullseye,
#      the oldest release deb.debian.org still serves, glibc 2.31; bookworm once it is gone),
#      unpacked afresh into a tmpfs that only a mount namespace of its own sees, with its own
#      PID and network namespaces (nothing of the host's processes or ports; everything in it
#      ends with it, even after a kill -9). There: dpkg -i, `longhaul --version`, the command
#      the unit runs, read from the installed unit and configuration and run as the unit's user,
#      serving a real `ls`, then dpkg --purge, after which nothing of the package is left but
#      its system user (Debian leaves those, see dist/debian/postrm). Before that, the packaged
#      unit's hardening is scored by `systemd-analyze security --offline` (2.5 at most).
#
# Tools and the clean root are cached under LONGHAUL_CI_CACHE (default /var/cache/longhaul-ci),
# outside the checkout, so that a second run on the same machine spends its time on the build.
#
# Usage: bash scripts/check-package.sh
set -euo pipefail

# What runs inside the clean root (this file, copied there): $2 is the package file.
in_root() {
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C HOME=/root
    local deb=$2 unit conf
    listing() {
        find / -xdev \( -path /tmp -o -path /proc -o -path /var/lib/dpkg -o -path /var/log \
            -o -path /var/cache -o -path /root \) -prune -o -print | sort
    }
    listing >/tmp/before
    dpkg -i "/tmp/$deb"
    longhaul --version
    for f in /usr/bin/longhaul /usr/share/man/man1/longhaul.1.gz /usr/share/man/man1/longhaul-cp.1.gz \
        /usr/share/bash-completion/completions/longhaul /usr/share/zsh/vendor-completions/_longhaul \
        /usr/share/fish/vendor_completions.d/longhaul.fish /etc/longhaul/serve.conf; do
        [ -f "$f" ] || { echo "check-package: $f is not installed" >&2; exit 1; }
    done
    [ "$(stat -c '%U %a' /var/lib/longhaul)" = "longhaul 700" ] ||
        { echo "check-package: /var/lib/longhaul is not longhaul's alone" >&2; exit 1; }
    [ "$(stat -c '%U %a' /etc/longhaul/serve.conf)" = "root 644" ] ||
        { echo "check-package: /etc/longhaul/serve.conf is not root's to change" >&2; exit 1; }

    # The unit's command, from what the package installed, as systemd would run it: its user
    # (and that user's home), its environment file, the variable split into words.
    unit=$(dpkg -L longhaul | grep '/systemd/system/longhaul-serve.service$')
    read_key() { sed -n "s/^$1=//p" "$unit"; }
    local user exec_start opts cmd
    user=$(read_key User)
    conf=$(read_key EnvironmentFile)
    exec_start=$(read_key ExecStart)
    opts=$(set -a && . "$conf" && echo "$LONGHAUL_SERVE_OPTS")
    read -ra cmd <<<"${exec_start//\$LONGHAUL_SERVE_OPTS/$opts}"
    echo "check-package: the unit runs, as $user: ${cmd[*]}"
    mkdir -p /data && echo "served from the clean root" >/data/hello.txt && chown -R "$user:" /data
    as_user() { env HOME=/var/lib/longhaul USER="$user" LOGNAME="$user" setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"; }
    local token fp
    token=$(as_user longhaul token create --state-dir /var/lib/longhaul --export data 2>/dev/null)
    fp=$(as_user longhaul id /var/lib/longhaul 2>/dev/null | grep -o 'SHA256:[^ ]*' | head -n 1)
    as_user "${cmd[@]}" >/tmp/serve.log 2>&1 &
    local serve=$! until=$((SECONDS + 60))
    export LONGHAUL_TOKEN=$token LONGHAUL_TRUST=$fp LONGHAUL_KNOWN_HOSTS=/tmp/known_hosts
    until longhaul ls --no-archive --retries 0 127.0.0.1:5310:data/ >/tmp/ls.out 2>/tmp/ls.err; do
        kill -0 "$serve" 2>/dev/null || { echo "check-package: the unit's command ended:" >&2; cat /tmp/serve.log >&2; exit 1; }
        [ "$SECONDS" -lt "$until" ] || { echo "check-package: no answer on :5310 within 60 s:" >&2; cat /tmp/serve.log /tmp/ls.err >&2; exit 1; }
        sleep 0.2
    done
    grep -q hello.txt /tmp/ls.out || { echo "check-package: ls did not list /data:" >&2; cat /tmp/ls.out >&2; exit 1; }
    echo "check-package: the installed server listed /data to the installed client"
    kill "$serve" && wait "$serve" || true

    dpkg --purge longhaul
    listing >/tmp/after
    local left
    left=$(comm -13 /tmp/before /tmp/after | grep -vxE '/etc/(passwd|group|shadow|gshadow)-' | grep -vx /data | grep -v '^/data/' || true)
    gone=$(comm -23 /tmp/before /tmp/after || true)
    if [ -n "$left$gone" ]; then
        echo "check-package: after dpkg --purge, left: ${left:-none}; gone: ${gone:-none}" >&2
        exit 1
    fi
    getent passwd "$user" >/dev/null || { echo "check-package: the system user went with the package" >&2; exit 1; }
    echo "check-package: purged; of $(wc -l </tmp/after) paths, nothing of the package is left but the system user $user"
}

# The namespaces' side: the clean root unpacked into a tmpfs only they see, then in_root.
in_namespaces() {
    local tar=$2 deb=$3 root=$4
    mount -t tmpfs -o size=2g,mode=0755 longhaul-clean-root "$root"
    tar -xf "$tar" -C "$root"
    mount -t proc proc "$root/proc"
    ip link set lo up
    cp "$deb" "$0" "$root/tmp/"
    chroot "$root" /bin/bash "/tmp/$(basename "$0")" --in-root "$(basename "$deb")"
}

case ${1:-} in
--in-root) in_root "$@"; exit ;;
--in-namespaces) in_namespaces "$@"; exit ;;
esac

cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "check-package: needs root (mmdebstrap, chroot, namespaces)" >&2; exit 1; }
CACHE=${LONGHAUL_CI_CACHE:-/var/cache/longhaul-ci}
mkdir -p "$CACHE"
export LONGHAUL_TOOLS=$CACHE/tools
t0=$SECONDS
mark() { echo "check-package: $1 done at $((SECONDS - t0)) s" >&2; }

DIST=$(bash scripts/release.sh)
mark "release build"

LONGHAUL_REQUIRE_DIST=1 LONGHAUL_REQUIRE_SSH=1 \
    cargo nextest run --cargo-profile ci --locked -p longhaul --test it -E 'test(/^portable::/)'
mark "tests of the release"

# The packaged unit's hardening as systemd scores it, offline from the package's own files:
# an exposure of 2.5 at most on its 0-10 scale (`--threshold` counts tenths).
deb=$(ls "$DIST"/longhaul_*.deb)
unpacked=$(mktemp -d)
dpkg-deb -x "$deb" "$unpacked"
systemd-analyze security --offline=true --threshold=25 --root="$unpacked" \
    /usr/lib/systemd/system/longhaul-serve.service | tail -n 1
rm -rf "$unpacked"

# The clean root, made once: the oldest Debian the mirror serves.
root_tar=""
for suite in bullseye bookworm; do
    tar=$CACHE/clean-root-$suite-minbase.tar
    if [ ! -s "$tar" ]; then
        command -v mmdebstrap >/dev/null 2>&1 ||
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
        mmdebstrap --quiet --variant=minbase "$suite" "$tar.part" >&2 || { rm -f "$tar.part"; continue; }
        mv "$tar.part" "$tar"
    fi
    root_tar=$tar
    echo "check-package: clean root: Debian $suite minbase ($tar)" >&2
    break
done
[ -n "$root_tar" ] || { echo "check-package: mmdebstrap could make no clean root" >&2; exit 1; }
mark "clean root"

# The mount point is all the namespaces leave behind.
mnt=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-clean-root.XXXXXX")
trap 'rmdir "$mnt"' EXIT
unshare --mount --pid --net --fork bash "$PWD/scripts/check-package.sh" --in-namespaces "$root_tar" "$deb" "$mnt"
mark "package in the clean root"
bin=$(ls "$DIST"/longhaul-*-linux-gnu/longhaul)
echo "check-package: binary $(stat -c %s "$bin") bytes, package $(stat -c %s "$deb") bytes ($(dpkg-deb -f "$deb" Installed-Size) KiB installed)"
