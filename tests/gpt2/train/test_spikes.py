"""Loss spikes (gpt2.train.spikes, gpt2.train.rollback): a poisoned stretch of
data (two batches of one repeated token) met by runs with each policy."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.config.identity import SPIKE_KEYS, train_fingerprint, train_identity
from gpt2.root import layout, storage
from gpt2.train import rollback
from gpt2.train.attempts import read_attempts
from gpt2.train.run import train
from gpt2.train.session import TrainingError
from gpt2.train.spikes import SpikeDetector, robust_z
from tests.gpt2.train.fixtures import tiny_config, write_poisoned_dataset
from tests.gpt2.train.test_train import weights

pytestmark = pytest.mark.xdist_group("spikes")

POISONED = (14, 15)
"""Steps whose batches are one repeated token; checkpoints every 4 steps put the last before them at 12."""

SPIKES = {"train.max_steps": 18, "train.spike_window": 8, "train.checkpoint_every": 4, "train.eval_every": 18,
          "train.sample_every": 18, "eval.every_steps": 0, "train.spike_zscore": 6.0}
PER_SHARD = (4096 - 1) // 256
"""Global batches per shard of the poisoned dataset (gpt2.data.loader)."""


def spiky_config(root, policy: str, **more):
    return tiny_config(root, **{**SPIKES, "train.on_spike": policy, "tracking.enabled": False, **more})


def run(root, policy: str, poisoned=POISONED, **more):
    config = spiky_config(root, policy, **more)
    write_poisoned_dataset(config, poisoned)  # () : the same tokens, none poisoned
    return config, train(config)


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    return run(tmp_path_factory.mktemp("rollback"), "rollback")


def test_the_robust_z_score_ignores_one_outlier_in_the_window_and_flags_the_next():
    window = [3.0, 3.1, 2.9, 3.05, 2.95, 9.0]  # one spike already in it
    assert robust_z(window, 3.0) == pytest.approx(0.0, abs=0.5)
    assert robust_z(window, 4.0) > 6
    assert robust_z(window, 2.0) < 0  # a falling loss is never a spike
    assert robust_z([1.0] * 8, 1.0005) < 1 and robust_z([1.0] * 8, 1.1) > 6  # no spread: a floor, not a division by 0
    assert robust_z(window, math.nan) == math.inf


def test_nothing_is_judged_before_the_window_is_full_and_a_resumed_detector_judges_alike():
    detector = SpikeDetector(zscore=6, window=8)
    verdicts = [detector.judge(step, 3.0 + 0.01 * (step % 3), 1.0) for step in range(1, 9)]
    assert verdicts == [None] * 8
    resumed = SpikeDetector(zscore=6, window=8)
    resumed.load_state_dict(detector.state_dict())
    for d in (detector, resumed):
        verdict = d.judge(9, 3.0, 5.0)
        assert verdict.spike and verdict.grad_norm_z > 6 and verdict.loss_z < 6
    assert detector.state_dict() == resumed.state_dict()
    assert SpikeDetector(zscore=0, window=8).judge(1, math.nan, 1.0) is None  # off: the NaN error as before


def test_detection_off_and_warn_keep_todays_fingerprint_skip_and_rollback_have_their_own(tmp_path):
    today = tiny_config(tmp_path)
    assert not set(SPIKE_KEYS) & set(train_identity(today)["train"])  # warn at the default z-score
    off = tiny_config(tmp_path, **{"train.spike_zscore": 0, "train.on_spike": "rollback"})
    warn = tiny_config(tmp_path, **{"train.spike_window": 32, "train.max_rollbacks": 9})
    assert train_fingerprint(off) == train_fingerprint(warn) == train_fingerprint(today)
    skip = tiny_config(tmp_path, **{"train.on_spike": "skip"})
    back = tiny_config(tmp_path, **{"train.on_spike": "rollback"})
    assert len({train_fingerprint(today), train_fingerprint(skip), train_fingerprint(back)}) == 3
    # max_rollbacks changes nothing a skipping run does
    assert train_fingerprint(skip) == train_fingerprint(tiny_config(tmp_path, **{"train.on_spike": "skip",
                                                                                   "train.max_rollbacks": 9}))


def test_rollback_steps_over_every_batch_since_its_checkpoint(rolled_back):
    config, result = rolled_back
    assert result.steps == 18 and result.spikes == {"warned": 0, "skipped": 0, "rollbacks": 2}
    state = storage.read_json(storage.join(result.checkpoint, "state.json"))
    events = state["spikes"]["events"]
    # Step 14 met the first poisoned batch: back to 12, past batches 13 and 14; step 13 then met batch 15: back again.
    assert [(e["step"], e["to_step"]) for e in events] == [(14, 12), (13, 12)]
    assert events[0]["data_from"] == {"shard": 0, "offset": 12 * 256, "epoch": 0}
    assert events[-1]["data_to"] == {"shard": 1, "offset": 0, "epoch": 0}  # batch 15 was shard 0's last
    records = rollback.read_records(layout.checkpoint_dir(layout.run_dir(config), 12))
    assert [r["rollback"] for r in records] == [1, 2]
    # 18 steps trained on 21 batches: the three stepped over were never trained on.
    assert state["loader"] == {"shard": 1, "offset": (18 + 3 - PER_SHARD) * 256, "epoch": 0}


def test_every_rollback_is_a_line_in_the_attempt_record_and_billed(rolled_back):
    config, result = rolled_back
    (attempt,) = read_attempts(layout.run_dir(config))
    assert [e["action"] for e in attempt["spikes"]] == ["rollback", "rollback"]
    assert attempt["rolled_back_steps"] == (14 - 12) + (13 - 12)
    assert result.bill["steps_redone"] == 3


def test_skip_drops_the_updates_and_leaves_the_optimizer_as_it_was(tmp_path):
    config, result = run(tmp_path, "skip", (13, 14), **{"train.checkpoint_every": 2, "train.keep_checkpoints": 5})
    assert result.spikes == {"warned": 0, "skipped": 2, "rollbacks": 0}
    run_dir = layout.run_dir(config)
    before, after = (store.load_checkpoint(layout.checkpoint_dir(run_dir, s)) for s in (12, 14))
    assert after.state["loader"] != before.state["loader"]  # the data moved on
    for k, v in before.model.items():
        assert torch.equal(after.model[k], v), k
    for i, moments in before.optimizer["state"].items():
        for name, value in moments.items():
            assert torch.equal(after.optimizer["state"][i][name], value), (i, name)


def test_past_max_rollbacks_the_run_fails_naming_the_steps_and_the_data(tmp_path):
    config = spiky_config(tmp_path, "rollback", **{"train.max_rollbacks": 1})
    write_poisoned_dataset(config, POISONED)
    with pytest.raises(TrainingError, match=r"loss spike at step 13: .* after train.max_rollbacks=1") as err:
        train(config)
    assert "step 14 -> 12, data skipped from epoch 0 shard 0 offset 3072 to epoch 0 shard 0 offset 3584" in str(
        err.value)
