"""Parity, on the same weights and items: the native scorer picks lm-eval's
ending on every item, and `lm-eval --model hf` on the exported directory
gives the numbers lm-eval gives on the wrapped model."""

from __future__ import annotations

import pytest
import torch

from gpt2.config.presets import smoke
from gpt2.eval.harness.model import GPTLM
from gpt2.eval.hellaswag import Item, load_rows, score_items, summarize
from gpt2.eval.hellaswag.harness import run_hellaswag
from gpt2.eval.hellaswag.items import FORMAT_SAMPLE
from gpt2.export.hf import write_hf_dir
from gpt2.model import GPT

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("hellaswag_parity")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(1)
    model = GPT(smoke().model).eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(20)  # peaky distributions: endings far apart
    rows = load_rows(FORMAT_SAMPLE)
    work = tmp_path_factory.mktemp("work")
    native = score_items(model, [Item.from_row(r) for r in rows], "cpu", batch_size=4)
    wrapped = run_hellaswag(GPTLM(model), rows, work)
    hf_dir = write_hf_dir(model.state_dict(), model.config, work / "hf")
    hf = run_hellaswag("hf", rows, work, model_args={"pretrained": str(hf_dir), "device": "cpu", "dtype": "float32"})
    return native, wrapped, hf


def test_native_scorer_picks_lm_evals_ending_on_every_item(setup):
    native, wrapped, _ = setup
    assert wrapped["n"] == len(native) >= 20
    assert [(s.pred, s.pred_norm) for s in native] == [(p["pred"], p["pred_norm"]) for p in wrapped["picks"]]
    assert [float(s.pred == s.label) for s in native] == [p["acc"] for p in wrapped["picks"]]
    assert [float(s.pred_norm == s.label) for s in native] == [p["acc_norm"] for p in wrapped["picks"]]
    ours = summarize(native)
    assert (ours["acc"], ours["acc_norm"]) == (wrapped["acc"], wrapped["acc_norm"])
    for s, p in zip(native, wrapped["picks"]):
        assert [x.logprob for x in s.scores] == pytest.approx(p["loglikelihoods"], abs=2e-4)


def test_the_picks_are_not_trivial(setup):
    native, _, _ = setup
    # A scorer stuck on one index would agree with itself; these weights spread the picks.
    assert len({s.pred for s in native}) > 1 and len({s.pred_norm for s in native}) > 1


def test_lm_eval_hf_on_the_export_equals_lm_eval_on_the_wrapped_model(setup):
    native, wrapped, hf = setup
    assert hf["n"] == wrapped["n"]
    assert (hf["acc"], hf["acc_norm"]) == (wrapped["acc"], wrapped["acc_norm"])
    assert [(p["pred"], p["pred_norm"]) for p in hf["picks"]] == [(p["pred"], p["pred_norm"]) for p in wrapped["picks"]]
    for a, b in zip(hf["picks"], wrapped["picks"]):
        assert a["loglikelihoods"] == pytest.approx(b["loglikelihoods"], abs=2e-4)
