"""The house plan (docs/architecture.md): imports run one way, from the CLI down to the formats,
with no cycle between packages or modules. Function-level imports count: a lazy import is still
a dependency."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torpor"

GROUND = {"errors", "config", "atomicfile", "durable", "output_path", "fastjson", "reporting",
          "tally", "handoff", "formats", "archive", "held_dirs", "ahead", "nice",
          "__init__"}
CAPABILITIES = {"containerd", "registry", "image", "capture", "gpu", "node", "runtime_config", "kube",
                "signing", "criu_images", "lazy"}
# what each area may import (besides itself); the ground floor may import only the ground
ALLOWED = {
    **{name: GROUND for name in GROUND},
    **{name: GROUND | CAPABILITIES for name in CAPABILITIES},
    # the self-contained capabilities (docs/architecture.md): only the ground floor below them
    **{name: GROUND for name in ("registry", "capture", "runtime_config", "criu_images", "kube")},
    "ops": GROUND | CAPABILITIES,
    "cli": GROUND | CAPABILITIES | {"ops"},
    # torpord runs the CLI's commands, the schedules, and torpor-runc's checkpoint (pyroute2
    # imported before it forks: capture.netns)
    "service": GROUND | {"cli", "ops", "shim", "capture", "lazy", "criu_images"},
    # create_cmd: a container created from a checkpoint image restores from it (ops/on_create)
    "shim": GROUND | {"capture", "gpu", "criu_images", "ops"},
    "oci_hooks": GROUND | {"capture"},
}
# the ground floor's own order: formats see only errors, atomicfile and themselves
FORMATS_ALLOWED = {"errors", "atomicfile", "formats", "__init__"}


def area(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


@functools.cache
def modules() -> dict[str, set[str]]:
    """module -> the torpor modules it imports (anywhere in it); parsed once per run."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "containerd/api" in str(path):
            continue
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("torpor")}
            elif isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("torpor"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    is_module = (PACKAGE.parent / full.replace(".", "/")).with_suffix(".py").exists() \
                        or (PACKAGE.parent / full.replace(".", "/")).is_dir()
                    targets.add(full if is_module else node.module)
        graph[name] = {t for t in targets if "containerd.api" not in t and t != name}
    return graph


def test_imports_run_downward() -> None:
    wrong = []
    for module, targets in modules().items():
        for target in targets:
            here, there = area(module), area(target)
            if here == there:
                continue
            allowed = FORMATS_ALLOWED if here == "formats" else ALLOWED.get(here, set())
            if there not in allowed:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_no_package_imports_another_in_a_circle() -> None:
    edges: dict[str, set[str]] = {}
    for module, targets in modules().items():
        edges.setdefault(area(module), set()).update(area(t) for t in targets
                                                     if area(t) != area(module))
    assert _cycles(edges) == []


def test_no_module_imports_another_in_a_circle() -> None:
    graph = modules()
    known = set(graph)
    assert _cycles({m: {t for t in ts if t in known} for m, ts in graph.items()}) == []


def test_nothing_below_imports_the_cli() -> None:
    """torpord (`service/`) is the one floor above the CLI: it runs the CLI's commands."""
    assert [m for m, ts in modules().items() if area(m) not in ("cli", "service")
            and any(area(t) == "cli" for t in ts)] == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for vertex in list(edges):
        if vertex not in index:
            visit(vertex)
    return found
