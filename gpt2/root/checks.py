"""Is this root usable? Asked where a root enters (the CLI's first second) and before a stage
writes: it answers, it can be written, it is not a file. Each failure is one StorageError that
names the root and what to do."""

from __future__ import annotations

import uuid

from gpt2.root.storage import StorageError, exists, join, local_path, remove, write_bytes_atomic
from gpt2.secrets import redact


def check_writable(root: str) -> None:
    """Fail early, naming the root, when nothing can be written there."""
    probe = join(root, f".write-probe-{uuid.uuid4().hex[:8]}")
    try:
        write_bytes_atomic(probe, b"ok")
        remove(probe)
    except Exception as err:  # noqa: BLE001 - any failure means "not writable"
        raise StorageError(
            f"artifact root {root} is not writable ({type(err).__name__}: {err}); "
            "pass a writable --root (a local directory or a bucket URL you can write to)"
        ) from err


def check_not_a_file(root: str) -> None:
    """A local root that is a file, or lies under one, can never be a folder: say that, not
    "not writable" (which sends the user looking at permissions)."""
    path = local_path(root)
    if path is None:
        return
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == path else f"lies under a file ({existing})"
        raise StorageError(f"artifact root {root} {where}, not a folder: pass a folder (or a new path) as --root")


def check_reachable(root: str) -> None:
    """Fail early, naming the root, when its storage does not answer (a host
    that cannot be reached, a refused connection): one listing, before any
    server starts or stage runs."""
    try:
        exists(root)
    except Exception as err:  # noqa: BLE001 - whatever the filesystem raised, the root is what to name
        raise StorageError(f"artifact root {redact(root)} cannot be reached ({type(err).__name__}: "
                           f"{redact(str(err))}); check the URL, the network and the credentials") from err
