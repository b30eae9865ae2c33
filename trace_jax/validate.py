"""Argument checks that run on the host when values are known and step aside under `jit`."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def concrete(x: Any) -> np.ndarray | None:
    """x as a NumPy array when its value is known (an eager call), else None (traced under jit)."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)
