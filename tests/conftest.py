"""Shared test setup: 8 host CPU devices for sharding tests (other tests' runs get one device's mesh), a per-session
compilation cache; the tiny Qwen3 checkpoint fixture and the tiny search QA kit (the search QA tests and the
bring-your-checkpoint notebook)."""

import os
import shutil
import tempfile

from xla_flags import host_flags

# 8 host devices for the sharding tests, compiled for speed of compiling, with the caller's own XLA flags after them
# (`xla_flags`: e.g. --xla_cpu_max_isa=AVX2).
os.environ["XLA_FLAGS"] = host_flags(8)
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


@pytest.fixture(autouse=True)
def one_device_mesh(request, monkeypatch):
    """Runs (training, comparison, evaluation: every mesh made without naming its devices) get one device's mesh
    (`one_device`), unless the test is marked `all_devices`: the sharding tests, the multi-process tests and
    tests/train/test_train.py (sharded steps, checkpoints, resume) keep the 8 devices'."""
    if not request.node.get_closest_marker("all_devices"):
        import one_device  # JAX and the package load in the workers that run tests, not at the session's start

        monkeypatch.setattr(one_device.sharding, "make_mesh", one_device.make_mesh)


@pytest.fixture(params=sorted(TINY_QWEN3))
def tiny_qwen3(request, tmp_path):
    """(hf_dir, torch model) for each tiny architecture."""
    hf_dir = tmp_path / request.param
    model = write_tiny_qwen3(hf_dir, **TINY_QWEN3[request.param])
    return hf_dir, model


def _write_kit(path):
    """The kit, its fine-tuning step compiled for running (`toy.fast_fitting`): 60 steps are most of its time."""
    from toy import fast_fitting
    from trace_jax.data import search_qa_tiny

    with fast_fitting():
        search_qa_tiny.write_tiny_search_qa(path, sft_steps=60)


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    """60 fine-tuning steps: enough for the policy to search (the retriever is really called), not to be right
    (30 are not: the search QA training test's run then never calls the retriever after its step 1)."""
    return built_once(session_tmp(tmp_path_factory), "search_qa_kit", _write_kit)


# The longest tests (`pytest --durations`, on a 2-core machine), longest first. With pytest-xdist's work stealing each
# worker starts on a contiguous share of the collection and steals from the end of the longest queue, so a long
# test left at the end of a share runs alone at the end of the session; these are dealt round-robin to the front of
# the shares instead. The search QA training test and the bring-your-checkpoint notebook land on one worker, in
# that order: the notebook then reuses the training test's compiled programs. The SIGKILL test goes first: it builds
# the 5-step run that two other tests of its module compare with (`full_run`, about 50 s) at the very start, so no
# worker reaches one of those while the other builds it and waits for it idle.
LONGEST = (
    "tests/train/test_train.py::test_sigkill_then_resume_reproduces_the_uninterrupted_run",
    "tests/test_notebooks.py::test_quickstart_and_compare_run_top_to_bottom",
    "tests/test_compare.py::test_quick_compare_end_to_end_from_raw_metrics",
    "tests/search_qa/test_search_qa_train.py::test_trace_steps_a_dead_retriever_resume_evaluation_and_export",
    "tests/train/test_chunked.py::test_chunked_step_equals_the_whole_step",
    "tests/test_notebooks.py::test_bring_your_checkpoint_runs_top_to_bottom",
    "tests/train/test_multihost.py::test_two_processes_answer_their_own_slots_on_the_host_path",
)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores (at most --maxprocesses). Many tests wait on processes of their
    own (the notebooks' kernels, killed runs, sandbox workers, retrievers), which leaves a core idle with one
    worker per core; docs/measurements/test_suite.md has the figures."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(trylast=True)  # after `-m` deselected the slow tests: the shares are of what runs
def pytest_collection_modifyitems(config, items):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set in xdist's workers, which collect
    longest = sorted((i for i in items if i.nodeid in LONGEST), key=lambda i: LONGEST.index(i.nodeid))
    if workers < 2 or not longest:
        return
    rest = iter(i for i in items if i.nodeid not in LONGEST)
    shares, left = [], len(items)
    for w in range(workers):  # the shares xdist hands out: len(pending) // workers still to serve
        size = left // (workers - w)
        head = longest[w::workers][:size]
        shares += head + [next(rest) for _ in range(size - len(head))]
        left -= size
    items[:] = shares


def pytest_sessionfinish(session, exitstatus):
    for made in (_CACHE, _SHARED):  # only the process that made them: workers find the variables set
        if made:
            shutil.rmtree(made, ignore_errors=True)
