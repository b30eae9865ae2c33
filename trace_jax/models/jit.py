"""One way to compile a function of a policy: split the module once, merge it inside the trace."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx


def jit_with_model(fn: Callable[..., Any], static_argnames: Sequence[str] = (), donate_first: bool = False
                   ) -> Callable[..., Any]:
    """`fn(model, *args, **kwargs)` compiled once per (model graph, shapes, static kwargs).

    The model's parameters enter as traced state, so a trained or re-sharded model with the same
    graph reuses the compilation. donate_first: the first argument after the model is donated (its
    buffers are reused for the outputs; the caller must not use it again). The result has `cache_size()`
    (compilations so far), `bind(model)` (the function of the remaining arguments, with the model split
    once instead of at every call) and `lower(model, ...)` (the program, as `jax.jit(...).lower`).
    """
    donate = (2,) if donate_first else ()

    @functools.partial(jax.jit, static_argnames=("graph", *static_argnames), donate_argnums=donate)
    def compiled(graph: _Graph, state: nnx.State, *args: Any, **kwargs: Any) -> Any:
        return fn(nnx.merge(graph.graphdef, state), *args, **kwargs)

    def split(model: nnx.Module) -> tuple[_Graph, nnx.State]:
        graphdef, state = nnx.split(model)
        return _Graph(graphdef), state

    @functools.wraps(fn)
    def call(model: nnx.Module, *args: Any, **kwargs: Any) -> Any:
        return compiled(*split(model), *args, **kwargs)

    def bind(model: nnx.Module) -> Callable[..., Any]:
        """`fn` with `model` split once, for many calls with the same parameters (a host loop's turns, a
        benchmark's timed calls): a call then costs JAX's dispatch alone, where `call` first walks the module's
        graph (NNX's split, about 10 ms at the HopWorld size on a 2-core CPU)."""
        return functools.partial(compiled, *split(model))

    def lower(model: nnx.Module, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """The program for these arguments, for inspection (`.compile().as_text()`, `.memory_analysis()`)."""
        return compiled.lower(*split(model), *args, **kwargs)

    call.cache_size = compiled._cache_size  # type: ignore[attr-defined]
    call.bind = bind  # type: ignore[attr-defined]
    call.lower = lower  # type: ignore[attr-defined]
    return call


class _Graph:
    """A model's GraphDef as jit's static argument, hashed once: jit hashes its static arguments at every call, and
    hashing a GraphDef walks it (about 1 ms at the HopWorld size), as long as a bound call's whole dispatch."""

    __slots__ = ("graphdef", "_hash")

    def __init__(self, graphdef: nnx.GraphDef) -> None:
        self.graphdef = graphdef
        self._hash = hash(graphdef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Graph) and self._hash == other._hash
                                 and self.graphdef == other.graphdef)
