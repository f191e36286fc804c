"""The preflight's checks of this machine that run no training step: the
devices, the local disk, the run's lease and the tracking services."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import urllib.request
from pathlib import Path

import torch

from gpt2.checkpoint.lease import Lease, earlier_attempt_wait_s
from gpt2.config.tree import Config
from gpt2.preflight.report import Failed, Outcome, Skipped, Warned
from gpt2.process.distributed import DistEnv, resolve_nproc, visible_gpus
from gpt2.root import layout
from gpt2.train.precision import PrecisionError, attention_kernel, choose_precision, device_caps

TESTED_TORCH = ((2, 11), (2, 13))
"""The torch minor versions CI and the GPU records cover (pyproject: torch>=2.11,<2.14)."""
MIN_DRIVER_CUDA = 12000
"""The CUDA driver API version (cudaDriverGetVersion) below which the CUDA builds of the
tested torch releases do not run (CUDA 12.x)."""


def _torch_minor() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _driver_version() -> int | None:
    """The CUDA version the installed driver supports (cuDriverGetVersion, e.g.
    13000), which torch does not expose; None where libcuda cannot be asked."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def devices(config: Config, env: DistEnv) -> Outcome:
    """The device the run uses, how many there are against runtime.nproc_per_node,
    their memory and bf16 support, and the versions against what is tested."""
    rt, figures = config.runtime, {}
    versions = [f"torch {torch.__version__}"]
    problems, notes = [], []
    minor = _torch_minor()
    if not TESTED_TORCH[0] <= minor <= TESTED_TORCH[1]:
        notes.append(f"torch {torch.__version__} is outside the tested {TESTED_TORCH[0][0]}.{TESTED_TORCH[0][1]}"
                     f"-{TESTED_TORCH[1][0]}.{TESTED_TORCH[1][1]}; install a tested one (pip install -e .)")
    if env.device.type == "cuda":
        gpus = visible_gpus(rt.device)
        nproc = resolve_nproc(rt.nproc_per_node, gpus)
        props = torch.cuda.get_device_properties(env.device)
        driver = _driver_version()
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None
        versions += [f"CUDA {torch.version.cuda}", "driver API " + (_cuda_version(driver) if driver else "unknown")]
        if nccl:
            versions.append(f"NCCL {nccl}")
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)  # emulated bf16 has no tensor cores
        figures = {"device": props.name, "gpus": gpus, "gpu_memory_bytes": props.total_memory, "bf16": bf16,
                   "cuda": torch.version.cuda, "nccl": nccl, "driver_api": driver}
        found = f"{gpus} x {props.name} ({props.total_memory / 2**30:.0f} GiB, bf16 {'yes' if bf16 else 'no'})"
        if driver and driver < MIN_DRIVER_CUDA:
            problems.append(f"the NVIDIA driver supports CUDA {_cuda_version(driver)}, below "
                            f"{_cuda_version(MIN_DRIVER_CUDA)}: update the driver")
        if nproc > gpus:
            problems.append(f"runtime.nproc_per_node={rt.nproc_per_node} but this machine shows {gpus} GPU(s): "
                            f"set runtime.nproc_per_node={gpus} or auto")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", nproc))
        if local != nproc:
            problems.append(f"{local} process(es) on this machine but runtime.nproc_per_node resolves to {nproc}: "
                            "start the preflight as the run starts (gpt2 preflight launches torchrun itself)")
    else:
        found = f"{env.device} ({os.cpu_count()} cores)"
        figures = {"device": str(env.device), "gpus": 0}
        if rt.device in ("auto", "cuda") and rt.nproc_per_node not in ("auto", 1):
            problems.append(f"runtime.nproc_per_node={rt.nproc_per_node} needs GPUs; this machine has none visible")
    figures["torch"] = torch.__version__
    detail = f"{found}; {', '.join(versions)}, world size {env.world_size}"
    caps = device_caps(env.device)
    try:
        precision = choose_precision(config.train.precision, caps)
        figures.update(precision=precision.name, precision_why=precision.why,
                       attention=attention_kernel(caps, precision))
        detail += f"; trains in {precision.describe()}, attention kernel {figures['attention']}"
    except PrecisionError as err:
        problems.append(str(err))
    if problems:
        raise Failed(f"{detail}: " + "; ".join(problems), **figures)
    if notes:
        raise Warned(f"{detail}: " + "; ".join(notes), **figures)
    return Outcome(detail, figures)


def _free_bytes(path: Path) -> tuple[Path, int]:
    """The nearest existing ancestor of `path` (where it will be created) and its free bytes."""
    path = path.expanduser().resolve()
    while not path.exists():
        path = path.parent
    return path, shutil.disk_usage(path).free


