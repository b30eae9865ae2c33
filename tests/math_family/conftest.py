import pytest
from built_once import built_once, session_tmp

from trace_jax.envs.math.kit import write_tiny_math


@pytest.fixture(scope="session")
def math_kit(tmp_path_factory):
    """The tiny math kit, fitted briefly (48 training problems, 8 evaluation problems)."""
    return built_once(session_tmp(tmp_path_factory), "math_kit",
                      lambda path: write_tiny_math(path, train=48, evaluate=8, sft_steps=150))
