"""Shared test setup: 8 host CPU devices for sharding tests; the tiny Qwen3 checkpoint fixture."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from tiny_qwen3 import TINY_QWEN3, write_tiny_qwen3


@pytest.fixture(params=sorted(TINY_QWEN3))
def tiny_qwen3(request, tmp_path):
    """(hf_dir, torch model) for each tiny architecture."""
    hf_dir = tmp_path / request.param
    model = write_tiny_qwen3(hf_dir, **TINY_QWEN3[request.param])
    return hf_dir, model
