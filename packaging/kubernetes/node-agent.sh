#!/bin/sh
# torpor's node agent: what `torpor kube migrate` runs on a node, by `kubectl exec` into the
# node installer's pod (node-installer.yaml: privileged, hostPID, hostNetwork), in the host's
# mount, UTS, IPC and PID namespaces (its network namespace is the host's already):
#
#   node-agent.sh image ARCHIVE REF   kubelet's checkpoint archive ARCHIVE as the checkpoint
#                                     image REF (`torpor kube image --json`: signed with the
#                                     node's key, encrypted as the node's config says), pushed;
#                                     ARCHIVE is removed afterwards whatever happened: it holds
#                                     the workload's memory and never leaves the node
#   node-agent.sh forget ARCHIVE      remove an archive a migration made and did not use
#
# ARCHIVE must be one of kubelet's checkpoint archives: .../checkpoints/checkpoint-*.tar.
# Settings (the pod's environment): TORPOR_BIN (/usr/local/bin/torpor), TORPOR_HOST_PID (1: the
# process whose namespaces are the host's), and torpor's own (TORPOR_CONFIG, CONTAINERD_ADDRESS,
# SSL_CERT_FILE...).
set -eu

TORPOR=${TORPOR_BIN:-/usr/local/bin/torpor}
die() { printf 'torpor-node-agent: %s\n' "$*" >&2; exit 2; }
on_host() { nsenter -t "${TORPOR_HOST_PID:-1}" -m -u -i -p -- "$@"; }

archive_only() {
    case "$1" in
    /*/checkpoints/checkpoint-*.tar) ;;
    *) die "$1: not a kubelet checkpoint archive (.../checkpoints/checkpoint-*.tar)" ;;
    esac
    case "$1" in
    */../*|*/./*) die "$1: a path with . or .. in it" ;;
    esac
}

[ $# -ge 2 ] || die "usage: node-agent.sh image ARCHIVE REF | forget ARCHIVE"
verb=$1 archive=$2
archive_only "$archive"
case "$verb" in
image)
    [ $# -eq 3 ] || die "usage: node-agent.sh image ARCHIVE REF"
    status=0
    on_host "$TORPOR" kube image "$archive" -t "$3" --json || status=$?
    on_host rm -f -- "$archive"
    exit "$status" ;;
forget)
    on_host rm -f -- "$archive" ;;
*) die "$verb: say image or forget" ;;
esac
