"""GPT-2 as in the llm.c / nanoGPT recipe, in plain PyTorch.

Pre-LayerNorm blocks, GELU (tanh approximation), learned positions, the
token embedding tied to the output head, residual projections scaled by
1/sqrt(2·n_layer) at init, vocabulary padded to 50304. Parameter names follow
nanoGPT (`transformer.h.0.attn.c_attn.weight`, ...) so the Hugging Face
conversion in `gpt2.export` is a fixed table.

`recompute` (runtime.recompute) keeps only each block's input for backward and
recomputes the block's activations there (torch.utils.checkpoint): the same
numbers for about a third more compute.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gpt2.config.sections import ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scale = True  # scaled init, see GPT._init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim) for scaled_dot_product_attention
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Flash / memory-efficient kernels on GPU, the math path on CPU.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # back to (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scale = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.n_embd),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying
        # runtime.recompute, as resolved by the trainer (an attribute, not a
        # config field: the micro-batch search switches it while probing).
        self.recompute = False
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_scale", False):
                # Each block adds two residual branches: keep the stream's variance flat.
                std *= (2 * self.config.n_layer) ** -0.5
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True):
        """idx (B, T) token ids -> logits (B, T, vocab_size); with targets also
        the mean cross-entropy loss. Training passes return_logits=False: a
        returned (B, T, vocab) tensor would be kept and, compiled, written out
        in full (6.6 GB at B=64 in bf16) only to be dropped."""
        logits = self.lm_head(self._features(idx))  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return (logits if return_logits else None), loss

    def _features(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> the final LayerNorm's output (B, T, C), what the output layer reads."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        # Only a training forward keeps activations worth recomputing.
        recompute = self.recompute and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            # use_reentrant=False: the variant torch recommends; it works with
            # autocast, torch.compile and inputs that need no grad.
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.transformer.ln_f(x)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self) -> int:
        return training_flops_per_token(self.config, self.num_params())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = 50, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuations of idx (B, T); only GPT-2's 50257 real tokens are drawn."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size:]
            # The output layer on the last position alone: the only one drawn from, and over a
            # 50,304-way vocabulary the bulk of a small model's forward (T times less of it).
            logits = self.lm_head(self._features(ctx)[:, -1, :])
            logits = logits[:, :50257] / max(temperature, 1e-6)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, -math.inf)
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def parameter_count(cfg: ModelConfig, non_embedding: bool = True) -> int:
    """What GPT(cfg).num_params(non_embedding) counts, from the shapes alone. Planning (gpt2.cost.plan:
    `gpt2 plan`, the training flow's checkpoint-time warning) needs the number without building the
    model: even on the meta device, nn.init.normal_ imports torch._dynamo (~0.9 s of CPU in a
    process that trains nothing). tests/gpt2/test_model.py holds it to the model for every preset."""
    C = cfg.n_embd
    layer_norm = 2 * C
    attention = (C * 3 * C + 3 * C) + (C * C + C)
    mlp = (C * 4 * C + 4 * C) + (4 * C * C + C)
    n = cfg.vocab_size * C + cfg.n_layer * (2 * layer_norm + attention + mlp) + layer_norm  # lm_head is wte
    return n if non_embedding else n + cfg.block_size * C


def training_flops_per_token(cfg: ModelConfig, n_params: int) -> int:
    """Training FLOPs per token (forward + backward), PaLM appendix B: 6·N (N without
    the position embeddings) plus the attention score/value matmuls 12·L·C·T."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
