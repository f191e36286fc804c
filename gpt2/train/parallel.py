"""DDP as the trainer and the benchmark build it: gradients kept in DDP's
buckets, and buckets sized to the model.

`gradient_as_bucket_view=True`: the gradients are views into DDP's all-reduce
buckets, so there is one copy of them instead of two (4 bytes a parameter less,
and no copy between them every step). The micro-batch probe reproduces those
buckets without DDP (gpt2.train.memory.GradientBuckets).

Bucket size: DDP's default of 25 MB cuts GPT-2 124M's ~500 MB of fp32
gradients into ~20 buckets and 1558m's ~6.2 GB into ~250, and a compiled
model's graph is split at every bucket boundary (dynamo's DDPOptimizer, so
each bucket's all-reduce can start while backward goes on): that many pieces
cost inductor its fusions across them and add a launch overhead per piece.
`DDP_BUCKETS` buckets whatever the size keep the compiled graph in a few
pieces while the all-reduce of all buckets but the last still overlaps the
rest of backward. Each is then ~60 MB at 124M, ~780 MB at 1558m: far past the
few MB where NCCL reaches its bus bandwidth, and the one bucket left exposed
is a small share of a step that accumulates over several micro-batches (DDP
communicates only on the last). Never below the default, for tiny models.
"""

from __future__ import annotations

import math

import torch
from torch.nn.parallel import DistributedDataParallel

from gpt2.process.distributed import DistEnv

DDP_BUCKETS = 8
DEFAULT_BUCKET_CAP_MB = 25  # DDP's own default


def bucket_cap_mb(model: torch.nn.Module) -> int:
    """DDP's bucket_cap_mb for `model`: its gradients in about `DDP_BUCKETS` buckets."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(DEFAULT_BUCKET_CAP_MB, math.ceil(grad_bytes / DDP_BUCKETS / (1 << 20)))


def wrap_ddp(model: torch.nn.Module, raw_model: torch.nn.Module, env: DistEnv) -> DistributedDataParallel:
    """`model` (the compiled or eager module the steps run) under DDP, its
    buckets sized from `raw_model`'s parameters."""
    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device_type == "cuda" else None,
                                   gradient_as_bucket_view=True, bucket_cap_mb=bucket_cap_mb(raw_model))
