"""Large CPU tensors on transparent huge pages: a CPU step stops paying the kernel page by page.

A training or scoring step on the CPU allocates the same large buffers every
step: the logits of a micro-batch over the 50,304-token vocabulary and their
gradient (~100 MB each for the smoke preset). glibc maps each afresh and the
kernel faults it in 4 KiB at a time: ~25,000 page faults a buffer, every step.
Measured on the smoke preset (20 steps, one thread): 6.8 s of system time beside
6.8 s of user time. PyTorch's CPU allocator puts allocations of 2 MiB and more
on huge pages when THP_MEM_ALLOC_ENABLE=1 (c10's alloc_cpu): ~115 faults a
buffer, and the same steps take 1.9 s of system time and 0.56 of the CPU in all (bench/cpu_memory.py).

PyTorch reads the variable once, at its first CPU allocation, so it is set
when `gpt2` is imported (gpt2/__init__.py), before the modules that import
torch, and every process a stage starts inherits it. A value already in the
environment is kept (THP_MEM_ALLOC_ENABLE=0 turns it off). Nothing else
changes: memory is still handed back when freed, and where the kernel has
transparent huge pages off (`never`) the allocations are as before. On a GPU
the step's buffers are CUDA's; this only touches CPU-side copies (checkpoint
staging, the CPU path of evaluation).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def use_huge_pages(environ: MutableMapping[str, str] = os.environ) -> None:
    """Large CPU tensors on huge pages, in this process (before torch's first allocation) and its children."""
    environ.setdefault(VARIABLE, "1")
