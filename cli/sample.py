"""`gpt2 sample`: text from a model, reproducible for a seed.

    gpt2 sample --preset smoke                                 # the preset's run, newest checkpoint
    gpt2 sample --run python_docs-927b5c8bb272 --root gs://bucket/gpt2 --num 3
    gpt2 sample --from runs/<run>/export/step_000020/hf --prompt "The meaning of life" --top-k 1
    gpt2 sample --from gpt2_124M.bin --max-new-tokens 100 --temperature 0.8 --json

--from takes a Hugging Face GPT-2 directory, an llm.c model .bin or a checkpoint of a run, as
a local path or any fsspec URL (gpt2.weights.source); the shape comes from the weights.
"""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, fail, load_config, setup_logging


def _source(source: Optional[str], run: Optional[str], preset: str, sets, root) -> str:
    """--from as given; else the newest complete checkpoint of --run, or of the preset's run."""
    if source:
        return source
    from gpt2.checkpoint.catalog import latest_checkpoint
    from gpt2.data.epoch import with_resolved_steps
    from gpt2.root import layout
    from gpt2.weights.init import with_resolved_init

    config = load_config(preset, sets, root)
    run_dir = layout.run_dir_under(layout.root(config), run) if run else \
        layout.run_dir(with_resolved_init(with_resolved_steps(config), fetching=False))
    found = latest_checkpoint(run_dir)
    if found is None:
        fail(f"no complete checkpoint under {run_dir}: train first (gpt2 train with the same preset, --set and "
             "--root), name a run with --run, or give weights with --from")
    return found


def sample(
    source: Optional[str] = typer.Option(
        None, "--from", help="Weights, any train.init_from source: a Hugging Face GPT-2 directory, an llm.c model "
        ".bin or a run's checkpoint (a path or any fsspec URL). Default: the newest checkpoint of --run, or of the "
        "preset's run."),
    run: Optional[str] = typer.Option(None, "--run", help="A run's name under the root's runs/ (its newest checkpoint)."),
    prompt: str = typer.Option("Hello, I'm a language model,", "--prompt", help="The text to continue ('' starts "
                               "a new document)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Tokens to add to the prompt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Softmax temperature (lower: surer)."),
    top_k: int = typer.Option(50, "--top-k", min=1, help="Draw among the k likeliest tokens; 1 is greedy."),
    num: int = typer.Option(1, "--num", min=1, help="How many samples."),
    seed: int = typer.Option(1337, "--seed", help="The same seed, the same text."),
    device: str = typer.Option("auto", "--device", help="auto (a GPU when there is one), cpu, cuda, cuda:N, mps."),
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Continue a prompt with a trained model: a run's checkpoint, an export, or OpenAI's weights."""
    setup_logging()
    from gpt2.errors import UserError
    from gpt2.process.distributed import pick_device
    from gpt2.sample import text_samples
    from gpt2.weights.source import model_from

    try:
        where = _source(source, run, preset, sets, root)  # a fine-tune's weights never fetched: one line
        model = model_from(where)
        target = pick_device(device)
        texts = text_samples(model.to(target), target, seed=seed, num=num, max_new_tokens=max_new_tokens,
                             prompt=prompt, temperature=temperature, top_k=top_k)
    except UserError as err:  # weights that are not GPT-2's, a device this machine lacks: one line
        fail(str(err))
    emit({"samples": texts, "source": where}, as_json,
         "\n\n".join(f"--- sample {i} ---\n{text}" for i, text in enumerate(texts)))
