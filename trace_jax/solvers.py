"""Exact budget solvers of TRACE's two allocation stages, with static shapes (jit-able).

Stage 1 (`root_counts`): give prompt i m_i in {0} ∪ [2, M] root rollouts, sum m_i = M, maximising
sum_i 1 - v_i^m_i - (1 - v_i)^m_i, by a max-plus DP over prompts. Stage 2 (`prefix_counts`): spread
each group's budget over its anchors, maximising sum 1 - q^K, by a per-group top-k of marginal gains.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trace_jax.validate import concrete

# A reading within this of 0 or 1 is a saturated head's: its contrast w (or its chance to flip 1 - q) counts as 0.
# Below it float32 no longer resolves the objectives' concavity (1 - (1-w)^m - w^m ~ m w: the gain of spreading
# roots is ~ m^2 w^2), and a pool of readings like sigmoid(-20) would put all M roots on one prompt.
SATURATION = 1e-4


def _stage1_values(v: jax.Array, num_roots: int, max_per_prompt: int) -> jax.Array:
    """[B, M+1] value f_i(m) = 1 - v_i^m - (1-v_i)^m of m = 0..M roots; f(0) = 0, f(1) = -inf (forbidden), and
    -inf above max_per_prompt.

    f is symmetric in v <-> 1-v; with w = min(v, 1-v) it is -expm1(m log1p(-w)) - w^m, accurate in float32
    even for w near 0 (no cancellation of 1 - (1-w)^m). NaN v counts as 0, and so does w below SATURATION. A
    pool where every w is 0 (V~ at or near 0 or 1 everywhere, a saturated head) says nothing about which prompt
    to open: every count vector is then (nearly) optimal and the tie-break would put all M roots on one prompt,
    so it is solved as V~ = 0.5 (the uninformed spread).
    """
    v = jnp.clip(jnp.nan_to_num(v.astype(jnp.float32)), 0.0, 1.0)[:, None]
    w = jnp.minimum(v, 1.0 - v)  # [B, 1]
    w = jnp.where(w < SATURATION, 0.0, w)
    w = jnp.where((w == 0.0).all(), 0.5, w)
    m = jnp.arange(num_roots + 1, dtype=jnp.float32)
    f = -jnp.expm1(m * jnp.log1p(-w)) - w ** m
    return jnp.where(m == 0, 0.0, jnp.where((m == 1) | (m > max_per_prompt), -jnp.inf, f))


def root_counts(v: jax.Array, num_roots: int, max_per_prompt: int | None = None) -> jax.Array:
    """Stage 1, exact: m [B] int32 maximising sum_i 1 - v_i^m_i - (1-v_i)^m_i, sum m = M, no m_i = 1.

    v [B]: predicted success rates of the pool's prompts (clipped to [0, 1]); num_roots = M (static);
    max_per_prompt: static cap on every m_i (None: M), e.g. so one prompt's tree fits a rollout chunk.
    Max-plus DP over prompts (`lax.scan`): best[j] = best value spending exactly j roots on prompts < i,
    best'[j] = max over m in {0} ∪ [2, j] of best[j - m] + f_i(m). A reverse scan then backtracks from
    j = M, redoing for each prompt only the maximisation of the budget it is left with, from the stored
    tables [B, M+1]. O(B M^2) time; memory: the tables and one [M+1, M+1] candidate matrix per step.
    Ties: going back from the last prompt, each takes the smallest count that stays optimal.
    """
    if isinstance(num_roots, bool) or not isinstance(num_roots, (int, np.integer)) or num_roots < 2:
        raise ValueError(f"stage 1 needs an integer budget of at least 2 root rollouts, got M={num_roots!r}")
    if v.ndim != 1 or v.shape[0] == 0:
        raise ValueError(f"v must be a non-empty vector [B], got shape {v.shape}")
    cap = num_roots if max_per_prompt is None else max_per_prompt
    if cap < 2 or cap * v.shape[0] < num_roots or (cap == 2 and num_roots % 2):
        raise ValueError(f"stage 1 cannot place M={num_roots} root rollouts over B={v.shape[0]} prompts with at "
                         f"most {cap} each (and at least 2 where any); raise the cap or the pool size")
    size = int(num_roots) + 1
    values = _stage1_values(v, size - 1, cap)  # [B, M+1]

    def forward(best, f):  # best [M+1]: best value per budget over prompts < i; f [M+1]: f_i
        before = jnp.arange(size)[:, None] - jnp.arange(size)  # [M+1, M+1]: budget j - m left for prompts < i
        cand = jnp.where(before >= 0, best[jnp.maximum(before, 0)] + f, -jnp.inf)  # [j, m]
        return cand.max(axis=1), best

    start = jnp.full((size,), -jnp.inf, jnp.float32).at[0].set(0.0)
    _, tables = jax.lax.scan(forward, start, values)  # [B, M+1]: row i is best over prompts < i

    def backward(left, table_f):  # left: budget for prompts <= i; recompute prompt i's row `left` only
        best, f = table_f
        m = jnp.arange(size)
        cand = jnp.where(m <= left, best[jnp.maximum(left - m, 0)] + f, -jnp.inf)  # [M+1]
        pick = jnp.argmax(cand).astype(jnp.int32)  # smallest optimal m
        return left - pick, pick

    _, m = jax.lax.scan(backward, jnp.int32(size - 1), (tables, values), reverse=True)
    return m


def prefix_counts(q: jax.Array, valid: jax.Array, group: jax.Array, budget: jax.Array,
                  max_per_anchor: int) -> tuple[jax.Array, jax.Array]:
    """Stage 2, exact: K [R, T] int32 maximising sum 1 - q^K, spending budget[g] over group g's anchors.

    q [R, T]: chance a continuation from anchor (r, t) repeats the observed outcome (clipped to [0, 1]);
    valid [R, T]: usable anchors; group [R]: group of root r (-1: none); budget [G] >= 0;
    max_per_anchor: static cap Kmax on any K (the solver sorts R*T*Kmax candidate units).
    1 - q^K is concave in K, so the top budget[g] marginal gains q^k (1-q) within each group are optimal.
    NaN q counts as 1 (no chance to flip). A group whose every usable anchor is saturated, q within SATURATION of
    1 (no chance to flip: zero gains) or of 0 (a head sure of the outcome the root did not get: one sure flip per
    anchor, then zero gains), has gains the tie-break would pile on its first anchor: it is solved as q = 0.5
    (spread evenly), as stage 1 solves a saturated pool.
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
    q = jnp.clip(jnp.nan_to_num(q.astype(jnp.float32), nan=1.0), 0.0, 1.0)
    seg = jnp.where((group >= 0) & (group < num_groups), group, num_groups)  # [R] each root's group, G: none
    usable = valid & (seg < num_groups)[:, None]
    informed = usable & (jnp.minimum(q, 1.0 - q) >= SATURATION)  # [R, T]
    group_informed = jax.ops.segment_max(informed.any(1).astype(jnp.int32), seg, num_groups + 1) > 0  # [G+1]
    q = jnp.where(group_informed[seg][:, None], q, 0.5)
    gain = q[..., None] ** jnp.arange(max_per_anchor, dtype=jnp.float32) * (1.0 - q[..., None])
    key = jnp.broadcast_to(jnp.where(usable, seg[:, None], num_groups)[..., None], gain.shape)
    order = jnp.arange(gain.size, dtype=jnp.int32)
    # equal gains go to the lower (root, turn) first, so a chunk of whole groups solves like the whole batch
    key_s, _, unit_s = jax.lax.sort((key.reshape(-1), -gain.reshape(-1), order), num_keys=3)
    rank = jnp.arange(gain.size) - jnp.searchsorted(key_s, key_s, side="left")
    take = (key_s < num_groups) & (rank < budget[jnp.minimum(key_s, num_groups - 1)])
    k = jnp.zeros(gain.size, jnp.int32).at[unit_s].set(take).reshape(gain.shape).sum(-1)
    spent = jax.ops.segment_sum(k.sum(1), seg, num_groups + 1)
    return k, budget.astype(jnp.int32) - spent[:num_groups]
