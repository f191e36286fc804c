"""Named presets: plain functions returning a full `Config`.

`smoke` runs the whole pipeline on a CPU, offline, in minutes (tests and CI use
it); `gpt2-124m` trains GPT-2 (124M) with llm.c's hyperparameters (batch, schedule,
AdamW settings) for one epoch of FineWeb-edu sample-10BT (`train.max_steps=epoch`:
the steps follow from the prepared train split, ~19,073 of 524,288 tokens for its
~10B tokens, so the last steps never re-read the first shard; gpt2.data.epoch), the
data of Karpathy's build-nanogpt
(llm.c's own 124M run used FineWeb 10B, not the edu subset, so its HellaSwag
curve is a reference, not a target to match step for step); `gpt2-124m-owt` is
the same recipe on OpenWebText with nanoGPT's split, to compare with nanoGPT;
`gpt2-124m-finetune` starts from OpenAI's GPT-2 (124M) weights (`train.init_from`) and
fine-tunes them on a text source, nanoGPT's Shakespeare fine-tune by default.
"""

from __future__ import annotations

from typing import Callable

from gpt2.config.data import DataConfig
from gpt2.config.sections import EvalConfig, ExportConfig, ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.config.tree import Config


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
            max_steps="epoch",
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


OPENWEBTEXT = "hf://datasets/Skylion007/openwebtext/data/train-*.parquet"


def gpt2_124m_owt() -> Config:
    """GPT-2 (124M) with llm.c's recipe on OpenWebText, the data nanoGPT reproduces
    GPT-2 on, so the run's val loss is measured on nanoGPT's val documents and
    compares with nanoGPT's figures (the report draws those, gpt2.report.reference_lines).

    Source: Skylion007/openwebtext on the Hugging Face hub, the dataset nanoGPT's
    data/openwebtext/prepare.py loads as `openwebtext` (8,013,769 documents, one
    `text` column). `datasets` no longer runs its loading script; the hub serves it
    as parquet files (data/train-*.parquet), which fsspec's hf:// reads as any
    other source. The split is nanoGPT's (data.val_split=nanogpt: 0.05% of the
    documents, seed 2357); everything else is gpt2-124m's, so one epoch is ~9.04B
    tokens (~17,234 steps of 524,288). With nanoGPT's train.bin/val.bin at hand,
    `--set data.source_format=nanogpt-bin --set data.source=<their folder>` reads
    them as they are instead (gpt2.data.nanogpt_bin).
    """
    base = gpt2_124m()
    data = DataConfig(name="openwebtext", source=OPENWEBTEXT, shard_size=100_000_000, val_split="nanogpt")
    return Config(preset="gpt2-124m-owt", model=base.model, data=data, train=base.train, eval=base.eval,
                  export=ExportConfig(registered_model="gpt2-124m-owt"))


def _larger_gpt2(name: str, depth: int, width: int, heads: int, data: DataConfig, total_batch_tokens: int,
                 max_steps: int, lr: float, min_lr_ratio: float, checkpoint_every: int) -> Config:
    """A larger GPT-2 with the settings of llm.c's scripts/run_gpt2_<size>.sh:
    depth/width/heads (its `-e dNN` models), batch (-d), steps (-x), peak and
    final learning rate (-l, -q), warmup 700 (-u), weight decay 0.1 (-c),
    checkpoints (-n), validation and HellaSwag every 250 steps (-v, -h).
    llm.c fits them with ZeRO-1 (-z 1); here `micro_batch_size=auto` finds
    what fits and gradient accumulation fills the global batch."""
    return Config(
        preset=name,
        model=ModelConfig(n_layer=depth, n_head=heads, n_embd=width, block_size=1024, vocab_size=50304),
        data=data,
        train=TrainConfig(total_batch_tokens=total_batch_tokens, micro_batch_size="auto", max_steps=max_steps,
                          lr=lr, min_lr_ratio=min_lr_ratio, warmup_steps=700, weight_decay=0.1,
                          betas=(0.9, 0.95), grad_clip=1.0, checkpoint_every=checkpoint_every),
        eval=EvalConfig(hellaswag_source="hf://datasets/Rowan/hellaswag", every_steps=250),
        export=ExportConfig(registered_model=name),
    )


