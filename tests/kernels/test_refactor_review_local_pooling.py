"""Review of two refactors made for compile time, which were to change nothing a user
sees (except that the layout pass now keeps a NaN as the largest magnitude); the flash
and decoding refactors are reviewed in ``test_refactor_review.py``:

* the local-polynomial passes take ``AllKeys`` at rtol = 0 (``chunk_runs``): compared
  with the dense weighted least squares and, bit for bit, with the one-leaf
  ``LocalLeaves`` that the exact passes received before;
* ``gaussian_weights`` and ``centred_scaled`` run on work items: the weight matrix
  against the dense softmax (far queries included), and the extreme magnitudes that
  the layout pass measures.

References are the dense float64 formulations of ``tests/naive.py``.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn

from .. import naive


# --------------------------------------------------------------------------- local passes
def _local_table(var_type, counts, n=60, n_queries=12, seed=0, missing=False):
    rng = np.random.default_rng(seed)
    columns = [
        rng.normal(size=n + n_queries) if kind == "c" else rng.integers(0, c, n + n_queries)
        for kind, c in zip(var_type, counts)
    ]
    data = np.column_stack(columns).astype(float)
    if missing:
        data[rng.random(data.shape) < 0.1] = np.nan
    X, Q = data[:n], data[n:]
    y = np.nan_to_num(np.sin(1.5 * X[:, 0])) + 0.1 * rng.normal(size=n) + 2.0
    widths = np.array([0.8 if kind == "c" else 0.3 for kind in var_type])
    return Q, X, y, widths


LOCAL_CASES = [("cc", [0, 0], False), ("cuo", [0, 3, 4], False), ("ccu", [0, 0, 3], True)]


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_local_rtol0_matches_dense_least_squares(degree):
    from nbattn.local.engine import local_loo_loss, local_polynomial

    for var_type, counts, missing in LOCAL_CASES:
        Q, X, y, widths = _local_table(var_type, counts, missing=missing)
        kw = dict(var_type=var_type, missing="marginalize" if missing else "error")
        fit = local_polynomial(Q, X, y, widths, degree, **kw)
        ref, _, _ = naive.local_polynomial_exact(Q, X, y, widths, var_type, counts, degree)
        np.testing.assert_allclose(fit, ref, rtol=1e-9, atol=1e-9, err_msg=var_type)
        loo = local_polynomial(X, X, y, widths, degree, exclude_self=True, **kw)
        ref, _, _ = naive.local_polynomial_exact(
            X, X, y, widths, var_type, counts, degree, exclude_self=True
        )
        np.testing.assert_allclose(loo, ref, rtol=1e-9, atol=1e-9, err_msg=var_type)
        loss = local_loo_loss(X, y, widths, degree, **kw)
        ref = naive.local_loo_loss_exact(X, y, widths, var_type, counts, degree)
        np.testing.assert_allclose(loss, ref, rtol=1e-9)


def _old_exact_leaves(problem):
    """What ``exact_leaves`` gave before ``AllKeys``: one leaf of every key, rtol 0."""
    from nbattn._core.local_groups import LocalLeaves
    from nbattn.local.leaves import _chunks

    n_k, n_q = problem.log_weights.shape[0], problem.q_cont.shape[0]
    dc, dk = problem.keys_cont_t.shape[0], problem.keys_cat_t.shape[0]
    return LocalLeaves(
        query_start=_chunks(np.array([0, n_q], dtype=np.int64)),
        leaf_start=np.array([0, n_k], dtype=np.int64),
        box_lo=np.zeros((1, dc)),
        box_hi=np.zeros((1, dc)),
        cat_lo=np.zeros((1, dk)),
        cat_hi=np.zeros((1, dk)),
        log_weight_max=np.zeros(1),
        log_weight_min=np.zeros(1),
        log_size=np.zeros(1),
        rtol=0.0,
    )


@pytest.mark.parametrize("degree", [0, 2])
def test_local_all_keys_gives_the_bits_of_the_one_leaf_pass(degree):
    """AllKeys (rtol = 0 now) and the one-leaf LocalLeaves (rtol = 0 before) visit the same
    keys in the same order: the first pass's every output to the bit."""
    from nbattn._core.local_groups import AllKeys
    from nbattn.local.engine import fit_layout
    from nbattn.local.leaves import TreeLayout, tree_layout
    from nbattn.local.problem import prepare

    for var_type, counts, missing in LOCAL_CASES:
        Q, X, y, widths = _local_table(var_type, counts, missing=missing, seed=degree)
        for queries, exclude in ((Q, False), (X, True)):
            problem = prepare(
                queries, X, y, widths, degree, var_type=var_type, exclude_self=exclude,
                missing="marginalize" if missing else "error",
            )  # fmt: skip
            tree = tree_layout(problem)
            assert isinstance(tree.leaves, AllKeys)
            new = fit_layout(tree, want_mfx=True)
            old = fit_layout(TreeLayout(problem, _old_exact_leaves(problem)), want_mfx=True)
            for name, a, b in zip(new._fields, new, old):
                assert np.array_equal(a, b, equal_nan=True), f"{var_type} {name}"


