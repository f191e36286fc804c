"""The `gpt2` command: one sub-command per stage plus config inspection.

    gpt2 config show --preset smoke --set train.max_steps=20
    gpt2 prepare --preset smoke --json
    gpt2 preflight --preset gpt2-124m --root gs://bucket/gpt2
    gpt2 report --runs smoke-1a2b3c4d5e6f --out report.png
    gpt2 sweep --preset smoke --grid train.lr=1e-3,3e-3
    gpt2 sample --from runs/RUN/export/step_000020/hf --prompt "Hello" --top-k 1

Logs go to stderr; with --json the last line of stdout is one JSON object.
"""

from __future__ import annotations

import gc

from gpt2.process.console import survive_closed_console

# First, before Prefect's console handler binds sys.stderr: a console that goes away (`| tee`
# ended by the same Ctrl-C) must not end the run (gpt2.process.console).
survive_closed_console()

import typer  # noqa: E402

from cli import config, plan, preflight, report, sample, stages, sweep  # noqa: E402
from cli.common import defer_errors_to_exit  # noqa: E402
from cli.stack import commands as stack_commands  # noqa: E402

app = typer.Typer(
    name="gpt2",
    help="Reproduce GPT-2 (124M) from scratch: prepare data, train, evaluate, export.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(config.app, name="config")
app.command("prepare")(stages.prepare)
app.command("train")(stages.train)
app.command("evaluate")(stages.evaluate)
app.command("export")(stages.export)
app.add_typer(stack_commands.app, name="stack")
app.command("run")(stages.run)
app.command("sweep")(sweep.sweep)
app.command("plan")(plan.plan)
app.command("preflight")(preflight.preflight)
app.command("report")(report.report)
app.command("sample")(sample.sample)


def main() -> None:
    defer_errors_to_exit()
    try:
        app()
    finally:
        # Ending: what this process imported (torch, Prefect, MLflow) goes with it. Frozen, it is
        # left out of the interpreter's final collection, which walks every object (seconds).
        gc.freeze()


if __name__ == "__main__":
    main()
