"""Training checkpoints under the artifact root, and finding the newest good one.

Layout (the evaluate and export stages read it):

    {root}/runs/{run_name}/checkpoints/step_000500/
        model.safetensors   GPT state_dict without the tied lm_head.weight
        optimizer.pt        AdamW state_dict (torch.load(weights_only=True)); on
                            several ranks one share per rank instead,
                            optimizer-00000-of-00008.pt ... (gpt2.checkpoint.shares)
        rng.pt              RNG states (torch.load(weights_only=True))
        state.json          step, full config, train_fingerprint, loader position,
                            mlflow_run_id, val_loss, ...
        COMPLETE            written last: sizes and sha256 of the files above

Each file is written atomically, and the marker last (on several ranks,
by rank 0 once every rank's files are written): object stores (GCS)
have no atomic directory rename, so a directory without a valid marker never
counts. `run_name` depends on the training identity only, so changing the
device, the GPU count or the root's location never orphans a run.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from gpt2.checkpoint import shares

# Re-exported: callers name the marker, the finding and the pruning as store.X.
from gpt2.checkpoint.catalog import (  # noqa: F401
    FILES,
    MARKER,
    REQUIRED,
    CheckpointError,
    clear_run,
    complete_checkpoints,
    discard_after,
    file_entry,
    is_complete,
    latest_checkpoint,
    prune,
    read_marker,
    step_dirs,
    write_marker,
)
from gpt2.config.tree import Config
from gpt2.model import GPT
from gpt2.root import storage

log = logging.getLogger(__name__)

TIED = "lm_head.weight"


@dataclass
class Checkpoint:
    url: str
    state: dict
    model: dict[str, torch.Tensor]
    optimizer: dict | None
    """The whole optimizer state_dict; None when read without it (a resume:
    each rank then reads its own part, gpt2.checkpoint.optim_load)."""
    rng: dict
    files: dict[str, bytes] | None = None
    """The verified bytes it was decoded from (kept so rank 0 can send them to
    the other ranks; dropped once that is done)."""
    entries: dict[str, dict] | None = None
    """Its marker's files: name -> {bytes, sha256}."""

    @property
    def step(self) -> int:
        return int(self.state["step"])


def _to_bytes(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict to store: a CPU copy, contiguous, the tied head left out
    (safetensors refuses shared tensors; the head is the token embedding).
    Always a copy: on a CPU `.to("cpu")` returns the live tensor itself, and
    the background writer would then serialize weights that later optimizer
    steps are changing (a checkpoint labelled step N holding later weights)."""
    return host_copy({k: v for k, v in model.state_dict().items() if k != TIED})


def host_copy(obj):
    """Deep copy with every tensor on the CPU (contiguous): the training step
    may change the originals while a background thread is still writing them.

    From a GPU every tensor goes into pinned memory without waiting, and the
    device is synchronized once at the end: one blocking copy per tensor into
    fresh pageable memory held the training thread ~1.1 s for GPT-2 124M with
    its AdamW state on an H100 (`python -m bench.checkpoint_snapshot`). The
    pinned blocks stay in torch's host cache and serve the next checkpoint."""
    copied = _host_copy(obj)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # every non-blocking copy above has landed
    return copied


def _host_copy(obj):
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cuda":
            return t.to("cpu", copy=True).contiguous()
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_host_copy(v) for v in obj)
    return obj


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model tensors, optimizer state) copied to the CPU, ready for write_checkpoint."""
    return model_tensors(model), host_copy(optimizer.state_dict())


def encode_checkpoint(tensors: dict[str, torch.Tensor], optimizer_state: dict, state: dict,
                      rng: dict) -> dict[str, bytes]:
    """The bytes of each file of a one-process checkpoint (what write_files stores)."""
    return {**encode_required(tensors, state, rng), shares.WHOLE: encode_optimizer(optimizer_state)}


def encode_required(tensors: dict[str, torch.Tensor], state: dict, rng: dict) -> dict[str, bytes]:
    """The bytes of the files rank 0 writes beside its optimizer share."""
    return {
        "model.safetensors": save_safetensors(tensors, metadata={"format": "pt"}),
        "rng.pt": _to_bytes(rng),
        "state.json": (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(),
    }


def encode_optimizer(optimizer_state: dict) -> bytes:
    """An optimizer state_dict or one rank's share of it."""
    return _to_bytes(optimizer_state)


def write_checkpoint(url: str, tensors: dict[str, torch.Tensor], optimizer_state: dict,
                     state: dict, rng: dict, fence: Callable[[], None] | None = None) -> None:
    """Write one checkpoint directory; it counts only once COMPLETE is written."""
    write_files(url, encode_checkpoint(tensors, optimizer_state, rng=rng, state=state), state["step"], fence)


def write_files(url: str, blobs: dict[str, bytes], step: int, fence: Callable[[], None] | None = None) -> None:
    """Store a checkpoint's encoded files, then its COMPLETE marker. `fence`
    (the run's lease check) runs first and again just before the marker: a
    trainer that lost its run never commits a checkpoint."""
    if fence is not None:
        fence()
    storage.remove(url, recursive=True)  # leftovers of a killed write at this step
    files = write_blobs(url, blobs)
    if fence is not None:
        fence()
    write_marker(url, step, files)


