"""`gpt2/` is a pure library: no prefect anywhere, mlflow only in tracking.py."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

GPT2 = Path(__file__).resolve().parents[2] / "gpt2"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_prefect_import_in_source():
    files = sorted(GPT2.rglob("*.py"))
    assert files
    offenders = [str(f.relative_to(GPT2)) for f in files if "prefect" in _imports(f)]
    assert offenders == []


def test_mlflow_only_through_tracking_module():
    offenders = [
        str(f.relative_to(GPT2)) for f in sorted(GPT2.rglob("*.py"))
        if "mlflow" in _imports(f) and f.name != "tracking.py"
    ]
    assert offenders == []


def test_importing_every_module_loads_no_prefect():
    modules = [
        ".".join(("gpt2",) + f.relative_to(GPT2).with_suffix("").parts)
        for f in sorted(GPT2.rglob("*.py")) if f.name != "__init__.py" and f.name != "__main__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'prefect'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_modules_stay_small():
    """A module a newcomer can read in one sitting (the house rule is ~300 lines)."""
    sizes = {str(f.relative_to(GPT2)): len(f.read_text().splitlines()) for f in GPT2.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 300} == {}


def test_the_root_is_resolved_in_one_place():
    """Paths under the artifact root come from gpt2/layout.py: nobody else
    turns `runtime.root` into a URL by hand."""
    project = GPT2.parent
    sources = [f for d in ("gpt2", "tasks", "flows", "cli") for f in (project / d).rglob("*.py")]
    offenders = [str(f.relative_to(project)) for f in sources
                 if "normalize_url(config.runtime.root)" in f.read_text() and f.name != "layout.py"]
    assert sources and offenders == []


def _module_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """The import statements a module runs when it is imported: its top level,
    inside `if`/`try` there too, but not under `if TYPE_CHECKING:` nor in functions."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def _package_imports(root: Path) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports at module level) -> the imports that make
    the edge, over the packages (directories) directly under `root`."""
    top = root.name
    packages = {d.name for d in root.iterdir() if (d / "__init__.py").is_file()}

    def package_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == top and parts[1] in packages else None

    edges: dict[tuple[str, str], list[str]] = {}
    for package in sorted(packages):
        for f in sorted((root / package).rglob("*.py")):
            for node in _module_level_imports(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif node.level == 0 and node.module:
                    # `from gpt2 import launch` names a package; `from gpt2.launch import x` is in one.
                    targets = [f"{node.module}.{a.name}" for a in node.names] if node.module == top else [node.module]
                else:
                    continue  # relative imports stay inside their package
                for target in targets:
                    other = package_of(target)
                    if other is not None and other != package:
                        where = f"{f.relative_to(root)}:{node.lineno}"
                        edges.setdefault((package, other), []).append(where)
    return edges


def _package_cycles(root: Path) -> dict[tuple[str, str], list[str]]:
    """Each pair of packages under `root` that reach each other through
    module-level imports, with the imports on the first one's side."""
    edges = _package_imports(root)
    reach: dict[str, set[str]] = {}
    for a, b in edges:
        reach.setdefault(a, set()).add(b)
    changed = True
    while changed:  # transitive closure: a handful of packages
        changed = False
        for a in list(reach):
            more = set().union(*(reach.get(b, set()) for b in reach[a])) - reach[a]
            if more:
                reach[a] |= more
                changed = True
    return {(a, b): where for (a, b), where in sorted(edges.items()) if a in reach.get(b, set())}


def test_no_two_packages_under_gpt2_import_each_other():
    """A package under gpt2/ (data, train, checkpoint, launch, ...) never imports
    one that imports it back at module level: what several need (the device and
    process group, the kill window) sits below them, in gpt2/ itself."""
    assert len(_package_imports(GPT2)) > 0  # the walk sees the packages' imports at all
    cycles = _package_cycles(GPT2)
    assert cycles == {}, "\n".join(f"gpt2.{a} imports gpt2.{b}, which imports it back: {', '.join(where)}"
                                   for (a, b), where in cycles.items())


def test_a_cycle_between_packages_is_found(tmp_path):
    """The check above can fail: a cycle through a third package, made of
    `import`, `from pkg import module` and a guarded import, is reported;
    imports in functions and under TYPE_CHECKING are not."""
    root = tmp_path / "lib"
    files = {
        "a/__init__.py": "",
        "a/one.py": "import lib.b.two\n",
        "b/__init__.py": "",
        "b/two.py": "try:\n    from lib import c\nexcept ImportError:\n    pass\n",
        "c/__init__.py": "from lib.a.one import x\n",
        "d/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lib.a\n"
                         "def f():\n    import lib.a\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "a" / "more.py").write_text("import lib.d\n")
    cycles = _package_cycles(root)
    assert set(cycles) == {("a", "b"), ("b", "c"), ("c", "a")}
    assert cycles[("a", "b")] == ["a/one.py:1"]
