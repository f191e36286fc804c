"""The commands docs/getting-started.md shows are the ones a test runs. Each shell block of the page
carries a marker comment that says what a test does with it:

    <!-- test: run, ...                   every command of the block runs, in an empty directory
         skip "pip install" ...: why      commands starting so are left out, each with its reason -->
    <!-- test: skip, why -->              the whole block is left out (the install: network)

The quick tier checks that every block has its marker and that every rule still names a command
of its block; the end-to-end tier runs the blocks marked `run` as written (one command after the
other, in a new directory, in the test environment, so nothing downloads: the smoke preset reads
the built-in sample and the shipped HellaSwag format sample), twice, as the page says."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli.stack.fixtures import clean_env

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
TIMEOUT_S = 900  # a hang guard per command; the smoke pipeline takes a few minutes on 2 cores

_BLOCK = re.compile(r"(?:<!--(?P<marker>(?:(?!-->).)*)-->[ \t]*\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)```", re.S)


@dataclass
class Block:
    line: int
    commands: list[str]
    marker: str | None
    run: bool = False
    reason: str = ""
    skips: dict[str, str] = field(default_factory=dict)
    """Command prefix -> why commands starting with it are not run."""

    def skipped(self, command: str) -> str | None:
        return next((why for prefix, why in self.skips.items() if command.startswith(prefix)), None)

    def to_run(self) -> list[str]:
        return [c for c in self.commands if self.run and self.skipped(c) is None]


def _commands(body: str) -> list[str]:
    """The block's commands in order: a line's trailing `  # comment` dropped, `&&` chains split."""
    lines = (line.split("  #")[0].strip() for line in body.splitlines())
    return [part.strip() for line in lines if line for part in line.split("&&") if part.strip()]


def _parse(marker: str, block: Block) -> None:
    head, *rules = re.split(r"\n\s*skip (?=\")", marker.strip())
    kind, _, block.reason = head.partition(",")
    block.run = kind.strip() == "test: run"
    block.reason = " ".join(block.reason.split())
    for rule in rules:
        names, _, why = rule.partition('":')
        for prefix in re.findall(r'"([^"]+)"', names + '"'):
            block.skips[prefix] = " ".join(why.split())


def shell_blocks(text: str) -> list[Block]:
    blocks = []
    for match in _BLOCK.finditer(text):
        if match["lang"] not in ("bash", "sh", "shell", ""):
            continue
        block = Block(text.count("\n", 0, match.start("body")), _commands(match["body"]), match["marker"])
        if block.marker is not None:
            _parse(block.marker, block)
        blocks.append(block)
    return blocks


def test_every_block_says_whether_a_test_runs_it():
    blocks = shell_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 2
    unmarked = [b.line for b in blocks if b.marker is None or not b.marker.strip().startswith("test: ")]
    assert not unmarked, f"{PAGE.name}: shell blocks without a `<!-- test: run|skip, ... -->` marker, lines {unmarked}"
    for block in blocks:
        if not block.run:
            assert block.reason, f"line {block.line}: a skipped block says why"
            continue
        assert block.to_run(), f"line {block.line}: a block marked run has a command left to run"
        for prefix, why in block.skips.items():
            assert why, f"line {block.line}: skip {prefix!r} says why"
            assert any(c.startswith(prefix) for c in block.commands), (
                f"line {block.line}: skip {prefix!r} names no command of the block (the page changed?)")
    run = [c for b in blocks for c in b.to_run()]
    assert "gpt2 run --preset smoke" in run, run


def test_markers_are_read_as_written():
    text = ('<!-- test: run, here\n     skip "pip install" "python3 -m venv": network,\n     still the reason\n'
            '     skip "python -m pytest": the suite -->\n```bash\npython3 -m venv .venv && pip install -e . && '
            'gpt2 run --preset smoke   # the run\npython -m pytest -q\n```\n\n'
            '<!-- test: skip, no network -->\n```bash\npip install x\n```\n\n```python\nprint(1)\n```\n')
    first, second = shell_blocks(text)
    assert first.run and first.to_run() == ["gpt2 run --preset smoke"]
    assert first.skips == {"pip install": "network, still the reason", "python3 -m venv": "network, still the reason",
                           "python -m pytest": "the suite"}
    assert not second.run and second.reason == "no network" and second.to_run() == []


def _environment(tmp_path: Path) -> dict[str, str]:
    """The test environment as the page's `. .venv/bin/activate` leaves it, in a home of its own
    (no Prefect server or MLflow store of this machine's; the migrated empty databases' cache is
    shared, as on a user's machine after the first run)."""
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home)
    venv_bin = Path(sys.prefix) / "bin"
    assert (venv_bin / "gpt2").is_file(), f"no gpt2 command in {venv_bin}: install the project (pip install -e .)"
    return {**env, "VIRTUAL_ENV": sys.prefix, "PATH": f"{venv_bin}:{env.get('PATH', '')}"}


def _run_block(block: Block, cwd: Path, env: dict[str, str]) -> str:
    out = []
    for command in block.to_run():
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        out.append(done.stdout + done.stderr)
    return "\n".join(out)


@pytest.mark.e2e  # the whole smoke pipeline, twice: a few minutes
def test_the_quick_start_runs_as_written_and_again_from_cache(tmp_path):
    blocks = [b for b in shell_blocks(PAGE.read_text(encoding="utf-8")) if b.run]
    assert blocks
    env = _environment(tmp_path)
    for i, block in enumerate(blocks):
        cwd = tmp_path / f"block-{i}"
        cwd.mkdir()
        first = _run_block(block, cwd, env)
        # What the page says the run ends by printing: the checkpoint, the Hugging Face export,
        # the MLflow UI and what the run cost; all of it under ./artifacts.
        for line in ("checkpoint:", "Hugging Face dir:", "MLflow UI:", "bill:"):
            assert line in first, f"the run's summary lacks {line!r}:\n{first[-3000:]}"
        assert (cwd / "artifacts" / "mlflow.db").is_file() and any((cwd / "artifacts" / "runs").iterdir())
        # "Run it again: every stage is `Cached`."
        again = _run_block(block, cwd, env)
        assert "pipeline finished (cached stages: data, train, evaluate, export)" in again, again[-3000:]
