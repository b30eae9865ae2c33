"""Task families by name: the value of `env` in a run's config selects one (`envs.family.Family`).

A family registers itself with one line in FAMILIES ("its module:its Family"); its module is imported only when a
run names it. A family kept outside the package (a user's own, or the tests' toy) is named by that same
"module:attribute" path, or registered at run time with `register`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from trace_jax.envs.family import Family, task_section

if TYPE_CHECKING:
    from trace_jax.config import TrainConfig

FAMILIES = {
    "hopworld": "trace_jax.envs.hopworld.family:FAMILY",  # the synthetic multi-hop world, a JaxEnv (CPU-sized)
    "search_qa": "trace_jax.envs.search_qa.family:FAMILY",  # Search-R1's protocol: an HF Qwen3 and a retriever
    "math": "trace_jax.envs.math.family:FAMILY",  # tool-integrated math: a Python sandbox and math-verify
    "bfcl": "trace_jax.envs.bfcl.family:FAMILY",  # BFCL v4 multi-turn function calling on stateful APIs
}
_registered: dict[str, Family] = {}
# what installs a package a family imports that `pip install trace-jax` does not bring
INSTALL = {"bfcl_eval": "pip install --no-deps -r launch/no_deps.txt (bfcl-eval, installed without its pinned "
                        "dependencies, which conflict with JAX's; `bash launch/local.sh` does this)"}


def register(family: Family) -> Family:
    """Makes `family` known by its name in this process (e.g. a family defined in a notebook)."""
    _registered[family.name] = family
    return family


def family_names() -> list[str]:
    return sorted({*FAMILIES, *_registered})


def get_family(name: str) -> Family:
    """The family `env=name` selects: a registered name, or a "module:attribute" path to a `Family`."""
    if name in _registered:
        return _registered[name]
    path = FAMILIES.get(name, name)
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"env={name!r} is not a task family: use one of {family_names()}, or 'module:attribute' "
                         "naming a trace_jax.envs.family.Family (docs/adding_a_task.md)")
    try:
        family = getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        fix = f"; install it with: {INSTALL[missing]}" if missing in INSTALL else ""
        raise ValueError(f"env={name!r}: cannot load the task family {path!r} ({e}){fix}") from e
    except (ImportError, AttributeError) as e:
        raise ValueError(f"env={name!r}: cannot load the task family {path!r} ({e})") from e
    if not isinstance(family, Family):
        raise ValueError(f"env={name!r}: {path} is a {type(family).__name__}, not a trace_jax.envs.family.Family")
    return family


def check_family(cfg: TrainConfig) -> Family:
    """cfg's family, once its `task:` section and the family's own checks accept cfg (before any work)."""
    family = get_family(cfg.env)
    task_section(cfg, family)
    if family.check_config is not None:
        family.check_config(cfg)
    return family