# llm.c trains 350M and 774M on FineWeb's 100B sample and 1558M on FineWeb-edu's.
FINEWEB_100B = DataConfig(name="fineweb_100B", source="hf://datasets/HuggingFaceFW/fineweb/sample/100BT/*.parquet",
                          shard_size=100_000_000, val_tokens=100_000_000)
FINEWEB_EDU_100B = DataConfig(name="fineweb_edu_100B",
                              source="hf://datasets/HuggingFaceFW/fineweb-edu/sample/100BT/*.parquet",
                              shard_size=100_000_000, val_tokens=100_000_000)


def gpt2_350m() -> Config:
    # d24; 60,000 steps × 524,288 tokens ≈ 31.5B tokens
    return _larger_gpt2("gpt2-350m", 24, 1024, 16, FINEWEB_100B, 524_288, 60_000, 3e-4, 0.0, 2000)


def gpt2_774m() -> Config:
    # d36; 286,102 steps × 524,288 tokens ≈ 150B tokens (more than the 100B sample holds: epochs repeat)
    return _larger_gpt2("gpt2-774m", 36, 1280, 20, FINEWEB_100B, 524_288, 286_102, 2.5e-4, 0.0, 4000)


def gpt2_1558m() -> Config:
    # d48; 32,000 steps × 1,048,576 tokens ≈ 33.5B tokens
    return _larger_gpt2("gpt2-1558m", 48, 1600, 25, FINEWEB_EDU_100B, 1_048_576, 32_000, 6e-4, 0.1, 2000)


OPENAI_GPT2 = "hf://openai-community/gpt2"
"""OpenAI's GPT-2 (124M) on the Hugging Face hub, as transformers' `from_pretrained("gpt2")` reads it."""
TINY_SHAKESPEARE = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
"""The ~1.1M characters (~338k GPT-2 tokens) nanoGPT's data/shakespeare/prepare.py downloads."""


def gpt2_124m_finetune() -> Config:
    """OpenAI's GPT-2 (124M) fine-tuned on your text, nanoGPT's config/finetune_shakespeare.py
    brought to the 124M model: 32 sequences of 1024 tokens a step, 20 steps, a constant
    learning rate of 3e-5 (here after 2 warmup steps), validation every 5 steps. The data is
    Tiny Shakespeare (one file, one document; data.max_document_chars lets it in whole) unless
    data.source names your own (a file, a folder, a URL). The validation split is its first
    32,768 tokens (nanoGPT's is the last 10% of the characters)."""
    base = gpt2_124m()
    return Config(
        preset="gpt2-124m-finetune",
        model=base.model,  # the weights' shape; their 50257 rows are used as they are (gpt2.weights.init)
        data=DataConfig(name="shakespeare", source=TINY_SHAKESPEARE, shard_size=1_000_000, val_tokens=32_768,
                        max_document_chars=2_000_000),
        train=TrainConfig(init_from=OPENAI_GPT2, total_batch_tokens=32_768, micro_batch_size="auto", max_steps=20,
                          lr=3e-5, min_lr_ratio=1.0, warmup_steps=2, weight_decay=0.1, betas=(0.9, 0.95),
                          grad_clip=1.0, eval_every=5, val_steps=1, sample_every=10, checkpoint_every=10,
                          keep_checkpoints=2),
        eval=EvalConfig(hellaswag_source="hf://datasets/Rowan/hellaswag", every_steps=20),
        export=ExportConfig(registered_model="gpt2-124m-finetune"),
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
        # 512 tokens a step in two micro-batches of 4x64 (accumulation is
        # exercised); the 50,304-way output layer dominates the cost (a step of
        # 1,024 tokens took 1.8x the CPU), so steps stay small and few.
        train=TrainConfig(
            total_batch_tokens=512,
            micro_batch_size=4,
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


PRESETS: dict[str, Callable[[], Config]] = {
    "gpt2-124m": gpt2_124m, "gpt2-124m-owt": gpt2_124m_owt, "gpt2-124m-finetune": gpt2_124m_finetune,
    "gpt2-350m": gpt2_350m, "gpt2-774m": gpt2_774m, "gpt2-1558m": gpt2_1558m, "smoke": smoke,
}
