"""Peak FLOPs by device name: every entry of the table is what its own device
name reads as, whatever the order of the table (an H200 NVL read as an H200
SXM made its MFU 18% too low)."""

import pytest

from gpt2.cost.gpus import gpu
from gpt2.train.throughput import GPU_MEMORY_GIB, PEAK_BF16_FLOPS, mfu, peak_flops_of


@pytest.mark.parametrize(("key", "flops"), PEAK_BF16_FLOPS)
def test_each_entry_is_read_from_its_own_device_name(key, flops):
    assert peak_flops_of(f"NVIDIA {key}") == flops
    assert peak_flops_of(f"NVIDIA GeForce {key} 80GB HBM3") == flops


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989),  # what torch.cuda.get_device_name said on the H100 we measured
    ("NVIDIA H100 PCIe", 756),
    ("NVIDIA H100 NVL", 835),
    ("NVIDIA H200", 989),
    ("NVIDIA H200 NVL", 835),
    ("NVIDIA GH200 480GB", 989),
    ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA L40S", 362),
    ("NVIDIA L40", 181),
    ("NVIDIA L4", 121),
    ("NVIDIA A10G", 70),
    ("NVIDIA A10", 125),
])
def test_real_device_names(name, tflops):
    assert peak_flops_of(name) == tflops * 1e12


def test_unknown_devices_have_no_peak_and_no_mfu():
    assert peak_flops_of("NVIDIA T4") is None and peak_flops_of("cpu") is None
    assert mfu(1e9, 1e5, None) is None


def test_every_gpu_plan_accepts_has_a_peak_and_memory():
    for name in GPU_MEMORY_GIB:
        g = gpu(name)
        assert g.peak_flops == peak_flops_of(name) and g.memory_gib == GPU_MEMORY_GIB[name]
    assert gpu("h200-nvl").peak_flops == 835e12
