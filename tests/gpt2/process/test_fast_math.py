"""TF32 on CUDA through enable_fast_math, read back through both of torch's APIs.

On torch >= 2.9, setting only `torch.backends.cuda.matmul.fp32_precision` made
the legacy getters raise ("mix of the legacy and new APIs"), seen on an H100
with torch 2.11; inductor, transformers and lm-eval read those getters. The
flags are process-global and need no GPU to set, so the CPU build reaches the
same code; a child process keeps them out of the other tests' matmuls."""

import json
import subprocess
import sys

PROBE = r"""
import json, sys, torch
from gpt2.process.distributed import enable_fast_math
enable_fast_math(torch.device(sys.argv[1]))
read = {"precision": torch.get_float32_matmul_precision,
        "matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32}
if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
    read["matmul_fp32_precision"] = lambda: torch.backends.cuda.matmul.fp32_precision
    read["conv_fp32_precision"] = lambda: torch.backends.cudnn.conv.fp32_precision
out = {}
for name, get in read.items():
    try:
        out[name] = get()
    except Exception as err:
        out[name] = f"raised {type(err).__name__}: {err}"
print(json.dumps(out))
"""


def _read_back(device: str = "cuda") -> dict:
    """What both APIs answer after the setup for `device`, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", PROBE, device], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tf32_setup_keeps_both_apis_answering():
    got = _read_back()
    assert got["precision"] == "high", got
    assert got["matmul_allow_tf32"] is True, got
    assert got["cudnn_allow_tf32"] is True, got
    if "matmul_fp32_precision" in got:  # torch >= 2.9: the new API agrees
        assert got["matmul_fp32_precision"] == "tf32", got
        assert got["conv_fp32_precision"] == "tf32", got


def test_cpu_device_leaves_precision_alone():
    got = _read_back("cpu")
    assert got["precision"] == "highest" and got["matmul_allow_tf32"] is False, got
