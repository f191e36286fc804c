"""Kill anything, lose nothing: a seeded fault soak of the whole local stack.

    python -m bench.soak --seed 7 --faults 50 --json --record --figure chaos.png

Stands up a stack of its own (Prefect server, MLflow server, a worker per
pool: `gpt2 stack up`), trains the soak's config once without faults (the
reference), then starts smoke-sized pipelines as a user does (`prefect
deployment run gpt2/full-pipeline`), each on a root and work dir of its own,
and while each runs injects faults at moments drawn from the seed
(bench/soak/faults.py: SIGKILL, SIGTERM, SIGSTOP-then-SIGCONT of the servers,
workers, flow runs, the trainer, tokenizer workers; the MLflow server away for
minutes; the pipeline's disk full). A supervisor brings back a dead server or
worker after a few seconds, as a platform would; nothing else is helped.

After every pipeline the checker (bench/soak/checks.py) compares it with
the reference: completed, weights bit-identical, one MLflow run per stage,
every metric step once and none missing, one attempt per trainer, nothing
left running, no lease held, no temporary file. A pipeline the disk-full
fault failed must say so and complete when rerun.

The last stdout line (--json) is one JSON object: `faults` (count by kind),
`pipelines`, `pipelines_completed`, `lost`, `duplicates`, `problems`, the
findings, seed and commit. Exit 0 only when nothing was lost, nothing
duplicated, every pipeline completed and no other check failed. `--record`
appends the object to bench/soak/results.jsonl; `--figure` draws it. A soak
stopped by Ctrl-C or SIGTERM still prints, records and draws the pipelines it
checked, with `interrupted` saying when (never a pass).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.soak import checks, faults
from bench.soak.stack import (
    Stack,
    Supervisor,
    _say,
    mount_small,
    pipeline_alive,
    reference_digest,
    settings,
    soak_env,
    unmount,
)
from flows.deployment_file import DEFAULT_ZOMBIE_AFTER_S
from gpt2.report.figures_on_record import commit

RESULTS = Path(__file__).with_name("results.jsonl")

STAGES = ("data", "train", "evaluate", "export")


def fault_plan(script: list[tuple[str, float, float | None]], rng: random.Random, window_s: tuple[float, float],
               n: int) -> list[tuple[str | None, float, float | None]]:
    """A pipeline's faults as (kind or None: drawn then, seconds, lasting or
    None): the script's, or `n` moments drawn from `window_s`, in order."""
    if script:
        return list(script)
    return [(None, at, None) for at in sorted(rng.uniform(*window_s) for _ in range(n))]


def _watch(stack: Stack, parent: str, deadline: float) -> None:
    """Follow the run to a final state."""
    while time.monotonic() < deadline:
        run = stack.read(parent)
        if run is not None and run.state.is_final():
            return
        time.sleep(0.5)


