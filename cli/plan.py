"""`gpt2 plan`: what a run will cost, before anyone rents a GPU.

    gpt2 plan --preset gpt2-124m --gpu H100 --gpus 8 --price-per-hour 25
    gpt2 plan --preset gpt2-124m --gpu A100-40GB --set train.max_steps=5000 --json
    gpt2 plan --preset gpt2-1558m --gpu H100 --gpus 8     # which memory savers it needs
    gpt2 plan --run fineweb-edu-10B-1a2b3c4d5e6f --gpu H100 --gpus 8   # the estimate beside what the run measured
    gpt2 plan --preset gpt2-124m --gpu H100 --set runtime.gpu_pools=gpu-spot:1.1:600:3,gpu:3.9   # each rung's cost
    gpt2 plan --preset gpt2-124m --gpu T4          # a free tier's card: fp16, days, 9-hour sessions
    gpt2 plan --preset gpt2-124m --gpu H100 --gpus 8 --grid train.lr=6e-4,1.2e-3   # a sweep: its members together
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from cli.common import GridOpt, JsonOpt, PresetOpt, RootOpt, RunsFileOpt, SetOpt, emit, fail, load_config


def plan(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    gpu: str = typer.Option("H100", "--gpu", help="GPU model, e.g. H100, H200, A100-40GB, A100-80GB, L4, L40S, "
                            "A10G, RTX4090, RTX3090, V100-16GB, V100-32GB, T4, P100."),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", help="GPUs training together (default: runtime.nproc_per_node when a number, else 1; "
        "with --run, the devices the run trained on)."),
    price: Optional[float] = typer.Option(
        None, "--price-per-hour", help="Price of the whole machine per hour; without it the cost is not given."),
    mfu: Optional[float] = typer.Option(
        None, "--mfu", help="Model FLOPs utilization to assume (default: the newest measured on that GPU for the "
        "preset in bench/results.jsonl, else 0.4)."),
    list_source: bool = typer.Option(
        False, "--list-source", help="List a remote data.source to size it (network, credentials); "
        "by default a remote source's size is estimated from the tokens trained."),
    run: Optional[str] = typer.Option(
        None, "--run", help="A trained run (its name under the root's runs/, or its directory URL): plan with its "
        "settings and print what it measured beside the estimate. Without it, the preset's own run is shown "
        "beside the plan once it has trained."),
    session_hours: float = typer.Option(
        9.0, "--session-hours", help="A session limit to count the run in (Kaggle's 9 h; Colab's free tier up to "
        "12 h): how many sessions, each resuming from the last checkpoint."),
    grid: Optional[list[str]] = GridOpt,
    runs_file: Optional[Path] = RunsFileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Tokens, steps, checkpoints, disk, micro-batch, GPU-hours and price of a training run (nothing is run);
    with --grid or --runs, of a sweep: each member's plan, added up, at runtime.max_parallel_runs."""
    from gpt2.cost import actual
    from gpt2.cost.plan import make_plan
    from gpt2.errors import UserError
    from gpt2.ladder import plan as ladder_plan

    config = load_config(preset, sets, root)
    nproc = config.runtime.nproc_per_node
    count = gpus if gpus is not None else (nproc if isinstance(nproc, int) else 1)
    try:
        if run:
            config = actual.run_config(config, run)
            count = gpus or actual.devices_of(config, run) or count
        else:  # a fine-tune's run is named by its weights' sha256, once they are in the root
            from gpt2.weights.init import with_resolved_init

            config = with_resolved_init(config, fetching=False, required=False)
        result = make_plan(config, gpu, count, price, mfu, list_source, session_hours)
        result["actual"] = actual.compare(config, result, run, actual.price_per_device(config, price, count))
        if grid or runs_file:  # a sweep: the keys above stay the common settings' plan, the sweep's under `sweep`
            result["sweep"] = _sweep(preset, sets, root, grid, runs_file, config,
                                     lambda c: make_plan(c, gpu, count, price, mfu, list_source, session_hours))
    except UserError as err:
        fail(str(err))
    text = describe(result)
    if result.get("ladder"):
        text += "\n" + ladder_plan.describe(result["ladder"])
    if result["actual"] is not None:
        text += "\n" + actual.describe(result["actual"], result["steps"])
    if result.get("sweep"):
        from gpt2.sweep.plan import describe as describe_sweep

        text += "\n" + describe_sweep(result["sweep"])
    emit(result, as_json, text)


def _sweep(preset, sets, root, grid, runs_file, config, plan_of) -> dict[str, Any]:
    """Each member planned as the command plans one run, priced together at the parallelism."""
    from cli.sweep import load_members
    from gpt2.sweep.plan import price_sweep
    from gpt2.weights.init import with_resolved_init

    _, members = load_members(preset, sets, grid, runs_file, root)
    plans = [plan_of(with_resolved_init(m.config, fetching=False, required=False)) for m in members]
    return price_sweep([m.label for m in members], plans, config.runtime.max_parallel_runs)


def _redo(p: dict[str, Any]) -> str:
    if p["redo_hours_per_session"] <= 0.5:
        return ""
    return f"; train.checkpoint_every={p['checkpoint_every_quarter_hour']} redoes at most ~15 min"


