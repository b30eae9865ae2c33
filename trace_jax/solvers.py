"""Exact budget solvers of TRACE's two allocation stages, with static shapes (jit-able).

Stage 1 (`root_counts`): give prompt i m_i in {0} ∪ [2, M] root rollouts, sum m_i = M, maximising
sum_i 1 - v_i^m_i - (1 - v_i)^m_i. Stage 2 (`prefix_counts`): spread each group's budget over its
anchors, maximising sum 1 - q^K.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Largest per-prompt deviation from the Lagrangian solution an optimal stage-1 solution needs
# (proof in `_repair_deviations`).
_MAX_DEV = 4


def concrete(x: jax.Array) -> np.ndarray | None:
    """x as a NumPy array when its value is known (outside jit), else None."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def _unit_gains(v: jax.Array, num_units: int) -> jax.Array:
    """[B, num_units] gains of the concave envelope of the stage-1 objective, unit by unit.

    The opening pair is worth 2 v (1-v); splitting it evenly gives units 1 and 2 the value c = v (1-v),
    equal to unit 3's true gain, after which gains v^m (1-v) + (1-v)^m v (m = 2, 3, ...) decrease.
    The envelope h equals the objective everywhere except at m = 1 (h(1) = c, true value 0).
    """
    v = jnp.clip(v, 0.0, 1.0)[:, None]
    c = v * (1.0 - v)
    m = jnp.arange(2, num_units, dtype=v.dtype)
    later = v ** m * (1.0 - v) + (1.0 - v) ** m * v
    return jnp.concatenate([c, c, later], axis=1)[:, :num_units]


def _lagrangian_counts(units: jax.Array, budget: int) -> tuple[jax.Array, jax.Array]:
    """Counts g [B] (no 1s, sum in {budget-1, budget}) maximising the envelope at threshold tau.

    tau is the budget-th largest unit: every prompt takes all units above tau and, in prompt order,
    units equal to tau until the budget is met. A prompt left holding exactly one tied unit (u_1 = tau)
    drops it, so sum g = budget - 1 at worst. Returns (g, tau).
    """
    tau = jax.lax.top_k(units.reshape(-1), budget)[0][-1]
    lo = (units > tau).sum(1)
    ties = (units >= tau).sum(1) - lo
    before = jnp.cumsum(ties) - ties
    g = lo + jnp.clip(budget - lo.sum() - before, 0, ties)
    return jnp.where(g == 1, 0, g).astype(jnp.int32), tau


def _deviation_costs(units: jax.Array, g: jax.Array, tau: jax.Array) -> jax.Array:
    """[B, 2D+1] loss of moving prompt i from g_i to g_i + d (d in [-D, D]); inf if infeasible.

    Loss = tau d - (h(g+d) - h(g)) >= 0: units added are worth <= tau, units removed >= tau.
    """
    b, num_units = units.shape
    d = _MAX_DEV
    cols = g[:, None] + jnp.arange(-d, d)  # unit indices g-D .. g+D-1 (0-based)
    window = jnp.take_along_axis(units, jnp.clip(cols, 0, num_units - 1), axis=1)
    gap = tau - window  # [B, 2D] >= 0 right of g, <= 0 left of g
    right = jnp.cumsum(gap[:, d:], axis=1)  # d = 1..D
    left = jnp.cumsum(-gap[:, :d][:, ::-1], axis=1)[:, ::-1]  # d = -D..-1
    cost = jnp.concatenate([left, jnp.zeros((b, 1), units.dtype), right], axis=1)
    new = g[:, None] + jnp.arange(-d, d + 1)
    feasible = (new >= 0) & (new <= num_units) & (new != 1)
    return jnp.where(feasible, jnp.maximum(cost, 0.0), jnp.inf)


def _repair_deviations(cost: jax.Array, target: jax.Array) -> jax.Array:
    """Deviations d [B] with sum d = target (0 or 1) and minimal total cost: a DP over prompts.

    Why |d_i| <= D = 4 suffices: costs are convex in d with minimum 0 at d = 0, so moving a positive
    and a negative deviation towards 0 by the same amount never costs more. Take an optimal d with
    least sum |d|; P = sum of positive parts, E = sum of negative parts, P = E + target. If P >= 4,
    the positive parts can shrink by exactly 2 without landing on count 1 (every positive part can
    shrink by 1 or by 2 on its own), and if E >= 4 the negative parts can grow by exactly 2 likewise,
    so P >= 4 and E >= 4 would contradict minimality: E <= 3, P <= 4, every prefix sum is in [-4, 4].
    """
    d = _MAX_DEV
    width = 2 * d + 1
    shift = jnp.arange(width)[:, None] - jnp.arange(width)[None, :]  # [state', state] = d_i
    choice_ok = jnp.abs(shift) <= d

    def step(dp, cost_i):
        total = jnp.where(choice_ok, dp[None, :] + cost_i[jnp.clip(shift + d, 0, width - 1)], jnp.inf)
        return total.min(1), total.argmin(1)  # best previous state for each new state

    start = jnp.full((width,), jnp.inf).at[d].set(0.0)
    _, prev = jax.lax.scan(step, start, cost)

    def back(state, prev_i):
        before = prev_i[state]
        return before, state - before

    _, dev = jax.lax.scan(back, (target + d).astype(jnp.int32), prev, reverse=True)
    return dev.astype(jnp.int32)


