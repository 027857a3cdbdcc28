"""The package's import graph: no cycles, and ``import mlx_w8a8`` stays light.

Edges come from an ``ast`` walk of every ``mlx_w8a8/**/*.py``, imports inside functions
included (a lazy import only hides a cycle until the function runs). ``from . import x``
where ``x`` is a submodule is an edge to the submodule, not to the package.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_w8a8

PACKAGE_DIR = Path(mlx_w8a8.__file__).parent
# The command-line modules (``python -m mlx_w8a8.X``) that the public API never needs.
# One the package imported would make ``python -m`` warn that it runs a module already
# in ``sys.modules`` (runpy's RuntimeWarning; tests/test_cli.py checks the output too).
COMMAND_LINES = ("mlx_w8a8.tune", "mlx_w8a8.bench", "mlx_w8a8.modelbench",
                 "mlx_w8a8.tpbench", "mlx_w8a8.check", "mlx_w8a8.convert", "mlx_w8a8.eval",
                 "mlx_w8a8.fetch", "mlx_w8a8.generate", "mlx_w8a8.server")


def modules(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under package ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """``{module: {imported module: ["line N: what", ...]}}`` over the package's modules
    (imports of anything outside the package are left out)."""
    mods = modules(root)
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def edge(target, what, node):
            graph[name].setdefault(target, []).append(f"line {node.lineno}: {what}")

        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods:
                        edge(alias.name, f"import {alias.name}", node)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                names: dict[str, list[str]] = {}  # target: the names imported from it
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in mods:
                        names.setdefault(submodule, []).append(alias.name)
                    elif source in mods:
                        names.setdefault(source, []).append(alias.name)
                for target, imported in names.items():
                    edge(target, f"from {source} import {', '.join(imported)}", node)
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, targets = work[-1]
            w = next(targets, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def a_cycle(graph: dict[str, dict], component: list[str]) -> list[str]:
    """One cycle through ``component[0]`` inside the component (breadth first, so the
    shortest), as ``[m0, m1, ..., m0]``."""
    inside, start = set(component), component[0]
    parent = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w == start:
                path = [v]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]  # path runs v, ..., start
            if w in inside and w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is not strongly connected")


def describe(graph: dict[str, dict], cycle: list[str]) -> str:
    return "\n".join(f"  {a} -> {b} ({'; '.join(graph[a][b])})" for a, b in zip(cycle, cycle[1:]))


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 30 and "mlx_w8a8.tuning.table" in graph  # the walk found the package
    components = strongly_connected(graph)
    report = "\n".join(
        f"{len(c)} modules import each other: {', '.join(c)}; for example\n"
        f"{describe(graph, a_cycle(graph, c))}" for c in components
    )
    assert not components, "import cycles (imports inside functions count):\n" + report


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_walk_finds_a_cycle_hidden_in_a_function(tmp_path):
    """The checker itself: a lazy import closing a cycle, through a subpackage, is found
    and printed; ``from . import sub`` is an edge to the submodule, not the package."""
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "from .sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..a import thing\n",
        "pkg/c.py": "from . import a\n",  # to the submodule a: no cycle with pkg
    })
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a": ["line 1: from pkg import a"]}
    assert set(graph["pkg.c"]) == {"pkg.a"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.sub.b"]]
    cycle = a_cycle(graph, ["pkg.a", "pkg.sub.b"])
    assert cycle == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert "line 2: from pkg.a import thing" in describe(graph, cycle)


def test_a_three_module_cycle_is_one_component(tmp_path):
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/x.py": "import pkg.y\n",
        "pkg/y.py": "from pkg import z\n",
        "pkg/z.py": "from .x import f\n",
        "pkg/w.py": "from . import x\n",  # into the cycle, not part of it
    })
    graph = import_graph(pkg)
    assert strongly_connected(graph) == [["pkg.x", "pkg.y", "pkg.z"]]
    assert a_cycle(graph, ["pkg.x", "pkg.y", "pkg.z"]) == ["pkg.x", "pkg.y", "pkg.z", "pkg.x"]


@pytest.fixture(scope="module")
def imported_by_the_package():
    """The modules a fresh ``import mlx_w8a8`` loads."""
    code = "import sys, mlx_w8a8; print('\\n'.join(sorted(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    return set(out.stdout.split())


def test_importing_the_package_loads_no_command_line(imported_by_the_package):
    assert "mlx_w8a8.tuning.table" in imported_by_the_package  # the listing is real
    loaded = sorted(set(COMMAND_LINES) & imported_by_the_package)
    assert not loaded, f"import mlx_w8a8 imported the command-line modules {loaded}"


def test_importing_the_package_does_not_import_mlx_lm(imported_by_the_package):
    """mlx-lm is an optional dependency (the ``lm`` extra): only the functions that
    build or run mlx-lm models import it."""
    assert "mlx_w8a8.nn" in imported_by_the_package
    assert not {m for m in imported_by_the_package if m == "mlx_lm" or m.startswith("mlx_lm.")}


def test_the_command_lines_are_still_attributes_of_the_package():
    # Loaded on first access (the package's __getattr__), not by import mlx_w8a8.
    code = ("import sys, mlx_w8a8; assert 'mlx_w8a8.convert' not in sys.modules; "
            "print(mlx_w8a8.convert.main.__module__, mlx_w8a8.eval.main.__module__, "
            "hasattr(mlx_w8a8, 'no_such_name'))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mlx_w8a8.convert", "mlx_w8a8.eval", "False"]


def test_no_library_module_imports_a_command_line():
    # Imports inside functions count: a library function that imported a command line
    # would load it (and its argument parsing) into every program that calls it.
    from mlx_w8a8.__main__ import COMMANDS

    graph = import_graph(PACKAGE_DIR)
    command_lines = set(COMMAND_LINES)
    assert command_lines <= set(graph)  # every name is a module of the package
    assert {f"mlx_w8a8.{name}" for name in COMMANDS} <= command_lines  # none forgotten
    found = [f"{m} -> {target} ({'; '.join(why)})" for m, targets in sorted(graph.items())
             if m not in command_lines for target, why in targets.items()
             if target in command_lines]
    assert not found, "library modules import command lines:\n" + "\n".join(found)
