"""The `gpt2` command: one sub-command per stage plus config inspection.

    gpt2 config show --preset smoke --set train.max_steps=20
    gpt2 prepare --preset smoke --json

Logs go to stderr; with --json the last line of stdout is one JSON object.
"""

from __future__ import annotations

import typer

from cli import config_cmd, data_cmd, eval_cmd, run_cmd, stack_cmd, train_cmd

app = typer.Typer(
    name="gpt2",
    help="Reproduce GPT-2 (124M) from scratch: prepare data, train, evaluate, export.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(config_cmd.app, name="config")
app.command("prepare")(data_cmd.prepare)
app.command("train")(train_cmd.train)
app.command("evaluate")(eval_cmd.evaluate)
app.command("export")(eval_cmd.export)
app.add_typer(stack_cmd.app, name="stack")
app.command("run")(run_cmd.run)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
