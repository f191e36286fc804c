"""The root is data, never code: task results are JSON, and a record planted
in the root (a cloudpickle payload, a Prefect JSON record naming a class to
build) runs nothing; the stage is recomputed and its record replaced."""

from __future__ import annotations

import json
import pathlib

import pytest
from prefect._internal.result_records import ResultRecord, ResultRecordMetadata
from prefect.serializers import JSONSerializer, PickleSerializer

from gpt2.config.overrides import resolve_config
from gpt2.data.sources import SourceFiles
from gpt2.root import layout
from gpt2.root.storage import local_path
from tasks.results import RefusedResult, RootJSONSerializer, RootResultStorage, check_record


class _Planted:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _record(serializer, result, key: str) -> bytes:
    metadata = ResultRecordMetadata(serializer=serializer, storage_key=key)
    return ResultRecord(metadata=metadata, result=result).serialize()


def test_serializer_round_trips_stage_results_and_refuses_unknown_types():
    ser = RootJSONSerializer()
    src = SourceFiles(url="builtin:x", format="json", files=("a", "b"), sizes=(1, 2))
    assert ser.loads(ser.dumps({"src": src, "n": 3})) == {"src": src, "n": 3}
    with pytest.raises(RefusedResult, match="unknown type 'Popen'"):
        ser.loads(json.dumps({"__gpt2_type__": "Popen", "data": {"args": "true"}}).encode())
    with pytest.raises(TypeError, match="not a stage result type"):
        ser.dumps(pathlib.Path("x"))


def test_records_naming_another_serializer_are_refused(tmp_path):
    marker = tmp_path / "ran"
    pickled = _record(PickleSerializer(), _Planted(marker), "k")
    with pytest.raises(RefusedResult, match="names serializer 'pickle'"):
        check_record(pickled, "k")
    prefect_json = _record(JSONSerializer(), {"a": 1}, "k")
    with pytest.raises(RefusedResult, match="names serializer 'json'"):
        check_record(prefect_json, "k")
    for junk in (b"", b"\x80\x04K\x01.", b"[1]", b'{"metadata": {}}'):
        with pytest.raises(RefusedResult, match="not a result record"):
            check_record(junk, "k")
    assert not marker.exists()


def test_storage_refuses_keys_outside_its_folder(tmp_path):
    store = RootResultStorage(basepath=str(tmp_path))
    for key in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(RefusedResult, match="plain file name"):
            store.write_path(key, b"{}", _sync=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["pickle", "prefect-json"])
def test_a_planted_record_in_the_root_runs_nothing(prefect_server, tmp_path, kind):
    from flows.data import data_flow

    args = {"preset": "smoke", "overrides": {"runtime.work_dir": str(tmp_path / "work")},
            "root": str(tmp_path / "root")}
    first = data_flow(**args)
    results = local_path(layout.prefect_results(resolve_config("smoke", args["overrides"], root=args["root"])))
    [download_key] = [p.name for p in results.iterdir() if p.name.startswith("download-")]
    marker = tmp_path / "code-ran"
    if kind == "pickle":
        planted = _record(PickleSerializer(), _Planted(marker), download_key)
    else:  # Prefect's JSON decoder builds whatever class a record names
        planted = json.dumps({
            "metadata": {"storage_key": download_key, "expiration": None, "serializer": {"type": "json"}},
            "result": json.dumps({"__class__": "pathlib.Path", "data": str(marker)}),
        }).encode()
    (results / download_key).write_bytes(planted)

    again = data_flow(**args)

    assert not marker.exists()
    assert again["manifest"] == first["manifest"]
    assert "download" not in again["cached_steps"]  # refused, so recomputed
    assert json.loads((results / download_key).read_bytes())["metadata"]["serializer"]["type"] == "gpt2-json"
    assert data_flow(**args)["cached"] is True


def test_a_stage_failure_is_kept_as_data_and_read_back_as_its_message(prefect_server, tmp_path, caplog):
    """Prefect persists a failed task's exception as its result: with this
    serializer as a record of the error's type and message, not a warning that
    it could not be serialized (on every trainer failure, before)."""
    import asyncio
    import logging
    import uuid

    from prefect.results import ResultStore
    from prefect.states import exception_to_failed_state

    from gpt2.train.session import TrainingError
    from tasks.results import StageFailed

    block = RootResultStorage(basepath=str(tmp_path))
    block.save(f"gpt2-results-failure-{uuid.uuid4().hex[:8]}")  # saved, as tasks.common.result_storage does
    store = ResultStore(result_storage=block, serializer=RootJSONSerializer())
    with caplog.at_level(logging.WARNING):
        state = asyncio.run(exception_to_failed_state(TrainingError("loss is NaN at step 3"), result_store=store,
                                                      write_result=True))
    assert state.is_failed() and "serialize" not in caplog.text and "Failed to write" not in caplog.text
    [written] = list(tmp_path.iterdir())
    check_record(written.read_bytes(), written.name)  # a record of this pipeline: JSON naming gpt2-json
    again = ResultStore(result_storage=block, serializer=RootJSONSerializer())  # another process's reader
    error = again.read(written.name).result
    assert isinstance(error, StageFailed) and str(error) == "TrainingError: loss is NaN at step 3"