def root_counts(v: jax.Array, num_roots: int) -> jax.Array:
    """Stage 1, exact: m [B] int32 maximising sum_i 1 - v_i^m_i - (1-v_i)^m_i, sum m = M, no m_i = 1.

    v [B]: predicted success rates of the pool's prompts (clipped to [0, 1]); num_roots = M.
    Solves the concave envelope by a top-M over unit gains (Lagrangian threshold tau), then makes it
    feasible (no m_i = 1) exactly with a DP over bounded per-prompt deviations: O(B M) memory.
    """
    if isinstance(num_roots, bool) or not isinstance(num_roots, (int, np.integer)) or num_roots < 2:
        raise ValueError(f"stage 1 needs an integer budget of at least 2 root rollouts, got M={num_roots!r}")
    if v.ndim != 1 or v.shape[0] == 0:
        raise ValueError(f"v must be a non-empty vector [B], got shape {v.shape}")
    units = _unit_gains(v.astype(jnp.float32), num_roots)
    g, tau = _lagrangian_counts(units, num_roots)
    dev = _repair_deviations(_deviation_costs(units, g, tau), num_roots - g.sum())
    return g + dev


def prefix_counts(q: jax.Array, valid: jax.Array, group: jax.Array, budget: jax.Array,
                  max_per_anchor: int) -> tuple[jax.Array, jax.Array]:
    """Stage 2, exact: K [R, T] int32 maximising sum 1 - q^K, spending budget[g] over group g's anchors.

    q [R, T]: chance a continuation from anchor (r, t) repeats the observed outcome (clipped to [0, 1]);
    valid [R, T]: usable anchors; group [R]: group of root r (-1: none); budget [G] >= 0;
    max_per_anchor: static cap Kmax on any K (the solver sorts R*T*Kmax candidate units).
    1 - q^K is concave in K, so the top budget[g] marginal gains q^k (1-q) within each group are optimal.
    Returns (K, unspent [G]): budget a group could not place (no valid anchors, or all at the cap).
    """
    r, t = q.shape
    if valid.shape != (r, t) or group.shape != (r,) or budget.ndim != 1:
        raise ValueError(f"shapes disagree: q {q.shape}, valid {valid.shape}, group {group.shape}, "
                         f"budget {budget.shape}")
    if max_per_anchor < 1 or budget.shape[0] == 0:
        raise ValueError(f"need max_per_anchor >= 1 and at least one group, got {max_per_anchor}, "
                         f"{budget.shape[0]} groups")
    bv = concrete(budget)
    if bv is not None and (bv < 0).any():
        raise ValueError(f"budget has negative entries: {bv[bv < 0][:5].tolist()}")
    num_groups = budget.shape[0]
    q = jnp.clip(q.astype(jnp.float32), 0.0, 1.0)
    gain = q[..., None] ** jnp.arange(max_per_anchor, dtype=jnp.float32) * (1.0 - q[..., None])
    usable = valid & (group >= 0)[:, None] & (group < num_groups)[:, None]
    key = jnp.broadcast_to(jnp.where(usable, group[:, None], num_groups)[..., None], gain.shape)
    order = jnp.arange(gain.size, dtype=jnp.int32)
    key_s, _, unit_s = jax.lax.sort((key.reshape(-1), -gain.reshape(-1), order), num_keys=2)
    rank = jnp.arange(gain.size) - jnp.searchsorted(key_s, key_s, side="left")
    take = (key_s < num_groups) & (rank < budget[jnp.minimum(key_s, num_groups - 1)])
    k = jnp.zeros(gain.size, jnp.int32).at[unit_s].set(take).reshape(gain.shape).sum(-1)
    spent = jax.ops.segment_sum(k.sum(1), jnp.where(group >= 0, group, num_groups), num_groups + 1)
    return k, budget.astype(jnp.int32) - spent[:num_groups]