@pytest.mark.parametrize("degree", [0, 1])
def test_local_pruned_within_its_bound_of_the_exact(degree):
    """rtol > 0 with leaves forced at a small size: within rtol of the exact fit's normaliser
    and close to its fit; the same bits twice."""
    from nbattn.local.engine import local_polynomial

    from .._config import config_values

    Q, X, y, widths = _local_table("cc", [0, 0], n=300, n_queries=40, seed=7)
    widths = widths / 4.0
    exact = local_polynomial(Q, X, y, widths, degree)
    with config_values(LOCAL_LEAF_KEYS=4, LOCAL_TREE_MIN_KEYS=1, LOCAL_TREE_MAX_SHARE=100):
        pruned = local_polynomial(Q, X, y, widths, degree, rtol=1e-6)
        again = local_polynomial(Q, X, y, widths, degree, rtol=1e-6)
        zero = local_polynomial(Q, X, y, widths, degree, rtol=0.0)
    assert np.array_equal(pruned, again)
    assert np.array_equal(zero, exact)
    np.testing.assert_allclose(pruned, exact, rtol=0, atol=1e-4 * np.abs(y).max())


def test_local_equivalent_weights_match_dense():
    from nbattn.local.engine import equivalent_weights
    from nbattn.local.problem import prepare

    Q, X, y, widths = _local_table("cuo", [0, 3, 4])
    for degree in (0, 1):
        problem = prepare(Q, X, y, widths, degree, var_type="cuo")
        weights = equivalent_weights(problem)
        ref = naive.local_equivalent_weights(Q, X, widths, "cuo", [0, 3, 4], degree)
        np.testing.assert_allclose(weights, ref, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------- pooling
def _pool_table(n_keys=20, n_queries=8, seed=0):
    """Keys, and queries near them, 120 widths away (beyond float32's far-score threshold)
    and 1e4 widths away (beyond float64's)."""
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n_keys, 2))
    queries = rng.normal(size=(n_queries, 2))
    queries[1] += [120.0, -40.0]
    queries[2] += [-1e4, 3e3]
    queries[3] = keys[4] + [2e4, 0.0]
    return queries, keys, rng.normal(size=n_keys), np.array([0.5, 0.8])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gaussian_weights_match_dense_softmax(dtype):
    from nbattn.smoothing.regression import gaussian_attention_weights

    queries, keys, _, h = _pool_table()
    tol = 1e-12 if dtype is np.float64 else 2e-5
    for q, k, exclude in ((queries, keys, False), (keys, keys, True), (queries[:1], keys, False)):
        w = gaussian_attention_weights(q, k, h, exclude, dtype=np.dtype(dtype).name)
        assert w.dtype == dtype and w.shape == (len(q), len(k))
        ref = naive.nadaraya_watson_exact_weights(q, k, h, exclude_self=exclude)
        np.testing.assert_allclose(w, ref, rtol=0, atol=tol, err_msg=f"{exclude=}")
    one = gaussian_attention_weights(queries, keys[:1], h, dtype=np.dtype(dtype).name)
    assert (one == 1).all()  # one key: all the weight, however far
    none = gaussian_attention_weights(keys[:1], keys[:1], h, True, dtype=np.dtype(dtype).name)
    assert (none == 0).all()  # no admissible key: a row of zeros


def test_regressor_attention_weights_match_dense():
    queries, keys, y, h = _pool_table(seed=2)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=h).fit(keys, y)
    w = model.attention_weights(queries)
    ref = naive.nadaraya_watson_exact_weights(queries, keys, h)
    np.testing.assert_allclose(w, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w @ y, model.predict(queries), rtol=1e-10, atol=1e-12)


