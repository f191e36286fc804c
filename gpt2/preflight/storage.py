"""The preflight's checks of the artifact root: the run's data (every shard's
size and sha256 against the manifest) and the run's directory (written, read
back and deleted, with the bandwidth a checkpoint save will see)."""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from gpt2.config.tree import Config
from gpt2.data.llmc import ShardError
from gpt2.data.manifest import Manifest, load_manifest, verify_shard
from gpt2.preflight.report import Failed, Outcome, Warned
from gpt2.process.kill_window import kill_window, lengthen
from gpt2.root import layout, storage
from gpt2.secrets import redact
from gpt2.weights.init import cache_dir, fetched

PROBE_BYTES = 64 << 20
"""The object written to time the root: large enough that a bucket's
bandwidth, not its latency, sets the figure."""


def data(config: Config, workers: int | None = None) -> tuple[Outcome, Manifest]:
    """The manifest this config addresses, and every shard it lists at the
    size and sha256 it records, read in parallel (streamed: no shard is held
    in memory). Raises Failed naming every bad shard by its file name."""
    url = layout.manifest(config)
    try:
        manifest = load_manifest(url)
    except (FileNotFoundError, ShardError) as err:
        raise Failed(str(err)) from None
    except Exception as err:  # noqa: BLE001 - an unreachable or unlistable root
        raise Failed(f"cannot read {url} ({type(err).__name__}: {err}); check --root and its credentials") from None
    started, total = time.perf_counter(), sum(e.bytes for e in manifest.shards)
    bad: list[str] = []
    workers = workers or min(16, os.cpu_count() or 1, max(1, len(manifest.shards)))
    with ThreadPoolExecutor(workers, thread_name_prefix="preflight-shard") as pool, \
            tqdm(total=total, unit="B", unit_scale=True, desc="shards", leave=False, disable=None) as bar:
        futures = {pool.submit(verify_shard, layout.shard(url, e.path), e, True): e for e in manifest.shards}
        for future in as_completed(futures):
            entry = futures[future]
            try:
                future.result()
            except ShardError as err:
                bad.append(f"{entry.path}: {_reason(err, layout.shard(url, entry.path))}")
            except Exception as err:  # noqa: BLE001 - an unreadable shard is a bad shard, named
                bad.append(f"{entry.path}: {type(err).__name__}: {err}")
            bar.update(entry.bytes)
    seconds = time.perf_counter() - started
    figures = {"shards": len(manifest.shards), "shard_bytes": total,
               "verify_bytes_per_s": total / seconds if seconds > 0 else None}
    if bad:
        raise Failed(f"{len(bad)} of {len(manifest.shards)} shard(s) in {redact(url)} do not match the "
                     f"manifest: {'; '.join(sorted(bad))}; rerun `gpt2 prepare` with the same preset, --set and "
                     "--root: it rebuilds only what is damaged", **figures)
    return Outcome(f"{len(manifest.shards)} shards, {manifest.total_tokens:,} tokens, {total / 1e9:.2f} GB: sizes and "
                   f"sha256 match the manifest ({total / seconds / 1e6:.0f} MB/s)", figures), manifest


def init_weights(config: Config) -> Outcome:
    """train.init_from's weights (a fine-tune): in the root already, or a source that answers, to be
    read once before the first step (gpt2.weights.init). Raises Failed naming a source that does not."""
    source = config.train.init_from
    if fetched(config):
        return Outcome(f"train.init_from={redact(source)}: in the root ({redact(cache_dir(config))}), the source "
                       "is not read again", {"init_fetched": True})
    try:
        there = storage.exists(storage.normalize_url(source))
    except Exception as err:  # noqa: BLE001 - the hub or a bucket that does not answer: named with the URL
        raise Failed(f"train.init_from={redact(source)} cannot be reached ({type(err).__name__}: {redact(str(err))}); "
                     "check the URL, the network and the credentials") from None
    if not there:
        raise Failed(f"train.init_from={redact(source)} does not exist; give a Hugging Face GPT-2 directory, an llm.c "
                     "model .bin or a run's checkpoint")
    return Outcome(f"train.init_from={redact(source)} answers: its weights are read once into the root before the "
                   "first step", {"init_fetched": False})


