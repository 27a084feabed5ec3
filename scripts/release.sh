#!/usr/bin/env bash
# Builds a release of longhaul under target/dist/, for any x86_64 Linux with glibc 2.17 or
# newer (the oldest that HPC centres still run; also Rust's own floor):
#
#   longhaul-V-x86_64-linux-gnu/          the archive's tree: longhaul (stripped), man/man1/,
#                                         completions/ (bash, zsh, fish), systemd/ (the unit and
#                                         its example serve.conf), README.md, docs/GUIDE.md, CHANGELOG.md, the
#                                         licences and SHA256SUMS of them all
#   longhaul-V-x86_64-linux-gnu.tar.gz    that tree
#   longhaul-V-x86_64-linux-gnu.debug     the binary's debug info: its .gnu_debuglink names this
#                                         file, so perf, gdb and backtraces find it beside the
#                                         binary (or under /usr/lib/debug/.build-id/)
#   longhaul_V-1_amd64.deb                the Debian package (crates/cli/Cargo.toml's metadata)
#   SHA256SUMS                            of the three files above
#
# The binary is the `profiling` build (the release build with debug info; Cargo.toml) made by
# cargo-zigbuild: zig's C toolchain compiles the C of aws-lc-sys, ring, zstd-sys and blake3
# and links against glibc 2.17's symbol versions, whatever this host's glibc is. The tools
# come at pinned versions, installed on first use under LONGHAUL_TOOLS (default
# ~/.cache/longhaul-tools): zig and cargo-zigbuild from PyPI, cargo-deb from crates.io.
#
# Usage: bash scripts/release.sh
# Needs: Rust, python3 with pip, objcopy (binutils), tar, gzip, sha256sum.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ZIG_VERSION=0.15.2
ZIGBUILD_VERSION=0.24.1
CARGO_DEB_VERSION=3.8.0
GLIBC=2.17
TRIPLE=x86_64-unknown-linux-gnu
PROFILE=profiling
TOOLS=${LONGHAUL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/longhaul-tools}

say() { echo "release: $*" >&2; }
die() { say "$*"; exit 1; }

for t in python3 objcopy tar gzip sha256sum; do
    command -v "$t" >/dev/null 2>&1 || die "$t is missing (apt-get install python3 python3-pip binutils tar gzip coreutils)"
done

# zig and cargo-zigbuild (both wheels carry a native binary), in a directory named by their
# versions; made whole or not at all, so an interrupted install is redone.
install_zig() {
    local dir=$TOOLS/zig-$ZIG_VERSION-zigbuild-$ZIGBUILD_VERSION
    if [ ! -x "$dir/bin/cargo-zigbuild" ] || [ ! -x "$dir/ziglang/zig" ]; then
        say "installing zig $ZIG_VERSION and cargo-zigbuild $ZIGBUILD_VERSION into $dir"
        mkdir -p "$TOOLS"
        rm -rf "$dir.part"
        python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
            --target "$dir.part" "ziglang==$ZIG_VERSION" "cargo-zigbuild==$ZIGBUILD_VERSION" ||
            die "pip could not install ziglang and cargo-zigbuild (apt-get install python3-pip)"
        rm -rf "$dir"
        mv "$dir.part" "$dir"
    fi
    export PATH=$dir/bin:$PATH CARGO_ZIGBUILD_ZIG_PATH=$dir/ziglang/zig
}

install_cargo_deb() {
    local dir=$TOOLS/cargo-deb-$CARGO_DEB_VERSION
    if [ ! -x "$dir/bin/cargo-deb" ]; then
        say "installing cargo-deb $CARGO_DEB_VERSION into $dir (compiled once)"
        mkdir -p "$TOOLS"
        rm -rf "$dir.part"
        cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION" \
            --root "$dir.part" --target-dir "$TOOLS/cargo-deb-build"
        rm -rf "$TOOLS/cargo-deb-build" "$dir"
        mv "$dir.part" "$dir"
    fi
    export PATH=$dir/bin:$PATH
}

install_zig
install_cargo_deb

meta=$(cargo metadata --format-version 1 --no-deps --locked)
field() { python3 -c "import json,sys; m=json.load(sys.stdin); print($1)" <<<"$meta"; }
VERSION=$(field '[p["version"] for p in m["packages"] if p["name"] == "longhaul"][0]')
TARGET_DIR=$(field 'm["target_directory"]')
NAME=longhaul-$VERSION-x86_64-linux-gnu
DIST=$ROOT/target/dist
# Archive times and gzip headers from the commit, so that a rebuild of it is the same bytes.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

say "building $NAME ($PROFILE profile, glibc $GLIBC)"
cargo zigbuild --locked --profile "$PROFILE" -p longhaul --bin longhaul --target "$TRIPLE.$GLIBC"
BUILT=$TARGET_DIR/$TRIPLE/$PROFILE/longhaul

rm -rf "$DIST"
STAGE=$DIST/$NAME
mkdir -p "$STAGE/man/man1" "$STAGE/completions" "$STAGE/systemd"
objcopy --only-keep-debug --compress-debug-sections=zlib "$BUILT" "$DIST/$NAME.debug"
objcopy --strip-all --add-gnu-debuglink="$DIST/$NAME.debug" "$BUILT" "$STAGE/longhaul"
chmod 755 "$STAGE/longhaul"
"$STAGE/longhaul" --version >/dev/null || die "the portable binary does not run here"

# The binary writes its own pages and completions: they list exactly what it accepts.
"$STAGE/longhaul" man --out "$STAGE/man/man1" >/dev/null
"$STAGE/longhaul" completions bash >"$STAGE/completions/longhaul.bash"
"$STAGE/longhaul" completions zsh >"$STAGE/completions/_longhaul"
"$STAGE/longhaul" completions fish >"$STAGE/completions/longhaul.fish"
cp dist/systemd/longhaul-serve.service dist/systemd/serve.conf "$STAGE/systemd/"
cp README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE "$STAGE/"
mkdir -p "$STAGE/docs" && cp docs/GUIDE.md "$STAGE/docs/"
(cd "$STAGE" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$DIST" -cf - "$NAME" | gzip -9n >"$DIST/$NAME.tar.gz"

# The package's inputs (crates/cli/Cargo.toml names them here): the same files, and the unit
# with the package's path of the binary.
DEB=$DIST/deb
mkdir -p "$DEB"
cp -r "$STAGE/longhaul" "$STAGE/man/man1" "$STAGE/completions" "$DEB/"
mv "$DEB/man1" "$DEB/man"
sed 's|/usr/local/bin/longhaul|/usr/bin/longhaul|g' dist/systemd/longhaul-serve.service \
    >"$DEB/longhaul-serve.service"
grep -q '^ExecStart=/usr/bin/longhaul ' "$DEB/longhaul-serve.service" ||
    die "the packaged unit does not start /usr/bin/longhaul"
cargo deb --quiet --locked --no-build --no-strip -p longhaul --output "$DIST/" >/dev/null
DEB_FILE=$(cd "$DIST" && ls longhaul_*.deb)

(cd "$DIST" && sha256sum "$NAME.tar.gz" "$NAME.debug" "$DEB_FILE" >SHA256SUMS)
size() { du -h --apparent-size "$1" | cut -f1; }
say "binary $(size "$STAGE/longhaul") (debug info $(size "$DIST/$NAME.debug")), archive $(size "$DIST/$NAME.tar.gz"), package $(size "$DIST/$DEB_FILE")"
echo "$DIST"
