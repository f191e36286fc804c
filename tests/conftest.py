"""Shared fixtures: a real temporary Prefect server, offline settings, tmp roots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# No network here or in CI: no telemetry, no hub lookups.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
# Read by gcsfs at import: otherwise it probes bucket types over gRPC, which
# the GCS emulator does not answer, and stalls.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from gpt2.overrides import resolve_config  # noqa: E402


@pytest.fixture(scope="session")
def prefect_server():
    """A real temporary Prefect server (SQLite) for the whole session; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture
def smoke_config(tmp_path):
    """Factory: the smoke preset rooted in this test's tmp dir, plus overrides."""

    def make(**overrides):
        values = {"runtime.work_dir": str(tmp_path / "work"), **overrides}
        return resolve_config("smoke", values, root=str(tmp_path / "root"))

    return make


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def prose_docs():
    """Real English prose split into ~500 paragraph documents (Python's own docs)."""
    from pydoc_data.topics import topics

    docs = []
    for key in sorted(topics):
        docs += [p for p in topics[key].split("\n\n") if len(p.strip()) > 40]
    return [{"text": t, "id": i} for i, t in enumerate(docs)]