def _days(hours: float) -> str:
    return f" (~{hours / 24:,.1f} days)" if hours >= 48 else ""


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def describe(p: dict[str, Any]) -> str:
    """The plan as a short table for people."""
    micro = p["micro_batch_size"]
    how = "auto, estimated" if p["micro_batch_auto"] else "set"
    if micro:
        micro_line = (f"{micro} sequences ({how}; ~{p['gpu_memory_bytes_estimated'] / 2**30:.1f} of "
                      f"{p['gpu_memory_gib']:g} GiB), {p['accumulation_steps']} accumulation step(s)")
    else:
        micro_line = (f"none fits ({how}): 1 sequence needs ~{p['gpu_memory_bytes_estimated'] / 2**30:.1f} GiB "
                      f"of {p['gpu_memory_gib']:g} GiB")
    savers = [name for key, name in (("shard_optimizer", f"ZeRO-1 (AdamW state split over {p['gpus']} GPUs, "
                                                        "runtime.shard_optimizer)"),
                                      ("recompute", "activation recomputation (runtime.recompute)")) if p[key]]
    kept = p["checkpoints_kept"]
    node_ckpt = ("+ the checkpoints (local root) and the local copy a save writes first"
                 if p["checkpoints_on_gpu_node"]
                 else "+ the local copy a save writes first (checkpoints go to the remote root)")
    data_tokens = f"{'~' if p['data_tokens_estimated'] else ''}{p['data_tokens'] / 1e9:.2f}B"
    cost = (f"{p['cost']:,.2f} at {p['price_per_hour']:,.2f}/h for the machine" if p["cost"] is not None
            else "no --price-per-hour given")
    rows = [
        ("model", f"{p['params'] / 1e6:,.1f}M parameters, {p['flops_per_token'] / 1e9:.2f} GFLOP per token trained"),
        ("GPUs", f"{p['gpus']} x {p['gpu']} ({p['peak_flops'] / 1e12:,.1f} TFLOP/s dense {p['precision']}, "
                 f"{p['gpu_memory_gib']:g} GiB each)".replace(".0 TFLOP", " TFLOP")),
        ("precision", f"{p['precision']}{' with loss scaling' if p['precision'] == 'fp16' else ''} "
                      f"({p['precision_why']})"),
        ("tokens", f"{p['tokens']:,} ({p['steps']:,} steps x {p['total_batch_tokens']:,} tokens)"),
        ("micro-batch", micro_line),
        ("memory savers", " + ".join(savers) if savers else "none needed"),
        ("checkpoints", f"{p['checkpoints']} written, {kept} kept, {_gb(p['checkpoint_bytes'])} each "
                        "(weights + AdamW state)"),
        ("SIGTERM save", f"~{p['checkpoint_save_s_expected']:.0f} s expected, {p['kill_window_s']:.0f} s allowed on "
                         f"runtime.pool={p['pool']} ({p['kill_window_from']})"),
        ("data", f"{data_tokens} tokens prepared (source size {p['source_size']})"),
        ("disk, data VM", f"{_gb(p['disk_data_vm_bytes'])} at the data stage's peak "
                          f"(runtime.keep_intermediate={p['keep_intermediate']})"),
        ("disk, GPU node", f"{_gb(p['disk_gpu_node_bytes'])}: {_gb(p['shard_bytes'])} of shards {node_ckpt}"),
        ("throughput", f"{p['tokens_per_second']:,.0f} tokens/s at {p['assumed_mfu']:.1%} MFU ({p['mfu_from']})"
         .replace(".0% MFU", "% MFU")),
        ("time", f"{p['hours']:,.2f} h{_days(p['hours'])} ({p['validation_passes']} validation passes included)"),
        ("sessions", f"{p['sessions']:,} session(s) of {p['session_hours']:g} h each (a free tier's limit), "
                     f"~{p['steps_per_session']:,} "
                     f"steps each; each resumes from the last checkpoint and redoes at most "
                     f"~{60 * p['redo_hours_per_session']:,.0f} min (train.checkpoint_every)" + _redo(p)),
        ("GPU-hours", f"{p['gpu_hours']:,.2f}"),
        ("cost", cost),
    ]
    if p.get("init"):  # a fine-tune: its weights are read before the first step, once
        init = p["init"]
        where = ("already in the root: read from there" if init["fetched"]
                 else f"~{_gb(init['bytes'])} (fp32) read once into the root's weights/ before the first step")
        rows.insert(1, ("weights", f"{init['source']}: {where}"))
    if p["sessions"] == 1:  # a session limit says nothing about a run shorter than one
        rows = [row for row in rows if row[0] != "sessions"]
    width = max(len(name) for name, _ in rows) + 2
    lines = [f"plan for preset {p['preset']} (estimates, nothing was run)"]
    lines += [f"  {name + ':':<{width}}{value}" for name, value in rows]
    if p.get("checkpoint_window_warning"):
        lines.append(f"  WARNING: {p['checkpoint_window_warning']}")
    if p.get("steps_note"):
        lines.append(f"  steps: {p['steps_note']}")
    lines.append(f"  counted: {p['counted']}; not counted: {p['not_counted']}")
    lines.append(f"  once rented: gpt2 preflight --preset {p['preset']} (with your --set and --root) measures this on "
                 "the machine in minutes, before the run spends on it")
    return "\n".join(lines)
