#!/usr/bin/env bash
# Install what torpor needs on a Debian 12 (bookworm) or 13 (trixie) machine, as root.
#
#   packaging/install-deps.sh            system packages + CRIU 4.2.1 with torpor's patches
#                                        (packaging/criu/) + the test tools + the venv
#   packaging/install-deps.sh --system   system packages and CRIU only
#   packaging/install-deps.sh --demo     system packages, CRIU and the venv: what `make demo`
#                                        and `make install` need (no test tools, no Go)
#   packaging/install-deps.sh --python   the Python venv only (make unit, make lint), with
#                                        pycriu and crit when CRIU's source tarball is already here
#
# The test tools live in a private prefix, $PREFIX/lib/torpor-deps, and replace nothing:
#   containerd-2/bin/   containerd, ctr, containerd-shim-runc-v2 of containerd 2.x (Debian sid's
#                       .deb, unpacked), beside Debian's containerd 1.6 on PATH
#   containerd-2.4/bin/ the same of containerd 2.4 (restore through CreateContainer removed),
#                       built from its pinned module like the tools below
#   bin/                runc 1.3.x, nerdctl, crictl, checkpointctl, built from pinned Go modules
#                       (packaging/go/<tool>/: go.mod and go.sum, the hashes the toolchain checks)
#   kubernetes/bin/     kubelet, kube-apiserver, kubectl, kube-controller-manager, kube-proxy,
#                       kube-scheduler
#                       (v1.37.x) and etcd, from one pinned module graph: the test cluster's
#                       (about 10 CPU-minutes and 3.7 GB of build cache, built once)
#   go/                 Debian sid's Go, only where the machine has no go new enough
#
# Every step checks first and skips work already done: a second run takes seconds.
# Nothing here names a package host: the Debian mirror comes from the machine's own apt sources,
# Go modules come through the machine's own Go proxy setting.
# Knobs: TORPOR_PREFIX (/usr/local), TORPOR_BUILD_DIR (/var/cache/torpor-build: downloads and the
# Go caches), TORPOR_VENV (.venv).
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_MIN=40200                      # criu --version as a number, 4.2.0
# containerd 2.x: Debian sid's binary package (its binaries need glibc 2.34: Debian 12 has 2.36)
CONTAINERD2_DEB=containerd=2.1.9+ds1-5
CONTAINERD2_SHA256=2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591
# Go: where no go as new as packaging/go/*/go.mod ask for is found, sid's Go
GO_DEBS=("golang-1.26-go=1.26.10-1 497c936cb5050aaeb52021e757aafc8c959248a4c7015615f40390882b76683c"
         "golang-1.26-src=1.26.10-1 c535cfd05d879c7cb2b28577fc9011fe1639d36e957d5077bb5c862b07b87c02")
# tool | main package (its module's version is pinned in packaging/go/<tool>/go.mod) | cgo |
# build tags | -X settings as the tool's own Makefile makes them ({v}: the module's version,
# v1.2.3; {n}: 1.2.3) | "heavy": built at the lowest priority, one package at a time (it takes
# long and much memory, and the machine may be shared), and stripped
GO_TOOLS=(
    "runc|github.com/opencontainers/runc|1|seccomp urfave_cli_no_docs|"
    "nerdctl|github.com/containerd/nerdctl/v2/cmd/nerdctl|0||github.com/containerd/nerdctl/v2/pkg/version.Version={v}"
    "crictl|sigs.k8s.io/cri-tools/cmd/crictl|0||sigs.k8s.io/cri-tools/pkg/version.Version={v}"
    "checkpointctl|github.com/checkpoint-restore/checkpointctl|0||main.name=checkpointctl main.version={n}"
    "cosign|github.com/sigstore/cosign/v2/cmd/cosign|0||sigs.k8s.io/release-utils/version.gitVersion={v}"
    # several packages: binaries of one module into $DEPS/<tool>/bin (containerd's Makefile
    # builds them without cgo and btrfs the same way)
    "containerd-2.4|github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2|0|no_btrfs|github.com/containerd/containerd/v2/version.Version={v} github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
    # PACKAGE=NAME names a binary (etcd's main package is .../server/v3); kubelet's build tags
    # and -X settings as Kubernetes' own build makes them, cgo for all (kubelet needs it)
    "kubernetes|k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3=etcd|1|selinux notest grpcnotrace|k8s.io/component-base/version.gitVersion={v} k8s.io/client-go/pkg/version.gitVersion={v}|heavy"
)
PREFIX=${TORPOR_PREFIX:-/usr/local}
DEPS=$PREFIX/lib/torpor-deps
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
VENV=${TORPOR_VENV:-$TOP/.venv}
STATE=${TORPOR_BUILD_DIR:-/var/cache/torpor-build}
CRIU_PATCHES=("$HERE/criu/lazy-pages-wait.patch")   # applied in order to CRIU's source

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }


