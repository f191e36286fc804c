"""`gpt2 sweep`: many training runs from one preset, each an ordinary run (its own run address,
so one that exists already is answered from it), the data stage once per data config, at most
runtime.max_parallel_runs training at once, compared in one table and one figure.

    gpt2 sweep --preset smoke --grid train.lr=1e-3,3e-3
    gpt2 sweep --preset gpt2-124m --grid train.lr=6e-4,1.2e-3 --grid train.optimizer=adamw,muon --json
    gpt2 sweep --preset gpt2-124m --runs members.yaml
    gpt2 plan --preset gpt2-124m --gpu H100 --gpus 8 --grid train.lr=6e-4,1.2e-3   # its price first

Exits 1 when any member failed (the others finish); the table names each failure's reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.common import (GridOpt, JsonOpt, PresetOpt, RootOpt, RunsFileOpt, SetOpt, VerboseOpt, emit, fail,
                        load_config, run_flow)


def load_members(preset: str, sets: Optional[list[str]], grid: Optional[list[str]], runs_file: Optional[Path],
                 root: Optional[str]):
    """The sweep's members, every one resolved; a bad one ends the command (exit 2) naming it and its key."""
    from gpt2.sweep.members import SweepError, member_sets, parse_common, parse_grid, read_runs, resolve_members

    load_config(preset, sets, root)  # the common settings first: their problems once, not once per member
    try:
        own = member_sets(parse_grid(grid or []), read_runs(runs_file) if runs_file else None)
        return own, resolve_members(preset, parse_common(sets or []), own, root=root)
    except SweepError as err:
        fail(str(err), code=2)


def sweep(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    grid: Optional[list[str]] = GridOpt,
    runs_file: Optional[Path] = RunsFileOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Train, evaluate and export every member of a grid or a runs file (each cached as `gpt2 run` is), and
    compare them: a table with the best marked, the bill by pool, and report.png on the sweep's MLflow run."""
    if not (grid or runs_file):
        fail("a sweep needs members: give --grid key=v1,v2,... (repeatable) or --runs FILE", code=2)
    own, members = load_members(preset, sets, grid, runs_file, root)
    from cli.common import check_root
    from cli.stages import check_run

    for m in members:
        check_run(m.config)
    unwritable = check_root(members[0].config)
    if unwritable:  # `gpt2 run` answers finished work from such a root; a sweep also writes its own record
        fail(f"{unwritable}: a sweep writes its record and its members' runs there; pass a writable --root")
    _, result = run_flow("flows.sweep:sweep_flow", preset, sets, root, verbose=verbose, members=own)
    from gpt2.sweep.table import describe

    text = describe(result["members"], result["bill"])
    if result.get("mlflow_url"):
        text += f"\nMLflow: {result['mlflow_url']}\n  its members side by side: {result['mlflow_members_url']}"
    if as_json:
        typer.echo(text, err=True)
    emit(result, as_json, text)
    failed = [r["member"] for r in result["members"] if r["state"] == "failed"]
    if failed:
        fail(f"{len(failed)} of {len(result['members'])} member(s) failed ({', '.join(map(str, failed))}): "
             "the others finished; fix what the table says and rerun the same command (finished members are "
             "answered from their runs)")
