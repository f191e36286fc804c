"""The compiled program travels with the run (runtime.compile): after an
attempt's first compiled step, rank 0 saves what the compiler made under the
run, `runs/<run>/compile/<key>.bin`, once per key; a later attempt whose key
matches, on any machine, loads it before its first step and starts warm.

What travels: torch's portable cache artifacts (`torch.compiler.
save_cache_artifacts`: the FX graph and AOTAutograd entries, on CUDA Triton's
kernels) and the files this process added to inductor's cache directory
while it compiled (on CPU the artifacts lack the compiled C++ objects: with
the artifacts alone the smoke model's first step took 17.6 s of a cold 27.6 s,
with the files too 2.4 s). The key holds everything that makes a program
unusable elsewhere: torch and Triton versions, the device (name and compute
capability, or the CPU's architecture and instruction-set flags), the model,
the micro-batch shape, the dtype the run computes in (train.precision as
resolved: an fp16 run and a bf16 run compile different programs), the compile
options and the rank count. Where compiling failed, why is recorded beside
the key (gpt2.train.compile_choice).

The root is data, never code: a compiled program is code, so a blob is
signed (HMAC-SHA256) with a secret that is not in the root: $GPT2_COMPILE_
CACHE_SECRET (the training flow sets it from a Prefect Secret block, so every
machine of a deployment shares it), else one kept in this machine's work dir
(warm restarts on this machine only). A blob that is unsigned, signed with
another secret, damaged, truncated, from another key or refused by torch is
ignored with one warning and the attempt compiles cold: never a crash, never a
program nobody here compiled."""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import io
import json
import logging
import os
import platform
import posixpath
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2.config.identity import fingerprint
from gpt2.config.tree import Config
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

SECRET_ENV = "GPT2_COMPILE_CACHE_SECRET"
MAGIC = b"gpt2-compile-cache-v1\n"
FILES = "inductor/"  # where the cache directory's files sit in the blob's tar
ARTIFACTS = "artifacts.bin"


def _cpu_flags() -> str:
    """The CPU's instruction-set flags, hashed (compiled C++ objects use them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.split(":", 1)[1].strip().encode()).hexdigest()[:16]
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""train.precision as resolved (gpt2.train.precision) -> the key's dtype."""


def key_fields(config: Config, device: torch.device, micro_batch: int, recompute: bool, world_size: int,
               precision: str = "fp32") -> dict:
    """What a compiled program depends on, beyond the graph inductor keys itself;
    `precision`: train.precision as resolved (bf16, fp16, fp32; a CPU run's is fp32)."""
    if device.type == "cuda":
        where = {"device": torch.cuda.get_device_name(device),
                 "capability": list(torch.cuda.get_device_capability(device)), "cuda": torch.version.cuda}
    else:
        where = {"device": device.type, "machine": platform.machine(), "cpu_flags": _cpu_flags()}
    return {"torch": torch.__version__, "triton": _version("triton"), **where,
            "model": config.model.model_dump(mode="json"), "micro_batch": micro_batch,
            "dtype": DTYPE_NAMES[precision], "compile": {"dynamic": False},
            "recompute": recompute, "world_size": world_size}


def key_of(fields: dict) -> str:
    return fingerprint(fields)


def secret(config: Config) -> bytes:
    """The signing secret: $GPT2_COMPILE_CACHE_SECRET, else this machine's own
    (made once in the work dir, readable by its owner only)."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV].encode()
    path = config.runtime.work_root / "compile-cache.secret"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(os.urandom(32).hex().encode())
        os.replace(tmp, path)  # two first attempts: one secret wins, both read it
        return path.read_bytes()


def _sign(key: bytes, name: str, payload: bytes) -> str:
    return hmac.new(key, name.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def _cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def _new_files(since: float) -> list[Path]:
    """Files of inductor's cache directory written since `since` (this
    process's compile), locks and temporaries left out."""
    root, out = _cache_dir(), []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if name.endswith((".lock", ".tmp")) or ".tmp" in name:
                continue
            try:
                if path.stat().st_mtime >= since:
                    out.append(path)
            except FileNotFoundError:
                continue
    return out


def pack(since: float) -> bytes:
    """This process's compiled program as a tar: the artifacts and the new cache files."""
    saved = torch.compiler.save_cache_artifacts()
    buf, root = io.BytesIO(), _cache_dir()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if saved is not None:
            info = tarfile.TarInfo(ARTIFACTS)
            info.size = len(saved[0])
            tar.addfile(info, io.BytesIO(saved[0]))
        for path in _new_files(since):
            tar.add(path, arcname=FILES + path.relative_to(root).as_posix(), recursive=False)
    return buf.getvalue()


def blob_url(config: Config, key: str) -> str:
    return storage.join(layout.run_dir(config), "compile", f"{key}.bin")


