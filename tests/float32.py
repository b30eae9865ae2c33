"""Comparing two float32 computations of one quantity whose operations run in another order (remat or not, sharded or
not, packed or not, chunked or whole, another CPU ISA's vector width): each sum's rounding error follows the size of
its terms, not of its result, so an entry near 0 of a tensor whose entries reach 1 is off by about n x 6e-8 whatever
its own size. A tolerance per element (rtol) plus an absolute one scaled by the tensor's largest magnitude (atol =
scale_tol x max |desired|) follows that; a bare atol does not (1e-7 passes on AVX-512 and fails on AVX2 for a gradient
whose entries are ~2.5e-4), nor does an atol fixed for O(1) values held against logits of size 10."""

import numpy as np


def assert_float32_close(actual, desired, *, scale_tol: float = 1e-5, rtol: float = 0.0, err_msg: str = "") -> None:
    """|actual - desired| <= rtol |desired| + scale_tol x max(max |desired|, tiny) elementwise. scale_tol 1e-5 is
    ~170 float32 ulps of the largest entry: a remat, shard or chunk that drops or doubles a term is off by far more."""
    desired = np.asarray(desired, np.float64)
    scale = max(float(np.abs(desired).max(initial=0.0)), np.finfo(np.float32).tiny)
    np.testing.assert_allclose(np.asarray(actual, np.float64), desired, rtol=rtol, atol=scale_tol * scale,
                               err_msg=err_msg)
