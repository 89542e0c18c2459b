#!/usr/bin/env bash
# Install torpor system-wide, as root: a virtual environment in /opt/torpor, fast launchers in
# $PREFIX/bin (torpor, torpor-runc, torpor-hook, torpord, torpor-decoder,
# containerd-shim-torpor-v2) and a commented
# /etc/torpor/config.toml. Run packaging/install-deps.sh --system first (make install does).
# It does not touch containerd's config: `torpor runtime-config containerd --install` does.
#
# PREFIX other than /usr/local or /usr (make install PREFIX=/opt/t): everything goes under it,
# nothing outside: the environment in $PREFIX/lib/torpor/venv, the configuration in
# $PREFIX/etc/torpor/config.toml, which that prefix's launchers read (TORPOR_CONFIG still wins).
# Knobs: SYSCONFDIR (the directory above torpor/config.toml), TORPOR_HOME (the environment).
set -euo pipefail

PREFIX=${PREFIX:-/usr/local}
case "$PREFIX" in
    /usr/local | /usr) SYSCONFDIR=${SYSCONFDIR:-/etc}; VENV=${TORPOR_HOME:-/opt/torpor} ;;
    *) SYSCONFDIR=${SYSCONFDIR:-$PREFIX/etc}; VENV=${TORPOR_HOME:-$PREFIX/lib/torpor/venv} ;;
esac
CONFIG=$SYSCONFDIR/torpor/config.toml
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf 'install: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
log "installing torpor into $VENV"
# a fresh venv's pip and setuptools are Debian's: too old to build torpor (no bdist_wheel)
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$VENV/bin/python" -m pip install -q --upgrade "$TOP"
# CRIU's own image definitions (pycriu) and crit, as install-deps.sh built them
PYCRIU=${TORPOR_BUILD_DIR:-/var/cache/torpor-build}/pycriu-4.2.1
if [ -f "$PYCRIU/.torpor-built" ]; then
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation "$PYCRIU/lib" "$PYCRIU/crit"
else
    log "warning: no pycriu built in $PYCRIU (run packaging/install-deps.sh): restores will be refused"
fi
own_config=()   # the launchers read /etc/torpor's unless told another
[ "$CONFIG" = /etc/torpor/config.toml ] || own_config=(--config "$CONFIG")
"$VENV/bin/python" -m torpor.runtime_config.launchers "${own_config[@]}" "$PREFIX/bin" \
    "$PREFIX/lib/torpor/runc" >&2
install -d -m 0755 "$SYSCONFDIR/torpor"
if [ ! -e "$CONFIG" ]; then
    "$VENV/bin/python" -m torpor.config --defaults > "$CONFIG"
    log "wrote $CONFIG (all defaults, commented out)"
fi
log "done. Next: $PREFIX/bin/torpor runtime-config containerd --install /etc/containerd/config.toml && systemctl restart containerd"
log "then: ctr run --runtime io.containerd.torpor.v2 ... ; torpor check"
