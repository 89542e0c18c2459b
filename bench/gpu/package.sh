#!/usr/bin/env bash
# Pack torpor's GPU bench for a GPU host without network: CRIU with every library it loads
# (the loader and libc included, so an older host libc does not matter), torpor's source,
# nvidia-ml-py's pynvml.py and the bench itself, in one directory and a .tar.gz of it.
#
#   bench/gpu/package.sh [OUT]        default OUT: build/gpu-bench
#   CRIU=/path/to/criu PYTHON=/path/to/python bench/gpu/package.sh OUT
#
# On the GPU host, as root:  tar xzf gpu-bench.tar.gz && gpu-bench/run.sh --gib 16
set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(realpath -m "${1:-$TOP/build/gpu-bench}")
CRIU=${CRIU:-$(command -v criu || echo "${TORPOR_PREFIX:-/usr/local}/sbin/criu")}
PYTHON=${PYTHON:-${TORPOR_VENV:-$TOP/.venv}/bin/python}

die() { echo "package.sh: $*" >&2; exit 1; }
[ -x "$CRIU" ] || die "no CRIU at $CRIU (set CRIU=)"
PYNVML=$("$PYTHON" -c 'import pynvml; print(pynvml.__file__)') \
    || die "$PYTHON cannot import pynvml (nvidia-ml-py); set PYTHON="

rm -rf "$OUT" "$OUT.tar.gz"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/libexec" "$OUT/python/bench/gpu"

# CRIU and every shared object it loads, run through the bundled loader.
cp "$CRIU" "$OUT/libexec/criu"
LOADER=""
while read -r lib; do
    cp -L "$lib" "$OUT/lib/"
    case "$lib" in */ld-linux*) LOADER=$(basename "$lib") ;; esac
done < <(ldd "$CRIU" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
[ -n "$LOADER" ] || die "ldd named no dynamic loader for $CRIU"
cat > "$OUT/bin/criu" <<WRAP
#!/bin/sh
# CRIU through its own loader and libraries (builtins only: no PATH needed)
case "\$0" in */*) bin=\${0%/*} ;; *) bin=. ;; esac
here=\$(cd "\$bin/.." && pwd)
exec "\$here/lib/$LOADER" --library-path "\$here/lib" "\$here/libexec/criu" "\$@"
WRAP
chmod 755 "$OUT/bin/criu"

# torpor's source (the bench uses torpor.gpu), pynvml, the bench.
(cd "$TOP" && find torpor -name '*.py' -o -name py.typed) | while read -r f; do
    mkdir -p "$OUT/python/$(dirname "$f")"
    cp "$TOP/$f" "$OUT/python/$f"
done
cp "$PYNVML" "$OUT/python/pynvml.py"
touch "$OUT/python/bench/__init__.py"
cp "$TOP"/bench/gpu/{__init__,preflight,run,session_check,workload}.py "$OUT/python/bench/gpu/"

cat > "$OUT/run.sh" <<'RUN'
#!/bin/sh
# torpor's GPU bench, from this bundle; every option: ./run.sh --help. As root.
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m bench.gpu.run --criu "$here/bin/criu" "$@"
RUN
chmod 755 "$OUT/run.sh"

{
    echo "torpor $(git -C "$TOP" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$OUT/bin/criu" --version | head -1
    echo "nvidia-ml-py $("$PYTHON" -c 'from importlib.metadata import version; print(version("nvidia-ml-py"))')"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -r)"
} > "$OUT/MANIFEST"

tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")"
echo "$OUT.tar.gz"
