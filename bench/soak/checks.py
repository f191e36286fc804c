"""What "nothing lost" means, checked after every pipeline of the soak
(bench/soak/run.py), each check able to fail on its own:

- weights: the final checkpoint's tensors are bit-identical to an
  uninterrupted run of the same config (`digest`);
- MLflow: exactly one pipeline run for the parent flow run and one run per
  stage under it; in the training run every metric step logged once, and the
  per-step metrics at every step from 1 to the last (no gaps);
- the bill: one attempt record per trainer process that ran;
- nothing left running for the pipeline, no lease held, no temporary file
  left under the root.

Each finding is a (what, detail) pair; `lost` and `duplicates` count the
data findings, `problems` the rest.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpt2.root import storage

PER_STEP_METRICS = ("train/loss", "train/lr", "train/grad_norm")
"""Logged at every training step: a missing step is a gap."""

TEMP_NAME = re.compile(r"(^\..*\.tmp-[0-9a-f]{8}$)|(\.tmp$)|(^\.tmp-)")
"""Names of the atomic writers' temporary files (gpt2.root.storage and its peers)."""


SAMPLED = "system/"
"""MLflow's system-metrics monitor (CPU, memory, disk of the machine) numbers
its samples itself, by wall time, in a thread of its own: a frozen machine
that thaws after a newer attempt took its run over may add a sample under a
number the new machine's monitor used, before the trainer notices the lost
lease (the lease fences the trainer's own sends, not MLflow's monitor). Such
overlaps are reported as notes, not as duplicated training data."""


@dataclass
class Findings:
    lost: list[tuple[str, str]] = field(default_factory=list)
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Reported, not failing the soak (SAMPLED)."""

    def as_dict(self) -> dict:
        return {"lost": [list(x) for x in self.lost], "duplicates": [list(x) for x in self.duplicates],
                "problems": [list(x) for x in self.problems], "notes": [list(x) for x in self.notes]}


def digest(checkpoint_url: str) -> str:
    """sha256 over the checkpoint's model tensors (names, dtypes, shapes, bytes)."""
    import torch
    from safetensors.torch import load

    tensors = load(storage.read_bytes(storage.join(checkpoint_url, "model.safetensors")))
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_weights(findings: Findings, checkpoint_url: str | None, reference: str, max_steps: int) -> None:
    if checkpoint_url is None or not checkpoint_url.rstrip("/").endswith(f"step_{max_steps:06d}"):
        findings.lost.append(("weights", f"no final checkpoint (latest: {checkpoint_url})"))
    elif digest(checkpoint_url) != reference:
        findings.lost.append(("weights", f"{checkpoint_url} differs from the uninterrupted run"))


