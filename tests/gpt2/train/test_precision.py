"""train.precision (gpt2.train.precision): the choice a device's capabilities make,
fingerprints left alone, and an fp16 run with its loss scaler on the CPU (torch runs
fp16 autocast and GradScaler there): it trains, keeps the scaler's state in its
checkpoints, and counts a step whose gradient came back inf."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow import MlflowClient

from gpt2.config.identity import legacy_train_fingerprint, model_data_fingerprint, train_fingerprint
from gpt2.config.tree import Config
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri
from gpt2.train.attempts import read_attempts
from gpt2.train.precision import DeviceCaps, LossScaler, PrecisionError, attention_kernel, choose_precision, device_caps
from gpt2.train.run import train
from gpt2.train.step import StepContext, train_step
from tests.gpt2.train.fixtures import tiny_config, write_dataset

pytestmark = pytest.mark.xdist_group("precision")

T4 = DeviceCaps("cuda", "Tesla T4", bf16=False, capability=(7, 5))
P100 = DeviceCaps("cuda", "Tesla P100-PCIE-16GB", bf16=False, capability=(6, 0))
A100 = DeviceCaps("cuda", "NVIDIA A100-SXM4-40GB", bf16=True, capability=(8, 0))
CPU = DeviceCaps("cpu", "cpu", bf16=True)


def test_auto_picks_bf16_where_native_fp16_with_a_scaler_where_not_fp32_on_a_cpu():
    assert choose_precision("auto", A100).name == "bf16" and not choose_precision("auto", A100).scaled
    for card in (T4, P100):
        chosen = choose_precision("auto", card)
        assert (chosen.name, chosen.dtype, chosen.scaled) == ("fp16", torch.float16, True)
        assert card.name in chosen.why and "no native bf16" in chosen.why
    cpu = choose_precision("auto", device_caps(torch.device("cpu")))
    assert (cpu.name, cpu.dtype, cpu.scaled) == ("fp32", None, False)
    assert choose_precision("fp16", A100).scaled and choose_precision("fp32", A100).dtype is None


def test_bf16_on_a_card_without_it_is_refused_naming_the_card_and_what_to_set():
    with pytest.raises(PrecisionError) as err:
        choose_precision("bf16", T4)
    message = str(err.value)
    assert "Tesla T4" in message and "7.5" in message and "train.precision=fp16" in message and "auto" in message
    assert "\n" not in message


def test_the_attention_kernel_is_the_one_the_device_has():
    assert attention_kernel(A100, choose_precision("auto", A100)) == "flash"
    assert attention_kernel(T4, choose_precision("auto", T4)) == "memory-efficient"
    assert attention_kernel(CPU, choose_precision("auto", CPU)) == "cpu flash"


def test_precision_enters_no_fingerprint(tmp_path):
    base = tiny_config(tmp_path)
    for value in ("auto", "bf16", "fp16", "fp32"):
        other = tiny_config(tmp_path, **{"train.precision": value})
        assert train_fingerprint(other) == train_fingerprint(base)
        assert legacy_train_fingerprint(other) == legacy_train_fingerprint(base)
        assert model_data_fingerprint(other) == model_data_fingerprint(base)
        assert layout.run_name(other) == layout.run_name(base)
    assert base.train.precision == "auto"


def test_an_unknown_precision_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="precision"):
        tiny_config(tmp_path, **{"train.precision": "fp8"})


def _step_setup():
    torch.manual_seed(0)
    config = Config.model_validate({"preset": "smoke", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                                                 "block_size": 8}})
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    x = torch.randint(0, 500, (2, 9))
    return model, optimizer, StepContext(env, torch.float16, 1.0, scaler=LossScaler("cpu")), [(x[:, :-1], x[:, 1:])]


def test_an_inf_gradient_skips_the_update_halves_the_scale_and_is_counted():
    model, optimizer, ctx, batches = _step_setup()
    train_step(model, model, optimizer, batches, ctx)  # a clean step first: AdamW's state exists
    scale = ctx.scaler.scale_value
    skipped_before = ctx.scaler.skipped
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state[model.lm_head.weight].items()}
    hook = model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    loss, norm = train_step(model, model, optimizer, batches, ctx)
    hook.remove()
    assert torch.isfinite(torch.tensor(loss)) and not torch.isfinite(torch.tensor(norm))
    assert ctx.scaler.last_skipped and ctx.scaler.skipped == skipped_before + 1
    assert ctx.scaler.scale_value == scale / 2
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, moments[k]) for k, v in optimizer.state[model.lm_head.weight].items())
    train_step(model, model, optimizer, batches, ctx)  # and the next step trains again
    assert not ctx.scaler.last_skipped
    assert not torch.equal(model.lm_head.weight, weights["lm_head.weight"])


def test_the_scaler_state_round_trips_through_json():
    model, optimizer, ctx, batches = _step_setup()
    for _ in range(3):
        train_step(model, model, optimizer, batches, ctx)
    state = json.loads(json.dumps(ctx.scaler.state_dict()))
    again = LossScaler("cpu")
    again.load_state_dict(state)
    assert again.state_dict() == ctx.scaler.state_dict() and again.scale_value == ctx.scaler.scale_value


class _InfAtForward:
    """Makes the gradient of the token embedding's output inf at the `at`-th forward
    that needs gradients (a step's micro-batches count one each): an injected overflow."""

    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def __call__(self, module, args, output):
        if not isinstance(module, torch.nn.Embedding) or not output.requires_grad or module.num_embeddings < 1000:
            return None
        self.seen += 1
        if self.seen == self.at:
            output.register_hook(lambda g: torch.full_like(g, float("inf")))
        return None


def _metric(config, run_id: str, key: str) -> list[float]:
    return [m.value for m in MlflowClient(default_tracking_uri(config)).get_metric_history(run_id, key)]


def test_an_fp16_run_trains_keeps_its_scaler_and_counts_an_injected_inf_gradient(tmp_path):
    # Four steps of half the tiny batch (fp16 matmuls are slow on a CPU: a micro-batch of 4x32 took
    # 0.86 CPU-s, of 2x32 0.43, against 0.21 and 0.07 in fp32): the overflow at step 3 is not the last's.
    fp16 = {"train.precision": "fp16", "train.max_steps": 4, "train.total_batch_tokens": 128,
            "train.micro_batch_size": 2}
    clean_config = tiny_config(tmp_path / "clean", **fp16)
    write_dataset(clean_config)
    clean = train(clean_config)
    assert clean.precision == "fp16" and clean.steps == 4
    state = storage.read_json(storage.join(clean.checkpoint, "state.json"))
    assert state["precision"] == "fp16" and state["loss_scaler"]["skipped_steps"] == clean.skipped_steps
    assert state["loss_scaler"]["scale"] > 0
    history = state["history"]["train"]
    assert history[-1][1] < history[0][1]
    assert len(_metric(clean_config, clean.mlflow_run_id, "train/loss_scale")) == 4

    config = tiny_config(tmp_path / "inf", **fp16)
    write_dataset(config)
    # Two micro-batches a step (128 tokens / (2 x 32)): the 5th forward is step 3's first.
    handle = torch.nn.modules.module.register_module_forward_hook(_InfAtForward(5))
    try:
        result = train(config)
    finally:
        handle.remove()
    assert result.skipped_steps == clean.skipped_steps + 1
    assert result.spikes == {"warned": 0, "skipped": 0, "rollbacks": 0}  # an overflow is not a loss spike
    assert _metric(config, result.mlflow_run_id, "train/skipped_steps")[-1] == result.skipped_steps
    record = read_attempts(layout.run_dir(config))[-1]
    assert record["precision"] == "fp16" and record["skipped_steps"] == result.skipped_steps
    assert record["last_skipped_step"] >= 3


def test_auto_on_a_cpu_trains_in_fp32_with_no_scaler_as_before(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": 2, "train.eval_every": 2})
    write_dataset(config)
    result = train(config)
    assert result.precision == "fp32" and result.skipped_steps is None
    state = storage.read_json(storage.join(result.checkpoint, "state.json"))
    assert state["loss_scaler"] is None and state["train_fingerprint"] == train_fingerprint(config)


class _StopAfter:
    def __init__(self, step: int):
        self.step = step

    def __call__(self, info) -> None:
        if info.step > self.step:
            raise RuntimeError(f"stopped by the test after step {self.step}")


def test_a_checkpoint_without_scaler_state_resumes_in_fp16_with_a_fresh_scaler(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": 4})
    write_dataset(config)
    with pytest.raises(Exception, match="stopped by the test"):
        train(config, progress=_StopAfter(2))  # fp32: its checkpoint has no scaler state, as an older release's
    state = storage.read_json(storage.join(layout.checkpoint_dir(layout.run_dir(config), 2), "state.json"))
    assert state["loss_scaler"] is None
    # The same run (precision is runtime), two steps on in fp16.
    result = train(tiny_config(tmp_path, **{"train.precision": "fp16", "train.max_steps": 4}))
    assert result.resumed_from_step == 2 and result.steps == 4 and result.precision == "fp16"
    assert result.skipped_steps is not None
