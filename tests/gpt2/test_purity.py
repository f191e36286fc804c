"""`gpt2/` is a pure library: no prefect anywhere, mlflow only in its tracking package."""

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


def test_mlflow_only_through_tracking_package():
    offenders = [
        str(f.relative_to(GPT2)) for f in sorted(GPT2.rglob("*.py"))
        if "mlflow" in _imports(f) and f.parent != GPT2 / "tracking"
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
    """Paths under the artifact root come from gpt2/root/layout.py: nobody else
    turns `runtime.root` into a URL by hand."""
    project = GPT2.parent
    sources = [f for d in ("gpt2", "tasks", "flows", "cli") for f in (project / d).rglob("*.py")]
    offenders = [str(f.relative_to(project)) for f in sources
                 if "normalize_url(config.runtime.root)" in f.read_text() and f.name != "layout.py"]
    assert sources and offenders == []