RUNTIME_PKGS=(containerd runc docker-registry busybox-static skopeo iproute2 iptables
              apache2-utils openssl ca-certificates gcc make python3-venv python3-dev tar)
TEST_PKGS=(containernetworking-plugins libseccomp-dev pkg-config   # CNI for CRI tests; runc's cgo
           podman fuse-overlayfs slirp4netns uidmap netavark aardvark-dns catatonit)  # test_podman
CRIU_BUILD_PKGS=(libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev libnl-3-dev libnet1-dev libcap-dev
                 libbsd-dev libnftables-dev libgnutls28-dev uuid-dev pkg-config python3-protobuf
                 gcc make patch)

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

SID_APT=""   # a temporary apt state that knows only sid of the machine's own mirror

sid_apt_init() {
    # Made once, in the main shell (callers run sid_apt inside $(...)), removed at exit.
    [ -n "$SID_APT" ] && return 0
    local mirror
    mirror=$(pick_mirror) || die "no Debian mirror found in /etc/apt/sources.list*; add one and rerun"
    SID_APT=$(mktemp -d)
    trap 'rm -rf "$SID_APT"' EXIT
    mkdir -p "$SID_APT/lists/partial" "$SID_APT/cache/archives/partial"
    printf 'deb %s sid main\ndeb-src %s sid main\n' "$mirror" "$mirror" >"$SID_APT/sid.list"
    log "reading the package lists of $mirror (sid)"
    sid_apt update -q >/dev/null 2>&1 || sid_apt update
}

sid_apt() {
    apt-get -o "Dir::Etc::SourceList=$SID_APT/sid.list" -o "Dir::Etc::SourceParts=/dev/null" \
            -o "Dir::State::Lists=$SID_APT/lists" -o "Dir::Cache=$SID_APT/cache" \
            -o "APT::Get::List-Cleanup=0" "$@"
}

download_dir() {
    mkdir -p "$STATE/download"
    # apt-helper downloads as _apt where it can
    id _apt >/dev/null 2>&1 && chown _apt "$STATE/download"
    echo "$STATE/download"
}

download() {
    # download URI DEST SHA256
    log "downloading $1"
    /usr/lib/apt/apt-helper download-file "$1" "$2" "SHA256:$3" >/dev/null \
        || die "download of $1 failed or its sha256 is not $3"
}

