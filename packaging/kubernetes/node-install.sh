#!/usr/bin/env bash
# torpor's node installer, run on a Kubernetes node as root (the DaemonSet in
# node-installer.yaml runs it in the host's namespaces; it runs by hand the same way):
#
#  1. check the node: python3 >= 3.11, CRIU >= 3.16 on containerd's PATH, containerd 2.x;
#  2. install torpor (packaging/install.sh: /opt/torpor, launchers in $PREFIX/bin);
#  3. merge the runtime class `torpor` into containerd's config (`torpor runtime-config
#     containerd --install`, comments and settings kept, backup beside it); on containerd 2.2.7
#     and later 2.2.x/2.3.x, also enable_experimental_restore_via_create, without which a pod
#     cannot restore a checkpoint;
#  4. only if the config changed: check that containerd loads it, restart containerd, wait for
#     it to answer, and put the old config back (and restart again) if it does not. Running
#     containers survive a containerd restart: their shims keep them;
#  5. leave a marker file the DaemonSet's readiness probe looks for.
#
# Settings (environment): TORPOR_SRC (torpor's source tree, default: the one this script is
# in), CONTAINERD_CONFIG (/etc/containerd/config.toml), CONTAINERD_ADDRESS
# (/run/containerd/containerd.sock), PREFIX (/usr/local), TORPOR_RESTART (systemctl | none),
# TORPOR_SKIP_INSTALL=1 (torpor already installed: steps 3-5 only), TORPOR_MARKER
# (/var/lib/torpor/node-installed), TORPOR_CONFIG (/etc/torpor/config.toml: written with
# [restore] signatures = "required" where there is none).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${TORPOR_SRC:-$(cd "$HERE/../.." && pwd)}
CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
ADDRESS=${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}
PREFIX=${PREFIX:-/usr/local}
RESTART=${TORPOR_RESTART:-systemctl}
MARKER=${TORPOR_MARKER:-/var/lib/torpor/node-installed}
TORPOR=${TORPOR_BIN:-$PREFIX/bin/torpor}
CONTAINERD=${CONTAINERD_BIN:-containerd}

log() { printf 'torpor-node-install: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# 1. the node
[ "$(id -u)" = 0 ] || die "run as root"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "torpor needs python3 >= 3.11 on the node"
version=$("$CONTAINERD" --version | awk '{print $3}' | sed 's/^v//; s/[-+~].*//')
IFS=. read -r major minor patch <<<"$version"
[ "${major:-0}" -ge 2 ] || die "containerd $version: kubelet's checkpoints need containerd 2.x \
(CheckpointContainer from 2.0, restore from 2.1)"
if [ "$major" -eq 2 ] && [ "$minor" -lt 1 ]; then
    log "warning: containerd $version checkpoints pods but cannot restore them (2.1 or later can)"
fi
if [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 4 ]; }; then
    log "warning: containerd $version no longer restores checkpoints through CreateContainer:"
    log "         pods cannot restore; torpor checkpoint/restore still work on this node"
fi
if ! command -v criu >/dev/null; then
    log "warning: no criu on PATH: containerd refuses CheckpointContainer without CRIU >= 3.16"
fi

# 2. torpor
if [ "${TORPOR_SKIP_INSTALL:-0}" != 1 ]; then
    PREFIX=$PREFIX bash "$SRC/packaging/install.sh"
fi
[ -x "$TORPOR" ] || die "$TORPOR is missing: install torpor first"

# 3. containerd's config
mkdir -p "$(dirname "$CONFIG")"
before=$(mktemp "${CONFIG}.torpor-before.XXXXXX")
trap 'rm -f "$before"' EXIT
if [ -e "$CONFIG" ]; then cp -p "$CONFIG" "$before"; else : >"$before"; fi
if [ ! -s "$CONFIG" ]; then
    # no config: containerd's defaults, so that the CRI plugin keeps its own settings
    "$CONTAINERD" config default >"$CONFIG"
fi
"$TORPOR" runtime-config containerd --binary "$PREFIX/bin/torpor-runc" --install "$CONFIG" >&2
restore_flag=0
if [ "$major" -eq 2 ] && { { [ "$minor" -eq 2 ] && [ "${patch:-0}" -ge 7 ]; } \
        || { [ "$minor" -eq 3 ] && [ "${patch:-0}" -ge 4 ]; }; }; then
    restore_flag=1
fi
if [ "$restore_flag" = 1 ]; then
    # 2.2.7+ and 2.3.4+ restore through CreateContainer only when asked to (deprecated there)
    "${TORPOR_PYTHON:-/opt/torpor/bin/python}" - "$CONFIG" <<'EOF'
import sys

import tomlkit

path = sys.argv[1]
with open(path) as f:
    doc = tomlkit.parse(f.read())
plugins = doc.setdefault("plugins", tomlkit.table(is_super_table=True))
runtime = plugins.setdefault("io.containerd.cri.v1.runtime", tomlkit.table())
if runtime.get("enable_experimental_restore_via_create") is not True:
    runtime["enable_experimental_restore_via_create"] = True
    with open(path, "w") as f:
        f.write(tomlkit.dumps(doc))
EOF
fi

# 4. restart containerd, only for a changed config, and only into one that loads
if cmp -s "$before" "$CONFIG"; then
    log "containerd's config already has the torpor runtime class"
else
    if ! "$CONTAINERD" --config "$CONFIG" config dump >/dev/null 2>&1; then
        cp -p "$before" "$CONFIG"
        die "containerd does not load the merged config: $CONFIG left as it was"
    fi
    case "$RESTART" in
    none)
        log "config changed; restart containerd to load it (TORPOR_RESTART=none)" ;;
    systemctl)
        log "restarting containerd (running containers keep running)"
        systemctl restart containerd
        for _ in $(seq 60); do
            if ctr --address "$ADDRESS" version >/dev/null 2>&1; then break; fi
            sleep 1
        done
        if ! ctr --address "$ADDRESS" version >/dev/null 2>&1; then
            log "containerd did not come back: putting the old config back"
            cp -p "$before" "$CONFIG"
            systemctl restart containerd
            die "containerd failed with the torpor runtime class: see journalctl -u containerd"
        fi ;;
    *) die "TORPOR_RESTART=$RESTART: say systemctl or none" ;;
    esac
fi

# 5. torpor's own config: a Kubernetes node restores only signed checkpoints (or its own); a
#    config the operator wrote is left as it is
TORPOR_CONFIG_FILE=${TORPOR_CONFIG:-/etc/torpor/config.toml}
if [ ! -e "$TORPOR_CONFIG_FILE" ]; then
    mkdir -p "$(dirname "$TORPOR_CONFIG_FILE")"
    printf '# written by torpor-node-install: see docs/signing.md\n[restore]\nsignatures = "required"\ntrusted_keys = []\n' \
        >"$TORPOR_CONFIG_FILE.tmp" && mv "$TORPOR_CONFIG_FILE.tmp" "$TORPOR_CONFIG_FILE"
    log "wrote $TORPOR_CONFIG_FILE: [restore] signatures = \"required\" (add your keys to trusted_keys)"
elif ! grep -q '^[[:space:]]*signatures[[:space:]]*=' "$TORPOR_CONFIG_FILE"; then
    log "note: $TORPOR_CONFIG_FILE sets no [restore] signatures: unsigned checkpoints from other nodes restore here"
fi

# 6. done
mkdir -p "$(dirname "$MARKER")"
printf 'torpor %s, containerd %s, %s\n' "$("$TORPOR" --version | awk '{print $NF}')" \
    "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$MARKER"
log "done: pods with runtimeClassName: torpor run under torpor-runc"
