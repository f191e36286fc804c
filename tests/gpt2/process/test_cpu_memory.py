"""gpt2.process.cpu_memory: once `gpt2` is imported, a large CPU tensor is faulted in on huge pages,
a few hundred faults where 4 KiB pages take ~25,000; a user's own THP_MEM_ALLOC_ENABLE is kept.
Counted by the kernel (minor page faults) in a fresh process each: torch reads the setting once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A buffer the size of the smoke preset's logits for one micro-batch (8 x 64 tokens x 50,304 fp32
# values, ~100 MB), filled and freed four times, as a step does: the page faults of each.
PROBE = """
import json, resource
import gpt2
import torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(4):
    before = faults()
    buffer = torch.ones(8 * 64, 50304)
    del buffer
    counts.append(faults() - before)
print(json.dumps(counts))
"""
PAGES = 8 * 64 * 50304 * 4 // 4096
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _faults(**env: str) -> list[int]:
    environ = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"} | env
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=environ,
                          cwd=Path(__file__).resolve().parents[3])
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="the kernel has no transparent huge pages to give")
def test_large_cpu_tensors_are_faulted_in_on_huge_pages_unless_the_user_said_otherwise():
    assert all(n < PAGES * 0.05 for n in _faults()), "gpt2 imported: huge pages"
    if "[madvise]" in THP.read_text():  # (a kernel set to `always` gives huge pages to every process)
        assert all(n > PAGES * 0.9 for n in _faults(THP_MEM_ALLOC_ENABLE="0")), "the user's 0 kept: 4 KiB pages"


def test_a_value_already_set_is_kept():
    from gpt2.process.cpu_memory import VARIABLE, use_huge_pages

    environ = {VARIABLE: "0"}
    use_huge_pages(environ)
    assert environ == {VARIABLE: "0"}
    environ = {}
    use_huge_pages(environ)
    assert environ == {VARIABLE: "1"}
