"""`gpt2 config show`: print the resolved config of a preset plus overrides."""

from __future__ import annotations

import json
from typing import Optional

import typer

from cli.common import PresetOpt, RootOpt, SetOpt, load_config
from gpt2.config.identity import data_fingerprint, train_fingerprint

app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)


@app.command("show")
def show(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    fingerprints: bool = typer.Option(False, "--fingerprints", help="Also print each stage's identity hash."),
) -> None:
    """Print the resolved config as JSON (invalid keys or values: every problem at once)."""
    config = load_config(preset, sets, root)
    out = config.model_dump(mode="json")
    if fingerprints:
        out["fingerprints"] = {"data": data_fingerprint(config), "train": train_fingerprint(config)}
    typer.echo(json.dumps(out, indent=2))
