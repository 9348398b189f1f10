"""Review of the one-pass key-block scores (``local_pairs.one_pass_for``: a generated C
callback per column kinds, called by address from the local passes).

The claim under test: the callback gives the same bits as the one-column passes of
``block_scores``. Every test here runs a problem twice, once as shipped and once with
``local_pairs.one_pass_kinds`` forced to None (``block_scores``, the general path; the
kernels take the same argument types either way, so nothing recompiles), and asks for
``np.array_equal``; a spy checks that the first run did take the callback. One test
also checks the fits against a dense naive formula.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.kernels import local_pairs
from nbattn.local import engine
from nbattn.local import widths as local_widths
from nbattn.local.widths import local_loo_loss_and_grad


def _table(var_type, n, seed=0, n_categories=4):
    rng = np.random.default_rng(seed)
    X = np.empty((n, len(var_type)))
    for c, kind in enumerate(var_type):
        X[:, c] = rng.normal(size=n) if kind == "c" else rng.integers(0, n_categories, n)
    y = np.sin(X.sum(axis=1)) + 0.1 * rng.normal(size=n)
    bw = np.array([0.7 if kind == "c" else 0.3 for kind in var_type])
    return X, y, bw


class _Kinds:
    """Records what ``one_pass_kinds`` answered; ``off`` forces the general path."""

    def __init__(self, monkeypatch):
        self.seen = []
        self.off = False
        real = local_pairs.one_pass_kinds

        def spy(data, model):
            kinds = None if self.off else real(data, model)
            self.seen.append(kinds)
            return kinds

        monkeypatch.setattr(local_pairs, "one_pass_kinds", spy)

    def both(self, f, expected=True):
        """f() with the callback (asserting it was taken, or with ``expected`` False that
        it was not: a problem it does not pay for) and without it."""
        self.off, self.seen = False, []
        on = f()
        assert self.seen and all((k is not None) == expected for k in self.seen), self.seen
        self.off = True
        off = f()
        self.off = False
        return on, off


@pytest.fixture
def kinds(monkeypatch):
    return _Kinds(monkeypatch)


def _flat(result):
    parts = result if isinstance(result, (tuple, list)) else (result,)
    return [np.asarray(p, dtype=float) for p in parts]


def _assert_same_bits(on, off):
    on, off = _flat(on), _flat(off)
    assert len(on) == len(off)
    for a, b in zip(on, off):
        assert a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=True), np.nanmax(np.abs(a - b))


# "ccccuuoo": the most columns a callback takes (ONE_PASS_COLUMNS)
@pytest.mark.parametrize("var_type", ["c", "uu", "co", "ccuo", "ccccuuoo", "cccccccc"])
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_engine_passes_same_bits(kinds, var_type, degree):
    if degree == 2 and var_type.count("c") > 4:
        pytest.skip("degree 2 on 8 continuous columns: 45 terms on 70 rows")
    X, y, bw = _table(var_type, 70, seed=len(var_type) + degree)
    w = np.random.default_rng(1).uniform(0.0, 2.0, len(y))
    w[::5] = 0.0  # log weight -inf
    shift = np.array([0.01 if kind == "c" else 0.0 for kind in var_type])

    def run():
        return (
            *_flat(engine.local_polynomial(X[:15] + shift, X, np.c_[y, y * y], bw, degree,
                                           var_type=var_type, sample_weight=w)),
            *_flat(engine.local_polynomial(X, X, y, bw, degree, var_type=var_type,
                                           exclude_self=True, return_gradient=True)),
            *_flat(engine.local_loo_loss(X, y, bw, degree, var_type=var_type)),
        )  # fmt: skip

    linear_columns = local_pairs.ONE_PASS_LINEAR_COLUMNS
    expected = degree == 0 or (degree == 1 and var_type.count("c") <= linear_columns)
    _assert_same_bits(*kinds.both(run, expected))


@pytest.mark.parametrize("var_type", ["cu", "co"])
def test_estimator_passes_same_bits(kinds, var_type):
    """The interval (predict_interval) and equivalent-weight (attention_weights) passes."""
    X, y, _ = _table(var_type, 90, seed=3)

    def run():
        m = nbattn.LocalPolynomialRegressor(degree=1, var_type=var_type, bandwidth="scott")
        m.fit(X, y)
        return m.predict(X[:20]), m.predict_interval(X[:20]), m.attention_weights(X[:6])

    _assert_same_bits(*kinds.both(run))


@pytest.mark.parametrize("n", [config.KEY_BLOCK - 1, config.KEY_BLOCK + 1])
def test_key_block_boundary_exclude_self(kinds, n):
    """Queries whose own key is the last of a block or the first of the next one."""
    X, y, bw = _table("cu", n, seed=n)

    def run():
        return engine.local_polynomial(X, X, y, bw, 1, var_type="cu", exclude_self=True,
                                       return_gradient=True)  # fmt: skip

    _assert_same_bits(*kinds.both(run))


@pytest.mark.parametrize("lam", [0.0, 1e-300, 0.5])
@pytest.mark.parametrize("kind", ["u", "o"])
def test_category_widths_at_the_ends(kinds, lam, kind):
    """l = 0 (b or t = -inf: exact matching) and tiny l, unordered and ordered."""
    vt = "c" + kind + kind
    X, y, _ = _table(vt, 80, seed=7, n_categories=3)
    bw = np.array([0.6, lam, 0.3])

    def run():
        return (
            *_flat(engine.local_polynomial(X[:20], X, y, bw, 1, var_type=vt)),
            *_flat(engine.local_polynomial(X, X, y, bw, 1, var_type=vt, exclude_self=True,
                                           return_gradient=True)),
        )  # fmt: skip

    _assert_same_bits(*kinds.both(run))


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_extreme_magnitudes(kinds, scale):
    """Continuous columns near 1e+-300 (scaled differences whose squares overflow)."""
    X, y, _ = _table("ccu", 60, seed=11)
    X[:, :2] *= scale
    bw = np.array([scale, scale, 0.3])
    bw_narrow = np.array([scale * 1e-160, scale, 0.3]) if scale > 1 else bw

    def run():
        return (
            *_flat(engine.local_polynomial(X[:10], X, y, bw, 1, var_type="ccu")),
            *_flat(engine.local_polynomial(X[:10], X, y, bw_narrow, 0, var_type="ccu")),
        )

    _assert_same_bits(*kinds.both(run))


def test_tied_gradient_same_bits(kinds, monkeypatch):
    """Mostly categorical rows with ties: the tied leave-one-out gradient
    (``local_ties``) takes the callback too."""
    rng = np.random.default_rng(5)
    n = 300
    X = np.c_[rng.integers(0, 3, n), rng.integers(0, 4, n), rng.integers(0, 2, n),
              np.round(rng.uniform(size=n), 1)].astype(float)  # fmt: skip
    y = X.sum(axis=1) + 0.1 * rng.normal(size=n)
    calls = []
    real = local_widths.tied_loo_gradient

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(local_widths, "tied_loo_gradient", spy)

    def run():
        return local_loo_loss_and_grad(X, y, np.array([0.1, -0.3, 0.2, np.log(0.4)]), 1,
                                       var_type="uuoc")  # fmt: skip

    _assert_same_bits(*kinds.both(run))
    assert calls, "the tied path was not taken"


def test_threads_racing_on_first_calls(monkeypatch):
    """Threads of different column kinds start at once on an empty kernel table: the same
    bits as one after the other."""
    specs = ["c", "cu", "co", "uuo", "ccuo", "cuuuoooo"]
    tables = [_table(vt, 400, seed=k) for k, vt in enumerate(specs)]

    def job(k):
        X, y, bw = tables[k]
        return _flat(engine.local_polynomial(X, X, y, bw, 1, var_type=specs[k],
                                             exclude_self=True, return_gradient=True))  # fmt: skip

    serial = [job(k) for k in range(len(specs))]
    monkeypatch.setattr(local_pairs, "_ONE_PASS", {})
    barrier = threading.Barrier(len(specs))
    racing, errors = {}, []

    def run(k):
        try:
            barrier.wait()
            racing[k] = job(k)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(len(specs)):
        _assert_same_bits(racing[k], serial[k])


def test_kinds_choice():
    """Which problems the callback serves (the others are block_scores')."""
    X, y, bw = _table("cuo", 30)
    seen = []
    real = local_pairs.one_pass_kinds

    def spy(data, model):
        seen.append(real(data, model))
        return seen[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_pairs, "one_pass_kinds", spy)
        engine.local_polynomial(X[:5], X, y, bw, 1, var_type="cuo")
        assert seen[-1] == "cuo"
        engine.local_polynomial(X[:5], X, y, bw, 1, var_type="cuo", kernel="epanechnikov")
        assert seen[-1] is None
        X9, y9, bw9 = _table("c" * 9, 30)
        engine.local_polynomial(X9[:5], X9, y9, bw9, 1, var_type="c" * 9)
        assert seen[-1] is None
        # where the one-column passes are as fast: many continuous columns at degree 1,
        # and degree 2; the local constant takes it up to ONE_PASS_COLUMNS
        wide = "c" * (local_pairs.ONE_PASS_LINEAR_COLUMNS + 1)
        X6, y6, bw6 = _table(wide, 30)
        engine.local_polynomial(X6[:5], X6, y6, bw6, 1, var_type=wide)
        assert seen[-1] is None
        engine.local_polynomial(X6[:5], X6, y6, bw6, 0, var_type=wide)
        assert seen[-1] == wide
        engine.local_polynomial(X[:5], X, y, bw, 2, var_type="cuo")
        assert seen[-1] is None


@pytest.mark.parametrize("degree", [0, 1])
def test_against_dense_formula(degree):
    """Unordered categories and continuous columns against the dense weighted least
    squares (Gaussian product kernel, Aitchison-Aitken categories)."""
    X, y, bw = _table("ccu", 120, seed=2, n_categories=3)
    Q = X[:25] + np.array([0.05, -0.05, 0.0])
    got = np.asarray(engine.local_polynomial(Q, X, y, bw, degree, var_type="ccu",
                                             n_categories=[1, 1, 3])).ravel()  # fmt: skip
    want = np.empty(len(Q))
    for i, q in enumerate(Q):
        d = (X[:, :2] - q[:2]) / bw[:2]
        lam = bw[2]
        w = np.exp(-0.5 * (d * d).sum(axis=1)) * np.where(X[:, 2] == q[2], 1 - lam, lam / 2)
        A = np.c_[np.ones(len(X)), X[:, :2] - q[:2]] if degree else np.ones((len(X), 1))
        sw = np.sqrt(w)
        want[i] = np.linalg.lstsq(A * sw[:, None], y * sw, rcond=None)[0][0]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
