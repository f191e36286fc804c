"""`gpt2 preflight`: on the machine that will train, prove in minutes that the
run will finish, or say exactly why not (gpt2.preflight).

    gpt2 preflight --preset gpt2-124m --root gs://bucket/gpt2
    gpt2 preflight --preset gpt2-124m --synthetic --json
"""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt


def preflight(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
    record: bool = typer.Option(False, "--record", help="On a GPU, append the figures to bench/results.jsonl."),
    synthetic: bool = typer.Option(False, "--synthetic",
                                   help="Random tokens for the steps, no data check (no prepared root at hand)."),
    steps: int = typer.Option(5, "--steps", help="Timed steps after the first (which compiles)."),
    join_timeout: float = typer.Option(300.0, "--join-timeout", help="Seconds rank 0 waits for every rank."),
    verbose: bool = typer.Option(False, "--verbose", help="The trainer core's log lines too."),
) -> None:
    """Check devices, data, root, memory, compile, throughput, collectives, disk, lease and tracking
    for this config on this machine, before the run spends on it (exit 1 when a check fails)."""
    from gpt2.preflight.__main__ import main

    argv = ["--preset", preset, "--steps", str(steps), "--join-timeout", str(join_timeout)]
    for s in sets or []:
        argv += ["--set", s]
    if root:
        argv += ["--root", root]
    argv += [flag for flag, on in (("--json", as_json), ("--record", record), ("--synthetic", synthetic),
                                   ("--verbose", verbose)) if on]
    raise typer.Exit(main(argv))
