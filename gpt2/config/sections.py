"""The base of every section of the config tree (gpt2.config.tree), and the
small sections: model, eval, export, tracking. The data, train and runtime
sections have modules of their own in this package."""

from __future__ import annotations

import difflib
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    # Frozen so a config can be hashed and passed between stages safely;
    # extra="forbid" so a typo in an override is an error, not a silent no-op.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ModelConfig(Section):
    n_layer: int = Field(12, ge=1)
    """Number of transformer blocks."""
    n_head: int = Field(12, ge=1)
    """Attention heads per block."""
    n_embd: int = Field(768, ge=1)
    """Width of the residual stream (channels)."""
    block_size: int = Field(1024, ge=8)
    """Context length T in tokens."""
    vocab_size: int = Field(50304, ge=50257)
    """Embedding rows: GPT-2's 50257 padded up to a multiple of 128 for speed."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


CORE_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
"""nanochat's CORE eval bundle: DCLM's 22 tasks."""
TASK_FORMS = ("hellaswag", "core", "core:<label>", "lm-eval:<task>")


def task_problem(task: str) -> str | None:
    """What is wrong with one name of eval.tasks (None: nothing). A `core:` label or an
    `lm-eval:` task is checked against the bundle or lm-eval's index when the stage runs."""
    kind, sep, name = task.partition(":")
    if task in ("hellaswag", "core") or (sep and kind in ("core", "lm-eval") and name.strip()):
        return None
    if sep:
        close = [f"{k}:{name}" for k in difflib.get_close_matches(kind, ["core", "lm-eval"], n=1, cutoff=0.5)]
    else:
        close = difflib.get_close_matches(task, ["hellaswag", "core"], n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown task {task!r}{hint}: give {', '.join(TASK_FORMS)}"


class EvalConfig(Section):
    hellaswag_source: str = "hf://datasets/Rowan/hellaswag"
    """HellaSwag validation data: the hub dataset, an fsspec URL of a JSONL in the
    original format, or `builtin:format-sample` (a tiny file, not the benchmark)."""
    limit: int | None = Field(None, ge=1)
    """Score only the first N items (None: all 10,042)."""
    every_steps: int = Field(0, ge=0)
    """Run the native HellaSwag scorer during training every N steps (0: never)."""
    core_every: int = Field(0, ge=0)
    """Score CORE during training every N steps and at the last step (0: never), eval.max_per_task items of
    each task (nanochat's in-loop look uses 500), from eval.core_bundle as fetched into the root before training."""
    batch_size: int = Field(8, ge=1)
    """Items per forward pass in the native scorers (HellaSwag's, CORE's)."""
    tasks: tuple[str, ...] = ("hellaswag",)
    """What the evaluate stage scores: `hellaswag`; `core` (DCLM's 22-task CORE score, from
    eval.core_bundle); `core:<label>` (one of its tasks); `lm-eval:<task>` (any lm-eval task, scored by
    lm-eval on our model). On the command line `eval.tasks=hellaswag,core` or `eval.tasks=[hellaswag,core]`."""
    core_bundle: str = CORE_BUNDLE_URL
    """The CORE eval bundle (core.yaml, eval_meta_data.csv, eval_data/): a directory or a zip, local or
    any fsspec URL; fetched once into the root. Default: nanochat's eval_bundle.zip (~162 MB)."""
    max_per_task: int | None = Field(None, ge=1)
    """Score at most N items of each CORE task, after a fixed shuffle (None: all; nanochat's quick look
    uses 500)."""
    lm_eval_include: str | None = None
    """A local folder of lm-eval task YAMLs, searched (before lm-eval's own tasks) for `lm-eval:<task>`."""

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks_from_text(cls, v: object) -> object:
        # `--set eval.tasks=hellaswag,core` and `--set 'eval.tasks=[hellaswag,core]'` arrive as text
        # (unquoted names are not JSON): split them as a list.
        if isinstance(v, str):
            return tuple(t.strip().strip("'\"") for t in v.strip().strip("[]").split(",") if t.strip())
        return v

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        problems = [task_problem(t) for t in v]
        problems = [p for p in problems if p]
        if not v:
            problems.append("name at least one task (e.g. hellaswag)")
        if len(set(v)) != len(v):
            problems.append(f"a task is named twice: {', '.join(sorted({t for t in v if v.count(t) > 1}))}")
        if problems:
            raise ValueError("; ".join(problems))
        return v


class ExportConfig(Section):
    registered_model: str = "gpt2-124m"
    """Name of the MLflow registered model for the Hugging Face export."""
    alias: str = Field("current", pattern=r"^[A-Za-z0-9_-]+$")
    """Alias pointed at the newly registered version (MLflow reserves `latest`
    and `v<N>`)."""

    @field_validator("alias")
    @classmethod
    def _alias_not_reserved(cls, v: str) -> str:
        if v.lower() == "latest" or re.fullmatch(r"[vV]\d+", v):
            raise ValueError(f"alias {v!r} is reserved by MLflow (latest, v<N>); pick another, e.g. current")
        return v


class TrackingConfig(Section):
    uri: str | None = None
    """MLflow tracking URI; None uses $MLFLOW_TRACKING_URI when set (the stack's
    workers get it), else a local SQLite store under the artifact root."""
    enabled: bool = True
    """Log to MLflow at all (off only for benchmarks and dry runs)."""
    experiment: str = "gpt2"
    """MLflow experiment name."""
