"""Comparing two float32 computations of one quantity whose operations run in another order (remat or not, sharded or
not, packed or not, chunked or whole, another CPU ISA's vector width): each sum's rounding error follows the size of
its terms, not of its result, so an entry near 0 of a tensor whose entries reach 1 is off by about n x 6e-8 whatever
its own size. A tolerance per element (rtol) plus an absolute one scaled by the tensor's largest magnitude (atol =
scale_tol x max |desired|) follows that; a bare atol does not (1e-7 passes on AVX-512 and fails on AVX2 for a gradient
whose entries are ~2.5e-4), nor does an atol fixed for O(1) values held against logits of size 10."""

import numpy as np


def assert_float32_close(actual, desired, *, scale_tol: float = 1e-5, scale: float | None = None, rtol: float = 0.0,
                         err_msg: str = "") -> None:
    """|actual - desired| <= rtol |desired| + scale_tol x scale elementwise, scale defaulting to max |desired|.
    scale_tol 1e-5 is ~170 float32 ulps of the scale: a remat, shard or chunk that drops or doubles a term is off by
    far more. Give `scale` where the terms summed are larger than the result: a gradient's tensors with
    `tree_scale(grads)` (a bias's gradient of 9e-4 is a sum of per-token terms as large as the others'), an O(1)
    quantity that came out near 0 (a KL of 4e-9) with 1.0."""
    desired = np.asarray(desired, np.float64)
    if scale is None:
        scale = float(np.abs(desired).max(initial=0.0))
    scale = max(scale, np.finfo(np.float32).tiny)
    np.testing.assert_allclose(np.asarray(actual, np.float64), desired, rtol=rtol, atol=scale_tol * scale,
                               err_msg=err_msg)


def tree_scale(tree) -> float:
    """The largest magnitude over a pytree's arrays (e.g. all of a gradient's tensors)."""
    import jax

    return max(float(np.abs(np.asarray(leaf)).max(initial=0.0)) for leaf in jax.tree.leaves(tree))
