"""The native batched scorer: tokenization like lm-eval, one forward per batch
of items, results independent of batching, training state left alone."""

from __future__ import annotations

import pytest
import torch

from gpt2.config.presets import smoke
from gpt2.eval.harness.model import GPTLM
from gpt2.eval.hellaswag import evaluate_hellaswag, load_items, score_items
from gpt2.eval.hellaswag.items import FORMAT_SAMPLE
from gpt2.eval.hellaswag.scorer import item_requests
from gpt2.eval.logprobs import model_inputs, selected_logits
from gpt2.model import GPT
from gpt2.tokenizer import get_encoding

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("hellaswag_scorer")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(smoke().model)
    with torch.no_grad():
        m.transformer.wte.weight.mul_(20)  # peaky distributions: endings far apart
    return m


@pytest.fixture(scope="module")
def items():
    return load_items(FORMAT_SAMPLE)


def test_pairs_are_tokenized_exactly_as_lm_evals_template_lm(model, items):
    lm, enc = GPTLM(model), get_encoding("gpt2")
    for item in items:
        ours = item_requests(enc, item)
        theirs = [lm._encode_pair(item.query, " " + e) for e in item.endings]
        assert ours == theirs


def test_sample_exercises_left_truncation(model, items):
    enc, T = get_encoding("gpt2"), model.config.block_size
    lengths = [len(c) + len(k) for item in items for c, k in item_requests(enc, item)]
    assert max(lengths) > T + 1
    inp, n = model_inputs(list(range(100)), [7, 8, 9], T)
    assert len(inp) == T and inp[-1] == 8 and n == 3  # last T+1 tokens, minus the final target


def test_selected_logits_equal_the_models_forward(model):
    idx = torch.randint(0, 50257, (3, 40))
    rows, pos = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 39, 5, 17])
    with torch.no_grad():
        full = model(idx)[0][..., :50257]
        picked = selected_logits(model, idx, rows, pos)
    torch.testing.assert_close(picked, full[rows, pos], rtol=0, atol=1e-5)


def test_results_do_not_depend_on_batching(model, items):
    one = score_items(model, items, "cpu", batch_size=1)
    many = score_items(model, items, "cpu", batch_size=7)
    assert [(s.pred, s.pred_norm, s.pred_norm_per_token) for s in one] == [
        (s.pred, s.pred_norm, s.pred_norm_per_token) for s in many
    ]
    for a, b in zip(one, many):
        assert [x.n_tokens for x in a.scores] == [x.n_tokens for x in b.scores]
        assert [x.logprob for x in a.scores] == pytest.approx([x.logprob for x in b.scores], abs=1e-3)


def test_metrics_and_training_state(model, items):
    model.train()
    metrics = evaluate_hellaswag(model, items, "cpu", batch_size=8)
    assert model.training  # restored for the training loop
    assert set(metrics) == {"acc", "acc_norm", "acc_norm_per_token", "n", "items_per_s"}
    assert metrics["n"] == len(items)
    scored = score_items(model, items, "cpu")
    assert metrics["acc"] == sum(s.pred == s.label for s in scored) / len(items)
    with pytest.raises(ValueError, match="no HellaSwag items"):
        evaluate_hellaswag(model, [], "cpu")


class Plain(torch.nn.Module):
    """Our GPT behind a plain module: the scorer must use four unpacked rows."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt, self.config = gpt, gpt.config

    def forward(self, idx):
        return self.gpt(idx)


def test_packed_endings_score_as_separate_rows(items):
    torch.manual_seed(2)
    wide = GPT(smoke().model.model_copy(update={"block_size": 256})).eval()  # every item packs
    with torch.no_grad():
        wide.transformer.wte.weight.mul_(20)
    packed = score_items(wide, items, "cpu", batch_size=5)
    rows = score_items(Plain(wide), items, "cpu", batch_size=5)
    assert [(s.pred, s.pred_norm, s.pred_norm_per_token) for s in packed] == [
        (s.pred, s.pred_norm, s.pred_norm_per_token) for s in rows
    ]
    for a, b in zip(packed, rows):
        assert [x.n_tokens for x in a.scores] == [x.n_tokens for x in b.scores]
        assert [x.greedy for x in a.scores] == [x.greedy for x in b.scores]
        assert [x.logprob for x in a.scores] == pytest.approx([x.logprob for x in b.scores], abs=2e-4)


def test_items_prepared_once_score_as_raw_items_and_split_by_rank(model, items):
    from gpt2.eval.hellaswag.scorer import prepare

    prepared = prepare(items)
    assert prepare(prepared) is prepared  # already tokenized: nothing redone
    assert score_items(model, prepared, "cpu", batch_size=3) == score_items(model, items, "cpu", batch_size=3)
    ranks = [prepared.subset(range(r, len(items), 2)) for r in range(2)]
    assert sum(len(p) for p in ranks) == len(items)
    split = [s for p in ranks for s in score_items(model, p, "cpu", batch_size=3)]
    whole = score_items(model, items, "cpu", batch_size=3)
    assert sorted(map(repr, split)) == sorted(map(repr, whole))
