"""Shared test setup: 8 host CPU devices for sharding tests, a per-session compilation cache; the tiny Qwen3
checkpoint fixture and the tiny search QA kit (the search QA tests and the bring-your-checkpoint notebook)."""

import os
import shutil
import tempfile

# 8 host devices for the sharding tests; LLVM's optimisation level 0, since compiling, not running, dominates the
# suite's time on a CPU (the programs are tiny; numerics are XLA's either way).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One XLA compilation cache per test session (fresh each time, shared by pytest-xdist's workers, which inherit
# this environment): many tests compile the same programs (a training step per run, evaluation).
_CACHE = None if "JAX_COMPILATION_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="trace-jax-xla-cache-")
if _CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# A folder for what the workers of one session compute once and share (`toy.trained_policy_state`).
_SHARED = None if "TRACE_JAX_TEST_SHARED" in os.environ else tempfile.mkdtemp(prefix="trace-jax-tests-")
if _SHARED:
    os.environ["TRACE_JAX_TEST_SHARED"] = _SHARED
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402 (after the environment above)
from built_once import built_once, session_tmp  # noqa: E402

from tiny_qwen3 import TINY_QWEN3, write_tiny_qwen3  # noqa: E402


@pytest.fixture(params=sorted(TINY_QWEN3))
def tiny_qwen3(request, tmp_path):
    """(hf_dir, torch model) for each tiny architecture."""
    hf_dir = tmp_path / request.param
    model = write_tiny_qwen3(hf_dir, **TINY_QWEN3[request.param])
    return hf_dir, model


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    """60 fine-tuning steps: enough for the policy to search (the retriever is really called), not to be right."""
    from trace_jax.data.search_qa_tiny import write_tiny_search_qa

    return built_once(session_tmp(tmp_path_factory), "search_qa_kit",
                      lambda path: write_tiny_search_qa(path, sft_steps=60))


def pytest_sessionfinish(session, exitstatus):
    for made in (_CACHE, _SHARED):  # only the process that made them: workers find the variables set
        if made:
            shutil.rmtree(made, ignore_errors=True)
