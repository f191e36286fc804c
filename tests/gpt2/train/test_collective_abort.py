"""The failure board's NCCL abort through the API every supported torch has.

NCCL cannot run here; the selection and the API are checked on a real gloo
group (a one-process group, where `ProcessGroup.abort` exists and returns),
and the NCCL call itself ran on an H100 with torch 2.11 (bench/results.jsonl,
`nccl_abort`)."""

import os
import subprocess
import sys

import torch.distributed as dist
from packaging.requirements import Requirement
from packaging.version import Version

from gpt2.train.failure_board import collective_abort

PROBE = r"""
import os, socket
import torch.distributed as dist
from gpt2.train.failure_board import collective_abort
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
group = dist.group.WORLD
assert collective_abort(group, "gloo") is None
abort = collective_abort(group, "nccl")
assert abort is not None and abort.__self__ is group and abort.__name__ == "abort"
abort()
print("aborted")
"""


def test_nccl_gets_the_groups_own_abort_and_gloo_none():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("aborted"), done.stderr[-2000:]


def test_every_supported_torch_has_the_api():
    """pyproject's lowest torch is one where ProcessGroup.abort exists (2.11 on
    the GPU machine, 2.13 here): a range widened below it needs a second branch."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    torch_req = next(Requirement(d) for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    lowest = min(Version(s.version) for s in torch_req.specifier if s.operator == ">=")
    assert lowest >= Version("2.11"), f"torch {lowest} is allowed; ProcessGroup.abort was checked from 2.11 on"
    assert hasattr(dist.ProcessGroup, "abort")