def _reason(err: ShardError, shard_url: str) -> str:
    """The part of a shard error after its URL (the file name leads the line):
    "shard <url>: sha256 ...", "shard <url> has N bytes, ...", "shard <url> listed ..."."""
    text, prefix = str(err), f"shard {shard_url}"
    return text[len(prefix):].lstrip(":").strip() if text.startswith(prefix) else text


def _created_dirs(path: Path) -> list[Path]:
    """The missing directories of `path` (deepest first), to remove afterwards."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def _write_read_delete(directory: str, data: bytes) -> tuple[float, float]:
    """(write, read) bytes/s of `data` in an object under `directory`, which is
    removed again whatever happens (Ctrl-C, SIGTERM as SystemExit included),
    with any local directory the write created."""
    url = storage.join(directory, f".preflight-probe-{uuid.uuid4().hex[:12]}")
    local = storage.local_path(directory)
    created = _created_dirs(local) if local is not None else []
    try:
        t0 = time.perf_counter()
        storage.write_bytes_atomic(url, data)
        t1 = time.perf_counter()
        back = storage.read_bytes(url)
        t2 = time.perf_counter()
        if back != data:
            raise Failed(f"{redact(url)} read back differs from what was written: the storage "
                         "corrupts data")
        return len(data) / max(t1 - t0, 1e-9), len(data) / max(t2 - t1, 1e-9)
    finally:
        try:
            storage.remove(url)
        except FileNotFoundError:
            pass
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break


def root(config: Config, checkpoint_bytes: int, distributed: bool, probe_bytes: int = PROBE_BYTES) -> Outcome:
    """The run's directory under the root can be written, read back and
    deleted; the checkpoint save that bandwidth implies (the local copy in the
    work dir first, for a remote root) against the kill window of the pool."""
    run_dir = layout.run_dir(config)
    payload = os.urandom(probe_bytes)
    try:
        write_bps, read_bps = _write_read_delete(run_dir, payload)
    except Failed:
        raise
    except Exception as err:  # noqa: BLE001 - credentials, permissions, a missing bucket: all named
        raise Failed(f"cannot write, read back and delete an object under {redact(run_dir)} "
                     f"({type(err).__name__}: {err}); check --root, its permissions and credentials") from None
    remote = layout.local_root(config) is None
    local_bps = None
    if remote:
        work = config.runtime.work_root / "preflight"
        try:
            local_bps, _ = _write_read_delete(work.as_uri(), payload)
        except Exception as err:  # noqa: BLE001
            raise Failed(f"cannot write to the work dir {work} ({type(err).__name__}: {err}); set runtime.work_dir "
                         "to a writable local disk") from None
    save_s = checkpoint_bytes / write_bps + (checkpoint_bytes / local_bps if local_bps else 0)
    limit, what = kill_window(distributed, config.runtime.pool)
    figures = {"root_write_bytes_per_s": write_bps, "root_read_bytes_per_s": read_bps,
               "work_dir_write_bytes_per_s": local_bps, "checkpoint_bytes": checkpoint_bytes,
               "expected_checkpoint_save_s": save_s, "kill_window_s": limit}
    rates = f"write {write_bps / 1e6:.0f} MB/s, read {read_bps / 1e6:.0f} MB/s" + (
        f", work dir write {local_bps / 1e6:.0f} MB/s" if local_bps else "")
    detail = (f"{redact(run_dir)} written, read back and deleted ({rates}); a checkpoint "
              f"({checkpoint_bytes / 1e9:.2f} GB) saves in ~{save_s:.1f} s, the kill window is {limit:.0f} s")
    if save_s > limit:
        raise Warned(f"{detail} ({what}): a preemption would resume from the last periodic checkpoint, up to "
                     f"train.checkpoint_every={config.train.checkpoint_every} steps back; lower "
                     f"train.checkpoint_every, use a root closer to the GPUs, or {lengthen(what)}", **figures)
    return Outcome(detail, figures)
