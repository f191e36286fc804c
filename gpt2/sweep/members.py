"""A sweep's members: each an ordinary run (a preset, the common `--set` overrides and its
own), resolved and checked before anything starts.

    --grid train.lr=3e-4,6e-4 --grid train.optimizer=adamw,muon   four members (a Cartesian product)
    --runs runs.yaml                                               a list of override sets (YAML or JSON)

Values are read as `--set` values are (gpt2.config.overrides.parse_value: JSON when they
parse as JSON, plain strings otherwise). A value that holds a comma outside brackets
(`runtime.gpu_pools=a,b`) cannot be a grid value: list it in a `--runs` file.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from gpt2.config.overrides import ConfigError, parse_assignments, parse_value, resolve_config
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout


class SweepError(UserError):
    """A sweep that cannot start: a bad grid or runs file, a member that does not resolve."""


@dataclass(frozen=True)
class Member:
    """One member: its number in the sweep (from 1), its own overrides (beside the common
    ones), the full config they make, and the run it trains (its address under the root)."""

    index: int
    overrides: dict[str, Any]
    config: Config

    @property
    def label(self) -> str:
        return label_of(self.overrides)

    @property
    def run_name(self) -> str:
        return layout.run_name(self.config)

    @property
    def run_dir(self) -> str:
        return layout.run_dir(self.config)


def label_of(overrides: Mapping[str, Any]) -> str:
    """`train.lr=0.0003 train.optimizer=muon`: how tables and errors name a member."""
    return " ".join(f"{k}={_show(v)}" for k, v in overrides.items()) or "(the preset as it is)"


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def split_values(text: str) -> list[str]:
    """`1e-3,3e-3` -> ["1e-3", "3e-3"]; commas inside brackets or quotes stay (`[0.9,0.95]`)."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    return parts + [current]


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """["train.lr=1e-3,3e-3", ...] -> {"train.lr": [0.001, 0.003], ...}, in the order given."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise SweepError(f"--grid {item!r} is not of the form key=v1,v2,... (e.g. --grid train.lr=3e-4,6e-4)")
        if key in grid:
            raise SweepError(f"--grid names {key} twice: give all its values once (--grid {key}=v1,v2,...)")
        grid[key] = [parse_value(v.strip()) for v in split_values(values)]
    return grid


def expand_grid(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """The Cartesian product, the last key varying fastest (as nested loops read)."""
    if not grid:
        return []
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def read_runs(path: Path) -> list[dict[str, Any]]:
    """A `--runs` file: a list of override sets, each a mapping of dotted keys to values
    (YAML, or JSON, which YAML reads too)."""
    import yaml

    try:
        entries = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SweepError(f"--runs file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise SweepError(f"--runs file {path} is neither YAML nor JSON: {str(err).splitlines()[0]}") from None
    return check_runs(entries, f"--runs file {path}")


def check_runs(entries: Any, where: str) -> list[dict[str, Any]]:
    """A list of override sets, each a mapping of dotted keys (`train.lr: 3e-4`)."""
    example = "e.g. [{train.lr: 3.0e-4}, {train.lr: 6.0e-4, train.optimizer: muon}]"
    if not isinstance(entries, list) or not entries:
        raise SweepError(f"{where} must hold a non-empty list of override sets, {example}")
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not all(isinstance(k, str) for k in entry):
            raise SweepError(f"{where}: member {i} is not a mapping of dotted keys to values, {example}")
    return [dict(e) for e in entries]


def member_sets(grid: Mapping[str, list[Any]], runs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Each member's own overrides: the runs' sets, each crossed with the grid's product
    when both are given; one member (the common overrides alone) when neither is."""
    product = expand_grid(grid) or [{}]
    return [{**run, **cell} for run in (runs or [{}]) for cell in product]


def resolve_members(preset: str, common: Mapping[str, Any], sets: list[dict[str, Any]],
                    root: str | None = None) -> list[Member]:
    """Every member resolved through the same path as `gpt2 run` (the preset, the common
    overrides, then its own); all bad members named at once, one line each with the key at
    fault, before anything starts. Two members that would train the same run are refused."""
    members, problems = [], []
    for i, own in enumerate(sets, 1):
        try:
            config = resolve_config(preset, {**common, **own}, root=root)
        except ConfigError as err:
            problems.append(f"member {i} ({label_of(own)}): {'; '.join(err.problems)}")
            continue
        members.append(Member(i, own, config))
    if problems:
        raise SweepError("\n".join(problems) + "\nfix or drop these members; nothing was started")
    _refuse_twins(members)
    return members


def parse_common(sets: Iterable[str]) -> dict[str, Any]:
    """The common `--set` overrides as a mapping (malformed ones refused by gpt2.config.overrides)."""
    overrides, problems = parse_assignments(sets)
    if problems:
        raise SweepError("; ".join(problems))
    return overrides


def _refuse_twins(members: list[Member]) -> None:
    """Members that differ only in settings that never change the weights (runtime, the
    micro-batch) are one run: training it twice at once would fight over its lease."""
    seen: dict[str, Member] = {}
    for m in members:
        if m.run_name in seen:
            first = seen[m.run_name]
            raise SweepError(f"members {first.index} ({first.label}) and {m.index} ({m.label}) train the same run "
                             f"{m.run_name}: they differ only in settings that never change the weights; drop one")
        seen[m.run_name] = m
