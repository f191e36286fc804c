"""Device and process-group setup, driven by the environment torchrun sets.

One process per device. Without torchrun (no WORLD_SIZE) this is a single
process on `runtime.device`; under torchrun every rank joins a process group
(NCCL on CUDA, gloo on CPU) that `distributed()` always tears down.

Two timeouts: the process group's (`runtime.collective_timeout_s`, minutes)
bounds how long a rank waits in a step's collective for a peer that will never
come; the waits before training, where rank 0 alone takes the run's lease and
reads the checkpoint while the others wait for it, go over a second, gloo
group with a long timeout (`control_group`). A failure a rank survives is not
left to either timeout: the training loop carries it on the step's flag
all-reduce (gpt2.train.loop).

It sits below the stages that share it (gpt2.data, gpt2.eval, gpt2.train),
so none of them imports another for it.

    torchrun --standalone --nproc_per_node=8 -m gpt2.train --config run.json
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from gpt2.errors import UserError

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 600.0
"""Default runtime.collective_timeout_s (NCCL's own default is 30 minutes)."""

STARTUP_TIMEOUT_S = 3600.0
"""The control group's timeout: rank 0 alone reads and verifies the checkpoint
(gigabytes from a bucket at 1558m) while the other ranks wait for it."""

_control: dist.ProcessGroup | None = None
# The last block's groups, kept: a DDP model that outlives the block frees its
# group from C++ with the GIL held, and gloo's thread, still releasing a finished
# collective, waits for the GIL (a rank hung at exit). Python frees them unlocked.
_retired: list[dist.ProcessGroup] = []


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Only rank 0 writes files, logs metrics and prints."""
        return self.rank == 0

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


class DeviceUnavailable(UserError, RuntimeError):
    """runtime.device names a device this machine does not have."""


def check_device_available(requested: str) -> None:
    """Fail naming the setting when `runtime.device` asks for what this machine
    lacks (CUDA, cuda:N past the visible GPUs, MPS): a second's check, which the
    CLI makes before it starts a server, and the trainer again where it runs."""
    if requested == "auto":
        return
    device = torch.device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"runtime.device={requested} but CUDA is not available on this machine; "
                                    "use runtime.device=cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"runtime.device={requested} but this machine shows "
                                    f"{torch.cuda.device_count()} GPU(s); use cuda:0..cuda:"
                                    f"{torch.cuda.device_count() - 1} or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable(f"runtime.device={requested} but MPS is not available on this machine; "
                                "use runtime.device=cpu or auto")


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    """Resolve `runtime.device` (`auto`, `cpu`, `cuda`, `cuda:N`, `mps`)."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    check_device_available(requested)
    device = torch.device(requested)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


def visible_gpus(requested: str) -> int:
    """GPUs this machine's trainer may spread over: every visible one for
    `runtime.device` auto/cuda, the one named by cuda:N, none for cpu/mps."""
    if requested.startswith("cuda:"):
        return 1
    if requested not in ("auto", "cuda") or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def resolve_nproc(setting: int | str, gpus: int) -> int:
    """`runtime.nproc_per_node`: `auto` is one process per visible GPU (1 with
    none); a number is kept, with a warning when it leaves GPUs idle."""
    if setting == "auto":
        return max(1, gpus)
    if setting < gpus:
        log.warning("runtime.nproc_per_node=%d trains on %d of the %d visible GPUs; the others stay idle "
                    "(runtime.nproc_per_node=auto uses them all)", setting, setting, gpus)
    return setting


def enable_fast_math(device: torch.device) -> None:
    """TF32 matmuls and cuDNN convolutions on Ampere+ (what llm.c and nanoGPT do).

    Through the API every supported torch has, not torch >= 2.9's
    `fp32_precision`: setting only the new one leaves the legacy getters
    (`torch.get_float32_matmul_precision()`, `torch.backends.cuda.matmul.allow_tf32`)
    raising "mix of the legacy and new APIs" on torch 2.9-2.13 (seen on an H100
    with 2.11), and inductor, transformers and lm-eval read them. The legacy
    setters also set the new API's values, so both keep answering."""
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high")  # TF32 for float32 matmuls
    torch.backends.cudnn.allow_tf32 = True


SHM_MIN_BYTES = 1 << 30
"""Below this much /dev/shm, NCCL's shared-memory transport between the ranks of
one machine can fail at its first collective: containers get 64 MB by default
(the Kubernetes pools mount an in-memory volume there; other hosts may not)."""


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory filesystem (None: there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def avoid_small_shm(local_ranks: int, size: int | None, environ: dict = os.environ) -> bool:
    """With several NCCL ranks on this machine and a /dev/shm under SHM_MIN_BYTES,
    turn NCCL's shared-memory transport off (NCCL_SHM_DISABLE=1: peers talk over
    NVLink/PCIe P2P or the network instead) rather than let a run fail at its
    first step; a value the user set is kept. True when it was turned off."""
    if local_ranks < 2 or size is None or size >= SHM_MIN_BYTES or "NCCL_SHM_DISABLE" in environ:
        return False
    environ["NCCL_SHM_DISABLE"] = "1"
    log.warning("/dev/shm holds %d MB, under the %d MB NCCL's shared-memory transport may need for %d ranks "
                "on this machine: NCCL_SHM_DISABLE=1 (peers use P2P or the network). Give the container a larger "
                "/dev/shm (an in-memory volume, as the Kubernetes pools do) to keep it", size >> 20,
                SHM_MIN_BYTES >> 20, local_ranks)
    return True


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@contextlib.contextmanager
def distributed(requested_device: str = "auto", timeout_s: float = COLLECTIVE_TIMEOUT_S,
                startup_timeout_s: float = STARTUP_TIMEOUT_S, store: dist.Store | None = None) -> Iterator[DistEnv]:
    """Join the torchrun process group (if any) for the duration of the block:
    its collectives time out after `timeout_s`; the control group's (gloo)
    after `startup_timeout_s`; formed over `store` (gpt2.preflight's roll call), else env://."""
    global _control
    world_size = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    device = pick_device(requested_device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    enable_fast_math(device)
    joined = False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            avoid_small_shm(_env_int("LOCAL_WORLD_SIZE", 1), shm_bytes())
        over = {"store": dist.PrefixStore("gpt2-pg/", store), "rank": rank, "world_size": world_size} if store else {}
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None, **over)
        joined = True
        _control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=startup_timeout_s))
        log.info("rank %d/%d joined the %s process group on %s", rank, world_size, backend, device)
    try:
        yield DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)
    finally:
        if joined:
            _retired[:] = [g for g in (dist.group.WORLD, _control) if g is not None]
            _control = None
            dist.destroy_process_group()


