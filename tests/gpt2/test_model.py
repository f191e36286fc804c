"""Our GPT against transformers' GPT2LMHeadModel with the same weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gpt2.config.sections import ModelConfig
from gpt2.model import GPT

if TYPE_CHECKING:  # imported by the test that uses it: ~4 s of every pytest worker's collection otherwise
    from transformers import GPT2LMHeadModel

# Hugging Face stores these as Conv1D, i.e. transposed relative to nn.Linear.
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_to_ours(hf: GPT2LMHeadModel, ours: GPT) -> None:
    hf_state = hf.state_dict()
    new = {}
    for name, tensor in ours.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to transformer.wte.weight
        src = hf_state[name]
        if name.endswith(CONV1D):
            src = src.t()
        if name == "transformer.wte.weight":
            # Padded vocabulary rows beyond GPT-2's 50257 are never produced by
            # the tokenizer; give them values so they are part of the check.
            src = torch.cat([src, torch.randn(tensor.shape[0] - src.shape[0], src.shape[1]) * 0.02])
        new[name] = src
    new["lm_head.weight"] = new["transformer.wte.weight"]
    ours.load_state_dict(new, strict=True)


def test_logits_match_transformers_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=48, vocab_size=50257,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    # Random biases and LayerNorm parameters: HF initialises them to 0/1, which
    # would hide a swapped or missing bias in the conversion.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ours = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, block_size=48, vocab_size=50304)).eval()
    hf_to_ours(hf, ours)
    idx = torch.randint(0, 50257, (3, 48))
    with torch.no_grad():
        expected = hf(idx).logits
        got, _ = ours(idx)
    assert got.shape == (3, 48, 50304)
    torch.testing.assert_close(got[..., :50257], expected, rtol=1e-5, atol=1e-5)


def test_loss_is_cross_entropy_of_the_logits():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    idx, targets = torch.randint(0, 50257, (2, 16)), torch.randint(0, 50257, (2, 16))
    logits, loss = model(idx, targets)
    manual = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    torch.testing.assert_close(loss, manual)
    # Untrained GPT-2 predicts roughly uniformly: loss near ln(vocab).
    assert abs(loss.item() - torch.log(torch.tensor(50304.0)).item()) < 0.5


def test_head_is_tied_to_the_token_embedding():
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def test_the_parameter_count_from_the_shapes_is_the_models_for_every_preset():
    """gpt2.model.parameter_count (what planning uses, without building the model) against the
    model itself, built on the meta device, for every preset and an odd shape."""
    from gpt2.config.presets import PRESETS
    from gpt2.model import parameter_count

    shapes = [preset().model for preset in PRESETS.values()]
    shapes.append(ModelConfig(n_layer=3, n_head=3, n_embd=48, block_size=40, vocab_size=50304))
    for cfg in shapes:
        with torch.device("meta"):
            model = GPT(cfg)
        assert parameter_count(cfg) == model.num_params(), cfg
        assert parameter_count(cfg, non_embedding=False) == model.num_params(non_embedding=False), cfg


def test_generate_draws_from_the_full_forwards_last_position():
    """generate runs the output layer on the last position alone: the tokens it draws are the ones
    the full forward's last-position logits give, with the same generator."""
    import math

    import torch.nn.functional as F

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50304)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 50257, (3, 5))
    drawn = model.generate(idx, 14, top_k=50, generator=torch.Generator().manual_seed(7))  # past block_size
    reference, gen = idx, torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(14):
            logits = model(reference[:, -cfg.block_size:])[0][:, -1, :50257]
            logits = logits.masked_fill(logits < torch.topk(logits, 50).values[:, [-1]], -math.inf)
            reference = torch.cat([reference, torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen)], dim=1)
    assert torch.equal(drawn, reference)
