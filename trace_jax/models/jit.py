"""One way to compile a function of a policy: split the module once, merge it inside the trace."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx


def jit_with_model(fn: Callable[..., Any], static_argnames: Sequence[str] = ()) -> Callable[..., Any]:
    """`fn(model, *args, **kwargs)` compiled once per (model graph, shapes, static kwargs).

    The model's parameters enter as traced state, so a trained or re-sharded model with the same
    graph reuses the compilation. The result has `cache_size()` (compilations so far).
    """

    @functools.partial(jax.jit, static_argnames=("graphdef", *static_argnames))
    def compiled(graphdef: nnx.GraphDef, state: nnx.State, *args: Any, **kwargs: Any) -> Any:
        return fn(nnx.merge(graphdef, state), *args, **kwargs)

    @functools.wraps(fn)
    def call(model: nnx.Module, *args: Any, **kwargs: Any) -> Any:
        graphdef, state = nnx.split(model)
        return compiled(graphdef, state, *args, **kwargs)

    call.cache_size = compiled._cache_size  # type: ignore[attr-defined]
    return call
