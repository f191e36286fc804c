"""The `train` section of the config tree (gpt2.config): how the training
stage trains, each field documented as `gpt2 config` and `--help` show it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from gpt2.config.sections import Section

SPIKE_ZSCORE = 15.0
"""train.spike_zscore's default: above every step of the clean run measured (`python -m
bench.spike_detector`: the largest z 12.35, a gradient norm; 8 of 272 steps above 6), far
below a poisoned batch's (120-290); docs/training.md, "Loss spikes"."""


SCRATCH = "scratch"
"""train.init_from's default: random weights, seeded by train.seed."""


class TrainConfig(Section):
    init_from: str = SCRATCH
    """Where the weights start: `scratch` (random, seeded by train.seed), or a source of
    weights to fine-tune: a Hugging Face GPT-2 directory (`hf://openai-community/gpt2`,
    our export's `.../export/step_N/hf`), an llm.c model `.bin` (llm.c's gpt2_124M.bin,
    our export's), or a checkpoint of one of our runs (`.../runs/<run>/checkpoints/step_N`),
    as a local path or any fsspec URL. The weights are fetched once into the root
    (`weights/`, their sha256 recorded) and a resumed run never reads the source again;
    their content, not where they were read, is part of the run's identity. The model's
    shape comes from the weights: a model.* that disagrees is refused (gpt2.weights.init)."""
    init_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """The sha256 of the weights train.init_from names, as fetched into the root: filled in
    when they are first fetched (the run's identity counts it); set it to insist on exactly
    those weights (other content is refused). Unused with init_from=scratch."""
    seed: int = 1337
    """Seed for the weight init and the text samples (batches follow the shards'
    fixed order, as in llm.c, so a resumed run sees exactly the same data)."""
    total_batch_tokens: int = Field(524_288, ge=1)
    """Tokens per optimizer step across all devices (gradient accumulation fills it)."""
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Sequences per device per forward pass, or `auto` to find the largest that fits."""
    max_steps: Annotated[int, Field(ge=1)] | Literal["epoch"] = 19_073
    """Optimizer steps (19,073 × 524,288 ≈ 10B tokens), or `epoch`: one pass over the
    prepared train split (its tokens // total_batch_tokens), read from the split's
    manifest once the data stage has run."""
    lr: float = Field(6e-4, gt=0)
    """Peak learning rate."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""
    warmup_steps: int = Field(700, ge=0)
    """Linear warmup steps."""
    decay: Literal["cosine", "linear"] = "cosine"
    """Shape of the decay after warmup."""
    weight_decay: float = Field(0.1, ge=0)
    """Weight decay (AdamW's, and Muon's for its matrices), applied to 2-D weights only."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """`adamw`: llm.c's recipe. `muon`: torch.optim.Muon (torch >= 2.9) for the blocks'
    weight matrices, AdamW for the embeddings, LayerNorms and biases (gpt2.train.muon)."""
    muon_lr: float | None = Field(None, gt=0)
    """Muon's peak learning rate, scaled to AdamW's update RMS (None: train.lr); it follows
    the same warmup and decay. Used with train.optimizer=muon only."""
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    """Muon's momentum (Nesterov). Used with train.optimizer=muon only."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this (0 disables)."""
    eval_every: int = Field(250, ge=1)
    """Measure validation loss every N steps (and at the end)."""
    val_steps: int = Field(20, ge=1)
    """Validation size in global batches: each evaluation reads the first
    val_steps × total_batch_tokens tokens of the val split (as llm.c does), so the
    number is the same for any device count or micro-batch."""
    sample_every: int = Field(1000, ge=1)
    """Write text samples every N steps."""
    checkpoint_every: int = Field(500, ge=1)
    """Write a checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """How many of the latest checkpoints to keep."""
    spike_zscore: float = Field(SPIKE_ZSCORE, ge=0)
    """A step whose loss or gradient norm lies more than this many robust standard
    deviations (median and MAD) above the last train.spike_window steps' is a loss
    spike, and so is one whose loss or norm is not finite (gpt2.train.spikes);
    0 turns detection off."""
    on_spike: Literal["warn", "skip", "rollback"] = "warn"
    """What a spike does: `warn` logs it (MLflow, the attempt record) and trains on,
    exactly as without detection; `skip` drops that step's update (the optimizer is
    not stepped; the data moves on); `rollback` goes back to the newest checkpoint
    before the spike, steps the data past every batch trained since, and continues
    (gpt2.train.rollback)."""
    max_rollbacks: int = Field(3, ge=0)
    """With on_spike=rollback: the run fails at the spike after this many rollbacks,
    naming each rollback's steps and data positions, instead of paying for a run
    that keeps diverging."""
    spike_window: int = Field(128, ge=8)
    """Steps of history the spike z-score is measured against (llm.c's 128); nothing
    is judged before the run has trained this many."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """The arithmetic of the forward and backward passes (the weights and AdamW's state
    stay fp32): `auto` picks bf16 on a GPU with native bf16 (compute capability 8.0 and
    up: A100, H100, L4, A10G, RTX 3090/4090), fp16 with a loss scaler on one without it
    (T4, V100, P100: torch.amp.GradScaler; the steps it skips for an inf or nan gradient
    are counted), fp32 on a CPU (exact). `bf16` on a GPU without native bf16 is refused.
    A runtime setting, like the device: it changes how the same training is computed
    (the last bits of each sum), not what is trained, so it never enters a fingerprint
    and a run started on an A100 in bf16 resumes on a T4 in fp16 (gpt2.train.precision;
    docs: "GPUs you may have")."""
    preflight: bool = True
    """Run `gpt2 preflight` on the training machine before the training flow
    trains (a failed check fails the flow in minutes, not retried or rescheduled);
    a runtime setting: it never changes the run's address."""

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas must lie in [0, 1), got {v}")
        return v
