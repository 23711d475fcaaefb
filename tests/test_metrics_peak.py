"""MFU's peak: a device kind gets its own chip's data-sheet peak, never a namesake's."""
import pytest

from bertjax.training import metrics


@pytest.mark.parametrize("kind, peak", [
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40", 181e12),  # not the L4's, whose name is its prefix
    ("NVIDIA L40S", 362e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("TPU v5 lite", 197e12),  # v5e
    ("TPU v5e", 197e12),
    ("TPU v5", 459e12),  # v5p
    ("TPU v5p", 459e12),
    ("TPU v6 lite", 918e12),
    ("tpu  V5 Lite ", 197e12),  # case and spacing aside
])
def test_a_device_kind_gets_its_own_chips_peak(kind, peak):
    assert metrics.table_peak_flops(kind) == peak


@pytest.mark.parametrize("kind", [
    "NVIDIA A10G",  # AWS's A10 variant: not the A10's peak
    "TPU v4 lite",  # v4i, an inference chip: not the v4's peak
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a seventh of the chip
    "cpu", "",
])
def test_a_kind_the_table_does_not_list_gets_no_peak(kind):
    # 0: peak_flops then measures a matmul instead of pricing the chip as another one.
    assert metrics.table_peak_flops(kind) == 0.0
