"""The project's imports run one way. No circle among the modules of gpt2/, tasks/, flows/, cli/
and bench/: every import statement counts, at the top of a module, in a function or under
`if TYPE_CHECKING:` (a tool that reads imports as text sees them all, and a lazy import only hides
a circle). And the folders stack: gpt2/ (the library) imports none of the others, tasks/ only the
library, flows/ the tasks, cli/ the flows; bench/ may import any, and nothing imports bench/.

A package's `__init__.py` is a module like any other: an import of `pkg.mod` is an edge to
`pkg.mod` only (Python runs `pkg/__init__.py` first, but that is no circle unless the `__init__`
itself imports back).

The library's packages stack too: gpt2's packages, each named for a concept (gpt2.config,
gpt2.train, gpt2.data, ...), import each other one way, so a circle between two packages is found
even where no two of their modules form one (a.x imports b.y, b.z imports a.w)."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
FOLDERS = ("gpt2", "tasks", "flows", "cli", "bench")
"""Lowest first: each folder may import the ones before it, never one after it."""


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(root, f): f for folder in folders for f in sorted((root / folder).rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names (a relative one resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    # `from pkg import mod` names a module; `from mod import name` names something in one.
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(root: Path, folders: tuple[str, ...] = FOLDERS) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: the line of the first such import}, from every
    import statement of the module's source, wherever it sits."""
    modules = _modules(root, folders)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _targets(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # the module itself where `name` is one, else its package
                names = [n for n in names[:-1] if n in modules] or names[-1:]
            for name in names:
                while name not in modules and "." in name:  # `import a.b.name`: the module a.b
                    name = name.rsplit(".", 1)[0]
                if name in modules and name != module:
                    edges.setdefault(name, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every circle a depth-first walk meets, each as [a, b, ..., a], one per set of modules."""
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []
    found: dict[frozenset[str], list[str]] = {}

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph.get(module, {})):
            if state.get(other) == 1:
                circle = path[path.index(other):] + [other]
                found.setdefault(frozenset(circle), circle)
            elif other not in state:
                visit(other)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return list(found.values())


def _describe(circle: list[str], graph: dict[str, dict[str, int]], root: Path) -> str:
    steps = []
    for a, b in zip(circle, circle[1:]):
        where = _modules(root, (a.split(".")[0],))[a].relative_to(root)
        steps.append(f"{a} ({where}:{graph[a][b]})")
    return " -> ".join(steps + [circle[-1]])


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, str]]:
    """package -> {package it imports: one "module -> module" that does}, each module standing for
    its folder's direct child (gpt2.config.tree for gpt2.config; gpt2.model for itself)."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, dict[str, str]] = {}
    for a, edges in graph.items():
        out = packages.setdefault(package(a), {})
        for b in edges:
            if package(b) != package(a):
                out.setdefault(package(b), f"{a} -> {b}")
    return packages


def test_no_import_circle_among_the_librarys_packages():
    packages = package_graph(import_graph(PROJECT, ("gpt2",)))
    assert {"gpt2.config", "gpt2.train", "gpt2.root", "gpt2.tracking"} <= set(packages)  # the walk sees them
    circles = import_cycles({p: dict.fromkeys(edges, 0) for p, edges in packages.items()})
    assert not circles, "package circles (move the definition both sides need below both):\n" + "\n".join(
        " -> ".join(f"{a} ({packages[a][b]})" for a, b in zip(c, c[1:])) for c in circles)


def test_the_library_root_holds_few_modules_and_no_prefix_family():
    """gpt2/'s root holds a handful of single-file concepts beside its packages; a row of modules
    sharing a prefix (config_train.py, config_data.py) is a package in disguise."""
    modules = sorted(p.stem for p in (PROJECT / "gpt2").glob("*.py") if p.stem != "__init__")
    assert len(modules) <= 6, f"gpt2/ holds {len(modules)} loose modules: {modules}; gather them into packages"
    prefixes = [m.split("_")[0] for m in modules]
    shared = sorted({p for p in prefixes if prefixes.count(p) > 1})
    assert not shared, f"modules of gpt2/ that share a prefix (make each a package): {shared}"
    packages = [p.name for p in (PROJECT / "gpt2").iterdir() if (p / "__init__.py").exists()]
    assert not set(modules) & set(packages)


def test_no_import_circle_among_the_projects_modules():
    graph = import_graph(PROJECT)
    assert len(graph) > 150 and sum(map(len, graph.values())) > 500  # the walk sees the project at all
    circles = import_cycles(graph)
    assert not circles, "import circles (move the definition both sides need to where it belongs):\n" + "\n".join(
        _describe(c, graph, PROJECT) for c in circles)


def test_the_folders_import_downwards_only():
    graph = import_graph(PROJECT)
    rank = {folder: i for i, folder in enumerate(FOLDERS)}
    upward = [f"{a} imports {b} (line {line})" for a, edges in sorted(graph.items()) for b, line in edges.items()
              if rank[b.split(".")[0]] > rank[a.split(".")[0]]]
    assert not upward, "\n".join(upward)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_circle_is_found_however_it_is_hidden(tmp_path):
    """The check can fail: a circle closed by an import in a function, one under TYPE_CHECKING,
    a relative import and `from pkg import module` is each found and named with its lines; a
    package whose `__init__` re-exports its modules is no circle."""
    files = {
        "lib/__init__.py": "",
        "lib/a.py": "from lib import b\n",
        "lib/b.py": "def f():\n    from lib.c import x\n",
        "lib/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n",
        "lib/face/__init__.py": "from lib.face.inner import z\n",
        "lib/face/inner.py": "import lib.face.other\n",
        "lib/face/other.py": "z = 1\n",
        "app/__init__.py": "",
        "app/main.py": "import lib.a\n",
    }
    _write(tmp_path, files)
    graph = import_graph(tmp_path, ("lib", "app"))
    assert graph["lib.face.inner"] == {"lib.face.other": 1} and graph["app.main"] == {"lib.a": 1}
    (circle,) = import_cycles(graph)
    assert set(circle) == {"lib.a", "lib.b", "lib.c"} and circle[0] == circle[-1]
    assert _describe(["lib.a", "lib.b", "lib.c", "lib.a"], graph, tmp_path) == (
        "lib.a (lib/a.py:1) -> lib.b (lib/b.py:2) -> lib.c (lib/c.py:3) -> lib.a")


def test_a_circle_between_packages_is_found_where_no_modules_form_one(tmp_path):
    files = {
        "lib/__init__.py": "", "lib/one/__init__.py": "", "lib/two/__init__.py": "",
        "lib/one/x.py": "from lib.two.y import f\n",
        "lib/two/y.py": "def f():\n    pass\n",
        "lib/two/z.py": "from lib.one import w\n",
        "lib/one/w.py": "",
        "lib/leaf.py": "import lib.one.x\n",
        # a circle through a third package, closed by an import in a function
        "lib/three/__init__.py": "", "lib/four/__init__.py": "",
        "lib/three/p.py": "from lib import four\n",
        "lib/four/q.py": "def g():\n    import lib.three.r\n",
        "lib/three/r.py": "",
        "lib/four/__main__.py": "from lib.four import q\n",
    }
    _write(tmp_path, files)
    graph = import_graph(tmp_path, ("lib",))
    assert not import_cycles(graph)
    packages = package_graph(graph)
    assert packages["lib.one"] == {"lib.two": "lib.one.x -> lib.two.y"} and packages["lib.leaf"] == {
        "lib.one": "lib.leaf -> lib.one.x"}
    circles = import_cycles({p: dict.fromkeys(e, 0) for p, e in packages.items()})
    assert sorted(sorted(set(c)) for c in circles) == [["lib.four", "lib.three"], ["lib.one", "lib.two"]]