def write_blobs(url: str, blobs: dict[str, bytes]) -> dict[str, dict]:
    """Write files into a checkpoint directory (each atomically, no marker);
    returns their marker entries."""
    for name, data in blobs.items():
        storage.write_bytes_atomic(storage.join(url, name), data)
    return {name: file_entry(data) for name, data in blobs.items()}


def save_checkpoint(url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict, rng: dict) -> None:
    """Snapshot and write a checkpoint in this thread."""
    write_checkpoint(url, *snapshot(model, optimizer), state, rng)


def read_verified(url: str, name: str, expected: dict) -> bytes:
    try:
        data = storage.read_bytes(storage.join(url, name))
    except FileNotFoundError as err:
        raise CheckpointError(f"checkpoint file {storage.join(url, name)} is missing") from err
    if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise CheckpointError(f"checkpoint file {storage.join(url, name)} does not match its {MARKER} marker (corrupt)")
    return data


def load_checkpoint(url: str, optimizer: bool = True) -> Checkpoint:
    """Read and verify (sha256) every file of a checkpoint. `optimizer=False`:
    the optimizer files are verified one at a time and dropped, not decoded
    (`Checkpoint.optimizer` is None): a resume reads each rank's part apart."""
    marker = read_marker(url)
    if marker is None:
        raise CheckpointError(f"checkpoint {url} has no valid {MARKER} marker (incomplete)")
    entries = marker["files"]
    blobs = {}
    for name, entry in entries.items():
        data = read_verified(url, name, entry)
        if optimizer or not shares.is_optimizer_file(name):
            blobs[name] = data
    return decode_checkpoint(url, blobs, entries)


def verify_checkpoint(url: str) -> None:
    """Raise CheckpointError naming the first file of `url` that is missing or
    does not match its marker's sha256 (reads every byte, decodes nothing)."""
    marker = read_marker(url)
    if marker is None:
        raise CheckpointError(f"checkpoint {url} has no valid {MARKER} marker (incomplete)")
    for name, entry in marker["files"].items():
        read_verified(url, name, entry)


def decode_checkpoint(url: str, blobs: dict[str, bytes], entries: dict[str, dict] | None = None) -> Checkpoint:
    """A checkpoint from its files' verified bytes (read here, or received from
    rank 0); the optimizer's only when `blobs` hold its files."""
    try:
        return Checkpoint(
            url=url,
            state=json.loads(blobs["state.json"]),
            model=load_safetensors(blobs["model.safetensors"]),
            optimizer=_decode_optimizer(blobs) if any(map(shares.is_optimizer_file, blobs)) else None,
            rng=torch.load(io.BytesIO(blobs["rng.pt"]), weights_only=True, map_location="cpu"),
            files=blobs,
            entries=entries,
        )
    except Exception as err:  # noqa: BLE001 - any decoding failure means a bad checkpoint
        raise CheckpointError(f"checkpoint {url} cannot be decoded: {type(err).__name__}: {err}") from err


def _decode_optimizer(blobs: dict[str, bytes]) -> dict:
    """The whole optimizer state_dict: optimizer.pt, or every rank's share merged."""
    names = shares.optimizer_files(blobs)
    if names is None:
        raise ValueError(f"no whole set of optimizer files among {sorted(blobs)}")
    parts = [torch.load(io.BytesIO(blobs[n]), weights_only=True, map_location="cpu") for n in names]
    return parts[0] if len(parts) == 1 else shares.merge(parts, names)


def resume_checkpoint(run_dir: str, optimizer: bool = True) -> Checkpoint | None:
    """The newest checkpoint that loads and verifies; damaged newer ones are
    skipped with a warning and then deleted, since the resumed run rewrites
    those steps (and pruning must never keep them over good ones). None when
    the run has no complete checkpoint; when it has some but none verifies,
    an error naming them: restarting at step 0 must be the user's choice."""
    damaged = []
    for url in complete_checkpoints(run_dir):
        try:
            ckpt = load_checkpoint(url, optimizer)
        except CheckpointError as err:
            log.warning("skipping damaged checkpoint: %s; falling back to the previous one", err)
            damaged.append(str(err))
            continue
        discard_after(run_dir, ckpt.step)
        return ckpt
    if damaged:
        raise CheckpointError(
            f"no checkpoint of {run_dir} verifies, so the run cannot resume:\n  " + "\n  ".join(damaged)
            + "\nrestore them from a copy, or start over with --fresh (deletes this run's checkpoints)")
    return None


def load_weights(model: GPT, tensors: dict[str, torch.Tensor]) -> None:
    """Load stored tensors; the tied head is restored by sharing, not copying."""
    full = dict(tensors)
    full[TIED] = full["transformer.wte.weight"]
    model.load_state_dict(full, strict=True)


def load_model(checkpoint_url: str, device: str = "cpu") -> tuple[GPT, Config]:
    """The GPT of a checkpoint (eval mode, fp32) and the config it was trained
    with; the weights and state are verified against the COMPLETE marker, so
    damaged weights are never evaluated, exported or registered."""
    marker = read_marker(checkpoint_url)
    if marker is None:
        raise CheckpointError(f"checkpoint {checkpoint_url} has no valid {MARKER} marker (incomplete)")
    state = read_verified(checkpoint_url, "state.json", marker["files"]["state.json"])
    weights = read_verified(checkpoint_url, "model.safetensors", marker["files"]["model.safetensors"])
    config = Config.model_validate(json.loads(state)["config"])
    model = GPT(config.model)
    load_weights(model, load_safetensors(weights))
    return model.to(device).eval(), config