def metric_steps(client, run_id: str) -> dict[str, Counter]:
    """{metric key: Counter of the steps logged}."""
    run = client.get_run(run_id)
    return {key: Counter(m.step for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}


def check_metrics(findings: Findings, steps: dict[str, Counter], max_steps: int) -> None:
    for key, counts in sorted(steps.items()):
        twice = sorted(s for s, n in counts.items() if n > 1)
        if twice:
            (findings.notes if key.startswith(SAMPLED) else findings.duplicates).append(
                ("metric steps", f"{key}: {len(twice)} step(s) logged more than once, first {twice[:5]}"))
        if key in PER_STEP_METRICS:
            missing = sorted(set(range(1, max_steps + 1)) - set(counts))
            if missing:
                findings.lost.append(("metric steps", f"{key}: {len(missing)} step(s) missing, first {missing[:5]}"))
    for key in PER_STEP_METRICS:
        if key not in steps:
            findings.lost.append(("metric steps", f"{key} never logged"))


def check_mlflow(findings: Findings, client, experiment: str, parent_flow_runs: list[str],
                 stages: tuple[str, ...], max_steps: int) -> None:
    """`parent_flow_runs`: the pipeline's flow run, then its rerun if it had one
    (a rerun's cached stages answer with the first run's stage runs, under the
    first run's pipeline run): one pipeline run each, one run per stage in all."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        findings.lost.append(("mlflow runs", f"no experiment {experiment!r}"))
        return
    children = []
    for flow_run in parent_flow_runs:
        parents = client.search_runs([exp.experiment_id], filter_string=(
            f"tags.stage = 'pipeline' and tags.`prefect.flow_run_id` = '{flow_run}'"))
        if len(parents) != 1:
            (findings.duplicates if parents else findings.lost).append(
                ("mlflow runs", f"{len(parents)} pipeline runs for flow run {flow_run}"))
        for parent in parents[:1]:
            children += client.search_runs([exp.experiment_id], filter_string=(
                f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"))
    by_stage = Counter(r.data.tags.get("stage") for r in children)
    for stage in stages:
        if by_stage[stage] != 1:
            (findings.duplicates if by_stage[stage] else findings.lost).append(
                ("mlflow runs", f"{by_stage[stage]} {stage} runs under the pipeline runs of {parent_flow_runs}"))
    train = [r for r in children if r.data.tags.get("stage") == "train"]
    if train:
        check_metrics(findings, metric_steps(client, train[0].info.run_id), max_steps)


def check_bill(findings: Findings, run_dir: str, trainers_seen: int, max_steps: int) -> None:
    """The bill counts what trained: one attempt record for every generation
    of the run's lease (a trainer records its attempt once it holds the lease),
    none twice, and no more records than trainer processes ran. Two kinds of
    trainer train nothing and rightly have no record: one killed before it
    took the lease (waiting for a killed predecessor's lease to go stale), and
    one that took it after an attempt had reached `max_steps` (its flow run
    killed after training, rescheduled: the trainer resumes at the last step
    and withdraws its record, gpt2.train.attempts.Attempt.resumed)."""
    from gpt2.checkpoint.lease import Lease
    from gpt2.root.layout import lease_dir
    from gpt2.train.attempts import read_attempts

    records = read_attempts(run_dir) if storage.exists(storage.join(run_dir, "attempts")) else []
    generations = Lease(lease_dir(run_dir), ttl_s=120.0).generations() if storage.exists(lease_dir(run_dir)) else []
    billed = Counter(r.get("lease_generation") for r in records)
    finished_at = min((r["lease_generation"] for r in records  # the generation that reached the last step
                       if (r.get("step") or 0) >= max_steps and isinstance(r.get("lease_generation"), int)),
                      default=None)
    unbilled = [g for g in generations if not billed[g] and (finished_at is None or g < finished_at)]
    twice = sorted(g for g, n in billed.items() if n > 1)
    if unbilled:
        findings.problems.append(("bill", f"lease generation(s) {unbilled} trained with no attempt record"))
    if twice:
        findings.problems.append(("bill", f"lease generation(s) {twice} billed more than once"))
    if len(records) > trainers_seen:
        findings.problems.append(("bill", f"{len(records)} attempt record(s) for {trainers_seen} trainer "
                                          f"process(es) seen"))


def check_lease(findings: Findings, run_dir: str) -> None:
    from gpt2.checkpoint.lease import Lease
    from gpt2.root.layout import lease_dir

    held = Lease(lease_dir(run_dir), ttl_s=120.0).holder()
    if held is not None:
        findings.problems.append(("lease", f"still held: {held[0]}"))


def temp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if TEMP_NAME.search(p.name))


def check_temp_files(findings: Findings, root: Path) -> None:
    left = temp_files(root)
    if left:
        findings.problems.append(("temporary files", f"{len(left)} under the root: {left[:5]}"))


def check_left_running(findings: Findings, alive, wait_s: float = 60.0) -> None:
    """`alive()`: descriptions of the pipeline's processes still running."""
    deadline = time.monotonic() + wait_s
    left = alive()
    while left and time.monotonic() < deadline:
        time.sleep(2)
        left = alive()
    if left:
        findings.problems.append(("left running", "; ".join(left)[:500]))
