"""The package's floors (docs/design.md, "Floors"): a module imports only from its own floor or below, and
no two units (subpackages or top-level modules) import each other, directly or round a cycle.

Every ``import`` of ``dipdeploy`` counts, at module level or inside a function (a lazy import is still a
dependency: it only defers it), except under ``if TYPE_CHECKING:`` (annotations, never run). The unit of
the graph is the first name under ``dipdeploy`` (``export`` for ``dipdeploy.export.bundle``, ``flash``
for ``dipdeploy.flash``). A lower floor that needs a higher one's behaviour is handed it by its caller
(a function or a context manager as an argument), never imports it. An exception goes in :data:`ALLOWED`,
with its reason and what removes it. ``python tests/test_layers.py`` prints the cycles and the upward imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dipdeploy"

# Unit -> floor. A unit may import its own floor and those below.
FLOORS = {
    # floor 1: the shared vocabulary, no torch: formats and names every stage agrees on.
    "dipdeploy": 1,  # the package's __init__ (__version__ only)
    "bundle": 1, "flash": 1, "data": 1, "registry": 1, "arch": 1, "defaults": 1, "paths": 1,
    "dirswap": 1,  # atomic output folders: paths and the bundle reader (an interrupted export) use it
    "trace": 1,  # the trace file (.npz), a file interface like the bundle; imports paths only
    "progress": 1,  # stage reporting, stdlib only; eval and cli report through it
    "terminal": 1,  # the one escaping of foreign text for a terminal (shown); progress, demo and cli print through it
    "extras": 1,  # the install's optional parts and the line naming a missing one; imports nothing of dipdeploy
    "limits": 1,  # the upper bounds on counts from flags and files, stdlib only
    "jsonout": 1,  # the commands' JSON documents (schema keys, the reader of old files), stdlib only
    "wheelparts": 1,  # a model file joined from data-only wheels; imports paths only (loading uses it)
    # floor 2: numeric formats and rules over numpy (torch only in quant's fake quantisation and GPTQ).
    "quant": 2, "cache": 2,
    "agreement": 2,  # the one rule for "two implementations agree"; compares top-k rows with cache.score
    "torchdevice": 2,  # which torch device a stage runs on: a leaf (torch imported on call) for any torch floor
    # floor 3
    "loading": 3, "sparsity": 3, "ops": 3,
    "checkpoint": 3,  # a streamed model's weights read one module at a time (safetensors, GGUF); loading hands it out
    # floor 4
    "export": 4, "eval": 4, "finetune": 4, "sim": 4,
    # floor 5
    "runtime": 5,
    # floor 6: the front ends. demo composes export, eval and runtime into one screen, as a command does.
    "cli": 6, "demo": 6,
    "bench": 6,  # dipdeploy bench: runs export and runtime as a command does; the CLI imports it, never the reverse
    "devtools": 6,  # the project's own check tools (the bundle fuzzer's worker runs the CLI); nothing imports them
}

# Known violations, each (importer module, imported module): why it stays and what removes it. The list is
# exact: the test fails on a violation not listed and on a listed one that is gone, so it cannot rot.
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every import under ``node``, skipping the bodies of ``if TYPE_CHECKING:`` (not their ``else``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported dipdeploy module, line) of each import in ``path``; ``from a import b`` names ``a.b``
    when that is a module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            if target == "dipdeploy" or target.startswith("dipdeploy."):
                while target not in known:  # an attribute path: the module that holds it
                    target = target.rpartition(".")[0]
                found.append((target, node.lineno))
    return found


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def graph() -> dict[str, dict[str, int]]:
    """importer module -> {imported module: first line}, other dipdeploy modules only."""
    mods = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        for target, line in imports(name, path, set(mods)):
            if target != name:
                edges.setdefault(name, {}).setdefault(target, line)
    return edges


def unit_graph(edges, skip=frozenset()) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {unit(m): set() for m in modules()}
    for src, targets in edges.items():
        for dst in targets:
            if unit(src) != unit(dst) and (src, dst) not in skip:
                units[unit(src)].add(unit(dst))
    return units


def components(units: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(units[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(units):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_count(units: dict[str, set[str]]) -> int:
    """Elementary cycles of the unit graph: each counted once, from its smallest unit."""
    count = 0

    def walk(start, v, seen):
        nonlocal count
        for w in units[v]:
            if w == start:
                count += 1
            elif w > start and w not in seen:
                walk(start, w, seen | {w})

    for start in sorted(units):
        walk(start, start, {start})
    return count


def upward(edges) -> dict[tuple[str, str], str]:
    """(importer, imported) -> 'file:line (floor a -> b)' for every import of a higher floor."""
    mods = modules()
    found = {}
    for src, targets in sorted(edges.items()):
        for dst, line in sorted(targets.items()):
            a, b = FLOORS[unit(src)], FLOORS[unit(dst)]
            if b > a:
                found[(src, dst)] = f"{mods[src].relative_to(PACKAGE.parent)}:{line} (floor {a} -> {b})"
    return found


def tangled(edges) -> dict[tuple[str, str], str]:
    """The imports between two units of one floor that import each other round a cycle. Every cycle of
    units holds an upward import or lies within one floor, so these and :func:`upward` are all there is
    to remove for an acyclic graph."""
    mods = modules()
    up = upward(edges)
    same = unit_graph(edges, skip=frozenset(up))
    comps = [set(c) for c in components(same)]
    return {(src, dst): f"{mods[src].relative_to(PACKAGE.parent)}:{line} (floor {FLOORS[unit(src)]}, a cycle)"
            for src, targets in sorted(edges.items()) for dst, line in sorted(targets.items())
            if (src, dst) not in up and unit(src) != unit(dst)
            and any(unit(src) in c and unit(dst) in c for c in comps)}


def violations(edges) -> dict[tuple[str, str], str]:
    return {**upward(edges), **tangled(edges)}


def test_every_unit_has_a_floor():
    missing = {unit(m) for m in modules()} - set(FLOORS)
    assert not missing, f"give these units a floor in FLOORS: {sorted(missing)}"
    assert not set(FLOORS) - {unit(m) for m in modules()}, "FLOORS names units that no longer exist"


def test_no_upward_imports_or_cycles_beyond_the_allowed():
    found = violations(graph())
    new = sorted(set(found) - set(ALLOWED))
    assert not new, ("imports of a higher floor, or between units of one floor that import each other:\n"
                     + "\n".join(f"  {s} -> {d}: {found[(s, d)]}" for s, d in new))
    gone = sorted(set(ALLOWED) - set(found))
    assert not gone, f"these allowed violations no longer exist; remove them from ALLOWED: {gone}"


def test_allowed_violations_are_all_that_tangles_the_units():
    assert not components(unit_graph(graph(), skip=frozenset(ALLOWED)))


def test_checker_sees_lazy_imports_and_skips_type_checking(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dipdeploy.cli import app\n"
                   "else:\n    import dipdeploy.paths\n"
                   "def f():\n    from dipdeploy.export import manifest\n    from . import x\n")
    known = {"dipdeploy", "dipdeploy.cli", "dipdeploy.paths", "dipdeploy.export", "dipdeploy.export.manifest",
             "dipdeploy.sim", "dipdeploy.sim.x"}
    found = [t for t, _ in imports("dipdeploy.sim.m", src, known)]
    assert found == ["dipdeploy.paths", "dipdeploy.export.manifest", "dipdeploy.sim.x"]


if __name__ == "__main__":
    edges = graph()
    units = unit_graph(edges)
    comps = components(units)
    print(f"units: {len(units)}; strongly connected components of >1 unit: {len(comps)}; "
          f"elementary cycles: {cycle_count(units)}")
    for comp in comps:
        print(f"  component of {len(comp)}: {' '.join(comp)}")
    for title, found in (("upward imports", upward(edges)), ("imports round a cycle within a floor", tangled(edges))):
        print(f"{title} (module pairs): {len(found)}; unit pairs: {len({(unit(s), unit(d)) for s, d in found})}")
        for (s, d), where in found.items():
            print(f"  {s} -> {d}  {where}{'  [allowed]' if (s, d) in ALLOWED else ''}")
    sys.exit(0)
