#!/usr/bin/env bash
# Pin (or re-pin) one of the Go tools that install-deps.sh builds:
#
#   packaging/go/pin.sh runc github.com/opencontainers/runc@v1.3.7
#   packaging/go/pin.sh nerdctl github.com/containerd/nerdctl/v2/cmd/nerdctl@v2.3.1
#   packaging/go/pin.sh crictl sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0
#   packaging/go/pin.sh checkpointctl github.com/checkpoint-restore/checkpointctl@v1.6.0
#   packaging/go/pin.sh cosign github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5
#   packaging/go/pin.sh kubernetes k8s.io/kubernetes/cmd/kubelet@v1.37.2 \
#       k8s.io/kubernetes/cmd/kube-apiserver@v1.37.2 k8s.io/kubernetes/cmd/kubectl@v1.37.2 \
#       k8s.io/kubernetes/cmd/kube-controller-manager@v1.37.2 \
#       k8s.io/kubernetes/cmd/kube-proxy@v1.37.2 go.etcd.io/etcd/server/v3@v3.7.0
#
# Rewrites packaging/go/TOOL/go.mod and go.sum from the tools' own requirements (their go.mod, as
# the Go proxy serves it), keeping the module line and any replace lines, then lists every
# package the build needs with -mod=readonly to prove go.sum holds every hash the build needs
# (a tool of one package is also built once). The go.sum hashes are the pin: review the diff; no
# checksum database is asked (none may be reachable from here).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
tool=$1
shift
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$tool"
go=$(command -v go || echo /usr/local/go/bin/go)
[ -f "$dir/go.mod" ] || printf 'module torpor.invalid/deps/%s\n\ngo 1.23.0\n' "$tool" >"$dir/go.mod"
awk '/^module |^replace /' "$dir/go.mod" >"$dir/go.mod.new"
printf '\ngo 1.23.0\n' >>"$dir/go.mod.new"
mv "$dir/go.mod.new" "$dir/go.mod"
rm -f "$dir/go.sum"
cd "$dir"
export GOTOOLCHAIN=local GOSUMDB=off GOFLAGS=-buildvcs=false
"$go" get "$@"
pkgs=("${@%@*}")
GOFLAGS="-mod=readonly -buildvcs=false" "$go" list -deps "${pkgs[@]}" >/dev/null
[ $# -gt 1 ] || GOFLAGS="-mod=readonly -buildvcs=false" "$go" build -o /dev/null "${pkgs[0]}"
echo "pinned $* in $dir (go $(awk '$1=="go"{print $2}' go.mod))"