def save(config: Config, fields: dict, since: float, replace: bool = False) -> str | None:
    """Rank 0, after the first compiled step: the signed blob under the run,
    unless one is there for this key (`replace`: one that was refused). Its
    URL, or None when none was written. Never raises (a warning at most)."""
    key = key_of(fields)
    url = blob_url(config, key)
    try:
        if not replace and storage.exists(url):
            return None
        started = time.perf_counter()
        payload = pack(since)
        header = json.dumps({"key": key, "fields": fields, "bytes": len(payload),
                             "hmac": _sign(secret(config), key, payload)}).encode()
        storage.write_bytes_atomic(url, MAGIC + len(header).to_bytes(4, "big") + header + payload)
        log.info("compiled program saved for the next attempt: %s (%.1f MB, %.1f s)", url, len(payload) / 1e6,
                 time.perf_counter() - started)
        return url
    except Exception as err:  # noqa: BLE001 - a cache: the run goes on without it
        log.warning("the compiled program was not saved to %s (%s: %s); the next attempt compiles cold",
                    url, type(err).__name__, err)
        return None


class Refused(ValueError):
    """A blob that is not this key's, not signed by our secret, or not whole."""


def _unpack(blob: bytes, key: str, secret_key: bytes) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """(the artifacts, [(relative path, bytes)]) of a verified blob."""
    if not blob.startswith(MAGIC):
        raise Refused("not a compile cache blob")
    at = len(MAGIC)
    size = int.from_bytes(blob[at:at + 4], "big")
    header = json.loads(blob[at + 4:at + 4 + size])
    payload = blob[at + 4 + size:]
    if header.get("key") != key:
        raise Refused(f"its key {header.get('key')} is not this program's {key}")
    if header.get("bytes") != len(payload):
        raise Refused(f"{len(payload)} bytes where {header.get('bytes')} were written: truncated")
    if not hmac.compare_digest(str(header.get("hmac")), _sign(secret_key, key, payload)):
        raise Refused(f"its signature does not match ${SECRET_ENV} (or this machine's secret): not loaded, "
                      "as the root is data, never code")
    artifacts, files = None, []
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read() if member.isfile() else None
            if member.name == ARTIFACTS and data is not None:
                artifacts = data
            elif member.name.startswith(FILES) and data is not None:
                rel = posixpath.normpath(member.name[len(FILES):])
                if rel.startswith(("/", "..")) or "/../" in f"/{rel}/":
                    raise Refused(f"{member.name} leaves the cache directory")
                files.append((rel, data))
    return artifacts, files


def load(config: Config, fields: dict) -> str:
    """Before the first step: the run's blob for this key into inductor's
    cache (files it already has are kept). `loaded`; `absent` (no blob);
    `refused` (one warning: unreadable, damaged, foreign), when the attempt compiles cold."""
    key = key_of(fields)
    url = blob_url(config, key)
    try:
        blob = storage.read_bytes(url)
    except FileNotFoundError:
        return "absent"
    except Exception as err:  # noqa: BLE001 - an unreadable compile/ directory
        log.warning("compiled program at %s not read (%s: %s): compiling cold", url, type(err).__name__, err)
        return "refused"
    try:
        artifacts, files = _unpack(blob, key, secret(config))
        root = _cache_dir()
        for rel, data in files:
            target = root / rel
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
            tmp.write_bytes(data)
            os.chmod(tmp, 0o755 if rel.endswith(".so") else 0o644)
            os.replace(tmp, target)
        if artifacts is not None:
            torch.compiler.load_cache_artifacts(artifacts)
    except Exception as err:  # noqa: BLE001 - damaged, foreign, refused by torch: compile cold
        log.warning("compiled program at %s not used (%s: %s): compiling cold", url, type(err).__name__, err)
        return "refused"
    log.info("compiled program loaded from %s (%d files): the first step starts warm", url, len(files))
    return "loaded"


@dataclass
class Travel:
    """One attempt's compiled program (the trainer's, the preflight's): loaded
    from the run before the first step, or saved to it after."""

    fields: dict
    status: str
    """`loaded`, `absent` or `refused` before the first step; `saved` once this attempt saved it;
    `failed` when compiling failed and the run trains eagerly (gpt2.train.compile_choice)."""
    since: float
    """When this attempt's compilation could begin (the files it adds are newer)."""

    @classmethod
    def begin(cls, config: Config, device: torch.device, micro_batch: int, recompute: bool,
              world_size: int, precision: str) -> Travel:
        """Before the first step: the run's program for this key, loaded when it is there."""
        fields = key_fields(config, device, micro_batch, recompute, world_size, precision)
        return cls(fields, load(config, fields), time.time())

    def after_first_step(self, config: Config, is_main: bool) -> None:
        """Rank 0 saves the program this attempt compiled, unless it was loaded (a refused one is replaced)."""
        if self.status not in ("loaded", "failed") and is_main and save(config, self.fields, self.since,
                                                                         replace=self.status == "refused"):
            self.status = "saved"
