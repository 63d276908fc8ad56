"""The package map of docs/design.md, checked over the source (`ast`, nothing imported).

* No module of `npu_rec/` imports a module that imports it back, directly or
  through a chain (imports inside functions count: they only delay a circle).
* `npu_rec.keras` and `npu_rec.estimator` never import each other.
* The core (everything but the front ends, `npu_rec.models` and the scripts
  `npu_rec.scripts`) imports neither front end nor the reference models.

An edge `a -> b` is an import statement in `a` naming module `b`
(`from pkg import name` names `pkg.name` when that is a module, else `pkg`).
Importing a module also runs its parent packages' `__init__`; those implicit
edges are not counted (every module would otherwise close a circle through
`npu_rec/__init__.py`, which re-exports the public names).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FRONT_ENDS = ("npu_rec.keras", "npu_rec.estimator")
ABOVE_CORE = (*FRONT_ENDS, "npu_rec.models", "npu_rec.scripts", "npu_rec.compat")


def _modules(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: pathlib.Path, mods) -> dict[str, int]:
    """Module -> first line number, for every `npu_rec` module `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in mods:  # `import npu_rec.x.y` names the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.setdefault(target, node.lineno)
    return out


def import_graph(root: pathlib.Path = ROOT, package: str = "npu_rec"):
    mods = _modules(root, package)
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def find_cycle(graph) -> list[str] | None:
    """One import circle `[a, b, ..., a]` of `graph`, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    assert len(graph) > 50, sorted(graph)  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("source,target", [FRONT_ENDS, FRONT_ENDS[::-1]])
def test_front_ends_never_import_each_other(source, target):
    graph = import_graph()
    bad = [
        f"{a} -> {b} (line {line})"
        for a, deps in graph.items()
        if _within(a, source)
        for b, line in deps.items()
        if _within(b, target)
    ]
    assert not bad, bad


def test_the_core_imports_no_front_end():
    graph = import_graph()
    bad = [
        f"{a} -> {b} (line {line})"
        for a, deps in graph.items()
        if a != "npu_rec" and not any(_within(a, p) for p in ABOVE_CORE)
        for b, line in deps.items()
        if any(_within(b, p) for p in ABOVE_CORE)
    ]
    assert not bad, bad


def test_the_checks_see_circles_through_chains_and_function_bodies(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from pkg import a\n")
    graph = import_graph(tmp_path, "pkg")
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import pkg.sub.b\n")  # a shorter circle b <-> c
    assert find_cycle(import_graph(tmp_path, "pkg")) == ["pkg.sub.b", "pkg.sub.c", "pkg.sub.b"]
    (pkg / "sub" / "c.py").write_text("x = 1\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
