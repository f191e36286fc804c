"""Named presets: plain functions returning a full `Config`.

`smoke` runs the whole pipeline on a CPU, offline, in minutes (tests and CI use
it); `gpt2-124m` trains GPT-2 (124M) with llm.c's hyperparameters (batch, schedule,
AdamW settings) on FineWeb-edu sample-10BT, the data of Karpathy's build-nanogpt
(llm.c's own 124M run used FineWeb 10B, not the edu subset, so its HellaSwag
curve is a reference, not a target to match step for step).
"""

from __future__ import annotations

from typing import Callable

from gpt2.config import Config, DataConfig, EvalConfig, ExportConfig, ModelConfig, TrainConfig


def gpt2_124m() -> Config:
    # llm.c's hyperparameters, spelled out for the reader; the data is FineWeb-edu (see above).
    return Config(
        preset="gpt2-124m",
        model=ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
        data=DataConfig(
            name="fineweb_edu_10B",
            source="hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/*.parquet",
            shard_size=100_000_000,
            val_tokens=100_000_000,
        ),
        train=TrainConfig(
            total_batch_tokens=524_288,
            micro_batch_size="auto",
            max_steps=19_073,
            lr=6e-4,
            min_lr_ratio=0.0,
            warmup_steps=700,
            weight_decay=0.1,
            betas=(0.9, 0.95),
            grad_clip=1.0,
        ),
        eval=EvalConfig(hellaswag_source="hf://datasets/Rowan/hellaswag", every_steps=250),
        export=ExportConfig(registered_model="gpt2-124m"),
    )


def smoke() -> Config:
    # Tiny everything: the ~110k-token Python docs sample, a 2-layer model,
    # enough steps for several checkpoints, all on one CPU core in minutes.
    return Config(
        preset="smoke",
        model=ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=50304),
        data=DataConfig(
            name="python_docs",
            source="builtin:python-docs",
            shard_size=32_768,
            val_tokens=8_192,
        ),
        # 1,024 tokens a step in two micro-batches (accumulation is exercised);
        # the 50,304-way output layer dominates the cost, so steps stay few.
        train=TrainConfig(
            total_batch_tokens=1_024,
            micro_batch_size=8,
            max_steps=30,
            lr=2e-3,
            min_lr_ratio=0.1,
            warmup_steps=5,
            eval_every=10,
            val_steps=4,
            sample_every=15,
            checkpoint_every=10,
            keep_checkpoints=3,
        ),
        eval=EvalConfig(hellaswag_source="builtin:format-sample", every_steps=30, batch_size=4),
        export=ExportConfig(registered_model="gpt2-smoke"),
    )


PRESETS: dict[str, Callable[[], Config]] = {"gpt2-124m": gpt2_124m, "smoke": smoke}
