"""A fine-tune started as a user starts any run on the stack (`prefect deployment run
gpt2/full-pipeline` with `train.init_from` among the overrides): every stage on its pool, the
weights copied once into the root, the training run started from them (its model the weights'
own 50257 rows). On the pytest worker's shared stack (tests/flows/conftest.py)."""

from __future__ import annotations

import json

import pytest

from tests.flows.pipeline_stack import assert_completed, child, deployment_run, overrides, wait_final
from tests.flows.test_finetune_pipeline import _hf_dir
from tests.tiers import STACK_A

# One pytest worker's stack for this module and the other modules of STACK_A (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_A)]


def test_a_fine_tune_deployment_run_completes_on_the_pools_from_its_weights(stack, tmp_path):
    from transformers import GPT2LMHeadModel

    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import storage

    source = _hf_dir(tmp_path / "openai-like")
    params = overrides(stack, **{"train.init_from": str(source), "train.max_steps": 4})
    parent = wait_final(stack, deployment_run(stack, params))
    assert_completed(stack, parent, "the fine-tune pipeline")
    for dep in ("gpt2-data/data", "gpt2-train/train", "gpt2-eval/evaluate", "gpt2-export/export"):
        assert_completed(stack, child(stack, str(parent.id), dep), dep)
    records = list((storage.local_path(storage.normalize_url(stack["root"])) / "weights").glob("*/weights.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["source"] == str(source), records
    export = child(stack, str(parent.id), "gpt2-export/export")
    config = resolve_config("smoke", params)
    hf_dir = storage.read_json(results_url(config, str(export.id)))["hf_dir"]
    assert GPT2LMHeadModel.from_pretrained(storage.local_path(hf_dir)).config.vocab_size == 50257
