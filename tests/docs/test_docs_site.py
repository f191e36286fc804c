"""The docs site: `mkdocs build --strict` passes (a broken link or anchor, a page missing from the
nav, fails it), and the references it generates hold every config key and every command of the
code, each key marked with the fingerprints it really enters."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer.main
from pydantic import BaseModel

from cli.main import app
from gpt2.config import identity
from gpt2.config.presets import PRESETS
from gpt2.config.tree import Config

REPO = Path(__file__).resolve().parents[2]
# One worker builds the site once for every test here.
pytestmark = pytest.mark.xdist_group("docs_site")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                          cwd=REPO, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                                         **__import__("os").environ})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        inner = field.annotation
        if typing.get_origin(inner) in (tuple, list):
            inner = typing.get_args(inner)[0]
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                keys += [prefix + name] + _leaf_keys(inner, f"{prefix}{name}[].")
                continue
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            keys += _leaf_keys(inner, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _rows(site: Path) -> dict[str, str]:
    """The configuration reference's table rows, by key: the row's text."""
    page = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, flags=re.S):
        cells = re.findall(r"<td>(.*?)</td>", row, flags=re.S)
        if cells:
            rows[html.unescape(re.sub(r"<[^>]+>", "", cells[0]))] = html.unescape(re.sub(r"<[^>]+>", " ", row))
    return rows


def test_the_site_builds_strict_with_every_page(site):
    for page in ("getting-started", "configuration", "using-the-model", "troubleshooting", "reference/cli",
                 "reference/configuration"):
        assert (site / page / "index.html").is_file(), page


def test_the_configuration_reference_has_every_key_with_its_doc(site):
    rows = _rows(site)
    keys = _leaf_keys(Config)
    assert len(keys) > 60
    assert set(rows) == set(keys), f"missing {set(keys) - set(rows)}, extra {set(rows) - set(keys)}"
    for key in keys:
        model, field = Config, None
        for part in key.replace("[]", "").split("."):
            field = model.model_fields[part]
            inner = field.annotation
            inner = typing.get_args(inner)[0] if typing.get_origin(inner) in (tuple, list) else inner
            model = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
        doc = re.sub(r"[\s`*]", "", field.description or "")
        assert doc and doc[:60] in re.sub(r"\s", "", rows[key]), f"{key}: its docstring is not in the reference"


def test_every_preset_value_that_differs_is_shown(site):
    rows = _rows(site)
    configs = {name: make() for name, make in PRESETS.items()}
    assert configs["smoke"].model.n_layer != configs["gpt2-124m"].model.n_layer
    for key in ("model.n_layer", "train.total_batch_tokens", "data.source"):
        for name, config in configs.items():
            value = config
            for part in key.split("."):
                value = getattr(value, part)
            assert f"{name}: " in rows[key] and str(value) in rows[key], (key, name)


def _fingerprints(config: Config) -> tuple[str, ...]:
    return (identity.data_fingerprint(config), identity.train_fingerprint(config),
            identity.eval_fingerprint(config, "w"), identity.register_fingerprint(config, "w"))


def _changed(config: Config, key: str):
    """The config with `key` set to another valid value (a number moved, a bool flipped, a literal
    swapped), or None when none is found."""
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    candidates = []
    if isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, int):
        candidates = [value * 2, value + 1, value - 1]
    elif isinstance(value, float):
        candidates = [value * 2 or 1.0, value / 2]
    elif isinstance(value, str):
        candidates = [value + "x", "auto", "cpu", "warn", "skip"]
    tree = config.model_dump()
    *parents, leaf = key.split(".")
    for candidate in (c for c in candidates if c != value):
        node = tree
        for part in parents:
            node = node[part]
        node[leaf] = candidate
        try:
            return Config.model_validate(tree)
        except Exception:
            continue
    return None


def test_the_identity_column_says_what_changing_the_key_changes(site):
    """Changing a key the reference calls runtime leaves every fingerprint as it was; changing a
    key it calls the run's identity re-addresses the run; the data's, the data. Checked by changing
    each simple key on the gpt2-124m preset (with Muon and rollback on, where the keys count)."""
    rows = _rows(site)
    base = PRESETS["gpt2-124m"]().model_copy(update={"train": PRESETS["gpt2-124m"]().train.model_copy(
        update={"optimizer": "muon", "on_spike": "rollback"})})
    checked = 0
    for key, row in rows.items():
        if "[]" in key or key in ("data.source", "preset"):
            continue
        changed = _changed(base, key)
        if changed is None:
            continue
        before, after = _fingerprints(base), _fingerprints(changed)
        if "runtime:" in row:
            assert before == after, f"{key} is called runtime but changes a fingerprint"
        elif "identity: the data" in row:
            assert before[0] != after[0], f"{key} is called the data's identity but leaves it"
        elif "identity: the run" in row:
            assert before[1] != after[1] and before[0] == after[0], f"{key}: the run's identity, not the data's"
        elif "identity: the evaluation" in row:
            assert before[2] != after[2] and before[1] == after[1], key
        elif "identity: the model's registration" in row:
            assert before[3] != after[3] and before[1] == after[1], key
        checked += 1
    assert checked > 40


def test_the_cli_reference_has_every_command_and_option(site):
    text = _text(site / "reference" / "cli" / "index.html")

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    commands = list(walk(typer.main.get_command(app), "gpt2"))
    assert len(commands) > 10
    for path, command in commands:
        assert f"$ {path} " in text, f"{path} is not in the CLI reference"
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in text, f"{path} {opt} is not in the CLI reference"
