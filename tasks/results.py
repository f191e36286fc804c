"""Prefect task results kept in the artifact root as data, never as code.

The root is a shared bucket that several people and machines write. Prefect's
default result records are cloudpickle, and a record names its own serializer,
so a planted record under `<root>/.prefect/results` would run code on every
worker (GPU pods and their credentials included) at the next cache check:
Prefect deserializes a record even to learn whether it exists.

So the stage tasks store results as plain JSON (`RootJSONSerializer`: only
the result types listed in RESULT_TYPES come back as objects, validated field
by field, nothing is imported by name), and the storage block
(`RootResultStorage`) hands Prefect a record only when it names that
serializer. Anything else is refused before Prefect sees it and counts as
"no cached result": the stage runs again (every stage is idempotent) and its
fresh record replaces the planted one.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar, Literal

from prefect._internal.compatibility.async_dispatch import async_dispatch
from prefect.filesystems import WritableFileSystem
from prefect.serializers import Serializer
from pydantic import TypeAdapter

from gpt2.data.shard import LocalShards
from gpt2.data.sources import SourceFiles
from gpt2.data.tokenized import Tokenized
from gpt2.root import storage

log = logging.getLogger(__name__)

SERIALIZER_TYPE = "gpt2-json"

# The task results that are not plain JSON. A record naming any other type
# is refused: decoding never imports or calls what a record names.
RESULT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (SourceFiles, Tokenized, LocalShards)}
_TYPE_TAG = "__gpt2_type__"


class RefusedResult(ValueError):
    """A result record in the root that this pipeline did not write as data."""


_ERROR_TAG = "error"


class StageFailed(Exception):
    """A stage's failure as its result record keeps it: the error's type and
    message, read back as data (never the class the record names)."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, BaseException):
        # Prefect persists a failed task's exception as its result: kept as
        # data, so every failure does not log that it could not be serialized.
        return {_TYPE_TAG: _ERROR_TAG, "data": {"type": type(obj).__qualname__, "message": str(obj)}}
    name = type(obj).__name__
    if RESULT_TYPES.get(name) is type(obj):
        return {_TYPE_TAG: name, "data": TypeAdapter(type(obj)).dump_python(obj, mode="json")}
    raise TypeError(f"{type(obj).__qualname__} is not a stage result type (add it to tasks.results.RESULT_TYPES)")


def _decode(obj: dict) -> Any:
    if _TYPE_TAG not in obj:
        return obj
    if obj[_TYPE_TAG] == _ERROR_TAG:
        data = obj["data"]
        return StageFailed(f"{data['type']}: {data['message']}")
    cls = RESULT_TYPES.get(obj[_TYPE_TAG])
    if cls is None:
        raise RefusedResult(f"result names unknown type {obj[_TYPE_TAG]!r}")
    return TypeAdapter(cls).validate_python(obj["data"])


class RootJSONSerializer(Serializer):
    """Plain JSON; the result types in RESULT_TYPES are tagged by name."""

    type: Literal["gpt2-json"] = SERIALIZER_TYPE

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, default=_encode, sort_keys=True).encode()

    def loads(self, blob: bytes) -> Any:
        return json.loads(blob, object_hook=_decode)


def check_record(content: bytes, where: str) -> None:
    """Refuse a result record that is not a JSON record naming RootJSONSerializer."""
    try:
        record = json.loads(content)
        kind = record["metadata"]["serializer"]["type"]
    except (ValueError, TypeError, KeyError) as err:
        raise RefusedResult(f"{where} is not a result record of this pipeline ({type(err).__name__})") from None
    if kind != SERIALIZER_TYPE:
        raise RefusedResult(f"{where} names serializer {kind!r}; only {SERIALIZER_TYPE!r} records are read")


class RootResultStorage(WritableFileSystem):
    """Result storage under the artifact root that reads only JSON records."""

    _block_type_name: ClassVar[str] = "gpt2 root results"
    _block_type_slug: ClassVar[str] = "gpt2-root-results"

    basepath: str

    def _url(self, key: str) -> str:
        # Keys are the tasks' cache keys (step-fingerprint-version): plain
        # names. Anything else would address files outside the results folder.
        if not key or "/" in key or "\\" in key or key.startswith("."):
            raise RefusedResult(f"result key {key!r} is not a plain file name")
        return storage.join(self.basepath, key)

    async def aread_path(self, path: str) -> bytes:
        return self.read_path(path, _sync=True)

    @async_dispatch(aread_path)
    def read_path(self, path: str) -> bytes:
        url = self._url(path)
        content = storage.read_bytes(url)
        try:
            check_record(content, url)
        except RefusedResult as err:
            # Prefect treats a failed read as "no cached result": the stage
            # runs again and overwrites this record.
            log.warning("ignoring cached result: %s", err)
            raise
        return content

    async def awrite_path(self, path: str, content: bytes) -> str:
        return self.write_path(path, content, _sync=True)

    @async_dispatch(awrite_path)
    def write_path(self, path: str, content: bytes) -> str:
        storage.write_bytes_atomic(self._url(path), content)
        return path
