"""`eval.core_bundle`: the CORE tasks fetched once into the root and kept there, as the data
stage keeps its shards and a fine-tune its starting weights.

    <root>/eval-bundles/<name>-<source hash>/
      core.yaml, eval_meta_data.csv, eval_data/<task>.jsonl   the files the tasks need
      bundle.json    the source, its sha256, each file's sha256 and size: written last

The source is a directory or a zip (nanochat's eval_bundle.zip holds an `eval_bundle/` folder),
local or any fsspec URL. Only the files core.yaml names are copied; a bundle without one of them
is refused by name before anything is written. An evaluation reads the copy, each file checked
against the record.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import zipfile
from typing import TYPE_CHECKING, Callable

from gpt2.eval.core.bundle import CONFIG, CoreBundleError, CoreTask, parse_tasks, read_bundle
from gpt2.root import layout, storage

if TYPE_CHECKING:
    from gpt2.config.tree import Config

RECORD = "bundle.json"
DEFAULT_BUNDLE = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
"""nanochat's CORE bundle (~162 MB): DCLM's 22 tasks."""


def _zip_reader(data: bytes, source: str) -> Callable[[str], bytes | None]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise CoreBundleError(f"CORE bundle {source} is not a zip file: give a directory or a zip") from None
    names = set(archive.namelist())
    # core.yaml at the top, or in the one folder the zip holds (nanochat's eval_bundle/).
    tops = sorted((n for n in names if posixpath.basename(n) == CONFIG), key=lambda n: n.count("/"))
    prefix = posixpath.dirname(tops[0]) + "/" if tops and "/" in tops[0] else ""
    return lambda rel: archive.read(prefix + rel) if prefix + rel in names else None


def _dir_reader(url: str) -> Callable[[str], bytes | None]:
    def read(rel: str) -> bytes | None:
        try:
            return storage.read_bytes(storage.join(url, rel))
        except (FileNotFoundError, IsADirectoryError):
            return None
    return read


def _source_files(source: str) -> tuple[dict[str, bytes], str]:
    """Every file the bundle's tasks need, by relative path, and the source's sha256 (the zip's,
    or for a directory the hash of its files' hashes)."""
    url = storage.normalize_url(source)
    try:
        if not storage.exists(url):
            raise CoreBundleError(f"CORE bundle {source} does not exist: set eval.core_bundle to a directory or zip "
                                  "holding core.yaml, eval_meta_data.csv and eval_data/ (a local path or a URL)")
        if storage.exists(storage.join(url, CONFIG)) or not url.endswith(".zip"):
            _, files = read_bundle(_dir_reader(url), source)
            listing = "".join(f"{k} {hashlib.sha256(v).hexdigest()}\n" for k, v in sorted(files.items()))
            return files, hashlib.sha256(listing.encode()).hexdigest()
        data = storage.read_bytes(url)
    except CoreBundleError:
        raise
    except Exception as err:  # noqa: BLE001 - a URL or bucket that does not answer, named as the data stage names one
        raise CoreBundleError(f"CORE bundle {source} cannot be read ({type(err).__name__}: {str(err)[:200]}): check "
                              "the URL, the network and the credentials") from None
    _, files = read_bundle(_zip_reader(data, source), source)
    return files, hashlib.sha256(data).hexdigest()


def fetched(root_url: str, source: str) -> dict | None:
    """The record of `source`'s copy under the root; None when it was never fetched (the source is not read)."""
    directory = layout.core_bundle_dir(root_url, source)
    record = storage.read_record(storage.join(directory, RECORD))
    return None if record is None else {**record, "dir": directory}


def fetch(root_url: str, source: str) -> dict:
    """The record of `source`'s copy under the root, written (source read once) if there is none."""
    directory = layout.core_bundle_dir(root_url, source)
    record = fetched(root_url, source)
    if record is not None:
        return record
    files, digest = _source_files(source)
    for rel, data in sorted(files.items()):
        storage.write_bytes_atomic(storage.join(directory, rel), data)
    record = {"source": source, "sha256": digest,
              "files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for rel, d in files.items()}}
    storage.write_record(storage.join(directory, RECORD), record)
    return {**record, "dir": directory}


def read_file(record: dict, rel: str) -> bytes:
    """A file of the fetched bundle, checked against its record; CoreBundleError naming it."""
    url = storage.join(record["dir"], rel)
    expected = record["files"].get(rel, {}).get("sha256")
    try:
        data = storage.read_bytes(url)
    except FileNotFoundError:
        data = None
    if data is None or hashlib.sha256(data).hexdigest() != expected:
        raise CoreBundleError(f"CORE bundle {record['source']}: {url} is missing or damaged (sha256 differs from "
                              f"{RECORD}); delete {record['dir']} to fetch the bundle again")
    return data


def fetched_tasks(record: dict) -> tuple[CoreTask, ...]:
    """The tasks of a fetched bundle (read from its checked copy)."""
    return parse_tasks(read_file(record, CONFIG).decode("utf-8"),
                       read_file(record, "eval_meta_data.csv").decode("utf-8"), record["source"])


def for_training(config: Config, fetching: bool = True) -> dict | None:
    """The bundle eval.core_every scores in the training loop (None: it scores none). The launcher and
    the pipeline's parent fetch it into the root before any rank starts (`fetching`); a training
    process only reads the root's copy (`fetching=False`), never the source, so a bundle not fetched
    yet is refused there in one line, before the first step."""
    cfg = config.eval
    if not cfg.core_every:
        return None
    root = layout.root(config)
    record = fetch(root, cfg.core_bundle) if fetching else fetched(root, cfg.core_bundle)
    if record is None:
        raise CoreBundleError(f"eval.core_every={cfg.core_every}: CORE bundle {cfg.core_bundle} is not in the root "
                              f"yet ({layout.core_bundle_dir(root, cfg.core_bundle)}); start training with gpt2 train "
                              "or gpt2 run, which fetch it first, or set eval.core_every=0")
    return record