def test_gaussian_weights_and_pool_bits_on_one_and_two_threads():
    from nbattn.smoothing.regression import gaussian_attention_weights

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    rng = np.random.default_rng(3)
    keys = rng.normal(size=(700, 2))  # the layout pass's chunks are 256 rows: three items
    queries = rng.normal(size=(300, 2))
    y = rng.normal(size=700)
    saved = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 2):
            numba.set_num_threads(threads)
            runs.append(
                (
                    gaussian_attention_weights(queries, keys, 0.3),
                    nbattn.nadaraya_watson(queries, keys, y, 0.3),
                )
            )
    finally:
        numba.set_num_threads(saved)
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert np.array_equal(a, b)


def test_layout_pass_keeps_nan_and_inf_as_the_largest_magnitude():
    """centred_scaled (work items of 256 rows) reports the largest |(x - c) s| over every
    chunk: inf where a product overflows, NaN once any is NaN, whatever comes after."""
    from nbattn.kernels.pooling import centred_scaled

    rng = np.random.default_rng(0)
    x = rng.normal(size=(700, 2))
    centre, scale = np.array([0.5, -1.0]), np.array([2.0, 0.25])
    out, out_t = np.empty_like(x), np.empty((2, 700))
    largest = centred_scaled(x, centre, scale, out, out_t)
    expected = (x - centre) * scale
    assert np.array_equal(out, expected) and np.array_equal(out_t, expected.T)
    assert largest == np.abs(expected).max()
    for rows, values in (([10], [np.nan]), ([10, 600], [np.nan, 1e300]), ([600], [1e308])):
        x_bad = x.copy()
        x_bad[rows, 0] = values
        with np.errstate(over="ignore"):
            got = centred_scaled(x_bad, centre, np.array([1e10, 1.0]), out, np.empty((0, 0)))
        want = np.nan if np.isnan(values).any() else np.inf
        assert np.array_equal(got, want, equal_nan=True), (rows, values)
    empty = np.empty((0, 2))
    assert centred_scaled(empty, centre, scale, empty.copy(), np.empty((0, 0))) == 0.0


@settings(max_examples=20)
@given(
    value_exp=st.integers(-300, 307),
    width_exp=st.integers(-300, 300),
    key_exp=st.integers(-300, 300),
    near=st.integers(-6, 6) | st.none(),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_nadaraya_watson_extreme_magnitudes_are_right_or_refused(
    value_exp, width_exp, key_exp, near, dtype
):
    """Values up to 1e307, widths and key spreads from 1e-300 to 1e300 (``near``: the
    spread within a millionfold of the width): the prediction matches the exact weights,
    or a ValueError says what overflows; never inf or NaN. float32 values stay within
    its range (smaller ones round to 0 before any kernel runs)."""
    if dtype == "float32":
        value_exp = value_exp % 60 - 30
    if near is not None:
        key_exp = width_exp + near
    rng = np.random.default_rng(abs(value_exp) + 1000 * abs(width_exp))
    keys = rng.normal(size=(9, 2)) * 10.0**key_exp
    queries = np.vstack([keys[:3], rng.normal(size=(3, 2)) * 10.0**key_exp])
    values = rng.normal(size=9) * 10.0**value_exp
    width = 10.0**width_exp
    try:
        got = nbattn.nadaraya_watson(queries, keys, values, width, dtype=dtype)
    except ValueError as exc:
        assert "overflow" in str(exc) or "beyond" in str(exc), str(exc)
        return
    assert np.isfinite(got).all()
    ref = naive.nadaraya_watson_exact(queries, keys, values, width)
    tol = 1e-9 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * np.abs(values).max())


def test_pooling_refuses_non_finite_inputs_naming_them():
    from nbattn.smoothing.regression import gaussian_attention_weights

    queries, keys, y, h = _pool_table()
    for name in ("queries", "keys", "values"):
        for bad in (np.nan, np.inf):
            args = {"queries": queries.copy(), "keys": keys.copy(), "values": y.copy()}
            args[name].flat[3] = bad
            before = {key: a.copy() for key, a in args.items()}
            with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
                nbattn.nadaraya_watson(args["queries"], args["keys"], args["values"], h)
            if name != "values":
                with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
                    gaussian_attention_weights(args["queries"], args["keys"], h)
            for key, a in args.items():
                np.testing.assert_array_equal(a, before[key])
