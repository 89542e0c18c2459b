#!/usr/bin/env bash
# torpor's node installer, run on a Kubernetes node as root (the DaemonSet in
# node-installer.yaml runs it in the host's namespaces; it runs by hand the same way):
#
#  1. check the node: python3 >= 3.11, CRIU >= 3.16 on containerd's PATH, containerd 2.x;
#  2. install torpor (packaging/install.sh: /opt/torpor, launchers in $PREFIX/bin);
#  3. merge the runtime class `torpor` into containerd's config (`torpor runtime-config
#     containerd --install`, comments and settings kept, backup beside it); on containerd 2.2.7
#     and later 2.2.x/2.3.x, also enable_experimental_restore_via_create, without which a pod
#     cannot restore a checkpoint; with TORPOR_DECRYPTION_KEYS (a directory of the node's
#     private keys, e.g. /etc/containerd/ocicrypt/keys), also torpor-decoder as containerd's
#     stream processor of encrypted layers, so that pods run the images torpor encrypts for
#     this node (docs/encryption.md);
#  4. only if the config changed: check that containerd loads it, restart containerd, wait for
#     it to answer, and put the old config back (and restart again) if it does not. Running
#     containers survive a containerd restart: their shims keep them;
#  5. torpor's own config, where there is none: [restore] signatures = "required";
#  6. torpord, the node service (docs/service.md), running: on a host whose init is systemd,
#     the unit packaging/systemd/torpord.service (ExecStart in $PREFIX/bin) installed,
#     enabled, and started, or restarted when the unit or torpor's version changed; on any
#     other host, torpord started here, detached (setsid), in a cgroup of its own so that the
#     installer pod's end does not take it, unless one already answers on its socket. Nothing
#     restarts that one if it dies, until the installer runs again (its pod restarting, at a
#     reboot): the CLI and torpor-runc work without it;
#  7. leave a marker file the DaemonSet's readiness probe looks for.
#
# Settings (environment): TORPOR_SRC (torpor's source tree, default: the one this script is
# in), CONTAINERD_CONFIG (/etc/containerd/config.toml), CONTAINERD_ADDRESS
# (/run/containerd/containerd.sock), PREFIX (/usr/local), TORPOR_DECRYPTION_KEYS (step 3;
# none by default), TORPOR_RESTART (systemctl | none),
# TORPOR_SKIP_INSTALL=1 (torpor already installed: steps 3-5 only), TORPOR_MARKER
# (/var/lib/torpor/node-installed), TORPOR_CONFIG (/etc/torpor/config.toml: written with
# [restore] signatures = "required" where there is none), TORPORD (auto | systemd | direct |
# none; auto: systemd where /run/systemd/system exists, else direct), SYSTEMD_UNIT_DIR
# (/etc/systemd/system), SYSTEMCTL (systemctl), TORPORD_CGROUP (direct: the cgroup v2 directory
# torpord runs in, /sys/fs/cgroup/torpord; "" leaves it in the installer's), TORPORD_LOG
# (direct: /var/log/torpor/torpord.log), TORPORD_STATE (/var/lib/torpor/torpord.installed: the
# unit and version torpord last started with).
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
decrypt=()
[ -z "${TORPOR_DECRYPTION_KEYS:-}" ] || decrypt=(--decryption-keys "$TORPOR_DECRYPTION_KEYS")
"$TORPOR" runtime-config containerd --binary "$PREFIX/bin/torpor-runc" --install "$CONFIG" \
    "${decrypt[@]}" >&2
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
keys=${TORPOR_DECRYPTION_KEYS:-}
if [ ! -e "$TORPOR_CONFIG_FILE" ]; then
    mkdir -p "$(dirname "$TORPOR_CONFIG_FILE")"
    { printf '# written by torpor-node-install: see docs/signing.md and docs/encryption.md\n'
      printf '[restore]\nsignatures = "required"\ntrusted_keys = []\n'
      [ -z "$keys" ] || printf 'decryption_keys = ["%s"]\n' "$keys"
    } >"$TORPOR_CONFIG_FILE.tmp" && mv "$TORPOR_CONFIG_FILE.tmp" "$TORPOR_CONFIG_FILE"
    log "wrote $TORPOR_CONFIG_FILE: [restore] signatures = \"required\" (add your keys to trusted_keys)"
else
    if ! grep -q '^[[:space:]]*signatures[[:space:]]*=' "$TORPOR_CONFIG_FILE"; then
        log "note: $TORPOR_CONFIG_FILE sets no [restore] signatures: unsigned checkpoints from other nodes restore here"
    fi
    if [ -n "$keys" ] && ! grep -q '^[[:space:]]*decryption_keys[[:space:]]*=' "$TORPOR_CONFIG_FILE"; then
        log "note: $TORPOR_CONFIG_FILE sets no [restore] decryption_keys: add \"$TORPOR_DECRYPTION_KEYS\" for encrypted checkpoints to restore on create"
    fi
