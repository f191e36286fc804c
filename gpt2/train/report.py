"""Human-readable outputs of a training run: text samples and the loss curve,
and logging them to the run's MLflow run."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from gpt2.model import GPT
from gpt2.sample import text_samples

log = logging.getLogger(__name__)
def loss_curve_png(path: Path, train: list[list[float]], val: list[list[float]], title: str,
                   spikes: list[dict] = ()) -> Path:
    """Plot train loss per step and val loss at its steps into a PNG, with the
    run's loss spikes (gpt2.train.spikes events): skipped updates as crosses
    at their loss, rollbacks as dotted lines at the step that spiked."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss", linewidth=1)
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="val loss")
    skipped = [(e["step"], float(e["loss"])) for e in spikes if e.get("action") == "skipped"]
    if skipped:
        ax.plot(*zip(*skipped), "x", color="red", label="skipped update (spike)")
    for i, step in enumerate(e["step"] for e in spikes if e.get("action") == "rollback"):
        ax.axvline(step, color="gray", linestyle=":", label="rollback (spike)" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def log_samples(tracker, model: GPT, device: torch.device, seed: int, step: int) -> None:
    """Samples of the model at `step`: in the log and as an MLflow artifact (rank 0)."""
    texts = text_samples(model, device, seed=seed)
    body = "\n\n".join(f"--- sample {i} ---\n{t}" for i, t in enumerate(texts))
    log.info("samples at step %d:\n%s", step, body)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"step_{step:06d}.txt"
        path.write_text(body + "\n")
        tracker.log_artifact(path, "samples")


def log_loss_curve(tracker, history: dict[str, list], run_name: str, spikes: list[dict] = ()) -> None:
    """The run's loss curve (train and validation) as an MLflow artifact (rank 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        png = loss_curve_png(Path(tmp) / "loss_curve.png", history["train"], history["val"], run_name, spikes)
        tracker.log_artifact(png)
