"""runtime.compile by device (gpt2.train.compile_choice): the choice a device's
capabilities make, and a compile that fails for real (torch.compile with a backend
that raises, which is how torch reports a device or model its compiler cannot
handle): `auto` goes on eagerly with one warning and trains exactly what an eager
run trains, `true` stops with one line. The preflight reports the same decision
and records it, so the training that follows starts eagerly.

On a CPU `auto` never compiles; where a test needs `auto` to compile, the
decision is the one a CUDA card's capabilities make (`choose_compile`, tested
on its own below), and the failure is torch's own."""

from __future__ import annotations

import logging

import pytest
import torch

from gpt2.model import GPT
from gpt2.preflight import steps
from gpt2.preflight.report import Report
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from gpt2.train import compile_cache, compile_choice
from gpt2.train.compile_choice import Built, CompileChoice, CompileError, choose_compile, warm_up_or_fall_back
from gpt2.train.optim import make_optimizer
from gpt2.train.precision import DeviceCaps
from gpt2.train.run import train
from gpt2.train.session import TrainingError
from gpt2.train.step import StepContext, train_step, warm_up
from tests.gpt2.train.fixtures import tiny_config, write_dataset

H100 = DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", bf16=True, capability=(9, 0))
T4 = DeviceCaps("cuda", "Tesla T4", bf16=False, capability=(7, 5))
V100 = DeviceCaps("cuda", "Tesla V100-SXM2-16GB", bf16=False, capability=(7, 0))
P100 = DeviceCaps("cuda", "Tesla P100-PCIE-16GB", bf16=False, capability=(6, 0))
CPU = DeviceCaps("cpu", "cpu", bf16=True)
MPS = DeviceCaps("mps", "mps", bf16=False)
CPU_ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
REFUSAL = "no kernels for this device"


@pytest.mark.parametrize(("setting", "caps", "compiles"), [
    ("auto", H100, True), ("auto", T4, True), ("auto", V100, True), ("auto", CPU, False), ("auto", MPS, False),
    (True, CPU, True), (True, T4, True), (False, H100, False), (False, P100, False),
])
def test_the_choice_by_device(setting, caps, compiles):
    chosen = choose_compile(setting, caps)
    assert (chosen.compile, chosen.fallback) == (compiles, False)


def test_auto_on_a_card_triton_does_not_compile_for_trains_eagerly_and_says_why():
    chosen = choose_compile("auto", P100)
    assert (chosen.compile, chosen.fallback) == (False, True)
    assert "Tesla P100-PCIE-16GB, compute capability 6.0" in chosen.why and "7.0" in chosen.why


def test_compile_true_on_such_a_card_is_one_line_naming_it_and_what_to_set():
    with pytest.raises(CompileError) as caught:
        choose_compile(True, P100)
    message = str(caught.value)
    assert "\n" not in message and "Tesla P100-PCIE-16GB" in message
    assert "runtime.compile=false or auto" in message


def _raising(calls: list):
    """A torch.compile backend that refuses, as a compiler does on a device it cannot build for."""
    def backend(graph, example_inputs):
        calls.append(graph)
        raise RuntimeError(f"{REFUSAL}\nmore of the compiler's story")
    return backend


def _compile_with(monkeypatch, backend) -> None:
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=backend, **kw))


def _as_on_a_card_that_compiles(monkeypatch) -> None:
    real = compile_choice.choose_compile
    monkeypatch.setattr(compile_choice, "choose_compile", lambda setting, caps: CompileChoice(True, "auto: compiles")
                        if setting == "auto" else real(setting, caps))


def _compile_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "compil" in r.getMessage()]