def control_group() -> dist.ProcessGroup | None:
    """The gloo group with the long timeout, for the waits before training and
    for small messages (None: the default group, outside `distributed()`)."""
    return _control


def all_reduce(value: torch.Tensor, env: DistEnv, op: str = "avg") -> torch.Tensor:
    """Reduce a tensor across ranks in place (a no-op for one process).
    gloo has no AVG, so the mean is a SUM divided by the world size."""
    if not env.is_distributed:
        return value
    if op == "avg":
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    else:
        dist.all_reduce(value, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return value


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True when `flag` is true on any rank, so every rank takes the same branch."""
    return any_ranks([flag], env)[0]


def any_ranks(flags: list[bool], env: DistEnv) -> list[bool]:
    """`any_rank` for several flags in one collective."""
    if not env.is_distributed:
        return list(flags)
    t = torch.tensor([int(f) for f in flags], device=env.device)
    return [bool(v) for v in all_reduce(t, env, op="max").tolist()]


def broadcast_bytes(data: bytes | None, env: DistEnv) -> bytes:
    """Rank 0's `data` on every rank, as one tensor collective (on the GPU with
    NCCL, over NVLink/the network: far faster than every rank reading the root)."""
    if not env.is_distributed:
        assert data is not None
        return data
    size = [len(data) if env.is_main else 0]
    # Where the other ranks wait for rank 0 (reading the checkpoint): the long timeout.
    dist.broadcast_object_list(size, src=0, group=control_group())
    if size[0] == 0:
        return b""
    device = env.device if dist.get_backend() == "nccl" else torch.device("cpu")
    if env.is_main:
        # Over the bytes themselves, not a copy (a checkpoint's share can be GBs);
        # the broadcast only reads its source, so the buffer's being read-only is moot.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            t = torch.frombuffer(data, dtype=torch.uint8).to(device)
    else:
        t = torch.empty(size[0], dtype=torch.uint8, device=device)
    dist.broadcast(t, src=0)
    return data if env.is_main else t.cpu().numpy().tobytes()


def first_error(error: BaseException | None, env: DistEnv) -> tuple[int, str] | None:
    """Every rank's outcome of a part only some ranks do (a download for the
    machine): the first failed rank and its "Type: message", or None. A
    collective of every rank, so all of them can raise together instead of
    one raising alone while the others wait for it. Over the control group:
    the others may wait that long (a shard's download)."""
    mine = f"{type(error).__name__}: {error}" if error is not None else None
    messages = [mine]
    if env.is_distributed:
        messages = [None] * env.world_size
        dist.all_gather_object(messages, mine, group=control_group())
    return next(((rank, m) for rank, m in enumerate(messages) if m is not None), None)


def barrier(env: DistEnv) -> None:
    if env.is_distributed:
        dist.barrier()


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA (llm.c/nanoGPT); fp32 elsewhere so CPU runs are exact."""
    return torch.bfloat16 if device.type == "cuda" else None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
