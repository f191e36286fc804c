"""The stage commands: `gpt2 prepare`, `train`, `evaluate`, `export` and `run`
(the whole pipeline in this process on the embedded default: a temporary
Prefect server, a local SQLite MLflow store).

    gpt2 prepare --preset smoke --json
    gpt2 train --preset smoke --json
    gpt2 train --preset gpt2-124m --root gs://bucket/gpt2 --set runtime.nproc_per_node=8
    gpt2 evaluate --preset smoke --json
    gpt2 evaluate --preset gpt2-124m --set eval.limit=1000 --checkpoint gs://b/runs/r/checkpoints/step_019073
    gpt2 export --preset smoke --json
    gpt2 run --preset smoke
    gpt2 run --preset smoke --json
"""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, VerboseOpt, emit, fail, load_config, run_flow, setup_logging
from flows.summary import describe_bill, describe_tasks, where_things_are

FreshOpt = typer.Option(False, "--fresh", help="Delete this run's checkpoints and start over (default: resume).")
CheckpointOpt = typer.Option(
    "latest", "--checkpoint", help="A checkpoint directory URL, or `latest`: the newest complete one of the preset's run."
)

EVAL_KEYS = ("hellaswag", "mlflow_run_id", "native", "parity", "source", "benchmark", "checkpoint", "step", "result_url", "cached",
             "core", "tasks")


def prepare(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Tokenize the corpus into llm.c shards under the artifact root (cached: a
    rerun skips finished work, a killed run continues where it stopped)."""
    _check_source(load_config(preset, sets, root))
    _, result = run_flow("flows.data:data_flow", preset, sets, root, verbose=verbose)
    emit(
        result,
        as_json,
        f"{'cached' if result['cached'] else 'prepared'}: {result['shards']} shards, "
        f"{result['train_tokens']:,} train + {result['val_tokens']:,} val tokens\nmanifest: {result['manifest']}",
    )


def _prepare_hint(preset: str, sets: Optional[list[str]], root: Optional[str]) -> str:
    parts = ["gpt2", "prepare", "--preset", preset]
    for s in sets or []:
        parts += ["--set", s]
    if root:
        parts += ["--root", root]
    return " ".join(shlex.quote(p) for p in parts)


def train(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    fresh: bool = FreshOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Train GPT-2 on the prepared shards; rerun the same command to resume."""
    config = load_config(preset, sets, root)
    setup_logging()
    from cli.common import check_root
    from gpt2.root import layout, storage

    # A bucket that does not answer is named before the manifest's check; a
    # root that cannot be written is answered from what it holds (run_flow).
    unwritable = check_root(config)
    url = layout.manifest(config)
    if not unwritable and not storage.exists(url):
        fail(f"no prepared data for this config: {url} does not exist; make it first with:\n  "
             + _prepare_hint(preset, sets, root))
    _check_device(config)
    _check_init(config)
    _, result = run_flow("flows.train:train_flow", preset, sets, root, verbose=verbose, fresh=fresh)
    val = result["final_val_loss"]
    summary = f"{'cached' if result.get('cached') else 'trained'}: {result['run_name']} at step {result['steps']}"
    if val is not None:
        summary += f", val loss {val:.4f}"
    emit(result, as_json, f"{summary}\ncheckpoint: {result['checkpoint']}\n{describe_bill(result.get('bill'))}")


def check_run(config) -> None:
    """What `gpt2 run` (and each member of `gpt2 sweep`) checks before any server starts."""
    if config.runtime.gpu_pools:
        from gpt2.ladder.rungs import IN_PROCESS

        fail(IN_PROCESS)
    _check_device(config)
    _check_source(config)
    _check_init(config)


def _check_source(config) -> None:
    """A mistyped local data.source (a glob that matches nothing, a folder without nanoGPT's
    pair) is answered in the command's first second, once, before any server starts."""
    from gpt2.data.download import source_problem

    problem = source_problem(config)
    if problem:
        fail(problem)


def _check_init(config) -> None:
    """A local train.init_from that does not exist, answered before any server starts."""
    from gpt2.weights.init import init_problem

    problem = init_problem(config)
    if problem:
        fail(problem)


def _check_device(config) -> None:
    """A device this machine lacks is answered before the server starts (and
    before a pipeline's data stage has run for nothing)."""
    if config.runtime.device == "auto":
        return  # no torch import for the common case
    from gpt2.process.distributed import DeviceUnavailable, check_device_available

    try:
        check_device_available(config.runtime.device)
    except DeviceUnavailable as err:
        fail(str(err))


def evaluate(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    checkpoint: str = CheckpointOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """The tasks of eval.tasks on a checkpoint (cached): HellaSwag with lm-eval, checked against the native
    scorer; CORE (`--set eval.tasks=hellaswag,core`); any lm-eval task (`lm-eval:<task>`)."""
    _check_device(load_config(preset, sets, root))
    _, result = run_flow("flows.evaluate:eval_flow", preset, sets, root, verbose=verbose, checkpoint=checkpoint)
    out = {k: result.get(k) for k in EVAL_KEYS}
    h = out["hellaswag"]
    lines = [f"{'cached' if result['cached'] else 'evaluated'} step {result['step']}"]
    if h:
        lines[0] += (f" on {result['source']} ({h['n']} items): acc {h['acc']:.4f}, acc_norm {h['acc_norm']:.4f}, "
                     f"acc_norm_per_token {h['acc_norm_per_token']:.4f}; native scorer "
                     f"{'agrees' if result['parity']['agree'] else 'DISAGREES'}")
    lines += [line.strip() if not line.startswith("    ") else line[2:] for line in describe_tasks(result)]
    emit(out, as_json, "\n".join(lines + [f"result: {result['result_url']}"]))


def export(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    checkpoint: str = CheckpointOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Export a checkpoint as a Hugging Face directory and llm.c files; register the HF model in MLflow (cached)."""
    _, result = run_flow("flows.export:export_flow", preset, sets, root, verbose=verbose, checkpoint=checkpoint)
    emit(
        result,
        as_json,
        f"{'cached' if result['cached'] else 'exported'} step {result['step']}\nhf: {result['hf_dir']}\n"
        f"llm.c: {result['llmc_bin']}\nregistered: {result['registered_model']} v{result['model_version']}"
        f" (alias {result['alias']})",
    )


def run(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Prepare, train, evaluate and export: every stage cached, so a rerun
    (or a rerun after a crash) only does what is missing."""
    check_run(load_config(preset, sets, root))
    # Any stage's error ends the pipeline; the flow already logged its traceback.
    config, result = run_flow("flows.pipeline:pipeline_flow", preset, sets, root, verbose=verbose,
                              errors=(Exception,))
    guide = where_things_are(config, result)
    if as_json:
        typer.echo(guide, err=True)
    emit(result, as_json, guide)
