"""SIGTERM: the step finishes, a checkpoint is written, then the signal goes
on to the handler it replaced (Prefect's bridge: a Crashed run, which the
reschedule automation acts on; never Failed)."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from gpt2.checkpoint import store
from gpt2.root import storage
from gpt2.train.preemption import SigtermGuard
from gpt2.train.run import Preempted, train
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.tiers import scenario

REPO = Path(__file__).resolve().parents[3]


class HandedOn(Exception):
    pass


def _raise_handed_on(signum, frame):
    raise HandedOn(signum)


@pytest.fixture
def outer_handler():
    previous = signal.signal(signal.SIGTERM, _raise_handed_on)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def ctrl_c_heard():
    """SIGINT at Python's own handler, as in a terminal's foreground command: pytest started as a
    script's background job inherits it ignored, and these tests send themselves a Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigterm_at(step: int):
    def progress(info) -> None:
        if info.step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return progress


def _stopped_step(config) -> int:
    latest = store.latest_checkpoint(config)
    return storage.read_json(storage.join(latest, "state.json"))["step"]


def test_the_guard_holds_the_signal_then_hands_it_on(outer_handler):
    guard = SigtermGuard()
    with guard.installed():
        os.kill(os.getpid(), signal.SIGTERM)  # held: nothing raised here
        assert guard.requested
        with pytest.raises(HandedOn):
            guard.hand_on()
    assert signal.getsignal(signal.SIGTERM) is _raise_handed_on


def test_a_first_ctrl_c_is_held_like_sigterm_and_a_second_one_stops_at_once(ctrl_c_heard):
    before = signal.getsignal(signal.SIGINT)  # Python's, or the command's (gpt2.process.signals): both raise
    guard = SigtermGuard(interrupts=True)
    with guard.installed():
        os.kill(os.getpid(), signal.SIGINT)  # held: the step finishes, the checkpoint is written
        assert guard.requested and guard.why == "Ctrl-C"
        guard.hand_on()  # not handed on: the trainer says it stopped
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_launchers_sigterm_after_a_ctrl_c_is_the_same_stop_said_once(caplog, ctrl_c_heard):
    """#64 item 4: one Ctrl-C logged `Ctrl-C: finishing this step` and then, when the launcher
    handed it on as SIGTERM, `SIGTERM received: finishing this step`."""
    guard = SigtermGuard(interrupts=True)
    with caplog.at_level(logging.WARNING, logger="gpt2.train.preemption"), guard.installed():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    said = [r.getMessage() for r in caplog.records if r.name == "gpt2.train.preemption"]
    assert len(said) == 1 and said[0].startswith("Ctrl-C: finishing this step") and guard.why == "Ctrl-C"
    # The other order: the launcher's SIGTERM first (both pending while the trainer was in a long C
    # call; seen end to end): still one line, the stop still the Ctrl-C's, a second Ctrl-C at once.
    caplog.clear()
    echoed = SigtermGuard(interrupts=True)
    with caplog.at_level(logging.WARNING, logger="gpt2.train.preemption"), echoed.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert echoed.requested and echoed.why == "Ctrl-C"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    said = [r.getMessage() for r in caplog.records if r.name == "gpt2.train.preemption"]
    assert len(said) == 1 and "finishing this step" in said[0], said
    # The Ctrl-C's handler run inside the SIGTERM's, while that one logs (seen end to end: both lines,
    # the same millisecond): still one line, the stop the Ctrl-C's, a second Ctrl-C at once.
    caplog.clear()
    nested = SigtermGuard(interrupts=True)

    class CtrlCWhileSaying(logging.Handler):
        def emit(self, record) -> None:
            if record.getMessage().startswith("SIGTERM received"):
                os.kill(os.getpid(), signal.SIGINT)  # its handler runs before this one returns

    during = CtrlCWhileSaying()
    logging.getLogger("gpt2.train.preemption").addHandler(during)
    try:
        with caplog.at_level(logging.WARNING, logger="gpt2.train.preemption"), nested.installed():
            os.kill(os.getpid(), signal.SIGTERM)
            assert nested.requested and nested.why == "Ctrl-C"
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        logging.getLogger("gpt2.train.preemption").removeHandler(during)
    said = [r.getMessage() for r in caplog.records if r.name == "gpt2.train.preemption"]
    assert len(said) == 1 and "finishing this step" in said[0], said
    lone = SigtermGuard()
    with caplog.at_level(logging.WARNING, logger="gpt2.train.preemption"), lone.installed():
        os.kill(os.getpid(), signal.SIGTERM)  # a SIGTERM of its own is still said
    assert caplog.records[-1].getMessage().startswith("SIGTERM received")


def test_a_process_started_with_ctrl_c_ignored_keeps_ignoring_it():
    """A shell's background job (`gpt2 train &`) is not stopped by the terminal's Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with SigtermGuard(interrupts=True).installed():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_in_training_writes_a_checkpoint_and_the_rerun_resumes_there(tmp_path, ctrl_c_heard):
    config = tiny_config(tmp_path, **{"train.checkpoint_every": 100})
    write_dataset(config)

    def ctrl_c_at_3(info) -> None:
        if info.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Preempted, match="stopped by Ctrl-C after step"):
        train(config, progress=ctrl_c_at_3)
    stopped = _stopped_step(config)
    assert 3 <= stopped < config.train.max_steps
    assert train(config).resumed_from_step == stopped


def test_after_the_checkpoint_the_replaced_handler_gets_the_signal(tmp_path, outer_handler):
    config = tiny_config(tmp_path, **{"train.checkpoint_every": 100})  # only SIGTERM and the end write one
    write_dataset(config)
    with pytest.raises(HandedOn):
        train(config, progress=_sigterm_at(3))
    assert 3 <= _stopped_step(config) < config.train.max_steps
    resumed = train(config)
    assert resumed.resumed_from_step == _stopped_step(config) or resumed.steps == config.train.max_steps


def test_without_a_handler_above_it_is_preempted(tmp_path):
    config = tiny_config(tmp_path, **{"train.checkpoint_every": 100})
    write_dataset(config)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Preempted, match="rerun the same command to resume"):
            train(config, progress=_sigterm_at(2))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _stopped_step(config) >= 2


FLOW_SCRIPT = """
import json, os, signal, sys
from prefect import flow
from prefect.runtime import flow_run
from gpt2.config.tree import Config
from gpt2.train.run import train

config = Config.model_validate(json.load(open(sys.argv[1])))

def progress(info):
    if info.step == 3:
        os.kill(os.getpid(), signal.SIGTERM)

@flow(name="sigterm-probe")
def training_flow():
    print("flow run", flow_run.id, flush=True)
    train(config, progress=progress)

training_flow()
"""


@scenario
def test_a_prefect_flow_run_ends_crashed_not_failed(tmp_path, prefect_server):
    """In its own process: after Prefect's bridge marks the run Crashed, it
    ends the process with the signal, as a preempted machine would see."""
    config = tiny_config(tmp_path, **{"train.checkpoint_every": 100})
    write_dataset(config)
    script = tmp_path / "probe.py"
    script.write_text(FLOW_SCRIPT)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), str(write_run_json(config, tmp_path / "run.json"))],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout + done.stderr  # it did not finish the run
    run_id = re.search(r"flow run ([0-9a-f-]{36})", done.stdout).group(1)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state.type.value == "CRASHED", f"{state.name}: {state.message}\n{done.stderr[-3000:]}"
    assert _stopped_step(config) >= 3