def _under_faults(i: int, stack: Stack, injector: faults.Injector, opts: argparse.Namespace, plan: list,
                  disk: Any, params: dict, script: list) -> tuple[dict[str, Any], Any, list, int]:
    """Start the pipeline, inject its faults, follow it (and its rerun after a
    full disk) to the end: (outcome, its final run or None, faults, reruns)."""
    parent = stack.start_pipeline(params)
    _say(f"pipeline {i}: flow run {parent}")
    injected = []
    deadline = time.monotonic() + opts.timeout_s
    began = time.monotonic()
    if script:  # the script's moments count from the first trainer's start
        while not faults.trainers(injector.mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        began = time.monotonic()
    for kind, at, lasting in plan:
        time.sleep(max(0.0, began + at - time.monotonic()))
        run = stack.read(parent)
        if run is not None and run.state.is_final() and not run.state.is_crashed():
            break
        fault = injector.inject(i, disk, kind, lasting)
        if fault is not None:
            injected.append(fault)
    _watch(stack, parent, deadline)
    injector.settle()
    run = stack.final(parent, max(deadline - time.monotonic(), 60))
    reruns, outcome = 0, {"parent": parent}
    if run is not None and not run.state.is_completed() and any(f.kind == "disk-full" for f in injected):
        outcome["failed_with"] = run.state.message
        named = any(w in (run.state.message or "").lower() for w in ("disk", "space"))
        _say(f"pipeline {i} ended {run.state.name} after a full disk ({'names' if named else 'does NOT name'} "
             f"the disk); rerunning it")
        reruns, outcome["rerun"] = 1, stack.start_pipeline(params)
        _watch(stack, outcome["rerun"], time.monotonic() + opts.timeout_s)
        run = stack.final(outcome["rerun"], opts.timeout_s)
        if not named:
            outcome.setdefault("problems", []).append(["error", f"the failure did not name the disk: "
                                                                f"{outcome['failed_with']}"])
    return outcome, run, injected, reruns


def run_pipeline(i: int, stack: Stack, injector: faults.Injector, opts: argparse.Namespace,
                 reference: Future[str], faults_left: int, script: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    """One pipeline under faults, then its checks."""
    from mlflow import MlflowClient

    from gpt2.checkpoint import store
    from gpt2.config.overrides import resolve_config
    from gpt2.root import layout

    place = stack.base / f"pipeline-{i}"
    plan = fault_plan(script, injector.rng, opts.window_s, min(opts.per_pipeline, faults_left))
    wants_disk = "disk-full" in ([kind for kind, _, _ in plan] if script else injector.kinds)
    small = wants_disk and mount_small(place, opts.small_fs_mb)
    params = settings(place / "root", place / "work")
    config = resolve_config("smoke", params)
    disk = faults.DiskFiller(place) if small else None
    with faults.TrainersSeen(injector.mark) as seen:  # the rerun's trainers count too
        outcome, run, injected, reruns = _under_faults(i, stack, injector, opts, plan, disk, params, script)
    parent = outcome.get("rerun", outcome["parent"])
    findings = checks.Findings()
    if run is None:
        findings.problems.append(("hung", f"flow run {parent} not final after {opts.timeout_s:.0f} s"))
    elif not run.state.is_completed():
        findings.problems.append(("not completed", f"{run.state.name}: {run.state.message}"))
    findings.problems.extend(tuple(p) for p in outcome.pop("problems", []))
    run_ids = {outcome["parent"], parent, *(str(r.id) for r in stack.stage_runs(outcome["parent"])),
               *(str(r.id) for r in stack.stage_runs(parent))}
    checks.check_left_running(findings, lambda: pipeline_alive(injector.mark, run_ids))
    checks.check_weights(findings, store.latest_checkpoint(config), reference.result(), config.train.max_steps)
    client = MlflowClient(stack.info["mlflow_url"])
    flow_runs = list(dict.fromkeys([outcome["parent"], parent]))  # the pipeline, then its rerun
    checks.check_mlflow(findings, client, config.tracking.experiment, flow_runs, STAGES, config.train.max_steps)
    checks.check_bill(findings, layout.run_dir(config), len(seen.pids), config.train.max_steps)
    checks.check_lease(findings, layout.run_dir(config))
    checks.check_temp_files(findings, place / "root")
    if small:
        unmount(place)
    result = {"pipeline": i, **outcome, "completed": run is not None and run.state.is_completed(),
              "reruns": reruns, "faults": [vars(f) for f in injected], "trainers": len(seen.pids),
              "own_filesystem": small,
              **findings.as_dict()}
    _say(f"pipeline {i}: {'completed' if result['completed'] else 'NOT completed'}; "
         f"{len(findings.lost)} lost, {len(findings.duplicates)} duplicated, {len(findings.problems)} problem(s)")
    for what, detail in findings.lost + findings.duplicates + findings.problems:
        _say(f"  {what}: {detail}")
    for what, detail in findings.notes:
        _say(f"  note, {what}: {detail}")
    return result


def soak(opts: argparse.Namespace) -> dict[str, Any]:
    base = Path(opts.dir or tempfile.mkdtemp(prefix="gpt2-chaos-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    mark = f"{opts.seed}-{os.getpid()}"
    env = soak_env(base, mark)
    rng = random.Random(opts.seed)
    timing = faults.Timing(pause_s=opts.pause_s, mlflow_away_s=opts.mlflow_away_s,
                                 disk_full_s=opts.disk_full_s, restart_delay_s=opts.restart_delay_s)
    started, revision = time.monotonic(), commit()  # the code the soak starts with
    _say(f"seed {opts.seed}: {len(opts.script)} scripted and {opts.faults} drawn fault(s) over at least "
         f"{opts.pipelines} pipeline(s) in {base}")
    # The reference trains beside the stack's start and the first pipeline's data stage (~45 s of the
    # soak's wall); it is needed only by the first pipeline's checks. Without the soak's mark, so the
    # injector never takes it for a pipeline's trainer.
    _say("training the reference (no faults) while the stack stands up")
    quiet = {k: v for k, v in env.items() if k != faults.MARK_ENV}
    references = ThreadPoolExecutor(1, thread_name_prefix="reference")
    reference = references.submit(reference_digest, quiet, base)
    references.shutdown(wait=False)
    _say("standing up the stack")
    try:
        stack = Stack(env, base, opts.max_reschedules, opts.zombie_after_s)
    except BaseException:
        reference.cancel()
        raise
    supervisor = Supervisor(stack.state_dir, timing, _say, env).start()
    injector = faults.Injector(stack.state_dir, mark, supervisor, timing, rng, tuple(opts.kinds), _say)
    pipelines = []

    def drawn() -> int:
        return sum(1 for p in pipelines for f in p["faults"] if not f["scripted"])

    def more() -> bool:
        if len(pipelines) < max(opts.pipelines, 1 if opts.script else 0):
            return True
        # Drawn faults go on until all were injected (one may find no target: stop somewhere).
        return drawn() < opts.faults and len(pipelines) < opts.pipelines + opts.faults + 1

    def next_pipeline() -> dict[str, Any]:  # the script (if any) on the first pipeline, drawn faults on the others
        script = opts.script if not pipelines else []
        return run_pipeline(len(pipelines), stack, injector, opts, reference,
                            0 if script else opts.faults - drawn(), script)

    try:
        interrupted = run_until_stopped(more, next_pipeline, pipelines)
    finally:  # also on Ctrl-C or SIGTERM (main): nothing of the soak outlives it
        injector.release()
        supervisor.stop()
        stack.down()
        for place in base.glob("pipeline-*"):  # a pipeline's own filesystem, where it had one
            unmount(place)
    by_kind = Counter(f["kind"] for p in pipelines for f in p["faults"])
    result = {
        "seed": opts.seed, "commit": revision, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "interrupted": interrupted,
        "faults": dict(sorted(by_kind.items())), "faults_total": sum(by_kind.values()),
        "pipelines": len(pipelines), "pipelines_completed": sum(p["completed"] for p in pipelines),
        "reruns": sum(p["reruns"] for p in pipelines),
        "lost": sum(len(p["lost"]) for p in pipelines),
        "duplicates": sum(len(p["duplicates"]) for p in pipelines),
        "problems": sum(len(p["problems"]) for p in pipelines),
        "notes": sum(len(p["notes"]) for p in pipelines),  # reported, not failing (checks.SAMPLED)
        # disk-full needs a filesystem of the pipeline's own (a tmpfs: the right to mount).
        "unavailable": ["disk-full"] if "disk-full" in opts.kinds and not any(
            p["own_filesystem"] for p in pipelines) else [],
        "restarts": supervisor.restarts, "supervisor_errors": supervisor.errors,
        "hit_trainer": sum(f["hit_trainer"] for p in pipelines for f in p["faults"]),
        "elapsed_s": round(time.monotonic() - started, 1),
        "options": {"pause_s": list(opts.pause_s), "mlflow_away_s": opts.mlflow_away_s,
                    "disk_full_s": opts.disk_full_s, "window_s": list(opts.window_s), "kinds": list(opts.kinds),
                    "script": [f"{kind}@{at:g}" + (f":{lasting:g}" if lasting else "")
                               for kind, at, lasting in opts.script]},
        "details": pipelines,
    }
    if not opts.dir and not opts.keep:
        shutil.rmtree(base, ignore_errors=True)
    return result


def run_until_stopped(more, run_one, pipelines: list) -> str | None:
    """Run pipelines while `more()`, appending each one's checks. A Ctrl-C or a
    SIGTERM (main) ends the loop and says why: the pipelines checked so far are
    kept (a soak stopped by hand, say on a hang, still records what it found),
    the one under way is not counted."""
    try:
        while more():
            pipelines.append(run_one())
    except KeyboardInterrupt as stop:
        why = f"stopped by {stop or 'Ctrl-C'} during pipeline {len(pipelines)}"
        _say(f"{why}: the {len(pipelines)} pipeline(s) checked before are recorded")
        return why
    return None


def passed(result: dict[str, Any]) -> bool:
    return (result["lost"] == 0 and result["duplicates"] == 0 and result["problems"] == 0
            and result["pipelines_completed"] == result["pipelines"] and not result.get("interrupted"))


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in faults.KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kind(s) {', '.join(unknown)}; known: "
                                         f"{', '.join(faults.KINDS)}")
    return kinds


def _script(text: str) -> list[tuple[str, float, float | None]]:
    """`kill:server@5,pause:train-run@20:150`: these faults, in this order,
    each so many seconds after the first pipeline's first trainer started
    (default 5), lasting so many seconds where a fault lasts (default: as drawn)."""
    steps = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, _, when = part.partition("@")
        at, _, lasting = when.partition(":")
        steps.append((_kinds(kind)[0], float(at or 5), float(lasting) if lasting else None))
    return steps


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the faults' generator: the same seed, the same schedule")
    p.add_argument("--faults", type=int, default=5, help="faults to draw in all (besides --script's)")
    p.add_argument("--pipelines", type=int, default=1, help="at least this many pipelines")
    p.add_argument("--per-pipeline", type=int, default=3, help="at most this many faults per pipeline")
    p.add_argument("--window-s", type=_pair, default=(10.0, 240.0),
                   help="a pipeline's faults come at moments drawn from LOW,HIGH seconds after its start "
                        "(a smoke pipeline takes ~3-4 minutes on two cores)")
    p.add_argument("--pause-s", type=_pair, default=(30.0, 120.0), help="how long a SIGSTOP lasts: LOW,HIGH")
    p.add_argument("--mlflow-away-s", type=float, default=180.0, help="how long mlflow-away keeps MLflow down")
    p.add_argument("--disk-full-s", type=float, default=30.0, help="how long disk-full keeps the disk full")
    p.add_argument("--restart-delay-s", type=float, default=5.0, help="the supervisor's delay before a restart")
    p.add_argument("--kinds", type=_kinds, default=list(faults.KINDS), help="comma-separated fault kinds")
    p.add_argument("--script", type=_script, default=[],
                   help="the first pipeline's faults: KIND@SECONDS,... after its first trainer started (the "
                        "questions a soak must answer, each at the moment that tests it); drawn ones follow")
    p.add_argument("--small-fs-mb", type=int, default=768, help="size of each pipeline's own filesystem")
    p.add_argument("--max-reschedules", type=int, default=10, help="the stack's reschedule budget per run")
    p.add_argument("--zombie-after-s", type=int, default=DEFAULT_ZOMBIE_AFTER_S,
                   help="the stack's zombie window (`gpt2 stack up --zombie-after`): a pause:train-run longer "
                        "than it is a machine gone")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="a pipeline not final after this is hung")
    p.add_argument("--dir", help="work here and keep it (default: a temporary directory, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line last")
    p.add_argument("--record", action="store_true", help=f"append the result to {RESULTS.name}")
    p.add_argument("--figure", type=Path, help="draw the result as a PNG here")
    return p.parse_args(argv)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM stops the soak as Ctrl-C does: its stack goes down
    result = soak(opts)
    if opts.record:
        with open(RESULTS, "a") as out:
            out.write(json.dumps({k: v for k, v in result.items() if k != "details"}) + "\n")
    if opts.figure:
        from bench.soak.figure import draw

        draw(result, opts.figure)
    print(f"{result['interrupted'] + ': ' if result['interrupted'] else ''}"
          f"{result['faults_total']} fault(s) {result['faults']}; {result['pipelines_completed']}/"
          f"{result['pipelines']} pipeline(s) completed ({result['reruns']} rerun); lost {result['lost']}, "
          f"duplicated {result['duplicates']}, other problems {result['problems']}; "
          f"supervisor restarts {result['restarts']}; {result['elapsed_s']:.0f} s")
    if opts.json:
        print(json.dumps(result))
    return 0 if passed(result) else 1

