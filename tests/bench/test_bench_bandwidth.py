"""Bandwidth measurements on CPU."""

import torch

from pretrain.bench.bandwidth import device_copy_gbps, host_to_device_gbps

CPU = torch.device("cpu")


def test_device_copy_gives_a_positive_bandwidth():
    # 4 MiB copies: cache-resident, so above DRAM speed, but a real, finite number
    gbps = device_copy_gbps(CPU, budget=0.05, nbytes=4 << 20)
    assert 0.1 < gbps < 10_000


def test_host_to_device_is_none_on_cpu():
    assert host_to_device_gbps(CPU, budget=0.05) is None