def test_auto_falls_back_with_one_warning_records_why_and_trains_as_eager_does(tmp_path, caplog):
    config = tiny_config(tmp_path)
    ctx = StepContext(CPU_ENV, None, config.train.grad_clip)
    gen = torch.Generator().manual_seed(1)
    batches = [tuple(torch.randint(0, 1000, (2, 2, config.model.block_size), generator=gen))] * 3
    finals = []
    for fails in (False, True):
        torch.manual_seed(0)
        raw = GPT(config.model)
        optimizer = make_optimizer(raw, config.train, "cpu")
        built = Built(raw, None, False)
        if fails:
            calls: list = []
            fields = compile_cache.key_fields(config, CPU_ENV.device, 2, False, 1)
            compiled = torch.compile(raw, dynamic=False, backend=_raising(calls))
            built = Built(compiled, compile_cache.Travel(fields, "absent", 0.0), True)
            with caplog.at_level(logging.WARNING):
                built = warm_up_or_fall_back(built, raw, config, CPU_ENV,
                                             lambda m: warm_up(m, raw, optimizer, 2, config.model.block_size, ctx))
            assert calls and built.model is raw and not built.compiling and built.travel.status == "failed"
            [warning] = _compile_warnings(caplog)
            assert "cpu" in warning and f"RuntimeError: {REFUSAL}" in warning and "more of" not in warning
            assert compile_choice.recorded_failure(config, fields) == f"RuntimeError: {REFUSAL}"
        for x, y in batches:
            train_step(built.model, raw, optimizer, [(x, y)], ctx)
        finals.append({k: v.clone() for k, v in raw.state_dict().items()})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_the_trainer_falls_back_once_and_its_next_attempt_starts_eagerly(tmp_path, monkeypatch, caplog):
    calls: list = []
    _compile_with(monkeypatch, _raising(calls))
    _as_on_a_card_that_compiles(monkeypatch)
    settings = {"train.max_steps": 2, "tracking.enabled": False}
    eager = tiny_config(tmp_path / "eager", **settings, **{"runtime.compile": False})
    write_dataset(eager)
    config = tiny_config(tmp_path / "auto", **settings)
    write_dataset(config)
    with caplog.at_level(logging.WARNING):
        fell_back = train(config)
    assert calls and fell_back.compile_cache == "failed"
    [warning] = _compile_warnings(caplog)
    assert "cpu" in warning and REFUSAL in warning and "training eagerly" in warning
    expected = train(eager)
    assert (fell_back.final_train_loss, fell_back.final_val_loss) == (expected.final_train_loss,
                                                                      expected.final_val_loss)

    calls.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = train(config, fresh=True)
    assert calls == [] and again.compile_cache == "failed"  # the recorded failure: not tried again
    [warning] = _compile_warnings(caplog)
    assert "failed there before" in warning and REFUSAL in warning
    assert (again.final_train_loss, again.final_val_loss) == (expected.final_train_loss, expected.final_val_loss)


def test_compile_true_that_fails_stops_the_run_in_one_line(tmp_path, monkeypatch):
    _compile_with(monkeypatch, _raising([]))
    config = tiny_config(tmp_path, **{"runtime.compile": True, "train.max_steps": 2, "tracking.enabled": False})
    write_dataset(config)
    with pytest.raises(TrainingError) as caught:
        train(config)
    message = str(caught.value)
    assert "\n" not in message and "runtime.compile=true" in message and "cpu" in message
    assert REFUSAL in message and "set runtime.compile=false or auto" in message


def test_the_preflight_reports_the_fallback_and_the_training_that_follows_uses_it(tmp_path, monkeypatch):
    calls: list = []
    _compile_with(monkeypatch, _raising(calls))
    _as_on_a_card_that_compiles(monkeypatch)
    config = tiny_config(tmp_path, **{"train.max_steps": 2, "tracking.enabled": False})
    write_dataset(config)
    run = steps.run_steps(config, CPU_ENV, 1)
    assert calls and run.error is None and not run.compiled and run.compile_cache == "failed"
    check = Report().check("compile", lambda: steps.compile_check(run))
    assert check.status == "warn" and REFUSAL in check.detail and "training eagerly" in check.detail

    calls.clear()
    result = train(config)
    assert calls == [] and result.compile_cache == "failed" and result.steps == 2


def test_the_preflight_fails_compile_true_on_a_failing_compile_and_still_measures_eagerly(tmp_path, monkeypatch):
    _compile_with(monkeypatch, _raising([]))
    config = tiny_config(tmp_path, **{"runtime.compile": True})
    run = steps.run_steps(config, CPU_ENV, 1)
    assert run.error is None and len(run.step_s) == 1 and not run.compiled
    check = Report().check("compile", lambda: steps.compile_check(run))
    assert check.status == "fail" and "set runtime.compile=false or auto" in check.detail
    assert not storage.list_dir(storage.join(layout.run_dir(config), "compile"))  # `true`: nothing recorded


def test_the_compiled_program_is_keyed_by_the_precision_the_run_trains_in(tmp_path, monkeypatch):
    """An fp16 run's program is not a bf16 run's: the preflight's (and the trainer's) key takes train.precision."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="eager", **kw))
    saved = []
    monkeypatch.setattr(compile_cache.Travel, "after_first_step", lambda self, *a: saved.append(self.fields))
    for precision, dtype in (("fp16", "float16"), ("fp32", "float32")):
        config = tiny_config(tmp_path / precision, **{"runtime.compile": True, "train.precision": precision})
        assert steps.run_steps(config, CPU_ENV, 0).error is None
        assert saved.pop()["dtype"] == dtype
