"""The arithmetic a training run uses (train.precision) and the loss scaler fp16 needs.

`auto` picks, from what the device can do (`DeviceCaps`):

    CUDA with native bf16 (compute capability 8.0 and up: A100, H100, L4, RTX 3090/4090)
                      -> bf16 autocast, as llm.c and nanoGPT train
    CUDA without it (T4, V100: 7.x; P100: 6.0)
                      -> fp16 autocast with a loss scaler (torch.amp.GradScaler)
    CPU, MPS          -> fp32, so a CPU run stays exact (a resumed run ends bit for bit
                         like an uninterrupted one)

fp16 holds 5 exponent bits: small gradients underflow to zero unless the loss is
multiplied by a large scale before backward; the scaler divides the gradients back
before clipping and the optimizer, skips the optimizer step when a gradient came back
inf or nan (the scale was too large) and halves the scale, and doubles it after 2,000
clean steps. The weights stay fp32 (autocast's master weights); a skipped step leaves
them and the optimizer's state as they were. Its state (the scale and the clean steps
since the last change) is saved with each checkpoint (state.json's `loss_scaler`), so
a resumed run scales exactly as the uninterrupted one did.

The attention kernel is not chosen here: `F.scaled_dot_product_attention` (gpt2.model)
dispatches to the fastest kernel the device and dtype have (`attention_kernel` says
which one it will be, for the preflight's report): Flash Attention from compute
capability 8.0 in fp16/bf16, the memory-efficient kernel below it (T4, V100, P100).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from gpt2.errors import UserError

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
NATIVE_BF16_CAPABILITY = (8, 0)
"""CUDA compute capability from which bf16 runs on the tensor cores (Ampere)."""
FLASH_CAPABILITY = (8, 0)
"""PyTorch's Flash Attention kernel needs Ampere or newer."""


class PrecisionError(UserError, ValueError):
    """A train.precision the device cannot run; the message names the device and what to set."""


@dataclass(frozen=True)
class DeviceCaps:
    """What a device can compute in: its type (cuda, cpu, mps), its name, whether
    bf16 runs natively, and (CUDA) its compute capability."""

    type: str
    name: str
    bf16: bool
    capability: tuple[int, int] | None = None


def device_caps(device: torch.device) -> DeviceCaps:
    """The capabilities of `device` as torch reports them (emulated bf16 does not count)."""
    if device.type != "cuda":
        return DeviceCaps(device.type, device.type, bf16=device.type == "cpu")
    capability = tuple(torch.cuda.get_device_capability(device))
    return DeviceCaps("cuda", torch.cuda.get_device_name(device), bf16=capability >= NATIVE_BF16_CAPABILITY,
                      capability=capability)


@dataclass(frozen=True)
class Precision:
    """What train.precision resolved to: `name` (bf16, fp16, fp32), the autocast dtype
    (None: fp32, no autocast), whether a loss scaler runs, and why it was chosen."""

    name: str
    why: str

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES[self.name]

    @property
    def scaled(self) -> bool:
        return self.name == "fp16"

    def describe(self) -> str:
        scaler = " with loss scaling" if self.scaled else ""
        return f"{self.name}{scaler} ({self.why})"


def where(caps: DeviceCaps) -> str:
    """The device as messages name it: its name and, on CUDA, its compute capability."""
    cc = f", compute capability {caps.capability[0]}.{caps.capability[1]}" if caps.capability else ""
    return f"{caps.name}{cc}"


def choose_precision(setting: str, caps: DeviceCaps) -> Precision:
    """train.precision for a device with `caps`; raises PrecisionError for bf16 on a
    GPU without native bf16 (emulated bf16 would run without tensor cores)."""
    if setting not in PRECISIONS:
        raise PrecisionError(f"train.precision={setting!r} is not one of {', '.join(PRECISIONS)}")
    if setting == "bf16" and caps.type == "cuda" and not caps.bf16:
        raise PrecisionError(f"train.precision=bf16 but {where(caps)} has no native bf16: "
                             "set train.precision=fp16 (with loss scaling) or auto")
    if setting != "auto":
        return Precision(setting, f"train.precision={setting}")
    if caps.type != "cuda":
        return Precision("fp32", f"auto on {caps.name}: fp32 keeps a CPU run exact")
    if caps.bf16:
        return Precision("bf16", f"auto: {where(caps)} has native bf16")
    return Precision("fp16", f"auto: {where(caps)} has no native bf16")


def attention_kernel(caps: DeviceCaps, precision: Precision) -> str:
    """The kernel `F.scaled_dot_product_attention` runs for the model's causal
    attention on this device: `flash`, `memory-efficient` or, on a CPU, `cpu flash`."""
    if caps.type == "cpu":
        return "cpu flash"
    if caps.type == "cuda" and precision.dtype is not None and (caps.capability or (0, 0)) >= FLASH_CAPABILITY:
        return "flash"
    return "memory-efficient" if caps.type == "cuda" else "math"


class LossScaler:
    """torch.amp.GradScaler for an fp16 run, with the steps it skipped. The step
    (gpt2.train.step) scales the loss before backward, unscales the gradients
    before clipping, steps through `step` and calls `update` once a step."""

    def __init__(self, device_type: str):
        self.scaler = torch.amp.GradScaler(device_type)
        self.skipped = 0
        """Optimizer steps skipped for an inf or nan gradient, over the whole run."""
        self.last_skipped = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step, unless a gradient is inf or nan (the scaler's own check)."""
        self.scaler.step(optimizer)

    def update(self, grad_norm: float) -> None:
        """The scale for the next step. The scaler skipped this one exactly when an
        unscaled gradient was inf or nan, which is when their total norm (over the
        same parameters, read by the step) is not finite."""
        self.scaler.update()
        self.last_skipped = not math.isfinite(grad_norm)
        self.skipped += self.last_skipped

    @property
    def scale_value(self) -> float:
        return self.scaler.get_scale()

    def overflowed(self, step: int, loss: float) -> bool:
        """Step `step` was skipped for an inf or nan gradient under a finite loss
        (a non-finite loss is the loop's to judge: the training diverged)."""
        if not self.last_skipped or not math.isfinite(loss):
            return False
        log.info("step %d: an fp16 gradient overflowed; the loss scaler skipped the update and lowered its scale "
                 "to %g (%d skipped so far)", step, self.scale_value, self.skipped)
        return True

    def metrics(self) -> dict[str, float]:
        """The run's MLflow metrics of the scaler: its scale and the steps it skipped so far."""
        return {"train/loss_scale": self.scale_value, "train/skipped_steps": self.skipped}

    def state_dict(self) -> dict:
        """JSON-able: the scale is a power of two, the growth tracker an int."""
        return {**self.scaler.state_dict(), "skipped_steps": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.skipped = int(state.pop("skipped_steps", 0))
        self.scaler.load_state_dict(state)


def make_scaler(precision: Precision, device: torch.device, state: dict | None = None) -> LossScaler | None:
    """The run's loss scaler (None unless fp16), resumed from a checkpoint's
    `loss_scaler` state when it has one (a checkpoint of a bf16 or fp32 run, or of
    an older release, has none: the scaler starts fresh)."""
    if not precision.scaled:
        return None
    scaler = LossScaler(device.type)
    if state:
        scaler.load_state_dict(state)
    return scaler
