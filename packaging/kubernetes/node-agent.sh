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
#   node-agent.sh import ARCHIVE REF  the same as a torpor checkpoint image (`torpor kube import
#                                     --push`): what a node restores through restore on create
#   node-agent.sh forget ARCHIVE      remove an archive a migration made and did not use
#   node-agent.sh unpush REF@DIGEST   delete an image a failed migration pushed (`torpor kube
#                                     unpush`, with the node's registry credentials)
#   node-agent.sh node                how this node restores pods (`torpor kube node --json`)
#   node-agent.sh restored POD_UID    which of the pod's containers torpor-runc restored here
#                                     (`torpor kube restored`): none may have started cold
#   node-agent.sh freeze UID SECONDS  hold the pod's containers frozen (`torpor kube freeze`)
#                                     until stdin closes or SECONDS pass: the checkpoints taken
#                                     meanwhile, one per container, are of one instant
#
# ARCHIVE must be one of kubelet's checkpoint archives: .../checkpoints/checkpoint-*.tar.
# Settings (the pod's environment, then the node's TORPOR_NODE_ENV file): TORPOR_BIN (/usr/local/bin/torpor), TORPOR_HOST_PID (1: the
# process whose namespaces are the host's), and torpor's own (TORPOR_CONFIG, CONTAINERD_ADDRESS,
# SSL_CERT_FILE...).
set -eu

# this node's own settings, as the installer read them (node-installer.yaml: TORPOR_NODE_ENV)
if [ -n "${TORPOR_NODE_ENV:-}" ]; then
    . "$(dirname "$0")/node-env.sh"
    read_node_env "/host$TORPOR_NODE_ENV" || exit 2
fi
TORPOR=${TORPOR_BIN:-/usr/local/bin/torpor}
die() { printf 'torpor-node-agent: %s\n' "$*" >&2; exit 2; }
on_host() { nsenter -t "${TORPOR_HOST_PID:-1}" -m -u -i -p -- "$@"; }
exec_on_host() { exec nsenter -t "${TORPOR_HOST_PID:-1}" -m -u -i -p -- "$@"; }

archive_only() {
    case "$1" in
    /*/checkpoints/checkpoint-*.tar) ;;
    *) die "$1: not a kubelet checkpoint archive (.../checkpoints/checkpoint-*.tar)" ;;
    esac
    case "$1" in
    */../*|*/./*) die "$1: a path with . or .. in it" ;;
    esac
}

usage="usage: node-agent.sh image|import ARCHIVE REF | forget ARCHIVE | unpush REF@DIGEST | freeze POD_UID SECONDS | restored POD_UID | node"
[ $# -ge 1 ] || die "$usage"
verb=$1
case "$verb" in
image|import)
    [ $# -eq 3 ] || die "$usage"
    archive_only "$2"
    status=0
    if [ "$verb" = image ]; then
        on_host "$TORPOR" kube image "$2" -t "$3" --json || status=$?
    else
        on_host "$TORPOR" -n k8s.io kube import "$2" -t "$3" --push --json || status=$?
    fi
    on_host rm -f -- "$2"
    exit "$status" ;;
unpush)
    [ $# -eq 2 ] || die "$usage"
    case "$2" in -*) die "$2: not a reference" ;; *@sha256:*) ;; *) die "$2: not REF@sha256:DIGEST" ;; esac
    on_host "$TORPOR" kube unpush "$2" ;;
restored)
    [ $# -eq 2 ] || die "$usage"
    case "$2" in ""|*[!0-9a-f-]*) die "$2: not a pod's UID" ;; esac
    exec_on_host "$TORPOR" kube restored "$2" ;;
node)
    [ $# -eq 1 ] || die "$usage"
    exec_on_host "$TORPOR" -n k8s.io kube node --json ;;
forget)
    [ $# -eq 2 ] || die "$usage"
    archive_only "$2"
    on_host rm -f -- "$2" ;;
freeze)
    [ $# -eq 3 ] || die "$usage"
    case "$2" in ""|*[!0-9a-f-]*) die "$2: not a pod's UID" ;; esac
    case "$3" in ""|*[!0-9]*) die "$3: not a number of seconds" ;; esac
    exec_on_host "$TORPOR" kube freeze "$2" --for "$3s" ;;
*) die "$usage" ;;
esac
