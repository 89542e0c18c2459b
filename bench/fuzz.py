"""The mutation fuzzer (tests/support/fuzz.py) at any length: one genuine checkpoint of a
container with a volume, a read-write layer and a listening server, mutated and restored with
`torpor restore` on a node whose policy is the default, as a checkpoint directory, an OCI layout
and an image in a local registry.

    python -m bench.fuzz [--cases 1000] [--seed 1] [--forms dir,layout,registry]
    python -m bench.fuzz --only layout:1:17 [--keep]     # reproduce one case, keep its files

Prints, per form and in all: cases, refused, restored safely, escapes, hangs, internal errors,
leftovers (and images the registry itself would not take), the time, and each failure's case
name and mutations, to reproduce it with --only. Exits 1 when any case failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.harness import IMAGE, world
from tests.support import fuzz
from tests.support.registry import Registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="cases per form (default 300)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--forms", default=",".join(fuzz.FORMS))
    parser.add_argument("--only", action="append", default=[], metavar="FORM:SEED:N",
                        help="run these cases only (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep each case's mutated copy")
    parser.add_argument("--timeout", type=float, default=fuzz.CASE_TIMEOUT)
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per case")
    args = parser.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    with world() as w:
        base = w.base / "fuzz"
        node = w.node("fuzz", config=fuzz.node_config(base))
        registry = Registry(base / "registry", "plain").start()
        try:
            genuine = fuzz.make_genuine(node, base, IMAGE, registry)
            total = fuzz.Summary()
            plan = {f: [c for c in args.only if c.startswith(f + ":")] for f in forms} \
                if args.only else {f: fuzz.cases(f, args.seed, args.cases) for f in forms}
            started = time.monotonic()
            for form, names in plan.items():
                if not names:
                    continue
                summary = fuzz.Summary()
                t0 = time.monotonic()
                for name in names:
                    result = fuzz.run_case(genuine, name, args.timeout, args.keep)
                    summary.add(result)
                    total.add(result)
                    if args.verbose or args.only:
                        print(f"{name} {result.outcome} {result.seconds:.1f}s "
                              f"[{'; '.join(result.mutations)}] {result.detail[-300:]}",
                              flush=True)
                print(f"{form}: {summary.text()}\n  ({time.monotonic() - t0:.0f} s)", flush=True)
            print(f"all: {total.text().splitlines()[0]} in {time.monotonic() - started:.0f} s")
            if args.keep:
                print(f"cases kept under {genuine.work}; the world is removed at exit")
            return 1 if total.failures() else 0
        finally:
            registry.stop()


if __name__ == "__main__":
    sys.exit(main())
