"""The runs beside this one under the root: what a run that starts at step 0 says about them.

A run of the same model and data that differs in a training setting is warned about (its name,
its step, the settings that differ), so nobody restarts a long run by changing a setting
unknowingly. One that differs in train.init_from alone is refused unless --fresh: the identity
makes it another run (gpt2.config.identity), but whoever set init_from beside a run with
checkpoints most likely meant to change that run.
"""

from __future__ import annotations

import logging

from gpt2.checkpoint import store
from gpt2.config.identity import INIT_KEYS, model_data_fingerprint, train_fingerprint
from gpt2.config.tree import Config
from gpt2.root import layout, storage

log = logging.getLogger(__name__)


def sibling_runs(config: Config, fresh: bool = False) -> str | None:
    """Warn of runs of the same model and data; the refusal (one line) when one differs from
    `config` in train.init_from alone, unless `fresh`."""
    mine = model_data_fingerprint(config)
    for name in storage.list_dir(layout.runs_dir(config)):
        if name == layout.run_name(config):
            continue
        latest = store.latest_checkpoint(layout.run_dir_under(layout.root(config), name))
        state = storage.read_record(storage.join(latest, "state.json")) if latest else None
        try:
            other = Config.model_validate(state["config"])
        except (TypeError, KeyError, ValueError):
            continue
        if not fresh and _init_alone_differs(config, other):
            return (f"train.init_from={config.train.init_from} makes another run ({layout.run_name(config)}): run "
                    f"{name} has the same settings and checkpoints up to step {state.get('step')}, started from "
                    f"train.init_from={other.train.init_from}; to continue it, set train.init_from="
                    f"{other.train.init_from}; to start the other at step 0, rerun with --fresh (gpt2 train --fresh)")
        if model_data_fingerprint(other) == mine:
            theirs = other.train.model_dump()
            changed = [f"train.{k}" for k, v in sorted(config.train.model_dump().items()) if theirs[k] != v]
            changed += ["data.shuffle"] if other.data.shuffle != config.data.shuffle else []  # the read order
            log.warning("starting %s at step 0; run %s has the same model and data (step %s) and differs in "
                        "%s: to continue that run, use its settings", layout.run_name(config), name,
                        state.get("step"), ", ".join(changed) or "(nothing: copied by hand?)")
    return None


def _init_alone_differs(config: Config, other: Config) -> bool:
    init = {k: getattr(config.train, k) for k in INIT_KEYS}
    if {k: getattr(other.train, k) for k in INIT_KEYS} == init:
        return False
    # The vocabulary follows the weights (gpt2.weights.init): 50257 from OpenAI's, 50304 from scratch.
    model = other.model.model_copy(update={"vocab_size": config.model.vocab_size})
    same_otherwise = other.model_copy(update={"train": other.train.model_copy(update=init), "model": model})
    return train_fingerprint(same_otherwise) == train_fingerprint(config)