fetch_criu_tarball() {
    local dest=$1 uri name
    sid_apt_init
    uri=$(cd "$SID_APT" && sid_apt --print-uris source "criu=${CRIU_VERSION}*" 2>/dev/null \
          | awk -F"'" '/orig\.tar/{print $2; exit}') || true
    if [ -z "$uri" ]; then
        # sid may have moved on: the tarball's name is fixed, so build its URI beside the current one.
        uri=$(cd "$SID_APT" && sid_apt --print-uris source criu 2>/dev/null \
              | awk -F"'" '/orig\.tar/{print $2; exit}') || true
        [ -n "$uri" ] || die "apt could not find criu's source package in sid"
        name=${uri##*/}
        uri="${uri%/*}/criu_${CRIU_VERSION}.orig.tar.${name##*.orig.tar.}"
    fi
    download "$uri" "$dest" "$CRIU_SHA256"
}

sid_deb_path() {
    # sid_deb_path PACKAGE=VERSION: where the .deb is kept under $STATE/download
    local pkg=${1%%=*} version=${1#*=}
    echo "$STATE/download/${pkg}_${version#*:}.deb"
}

fetch_sid_deb() {
    # fetch_sid_deb PACKAGE=VERSION SHA256: download it once to sid_deb_path (main shell only)
    local pkg=${1%%=*} version=${1#*=} sha=$2 dest uri file
    dest=$(sid_deb_path "$1")
    download_dir >/dev/null
    echo "$sha  $dest" | sha256sum -c --status 2>/dev/null && return 0
    sid_apt_init
    uri=$(cd "$SID_APT" && sid_apt download --print-uris "$1" 2>/dev/null \
          | awk -F"'" 'NR==1{print $2}') || true
    if [ -z "$uri" ]; then
        # sid moved on: the pool keeps a superseded file for a while beside the current one
        uri=$(cd "$SID_APT" && sid_apt download --print-uris "$pkg" 2>/dev/null \
              | awk -F"'" 'NR==1{print $2}') || true
        [ -n "$uri" ] || die "apt could not find $pkg in sid"
        file=${uri##*/}
        uri="${uri%/*}/${pkg}_$(printf '%s' "${version#*:}" | sed 's/+/%2b/g')_${file##*_}"
    fi
    download "$uri" "$dest" "$sha"
}

unpack_debs() {
    # unpack_debs DIR PACKAGE=VERSION SHA256 ...: the packages' files under DIR, fetched once;
    # DIR/.torpor-pin records what is there, so an unchanged pin costs nothing
    local dir=$1; shift
    local pin="$*" tmp
    [ -f "$dir/.torpor-pin" ] && [ "$(cat "$dir/.torpor-pin")" = "$pin" ] && return 0
    while [ $# -ge 2 ]; do fetch_sid_deb "$1" "$2"; set -- "${@:3}"; done
    set -- $pin
    tmp="$dir.tmp-$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    while [ $# -ge 2 ]; do dpkg-deb -x "$(sid_deb_path "$1")" "$tmp"; set -- "${@:3}"; done
    echo "$pin" >"$tmp/.torpor-pin"
    rm -rf "$dir"
    mv "$tmp" "$dir"
}

criu_build_id() {
    # what $PREFIX/sbin/criu is when this script built it: the version and torpor's patches
    { echo "$CRIU_VERSION $CRIU_SHA256"; cat "${CRIU_PATCHES[@]}"; } | sha256sum | cut -d' ' -f1
}

install_criu() {
    # torpor's build (CRIU_PATCHES applied) in $PREFIX/sbin, ahead of a distribution's CRIU on
    # PATH: a stock CRIU works too, but its lazy-pages daemon spins on a core during every
    # lazy restore (packaging/criu/lazy-pages-wait.patch)
    local stamp=$DEPS/criu.build
    if [ "$(criu_version_num "$PREFIX/sbin/criu")" -ge "$CRIU_MIN" ] \
            && [ "$(cat "$stamp" 2>/dev/null)" = "$(criu_build_id)" ]; then
        log "criu $("$PREFIX/sbin/criu" --version | awk '/^Version:/{print $2}') (torpor's build) already in $PREFIX/sbin"
        return 0
    fi
    apt_install "${CRIU_BUILD_PKGS[@]}"
    local tarball
    tarball="$(download_dir)/criu_${CRIU_VERSION}.orig.tar"
    if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
        fetch_criu_tarball "$tarball"
    fi
    local src="$STATE/criu-$CRIU_VERSION"
    rm -rf "$src"
    mkdir -p "$src"
    tar -xf "$tarball" -C "$src" --strip-components=1
    local fix
    for fix in "${CRIU_PATCHES[@]}"; do
        patch -p1 -d "$src" --forward --batch --quiet <"$fix" || die "$fix does not apply to criu $CRIU_VERSION"
    done
    log "building criu $CRIU_VERSION with ${#CRIU_PATCHES[@]} patch(es) of torpor's ($(nproc) cores)"
    make -C "$src" -j"$(nproc)" criu >"$STATE/criu-build.log" 2>&1 \
        || { tail -n 30 "$STATE/criu-build.log" >&2; die "criu build failed (log: $STATE/criu-build.log)"; }
    install -D -m 0755 "$src/criu/criu" "$PREFIX/sbin/criu"
    mkdir -p "$DEPS"
    criu_build_id >"$stamp"
    rm -rf "$src"
    log "installed $("$PREFIX/sbin/criu" --version | head -n1) to $PREFIX/sbin/criu"
}

install_containerd2() {
    local dir="$DEPS/containerd-2"
    unpack_debs "$dir" "$CONTAINERD2_DEB" "$CONTAINERD2_SHA256"
    ln -sfn usr/bin "$dir/bin"
    "$dir/bin/containerd" --version >/dev/null 2>&1 \
        || die "$dir/bin/containerd does not start on this machine: $("$dir/bin/containerd" --version 2>&1 | head -n1)"
    log "containerd ${CONTAINERD2_DEB#*=} in $dir/bin"
}

go_version_ok() {
    # go_version_ok GO: it runs and is at least every go.mod under packaging/go asks for
    local have need
    have=$("$1" env GOVERSION 2>/dev/null) || return 1
    have=${have#go}
    need=$(go_min)
    [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" = "$need" ]
}

go_min() {
    awk '$1=="go"{print $2}' "$HERE"/go/*/go.mod | sort -V | tail -n1
}

find_go() {
    # The machine's go (PATH, /usr/local/go) when new enough, else sid's Go in $DEPS/go.
    local g
    for g in "$(command -v go || true)" /usr/local/go/bin/go /usr/lib/go/bin/go "$DEPS"/go/usr/lib/go-*/bin/go; do
        [ -n "$g" ] && [ -x "$g" ] && go_version_ok "$g" && { echo "$g"; return 0; }
    done
    return 1
}

install_go() {
    # Sets GO to a go binary new enough for packaging/go/*.
    GO=$(find_go) && return 0
    log "no go >= $(go_min) found: unpacking Debian sid's Go into $DEPS/go"
    local args=() entry
    for entry in "${GO_DEBS[@]}"; do args+=($entry); done
    unpack_debs "$DEPS/go" "${args[@]}"
    GO=$(find_go) || die "Debian's Go in $DEPS/go is older than $(go_min): update GO_DEBS"
}

go_tool_pin() {
    # What a built tool is made of: the go.mod/go.sum pin, the build recipe and the toolchain
    local name=$1 recipe=$2
    { cat "$HERE/go/$name/go.mod" "$HERE/go/$name/go.sum"
      [ -d "$HERE/go/$name/tigron" ] && find "$HERE/go/$name/tigron" -type f | sort | xargs cat
      echo "$recipe"; "$GO" env GOVERSION; } | sha256sum | cut -c1-64
}

go_tool_out() {
    # go_tool_out ENTRY: what a line of GO_TOOLS builds: $DEPS/bin/<tool>, or for several
    # packages the directory $DEPS/<tool>/bin
    local name=${1%%|*} rest=${1#*|}
    case ${rest%%|*} in
        *" "*) echo "$DEPS/$name/bin" ;;
        *) echo "$DEPS/bin/$name" ;;
    esac
}

module_version() {
    # The version packaging/go/NAME/go.mod requires of the module that holds package PKG.
    awk -v pkg="$2" '$1 != "module" && $2 ~ /^v/ && (pkg == $1 || index(pkg, $1 "/") == 1) {
        if (length($1) > length(best)) { best = $1; v = $2 } } END { print v }' "$HERE/go/$1/go.mod"
}

install_go_tools() {
    local entry name pin todo=()
    mkdir -p "$DEPS/bin"
    install_go
    for entry in "${GO_TOOLS[@]}"; do
        name=${entry%%|*}
        pin=$(go_tool_pin "$name" "$entry")
        if [ -e "$(go_tool_out "$entry")" ] \
                && [ "$(cat "$DEPS/bin/.$name.pin" 2>/dev/null)" = "$pin" ]; then
            continue
        fi
        todo+=("$entry")
    done
    if [ "${#todo[@]}" -eq 0 ]; then
        log "the Go tools (${GO_TOOLS[*]%%|*}) are up to date in $DEPS"
        return 0
    fi
    mkdir -p "$STATE"
    # One build per tool, all at once: each module has its own dependency versions, and while one
    # build downloads or links (one core), the others compile.
    local pids=() start=$SECONDS failed=0 i
    for entry in "${todo[@]}"; do
        build_go_tool "$entry" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || failed=1
    done
    [ "$failed" = 0 ] || die "a Go tool did not build (logs: $STATE/*-build.log)"
    log "built ${#todo[@]} Go tools in $((SECONDS - start)) s"
}

build_go_tool() {
    # build_go_tool ENTRY: one line of GO_TOOLS, built into $DEPS/bin (runs in the background)
    local name pkg cgo tags xvars heavy x version flags=() ldflags="-s -w" start=$SECONDS
    local out pkgs plain=() named=() prio=() goflags="-mod=readonly -trimpath -buildvcs=false -modcacherw"
    IFS='|' read -r name pkg cgo tags xvars heavy <<<"$1"
    read -r -a pkgs <<<"$pkg"
    out=$(go_tool_out "$1")
    version=$(module_version "$name" "${pkgs[0]}")
    [ -n "$tags" ] && flags+=(-tags "$tags")
    [ "$cgo" = 1 ] && flags+=(-buildmode=pie) && ldflags=""
    # (stripped, as Kubernetes' own build makes its binaries: 120 MB less on disk)
    [ "$heavy" = heavy ] && prio=(nice -n 19) && goflags+=" -p=1" && ldflags="-s -w"
    xvars=${xvars//\{v\}/$version}
    for x in ${xvars//\{n\}/${version#v}}; do ldflags+=" -X $x"; done
    for x in "${pkgs[@]}"; do
        case $x in *=*) named+=("$x") ;; *) plain+=("$x") ;; esac
    done
    log "building $name $version with $("$GO" env GOVERSION)"
    go_build() {
        # The pins are go.mod + go.sum: -mod=readonly refuses any module whose hash go.sum
        # lacks, so no checksum database is needed (none may be reachable) and none is asked.
        env GOTOOLCHAIN=local GOSUMDB=off GOFLAGS="$goflags" \
            GOPATH="$STATE/go/path" GOMODCACHE="$STATE/go/mod" GOCACHE="$STATE/go/cache" \
            CGO_ENABLED="$cgo" "${prio[@]}" "$GO" build "${flags[@]}" -ldflags "$ldflags" "$@"
    }
    if ! (cd "$HERE/go/$name"
          if [ "${#pkgs[@]}" -gt 1 ]; then
              mkdir -p "$out.tmp"
              [ "${#plain[@]}" -eq 0 ] || go_build -o "$out.tmp/" "${plain[@]}" || exit 1
              for x in "${named[@]}"; do go_build -o "$out.tmp/${x#*=}" "${x%=*}" || exit 1; done
          else
              go_build -o "$out.tmp" "${pkgs[@]}"
          fi) >"$STATE/$name-build.log" 2>&1; then
        tail -n 30 "$STATE/$name-build.log" >&2
        log "error: $name build failed (log: $STATE/$name-build.log)"
        rm -rf "$out.tmp"
        return 1
    fi
    rm -rf "$out"
    mv "$out.tmp" "$out"
    go_tool_pin "$name" "$1" >"$DEPS/bin/.$name.pin"
    log "installed $name $version to $out ($((SECONDS - start)) s)"
}

venv_is_this_checkouts() {
    # torpor imported from this checkout, and its commands run (a venv moved, copied or
    # installed from another checkout keeps its stamp, but its scripts name another python)
    local here
    here=$("$VENV/bin/python" -c 'import os, torpor; print(os.path.realpath(torpor.__file__))' \
        2>/dev/null) || return 1
    [ "$here" = "$(cd "$TOP" && pwd -P)/torpor/__init__.py" ] \
        && "$VENV/bin/torpor" --version >/dev/null 2>&1
}

install_venv() {
    local stamp="$VENV/.torpor-installed"
    if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$TOP/pyproject.toml" ] \
        && venv_is_this_checkouts; then
        log "python environment $VENV is up to date"
        return 0
    fi
    local py=${PYTHON:-python3}
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "torpor needs Python >= 3.11 ($py is $("$py" --version))"
    [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
    log "installing torpor and its tools into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    # setuptools' build warnings (an editable install) would bury the rest: shown on failure
    local pip_log
    pip_log=$(mktemp)
    if ! "$VENV/bin/python" -m pip install -q -e "$TOP[dev]" >"$pip_log" 2>&1; then
        cat "$pip_log" >&2
        rm -f "$pip_log"
        die "pip could not install torpor into $VENV (its output is above)"
    fi
    rm -f "$pip_log"
    touch "$stamp"
}

criu_tarball() {
    echo "$STATE/download/criu_${CRIU_VERSION}.orig.tar"
}

pycriu_ok() {
    # pycriu (CRIU's image definitions, which torpor reads CRIU's images with) and crit, both
    # of CRIU_VERSION, in the venv $1
    "$1/bin/python" -c "import sys, pycriu, pycriu.images.pb; sys.exit(pycriu.__version__ != '$CRIU_VERSION')" \
        >/dev/null 2>&1 && [ -x "$1/bin/crit" ]
}

install_pycriu() {
    # install_pycriu VENV: CRIU's own Python packages from its source tarball into VENV: pycriu
    # (lib/pycriu, its images/*.proto compiled with the protoc of grpcio-tools, which matches
    # torpor's protobuf) and crit. Built once into $STATE/pycriu-$CRIU_VERSION, nothing of CRIU's
    # is kept in torpor's tree.
    local venv=$1 tarball src protoc_py
    pycriu_ok "$venv" && { log "pycriu and crit $CRIU_VERSION are in $venv"; return 0; }
    src="$STATE/pycriu-$CRIU_VERSION"
    if [ ! -f "$src/.torpor-built" ]; then
        tarball=$(criu_tarball)
        if ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
            [ "$(id -u)" = 0 ] || { log "no CRIU $CRIU_VERSION source tarball in $STATE/download: pycriu skipped (make deps installs it)"; return 0; }
            fetch_criu_tarball "$tarball"
        fi
        protoc_py=$VENV/bin/python
        "$protoc_py" -c 'import grpc_tools.protoc' 2>/dev/null \
            || die "$protoc_py has no grpc_tools (grpcio-tools) to compile CRIU's images/*.proto"
        rm -rf "$src.tmp"
        mkdir -p "$src.tmp"
        tar -xf "$tarball" -C "$src.tmp" --strip-components=1 "criu-$CRIU_VERSION/lib" \
            "criu-$CRIU_VERSION/crit" "criu-$CRIU_VERSION/images" \
            "criu-$CRIU_VERSION/scripts/magic-gen.py" "criu-$CRIU_VERSION/criu/include/magic.h"
        (cd "$src.tmp"
         wkt=$("$protoc_py" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
         protos=$(ls images/*.proto | grep -v '^images/rpc.proto$')
         # shellcheck disable=SC2086
         "$protoc_py" -m grpc_tools.protoc -Iimages -I"$wkt" --python_out=lib/pycriu/images $protos
         "$protoc_py" -m grpc_tools.protoc -Iimages --python_out=lib/pycriu images/rpc.proto
         "$protoc_py" scripts/magic-gen.py criu/include/magic.h lib/pycriu/images/magic.py
         { echo "# generated by torpor's install-deps.sh, as CRIU's lib/pycriu/images/Makefile does"
           for m in lib/pycriu/images/*_pb2.py; do
               m=$(basename "$m" .py)
               [ "$m" = opts_pb2 ] || echo "from .$m import *"
           done; } >lib/pycriu/images/pb.py
         echo "__version__ = '$CRIU_VERSION'" >lib/pycriu/version.py
         echo "__version__ = '$CRIU_VERSION'" >crit/crit/version.py) \
            || die "compiling CRIU's image definitions failed"
        touch "$src.tmp/.torpor-built"
        rm -rf "$src"
        mv "$src.tmp" "$src"
    fi
    # their own build backends want an old protobuf at build time only: build without isolation
    "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation "$src/lib" "$src/crit" \
        >/dev/null 2>&1 || "$venv/bin/python" -m pip install --no-deps --no-build-isolation \
        "$src/lib" "$src/crit" || die "pip could not install pycriu and crit into $venv"
    pycriu_ok "$venv" || die "pycriu $CRIU_VERSION does not import in $venv"
    log "installed pycriu and crit $CRIU_VERSION into $venv"
}

main() {
    if [ "${1:-}" = "--python" ]; then
        install_venv
        install_pycriu "$VENV"
        return
    fi
    [ "$(id -u)" = 0 ] || die "run as root (it installs packages and CRIU)"
    apt_install "${RUNTIME_PKGS[@]}"
    install_criu
    [ "${1:-}" = "--system" ] && return 0
    if [ "${1:-}" = "--demo" ]; then
        install_venv
        install_pycriu "$VENV"
        return 0
    fi
    apt_install "${TEST_PKGS[@]}"
    install_containerd2
    install_go_tools
    install_venv
    install_pycriu "$VENV"
}

main "$@"
