"""No import cycles inside the package: every module's imports (top-level and lazy, inside functions) are read
with `ast`, without importing anything, and the graph they make must be acyclic.

A lazy import inside a function breaks a cycle at import time only; the modules still depend on each other, and
the cycle returns as soon as one of them moves an import to the top. Each cycle found is printed in order."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = "trace_jax"


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """{dotted module name: its file} for every module of the package (a package's `__init__.py` is the package)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).with_suffix("")
        if "__pycache__" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join((package, *parts))] = path
    return out


def _ancestors(name: str) -> list[str]:
    """"a.b.c" -> ["a", "a.b", "a.b.c"]."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _known(name: str, modules: Set[str]) -> str | None:
    """The longest prefix of `name` that is a module of the package (None: outside it)."""
    for candidate in reversed(_ancestors(name)):
        if candidate in modules:
            return candidate
    return None


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules: Set[str]) -> set[str]:
    """The package's modules that module `name` imports anywhere in `tree` (functions too), by name.

    `import a.b` and `from a import b` with b a submodule name a.b; `from a import f` names a. Importing a.b.c
    runs the `__init__` of a and a.b first, so each is named as well, except the importer's own packages
    (already initialising by the time its imports run) and the importer itself."""
    here = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package, one level up per extra dot
                anchor = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
    own = set(_ancestors(name))
    out = set()
    for target in targets:
        known = _known(target, modules)
        if known is not None:
            out |= {m for m in _ancestors(known) if m in modules and m not in own}
    return out


def import_graph(package_dir: Path = ROOT / PACKAGE, package: str = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for every module of the package."""
    files = module_names(package_dir, package)
    return {name: imported_modules(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py",
                                   files.keys())
            for name, path in files.items()}


def strongly_connected(graph: Mapping[str, Set[str]]) -> Iterator[set[str]]:
    """Tarjan's strongly connected components of `graph` (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    yield component


def shortest_cycle(graph: Mapping[str, Set[str]], start: str, within: Set[str] | None = None) -> list[str] | None:
    """The shortest cycle through `start` as [start, ..., start] (through modules of `within` only, if given);
    None if there is none. Ties go to the path through the modules first by name."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:  # breadth first, back to start
        node = queue.popleft()
        if start in graph.get(node, ()):
            path = [node]
            while path[-1] != start:
                path.append(parent[path[-1]])
            return [start, *reversed(path[:-1]), start] if node != start else [start, start]
        for nxt in sorted(graph.get(node, ())):
            if (within is None or nxt in within) and nxt not in parent and nxt != start:
                parent[nxt] = node
                queue.append(nxt)
    return None


def find_cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Cycles of `graph`, each as [a, b, ..., a], enough that every module on some cycle is on one printed:
    per strongly connected component, the shortest cycle through its first module by name, then through each
    module not on a cycle yet. A module importing itself counts. Empty when the graph is acyclic."""
    cycles = []
    for component in strongly_connected(graph):
        covered: set[str] = set()
        for start in sorted(component):
            if start not in covered and (cycle := shortest_cycle(graph, start, component)) is not None:
                cycles.append(cycle)
                covered |= set(cycle)
    return sorted(cycles)


def test_the_cycle_finder_finds_each_cycle_in_order():
    graph = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "x": {"y"}, "y": set(), "p": {"q"}, "q": {"p", "r"},
             "r": set(), "s": {"s"}, "t": {"u", "a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["p", "q", "p"], ["s", "s"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    # two cycles in one component: the shortest through its first module, then one through each module left
    assert find_cycles({"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "d", "a"], ["b", "c", "a", "b"]]
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [["a", "b", "a"], ["c", "b", "c"]]
    assert shortest_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}, "a") is None


def test_imports_are_read_from_every_form(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import pkg.b\nimport os\n",
        "b.py": "def f():\n    from pkg.sub import c\n",  # a lazy import of a submodule
        "sub/__init__.py": "from pkg.sub.c import thing\n",  # a package's __init__ is a module
        "sub/c.py": "from pkg import a\nfrom . import d\nthing = 1\n",  # relative
        "sub/d.py": "from ..b import f\nfrom pkg.sub import thing\n",  # own package's __init__: not an edge
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub", "pkg.sub.c"},
                     "pkg.sub": {"pkg.sub.c"}, "pkg.sub.c": {"pkg.a", "pkg.sub.d"}, "pkg.sub.d": {"pkg.b"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"],
                                  ["pkg.sub", "pkg.sub.c", "pkg.a", "pkg.b", "pkg.sub"],
                                  ["pkg.sub.d", "pkg.b", "pkg.sub.c", "pkg.sub.d"]]
    # importing pkg.sub.c from outside pkg.sub runs pkg/sub/__init__.py first: that is an edge as well
    (pkg / "a.py").write_text("import pkg.sub.d\n")
    (pkg / "sub/c.py").write_text("thing = 1\nimport pkg.a\n")
    assert find_cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.sub", "pkg.sub.c", "pkg.a"],
                                                     ["pkg.b", "pkg.sub.c", "pkg.a", "pkg.sub.d", "pkg.b"]]


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and f"{PACKAGE}.cli" in graph and graph[f"{PACKAGE}.cli"]  # the whole package was read
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(" -> ".join(c) for c in cycles)


def layer_violations(graph: Mapping[str, Set[str]], layer: Mapping[str, int]) -> list[str]:
    """Each import of a module from a layer above its own ("a (layer i) -> b (layer j > i)"). An import of a package
    (its `__init__`, which imports only its own modules) is left to that package's own line."""
    packages = {m for m in graph if any(other.startswith(m + ".") for other in graph)}
    return sorted(f"{a} ({layer[a]}) -> {b} ({layer[b]})" for a, deps in graph.items() for b in deps
                  if b not in packages and layer[b] > layer[a])


def test_the_layer_check_flags_an_import_from_above():
    graph = {"p": set(), "p.low": set(), "p.mid": {"p", "p.low"}, "p.top": {"p.mid"}}
    assert layer_violations(graph, {"p": 2, "p.low": 0, "p.mid": 1, "p.top": 2}) == []
    graph["p.low"] = {"p.top"}
    assert layer_violations(graph, {"p": 2, "p.low": 0, "p.mid": 1, "p.top": 2}) == ["p.low (0) -> p.top (2)"]


def test_no_module_imports_one_above_it_in_the_readme_layout():
    from layout_map import layout_text, module_entries

    graph, layer = import_graph(), module_entries(layout_text())
    layer[PACKAGE] = -1  # trace_jax/__init__.py imports nothing: below every layer
    assert set(graph) <= set(layer), f"modules the map does not name: {sorted(set(graph) - set(layer))}"
    bad = layer_violations(graph, layer)
    assert not bad, ("imports of a module the Layout map (docs/architecture.md) places above the importer:\n"
                     + "\n".join(bad))
