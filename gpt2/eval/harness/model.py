"""Our GPT as an lm-eval model, so lm-eval's own task code scores it.

lm-eval does the prompting, request building and metrics; this class only
turns (context, continuation) token ids into log-probabilities with our
tokenizer and model. Multiple-choice tasks need nothing else.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from gpt2.eval.logprobs import encode, score_requests
from gpt2.tokenizer import EOT_TOKEN, get_encoding


class GPTLM(TemplateLM):
    """lm-eval model over `gpt2.model.GPT` and the GPT-2 BPE (tiktoken)."""

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu", batch_size: int = 32):
        super().__init__()
        self.model = model
        self._device = torch.device(device)
        self.batch_size = batch_size  # sequences per forward pass
        self.enc = get_encoding("gpt2")

    @property
    def eot_token_id(self) -> int:
        return EOT_TOKEN

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def tokenizer_name(self) -> str:
        return "gpt2"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # GPT-2 adds no BOS token, so add_special_tokens changes nothing.
        return encode(self.enc, string)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        results = []
        step = 64 * self.batch_size  # progress granularity only
        for start in tqdm(range(0, len(pairs), step), disable=disable_tqdm, desc="Scoring loglikelihood requests"):
            chunk = pairs[start: start + step]
            scores = score_requests(self.model, chunk, self._device, self.batch_size, self.max_length)
            results.extend((s.logprob, s.greedy) for s in scores)
        for (request_str, _, _), answer in zip(requests, results):
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise UnsupportedRequest("loglikelihood_rolling")

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise UnsupportedRequest("generate_until")


class UnsupportedRequest(NotImplementedError):
    """A task asks for what GPTLM does not do (generation, rolling perplexity): the runner
    names the task and the request kind in one line."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind
