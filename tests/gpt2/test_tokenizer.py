"""The offline tokenizer equals tiktoken's own `get_encoding("gpt2")`."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import tiktoken

from gpt2.tokenizer import EOT_TOKEN, FILE_SHA256, TokenizerFilesError, bpe_files_dir, get_encoding, verify_bpe_files

# The URLs tiktoken_ext.openai_public downloads the gpt2 files from; tiktoken
# caches each under sha1(url), which lets its own loader run offline here.
URLS = {
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.\n\nNew paragraph!",
    "    indented code:\n\tdef f(x):\n\t\treturn x ** 2  # comment",
    "Numbers 1234567890, 3.14159, 1e-9 and dates 2024-05-20.",
    "Ünïcödé: naïve café, Straße, 日本語のテキスト, emoji 🎉🚀, Ελληνικά, русский",
    "Contractions: don't, I'll, we've, they're, she'd, it's",
    "URLs https://example.com/path?q=1&b=2 and e-mail a.b@c.org",
    "<|endoftext|> is text here, not the special token",
    "   leading and trailing spaces   ",
    "\n\n\nmany\n\n\nnewlines\r\n",
    "",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in URLS.items():
        shutil.copy(bpe_files_dir() / name, cache / hashlib.sha1(url.encode()).hexdigest())
    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    try:
        yield tiktoken.get_encoding("gpt2")
    finally:
        mp.undo()


def test_same_ids_as_tiktoken(reference, prose_docs):
    ours = get_encoding("gpt2")
    assert ours._mergeable_ranks == reference._mergeable_ranks  # ours are read from encoder.json alone
    texts = SAMPLES + [d["text"] for d in prose_docs[:300]]
    for text in texts:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text), text[:60]
    assert ours.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    assert ours.n_vocab == reference.n_vocab == 50257


def test_files_are_hash_checked(tmp_path):
    verify_bpe_files(bpe_files_dir())
    for name in FILE_SHA256:
        shutil.copy(bpe_files_dir() / name, tmp_path / name)
    with open(tmp_path / "vocab.bpe", "ab") as f:
        f.write(b"tampered")
    with pytest.raises(TokenizerFilesError, match="vocab.bpe"):
        verify_bpe_files(tmp_path)
    shutil.copy(bpe_files_dir() / "vocab.bpe", tmp_path / "vocab.bpe")
    verify_bpe_files(tmp_path)
    (tmp_path / "encoder.json").unlink()
    with pytest.raises(TokenizerFilesError, match="missing"):
        verify_bpe_files(tmp_path)
