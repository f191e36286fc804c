"""README.md is the door: short, its test commands the ones CI runs, its torch the one CI
installs, and every page of the docs one link away."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
CI = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _commands(text: str) -> list[str]:
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_reads_in_five_minutes():
    assert len(README.splitlines()) <= 150
    assert len(README.split()) <= 1200


def test_its_test_commands_are_the_ones_ci_runs():
    readme = [c for c in _commands(README) if c.startswith("python -m pytest")]
    ci = [line.strip() for line in CI.splitlines() if line.startswith("python -m pytest")]
    assert len(readme) == len(ci) == 2
    for shown, run in zip(readme, ci):
        assert run == shown or run.startswith(shown + " --"), f"README shows {shown!r}, CI runs {run!r}"


def test_its_torch_is_the_one_ci_installs():
    (ci_torch,) = re.findall(r"pip install (?:--\S+ )*(torch==\S+)", CI)
    installs = [c for c in _commands(README) if c.startswith("pip install torch")]
    assert installs and all(ci_torch in c.split() for c in installs)
    assert "pip install -e \".[dev]\"" in _commands(README)


def test_every_link_resolves_and_every_page_is_one_link_away():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"\w+://", link)]
    for link in local:
        assert (REPO / link).exists(), f"README links {link}, which does not exist"
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]

    def pages(items):
        for item in items:
            for value in item.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    linked = {Path(link).relative_to("docs").as_posix() for link in local if link.startswith("docs/")}
    # The references are generated as the site builds (docs/hooks/references.py): no file to link.
    missing = [page for page in pages(nav)
               if page != "index.md" and not page.startswith("reference/") and page not in linked]
    assert not missing, f"pages the README does not link: {missing}"
