"""The base of every section of the config tree (gpt2.config.tree), and the
small sections: model, eval, export, tracking. The data, train and runtime
sections have modules of their own in this package."""

from __future__ import annotations

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


class EvalConfig(Section):
    hellaswag_source: str = "hf://datasets/Rowan/hellaswag"
    """HellaSwag validation data: the hub dataset, an fsspec URL of a JSONL in the
    original format, or `builtin:format-sample` (a tiny file, not the benchmark)."""
    limit: int | None = Field(None, ge=1)
    """Score only the first N items (None: all 10,042)."""
    every_steps: int = Field(0, ge=0)
    """Run the native HellaSwag scorer during training every N steps (0: never)."""
    batch_size: int = Field(8, ge=1)
    """Items per forward pass in the native scorer."""


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
