import pytest
from built_once import built_once, session_tmp

from toy import fast_fitting
from trace_jax.envs.math.kit import write_tiny_math


@pytest.fixture(scope="session")
def math_kit(tmp_path_factory):
    """The tiny math kit, fitted briefly (48 training problems, 8 evaluation problems; `toy.fast_fitting`)."""

    def write(path):
        with fast_fitting():
            write_tiny_math(path, train=48, evaluate=8, sft_steps=150)

    return built_once(session_tmp(tmp_path_factory), "math_kit", write)