def disk(config: Config, needs: dict[str, int]) -> Outcome:
    """Free space where the run writes locally against what it needs there
    (`needs`: bytes by what they are for: shard cache, checkpoint staging and,
    for a local root, its checkpoints), summed per filesystem."""
    targets = {"work dir": config.runtime.work_root}
    local_root = layout.local_root(config)
    if local_root is not None:
        targets["root"] = local_root
    per_fs: dict[int, list] = {}
    for what, path in targets.items():
        where, free = _free_bytes(path)
        wanted = sum(v for k, v in needs.items() if k.startswith(what))
        entry = per_fs.setdefault(os.stat(where).st_dev, [where, free, 0, []])
        entry[2] += wanted
        entry[3].append(what)
    lines, short, advice = [], [], []
    for where, free, wanted, whats in per_fs.values():
        lines.append(f"{' and '.join(whats)} on {where}: {free / 1e9:.1f} GB free, {wanted / 1e9:.2f} GB needed")
        if free < wanted:
            parts = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in needs.items() if v and k.startswith(tuple(whats)))
            short.append(f"{where} has {free / 1e9:.1f} GB free, the run needs {wanted / 1e9:.1f} GB there ({parts})")
            if "work dir" in whats:
                advice.append("point runtime.work_dir at a larger local disk")
            if "root" in whats:
                advice.append("lower train.keep_checkpoints, or use a root with more space")
    figures = {"disk_needed_bytes": sum(needs.values())}
    if short:
        raise Failed("; ".join(short) + ": free space, or " + ", or ".join(advice), **figures)
    return Outcome("; ".join(lines), figures)


FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"
"""Set by a Prefect worker in the flow run it starts; the preflight's process inherits it."""


def lease(config: Config) -> Outcome:
    """No live trainer holds the run's lease, or the run is set to wait for it
    (runtime.lease_wait_s) longer than it can stay live without renewal, or
    the holder is this flow run's own earlier attempt, which the trainer waits
    for (a rescheduled run whose old machine is still stopping). Read only:
    the preflight never takes it."""
    run_dir = layout.run_dir(config)
    held = Lease(layout.lease_dir(run_dir), config.runtime.lease_ttl_s, os.environ.get(FLOW_RUN_ENV))
    found = held.holder()
    if found is None:
        return Outcome(f"no live holder of {layout.lease_dir(run_dir)}")
    holder, stale_in = found
    wait = config.runtime.lease_wait_s
    _, record = held.current()
    if held.held_by_this_run(record):
        raise Warned(f"this flow run's earlier attempt holds the run's lease ({holder}); the trainer waits up to "
                     f"{earlier_attempt_wait_s(record, config.runtime.lease_ttl_s, wait):.0f} s for it to let go "
                     "or go stale, as a rescheduled run does")
    if wait >= stale_in:
        raise Warned(f"a trainer holds the run's lease ({holder}); the run waits up to runtime.lease_wait_s={wait:.0f} "
                     f"s for it, and it goes stale in {stale_in:.0f} s unless its holder is alive")
    raise Failed(f"a live trainer holds the run's lease ({holder}): the run would be refused; stop that trainer, "
                 f"wait for it to finish, or set runtime.lease_wait_s above {stale_in:.0f} s to wait for a holder "
                 "that may be gone")


def tracking(config: Config, timeout_s: float = 10.0) -> Outcome:
    """The MLflow store answers and, inside a flow run, the Prefect API does
    (a warning at worst: training goes on without them). A SQLite store that
    does not exist yet is not created (the run creates it): its directory is
    enough."""
    if not config.tracking.enabled:
        raise Skipped("tracking.enabled=false")
    found, problems = [], []
    api = os.environ.get("PREFECT_API_URL")
    if importlib.util.find_spec("mlflow") is None:
        if not api:
            raise Skipped("MLflow is not installed here: the run would log no metrics (pip install -e .)")
        found.append("MLflow: not installed here (metrics are not logged)")
    else:
        found_mlflow, problem = _mlflow(config)
        found += [found_mlflow] if found_mlflow else []
        problems += [problem] if problem else []
    if api:
        try:
            with urllib.request.urlopen(api.rstrip("/") + "/health", timeout=timeout_s) as r:
                found.append(f"Prefect API {api} answered ({r.status})")
        except OSError as err:
            problems.append(f"the Prefect API at {api} does not answer ({err}); the flow run cannot report")
    if problems:
        raise Warned("; ".join(found + problems))
    return Outcome("; ".join(found))


def _mlflow(config: Config) -> tuple[str | None, str | None]:
    """(what was found, what is wrong) of the run's MLflow store."""
    from gpt2.secrets import redact
    from gpt2.tracking.store import answers, default_tracking_uri

    uri = default_tracking_uri(config)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.exists():
            parent = next(p for p in db.parents if p.exists())
            if parent.is_dir() and os.access(parent, os.W_OK):
                return f"MLflow store {redact(uri)}: created by the run ({parent} is writable)", None
            return None, f"MLflow store {redact(uri)} cannot be created: {parent} is not writable"
    try:
        seconds = answers(uri)
    except Exception as err:  # noqa: BLE001 - any failure is "does not answer"
        return None, (f"MLflow at {redact(uri)} does not answer ({type(err).__name__}: {err}); "
                      "check tracking.uri / $MLFLOW_TRACKING_URI")
    return f"MLflow {redact(uri)} answered in {seconds:.1f}s", None
