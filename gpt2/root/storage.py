"""The artifact root: any fsspec URL (file://, gs://, s3://, memory://).

Writes are atomic, so a reader never sees a partial file under its final name.
On object stores (GCS, S3, Azure) an object only becomes visible once its
upload completes, so bytes go straight to the final name; a temporary name
plus a move would cost a server-side copy (GCS has no atomic rename). Other
filesystems get a temporary name beside the target, then a rename; on a
local disk the bytes are fsynced before the rename and the directory after
it, so a power loss or a kernel crash leaves the old file or the new one,
never a renamed file whose blocks never reached the disk.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from gpt2.errors import UserError


class StorageError(UserError, RuntimeError):
    """The artifact root cannot be used; the message names the URL."""


def normalize_url(url: str) -> str:
    """Make local paths absolute `file://` URLs so they mean the same thing in
    every process (workers run in other directories); other URLs pass as is."""
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    if url.startswith("file://"):
        return "file://" + os.path.abspath(os.path.expanduser(url[len("file://"):]))
    return url.rstrip("/")


def join(url: str, *parts: str) -> str:
    return posixpath.join(url.rstrip("/"), *parts)


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = url_to_fs(url)
    return fs, path


def local_path(url: str) -> Path | None:
    """The local path of a file:// URL (None for remote URLs)."""
    fs, path = filesystem(url)
    return Path(path) if "file" in _protocols(fs) else None


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def size(url: str) -> int | None:
    fs, path = filesystem(url)
    try:
        return int(fs.size(path))
    except FileNotFoundError:
        return None


def read_bytes(url: str, start: int | None = None, end: int | None = None) -> bytes:
    fs, path = filesystem(url)
    if start is None and end is None:
        return fs.cat_file(path)
    return fs.cat_file(path, start=start, end=end)


def read_json(url: str) -> Any:
    return json.loads(read_bytes(url))


# Protocols whose uploads are all-or-nothing by the store's own guarantee.
OBJECT_STORES = frozenset({"gs", "gcs", "s3", "s3a", "az", "abfs", "abfss"})


def _writes_atomically(fs: fsspec.AbstractFileSystem) -> bool:
    return bool(OBJECT_STORES & set(_protocols(fs)))


def _tmp_name(path: str) -> str:
    head, tail = posixpath.split(path)
    return posixpath.join(head, f".{tail}.tmp-{uuid.uuid4().hex[:8]}")


def _commit(fs: fsspec.AbstractFileSystem, tmp: str, path: str) -> None:
    try:
        fs.mv(tmp, path)
    except Exception:
        fs.rm(tmp)
        raise


def fsync_file(path: str | Path) -> None:
    """Flush a local file's bytes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new name in a local directory durable."""
    try:
        fsync_file(path)
    except OSError:  # some filesystems refuse fsync on a directory: nothing more to do there
        pass


def replace_durably(tmp: str | Path, final: str | Path) -> None:
    """Rename a finished local temporary file to its final name, durably."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(os.path.abspath(final)))


def _write_local(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)  # a full disk raises here: the old file stays
        replace_durably(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(url: str, data: bytes) -> None:
    local = local_path(url)
    if local is not None:
        _write_local(local, data)
        return
    fs, path = filesystem(url)
    if _writes_atomically(fs):
        fs.pipe_file(path, data)
        return
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    tmp = _tmp_name(path)
    try:
        fs.pipe_file(tmp, data)
    except Exception:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    _commit(fs, tmp, path)


def write_json_atomic(url: str, obj: Any) -> None:
    write_bytes_atomic(url, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


# --- completion records ---------------------------------------------------
# A step is done when its record exists and parses. The record is written
# last and atomically, so a reader never sees half of one; a record that is
# missing, empty or torn all the same means "not done", and the step is redone.


def write_record(url: str, record: Any) -> None:
    """Mark a step done: its record (a JSON object), written atomically, last."""
    write_json_atomic(url, record)


def read_record(url: str) -> Any | None:
    """The record at `url`, or None when the step is not done (no record, or
    one that does not parse)."""
    try:
        return json.loads(read_bytes(url))
    except (FileNotFoundError, ValueError):
        return None


def create_exclusive(url: str, data: bytes) -> None:
    """Create `url` holding `data`, whole, only if nothing is there yet;
    FileExistsError otherwise. Of two writers racing, exactly one wins:
    locally a hard link of a finished temporary file (atomic, refuses an
    existing name); elsewhere fsspec's exclusive create (GCS's
    ifGenerationMatch=0, S3's If-None-Match, memory's check under the GIL)."""
    local = local_path(url)
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_bytes(data)
            fsync_file(tmp)
            os.link(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(local.parent)
        return
    fs, path = filesystem(url)
    fs.pipe_file(path, data, mode="create")


def put_file_atomic(local: str | Path, url: str) -> None:
    """Upload a local file to `url`; nothing appears under `url` until it is whole."""
    dest = local_path(url)
    if dest is not None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            shutil.copyfile(local, tmp)
            replace_durably(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return
    fs, path = filesystem(url)
    if _writes_atomically(fs):
        fs.put_file(str(local), path)
        return
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    tmp = _tmp_name(path)
    try:
        fs.put_file(str(local), tmp)
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    _commit(fs, tmp, path)


def get_file(url: str, local: str | Path) -> None:
    """Download `url` to a local path atomically (temporary name, then rename)."""
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.tmp-{uuid.uuid4().hex[:8]}")
    fs, path = filesystem(url)
    try:
        fs.get_file(path, str(tmp))
        replace_durably(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)


def remove(url: str, recursive: bool = False) -> None:
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm(path, recursive=recursive)


def list_dir(url: str) -> list[str]:
    """Names (not paths) directly under `url`; empty when it does not exist."""
    fs, path = filesystem(url)
    try:
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []


def list_sizes(url: str) -> dict[str, int]:
    """{name: bytes} of the files directly under `url` (one listing); empty when it does not exist."""
    fs, path = filesystem(url)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return {}
    return {posixpath.basename(e["name"].rstrip("/")): int(e.get("size") or 0)
            for e in entries if e.get("type") != "directory"}