fi

# 6. torpord
TORPORD_BIN=${TORPORD_BIN:-$PREFIX/bin/torpord}
mode=${TORPORD:-auto}
if [ "$mode" = auto ]; then
    if [ -d /run/systemd/system ]; then mode=systemd; else mode=direct; fi
fi
torpord_answers() { "$TORPORD_BIN" --ping 2>/dev/null; }
wait_torpord() {
    for _ in $(seq 60); do torpord_answers && return 0; sleep 0.5; done
    return 1
}
state=${TORPORD_STATE:-/var/lib/torpor/torpord.installed}
torpor_version=$(TORPOR_NO_SERVICE=1 "$TORPOR" --version | awk '{print $NF}')
mkdir -p "$(dirname "$state")"
case "$mode" in
none)
    log "torpord: not started (TORPORD=none); the CLI and torpor-runc run without it" ;;
systemd)
    SYSTEMCTL=${SYSTEMCTL:-systemctl}
    units=${SYSTEMD_UNIT_DIR:-/etc/systemd/system}
    mkdir -p "$units"
    unit=$(sed "s|^ExecStart=.*|ExecStart=$TORPORD_BIN|" "$SRC/packaging/systemd/torpord.service")
    wanted=$(printf '%s\n%s\n' "$torpor_version" "$unit" | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$units/torpord.service" 2>/dev/null)" != "$unit" ]; then
        printf '%s\n' "$unit" >"$units/torpord.service.tmp"
        mv "$units/torpord.service.tmp" "$units/torpord.service"
        "$SYSTEMCTL" daemon-reload
        log "torpord: installed $units/torpord.service"
    fi
    "$SYSTEMCTL" is-enabled --quiet torpord 2>/dev/null || "$SYSTEMCTL" enable torpord
    if [ "$(cat "$state" 2>/dev/null)" != "$wanted" ]; then
        # a new unit or a new torpor: restart (KillMode=process: running commands finish)
        "$SYSTEMCTL" restart torpord
        printf '%s\n' "$wanted" >"$state"
        log "torpord: (re)started with systemd"
    elif ! "$SYSTEMCTL" is-active --quiet torpord; then
        "$SYSTEMCTL" start torpord
        log "torpord: started with systemd"
    else
        log "torpord: already running (systemd)"
    fi
    wait_torpord || log "warning: torpord does not answer on its socket: journalctl -u torpord \
(the CLI and torpor-runc run without it)" ;;
direct)
    read -r old_pid old_version <"$state" 2>/dev/null || true
    if torpord_answers && { [ "${old_version:-}" = "$torpor_version" ] || [ -z "${old_pid:-}" ]; }; then
        log "torpord: already answers on its socket"
    else
        if torpord_answers && grep -qs torpord "/proc/$old_pid/cmdline"; then
            log "torpord: stopping pid $old_pid (torpor ${old_version:-?}; running commands finish)"
            kill -TERM "$old_pid"
            for _ in $(seq 60); do torpord_answers || break; sleep 0.5; done
        fi
        log_file=${TORPORD_LOG:-/var/log/torpor/torpord.log}
        cgroup=${TORPORD_CGROUP-/sys/fs/cgroup/torpord}
        mkdir -p "$(dirname "$log_file")"
        (
            # out of the installer pod's cgroup (cgroup v2), so that the pod's end spares it
            if [ -n "$cgroup" ] && [ -f "$(dirname "$cgroup")/cgroup.controllers" ]; then
                mkdir -p "$cgroup" && echo "$BASHPID" >"$cgroup/cgroup.procs"
            fi
            exec setsid "$TORPORD_BIN" </dev/null >>"$log_file" 2>&1
        ) &
        printf '%s %s\n' "$!" "$torpor_version" >"$state"
        if wait_torpord; then
            log "torpord: started (pid $!, log $log_file); nothing restarts it if it dies \
until this installer runs again"
        else
            log "warning: torpord did not answer: see $log_file (the CLI and torpor-runc run without it)"
        fi
    fi ;;
*) die "TORPORD=$mode: say auto, systemd, direct or none" ;;
esac

# 7. done
mkdir -p "$(dirname "$MARKER")"
printf 'torpor %s, containerd %s, %s\n' "$("$TORPOR" --version | awk '{print $NF}')" \
    "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$MARKER"
log "done: pods with runtimeClassName: torpor run under torpor-runc"
