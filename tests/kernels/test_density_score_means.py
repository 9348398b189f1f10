"""The density gradient pass (nbattn.kernels.density.log_sums_and_score_means) against
NumPy over the whole score matrix: several key blocks, a maximum that grows from block to
block, keys of weight 0, exclude_self, every continuous kernel, categorical columns."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn.kernels import density as kd
from nbattn.kernels.local_pairs import dlog_kernel

from ..strategies import seeds

KERNELS = {"gaussian": 0, "epanechnikov": 1, "tricube": 2}


def _log_kernel(d, name):
    if name == "gaussian":
        return -0.5 * d * d
    inside = 1.0 - (d * d if name == "epanechnikov" else np.abs(d) ** 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inside > 0, (1 if name == "epanechnikov" else 3) * np.log(inside), -np.inf)


def _category_terms(keys, q, params):
    """(n_q, n_k) term of one column: a where equal, b + t max(|x - q|, 1) elsewhere."""
    a, b, t = params
    diff = np.abs(keys[None, :] - q[:, None])
    return np.where(diff == 0, a, b + t * np.maximum(diff, 1.0))


@settings(max_examples=12, deadline=None)
@given(
    seed=seeds,
    n=st.integers(1, 700),
    dc=st.integers(0, 2),
    dk=st.integers(0, 2),
    kernel=st.sampled_from(sorted(KERNELS)),
    exclude_self=st.booleans(),
    sort_keys=st.booleans(),
)
def test_the_pass_is_the_softmax_mean(seed, n, dc, dk, kernel, exclude_self, sort_keys):
    rng = np.random.default_rng(seed)
    spread = 0.3 if kernel == "gaussian" else 0.15
    q_cont = rng.normal(scale=spread, size=(n, dc)) * np.arange(1, n + 1)[:, None] ** 0.5
    if sort_keys and dc:  # the running maximum then grows block after block for row 0
        q_cont = q_cont[np.argsort(-np.abs(q_cont[:, 0] - q_cont[0, 0]))]
    q_cat = rng.integers(0, 3, (n, dk)).astype(float)
    params = rng.uniform(-3.0, 0.0, (dk, 3))
    params[:, 0] = -rng.uniform(0.0, 0.5, dk)
    dparams = rng.normal(size=(dk, 3))
    log_w = np.log(rng.uniform(0.1, 3.0, n))
    log_w[rng.random(n) < 0.1] = -np.inf
    code = KERNELS[kernel]
    log_sums, means = kd.log_sums_and_score_means(
        q_cont,
        np.ascontiguousarray(q_cont.T),
        q_cat,
        np.ascontiguousarray(q_cat.T),
        params,
        dparams,
        log_w,
        code,
        exclude_self,
    )
    diff = q_cont.T[:, None, :] - q_cont.T[:, :, None]  # (dc, n_q, n_k): key - query
    scores = np.broadcast_to(log_w, (n, n)).copy()
    for c in range(dc):
        scores += _log_kernel(diff[c], kernel)
    derivatives = []
    for c in range(dc):
        slope = np.vectorize(lambda d: dlog_kernel(d, code))(diff[c])
        derivatives.append(-diff[c] * slope)
    for k in range(dk):
        scores += _category_terms(q_cat[:, k], q_cat[:, k], params[k])
        derivatives.append(_category_terms(q_cat[:, k], q_cat[:, k], dparams[k]))
    if exclude_self:
        np.fill_diagonal(scores, -np.inf)
    top = scores.max(axis=1, keepdims=True)
    reached = np.isfinite(top[:, 0])
    with np.errstate(invalid="ignore"):
        p = np.where(reached[:, None], np.exp(scores - top), 0.0)
    total = p.sum(axis=1)
    with np.errstate(divide="ignore"):
        expected = np.where(reached, top[:, 0] + np.log(total), -np.inf)
    np.testing.assert_allclose(log_sums, expected, rtol=1e-13, atol=1e-13)
    safe_total = np.where(reached, total, 1.0)
    for g, derivative in enumerate(derivatives):
        with np.errstate(invalid="ignore"):
            mean = np.where(reached, (p * derivative).sum(axis=1) / safe_total, 0.0)
            scale = np.where(reached, (p * np.abs(derivative)).sum(axis=1) / safe_total, 0.0)
            # a compact kernel's term -d s'(d) near the support's edge carries the rounding
            # of 1 - d^2 (or 1 - |d|^3) magnified by its condition number, about 1 + |term|
            edge = np.where(
                reached,
                (p * np.abs(derivative) * (1 + np.abs(derivative))).sum(axis=1) / safe_total,
                0.0,
            )
        atol = 1e-12 * (1 + scale).max() + 1e-15 * edge.max()
        np.testing.assert_allclose(means[:, g], mean, rtol=0, atol=atol)
