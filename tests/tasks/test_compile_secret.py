"""The secret that signs a run's compiled program (gpt2.train.compile_cache) is kept
by the Prefect API, never in the root: the first compiled run of a deployment
makes it, every later one, on any machine, reads the same; the trainer, a
child of the task, inherits it. A run that compiles nothing asks for none."""

from __future__ import annotations

import os

from prefect.blocks.system import Secret

from gpt2.train.compile_cache import SECRET_ENV
from tasks.train import COMPILE_SECRET_BLOCK, share_compile_secret
from tests.gpt2.train.fixtures import tiny_config


def test_the_first_compiled_run_makes_the_secret_and_every_later_one_reads_it(prefect_server, tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    eager = tiny_config(tmp_path, **{"runtime.compile": False})
    share_compile_secret(eager)
    assert SECRET_ENV not in os.environ  # nothing compiled, nothing signed
    compiled = tiny_config(tmp_path, **{"runtime.compile": True})
    share_compile_secret(compiled)
    first = os.environ[SECRET_ENV]
    assert len(first) == 64 and Secret.load(COMPILE_SECRET_BLOCK).get() == first
    monkeypatch.delenv(SECRET_ENV)  # another machine: only the Prefect API knows it
    share_compile_secret(compiled)
    assert os.environ[SECRET_ENV] == first
    monkeypatch.setenv(SECRET_ENV, "set by the operator")  # an explicit secret wins and is left alone
    share_compile_secret(compiled)
    assert os.environ[SECRET_ENV] == "set by the operator" and Secret.load(COMPILE_SECRET_BLOCK).get() == first
