#!/usr/bin/env bash
# Install what torpor needs on a Debian 12 (bookworm) or 13 (trixie) machine, as root.
#
#   packaging/install-deps.sh            system packages + CRIU >= 4.2 + the Python venv
#   packaging/install-deps.sh --system   system packages and CRIU only
#   packaging/install-deps.sh --python   the Python venv only (make unit, make lint)
#
# Every step checks first and skips work already done: a second run takes seconds.
# Nothing here names a package host: the Debian mirror comes from the machine's own apt sources.
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_MIN=40200                      # criu --version as a number, 4.2.0
PREFIX=${TORPOR_PREFIX:-/usr/local}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
VENV=${TORPOR_VENV:-$TOP/.venv}
STATE=${TORPOR_BUILD_DIR:-/var/cache/torpor-build}

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }


RUNTIME_PKGS=(containerd runc docker-registry busybox-static skopeo iproute2 iptables
              apache2-utils openssl ca-certificates gcc make python3-venv python3-dev tar)
CRIU_BUILD_PKGS=(libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev libnl-3-dev libnet1-dev libcap-dev
                 libbsd-dev libnftables-dev libgnutls28-dev uuid-dev pkg-config python3-protobuf
                 gcc make)

missing_pkgs() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || echo "$p"
    done
}

apt_install() {
    local todo
    mapfile -t todo < <(missing_pkgs "$@")
    [ "${#todo[@]}" -eq 0 ] && return 0
    log "apt-get install ${todo[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${todo[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends "${todo[@]}" >/dev/null
    }
}

criu_version_num() {
    # "Version: 4.2.1" -> 40201; 0 when criu is absent or does not start
    local v
    v=$("$1" --version 2>/dev/null | awk '/^Version:/{print $2}') || true
    [ -n "$v" ] || { echo 0; return; }
    IFS=. read -r a b c <<<"$v"
    echo $(( ${a:-0} * 10000 + ${b:-0} * 100 + ${c:-0} ))
}

debian_mirror() {
    # The first Debian archive URI that apt already uses (not the security archive).
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        awk 'tolower($1)=="uris:"{for(i=2;i<=NF;i++)print $i}' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -e "$f" ] || continue
        awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i !~ /^\[/ && $i !~ /\]$/) {print $i; break}}' "$f"
    done
}

pick_mirror() {
    local uri
    while read -r uri; do
        case "$uri" in
            *security*|*ports*) continue ;;
            http://*/debian|http://*/debian/|https://*/debian|https://*/debian/) echo "${uri%/}"; return 0 ;;
        esac
    done < <(debian_mirror)
    return 1
}

fetch_criu_tarball() (
    # A subshell: its EXIT trap removes the temporary apt state however it ends, and nothing of
    # it outlives the function (a RETURN trap would, and fire later with $tmp unset).
    local dest=$1 mirror tmp uri name
    mirror=$(pick_mirror) || die "no Debian mirror found in /etc/apt/sources.list*; add one and rerun"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo "deb-src $mirror sid main" >"$tmp/sid.list"
    local opts=(-o "Dir::Etc::SourceList=$tmp/sid.list" -o "Dir::Etc::SourceParts=/dev/null"
                -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "APT::Get::List-Cleanup=0")
    log "looking up criu's source in $mirror (sid)"
    apt-get "${opts[@]}" update -q >/dev/null 2>&1 || apt-get "${opts[@]}" update
    uri=$(cd "$tmp" && apt-get "${opts[@]}" --print-uris source "criu=${CRIU_VERSION}*" 2>/dev/null \
          | awk -F"'" '/orig\.tar/{print $2; exit}') || true
    if [ -z "$uri" ]; then
        # sid may have moved on: the tarball's name is fixed, so build its URI beside the current one.
        uri=$(cd "$tmp" && apt-get "${opts[@]}" --print-uris source criu 2>/dev/null \
              | awk -F"'" '/orig\.tar/{print $2; exit}') || true
        [ -n "$uri" ] || die "apt could not find criu's source package in $mirror sid"
        name=${uri##*/}
        uri="${uri%/*}/criu_${CRIU_VERSION}.orig.tar.${name##*.orig.tar.}"
    fi
    log "downloading $uri"
    /usr/lib/apt/apt-helper download-file "$uri" "$dest" "SHA256:$CRIU_SHA256" >/dev/null \
        || die "download of $uri failed or its sha256 is not $CRIU_SHA256"
)

install_criu() {
    local have
    have=$(criu_version_num "$PREFIX/sbin/criu")
    if [ "$have" -ge "$CRIU_MIN" ]; then
        log "criu $("$PREFIX/sbin/criu" --version | awk '/^Version:/{print $2}') already in $PREFIX/sbin"
        return 0
    fi
    have=$(criu_version_num "$(command -v criu || echo /nonexistent)")
    if [ "$have" -ge "$CRIU_MIN" ]; then
        log "criu on PATH is new enough"
        return 0
    fi
    apt_install "${CRIU_BUILD_PKGS[@]}"
    mkdir -p "$STATE/download"
    # apt-helper downloads as _apt where it can
    id _apt >/dev/null 2>&1 && chown _apt "$STATE/download"
    local tarball="$STATE/download/criu_${CRIU_VERSION}.orig.tar"
    if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
        fetch_criu_tarball "$tarball"
    fi
    local src="$STATE/criu-$CRIU_VERSION"
    rm -rf "$src"
    mkdir -p "$src"
    tar -xf "$tarball" -C "$src" --strip-components=1
    log "building criu $CRIU_VERSION ($(nproc) cores)"
    make -C "$src" -j"$(nproc)" criu >"$STATE/criu-build.log" 2>&1 \
        || { tail -n 30 "$STATE/criu-build.log" >&2; die "criu build failed (log: $STATE/criu-build.log)"; }
    install -D -m 0755 "$src/criu/criu" "$PREFIX/sbin/criu"
    rm -rf "$src"
    log "installed $("$PREFIX/sbin/criu" --version | head -n1) to $PREFIX/sbin/criu"
}

install_venv() {
    local stamp="$VENV/.torpor-installed"
    if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$TOP/pyproject.toml" ]; then
        log "python environment $VENV is up to date"
        return 0
    fi
    local py=${PYTHON:-python3}
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "torpor needs Python >= 3.11 ($py is $("$py" --version))"
    [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
    log "installing torpor and its tools into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install -q -e "$TOP[dev]"
    touch "$stamp"
}

main() {
    if [ "${1:-}" = "--python" ]; then
        install_venv
        return
    fi
    [ "$(id -u)" = 0 ] || die "run as root (it installs packages and CRIU)"
    apt_install "${RUNTIME_PKGS[@]}"
    install_criu
    [ "${1:-}" = "--system" ] || install_venv
}

main "$@"
