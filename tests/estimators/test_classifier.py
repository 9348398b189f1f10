"""NadarayaWatsonClassifier: attention pooling over one-hot labels."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.local.class_widths import ALPHA_HIGH_PER_ROW, ALPHA_LOW
from nbattn.smoothing import regression
from nbattn.smoothing.width_search import LOO_GRID

from .. import naive


def _blobs(seed, n=120):
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0], [2.0, 0.5], [0.5, 2.5]])
    labels = rng.integers(0, 3, size=n)
    X = centers[labels] + 0.7 * rng.normal(size=(n, 2))
    return X, np.array(["a", "b", "c"])[labels]


def test_probabilities_match_naive_pooling():
    X, y = _blobs(0)
    Q = np.random.default_rng(1).normal(size=(25, 2)) * 2
    model = nbattn.NadarayaWatsonClassifier(bandwidth=0.5).fit(X, y)
    assert list(model.classes_) == ["a", "b", "c"]
    onehot = (y[:, None] == model.classes_[None, :]).astype(float)
    expected = naive.nadaraya_watson(Q, X, onehot, 0.5)
    proba = model.predict_proba(Q)
    np.testing.assert_allclose(proba, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-14)
    assert np.all(model.predict(Q) == model.classes_[np.argmax(expected, axis=1)])
    np.testing.assert_allclose(model.attention_weights(Q) @ onehot, expected, rtol=1e-12)


def _brute_force_log_loss(X, onehot, widths, var_type, counts, sample_weight=None):
    """min over a fine grid of alpha of the naive smoothed LOO log-loss at ``widths``
    (alpha up to its bound for n rows, the most any weights allow)."""
    n_eff = X.shape[0]
    alphas = np.exp(np.arange(np.log(ALPHA_LOW), np.log(ALPHA_HIGH_PER_ROW * n_eff), 0.1))
    return min(
        naive.smoothed_class_loo_log_loss(X, onehot, widths, var_type, counts, a, sample_weight)
        for a in alphas
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
def test_loo_widths_minimise_the_smoothed_log_loss_against_brute_force(seed, bandwidth):
    """The chosen (widths, alpha) score no worse than a brute-force grid of common factors
    of Scott's widths, each with its best alpha on a fine grid: Scott's own widths (factor
    1) among them."""
    X, y = _blobs(seed, n=70)
    model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth).fit(X, y)
    onehot = (y[:, None] == model.classes_[None, :]).astype(float)
    counts = [0, 0]
    chosen = naive.smoothed_class_loo_log_loss(
        X, onehot, model.bandwidth_, "cc", counts, model.prior_count_
    )
    h0 = regression.bandwidth_rule(X)
    brute = [_brute_force_log_loss(X, onehot, f * h0, "cc", counts) for f in LOO_GRID]
    assert chosen <= min(brute) * (1 + 1e-4), (chosen, min(brute))
    assert ALPHA_LOW <= model.prior_count_ <= ALPHA_HIGH_PER_ROW * X.shape[0]


@pytest.mark.parametrize("seed", range(3))
def test_mixed_loo_widths_are_never_worse_than_the_rule_on_the_smoothed_log_loss(seed):
    rng = np.random.default_rng(seed)
    X, y = _blobs(seed, n=60)
    group = ((y == "a") & (rng.random(60) < 0.7)).astype(float)  # an informative category
    X = np.column_stack([X, group.astype(float)])
    model = nbattn.NadarayaWatsonClassifier(bandwidth="loo", var_type="ccu").fit(X, y)
    onehot = (y[:, None] == model.classes_[None, :]).astype(float)
    counts = [0, 0, 2]
    chosen = naive.smoothed_class_loo_log_loss(
        X, onehot, model.bandwidth_, "ccu", counts, model.prior_count_
    )
    rule = nbattn.NadarayaWatsonClassifier(var_type="ccu").fit(X, y).bandwidth_
    assert chosen <= _brute_force_log_loss(X, onehot, rule, "ccu", counts) * (1 + 1e-4)


def test_loo_probabilities_match_the_naive_smoothed_formula():
    """predict_proba = (S_c + alpha pi_c) / (S + alpha) on the Gaussian fast path, the
    engine (a categorical column, a compact kernel) and with sample weights."""
    X, y = _blobs(7, n=80)
    rng = np.random.default_rng(8)
    Q = rng.normal(size=(30, 2)) * 2
    Q[0] = [40.0, -40.0]  # far from every row: the class frequencies
    sw = rng.uniform(0.2, 3.0, size=80)
    group = rng.integers(0, 3, size=80).astype(float)
    cases = [
        (X, Q, {}, None, "cc", [0, 0], "gaussian"),
        (X, Q, {}, sw, "cc", [0, 0], "gaussian"),
        (X, Q, {"kernel": "epanechnikov"}, None, "cc", [0, 0], "epanechnikov"),
        (
            np.column_stack([X, group]),
            np.column_stack([Q, rng.integers(0, 3, size=30)]),
            {"var_type": "ccu"},
            sw,
            "ccu",
            [0, 0, 3],
            "gaussian",
        ),
    ]
    for train, queries, options, weights, kinds, counts, kernel in cases:
        model = nbattn.NadarayaWatsonClassifier(bandwidth="loo_scale", **options)
        model.fit(train, y, sample_weight=weights)
        assert model.prior_count_ > 0
        onehot = (y[:, None] == model.classes_[None, :]).astype(float)
        expected = naive.smoothed_class_probabilities(
            queries,
            train,
            onehot,
            model.bandwidth_,
            kinds,
            counts,
            model.prior_count_,
            weights,
            kernel,
        )
        np.testing.assert_allclose(model.predict_proba(queries), expected, rtol=1e-9, atol=1e-15)
    frequencies = np.array([(np.sum(y == c) + 1) / (y.size + 3) for c in model.classes_])
    far = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, y).predict_proba(Q[:1])
    np.testing.assert_allclose(far[0], frequencies, rtol=1e-9)


def test_far_query_gets_its_nearest_class():
    X = np.array([[0.0], [1.0], [10.0]])
    y = np.array([0, 0, 1])
    model = nbattn.NadarayaWatsonClassifier(bandwidth=0.01).fit(X, y)
    np.testing.assert_allclose(model.predict_proba([[1e4]]), [[0.0, 1.0]])
    assert model.predict([[-1e4], [1e4]]).tolist() == [0, 1]


def test_single_class_and_bad_input():
    X, _ = _blobs(3, n=10)
    with pytest.raises(ValueError, match="only one class"):
        nbattn.NadarayaWatsonClassifier().fit(X, np.zeros(10))
    with pytest.raises(ValueError):
        nbattn.NadarayaWatsonClassifier().fit(X, np.linspace(0, 1, 10))  # continuous target
    two = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X[:2], [0, 1])
    assert np.all(np.isfinite(two.bandwidth_))  # n = 2 is enough for leave-one-out


def test_effective_neighbors_and_float32_against_naive():
    X, y = _blobs(4)
    Q = np.random.default_rng(5).normal(size=(20, 2)) * 2
    onehot_model = nbattn.NadarayaWatsonClassifier(bandwidth=[0.4, 0.9]).fit(X, y)
    w = naive.nadaraya_watson_weights(Q, X, [0.4, 0.9])
    np.testing.assert_allclose(
        onehot_model.effective_n_neighbors(Q), 1.0 / (w**2).sum(axis=1), rtol=1e-10
    )
    f32 = nbattn.NadarayaWatsonClassifier(bandwidth=[0.4, 0.9], dtype="float32").fit(X, y)
    proba = f32.predict_proba(Q)
    assert proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(proba, onehot_model.predict_proba(Q), atol=1e-5)


def test_y_fit_holds_the_one_hot_labels_and_is_a_copy():
    X, y = _blobs(6, n=40)
    labels = y.copy()
    model = nbattn.NadarayaWatsonClassifier(bandwidth=0.5).fit(X, labels)
    before = model.predict_proba(X)
    np.testing.assert_array_equal(model.y_fit_, labels[:, None] == model.classes_[None, :])
    labels[:] = "a"
    X[:] = 0.0
    np.testing.assert_array_equal(model.predict_proba(_blobs(6, n=40)[0]), before)
    assert not hasattr(model, "Y_fit_")


@pytest.mark.parametrize("seed", range(8))
def test_loo_width_keeps_every_neighbouring_class_possible(seed):
    """A collapsed width gives probabilities of exactly 0 and 1; the LOO width must not.

    Overlapping classes (like occupational-prestige types against education
    and income): every class present among a query's 5 nearest training rows
    gets a positive probability.
    """
    rng = np.random.default_rng(seed)
    n = 90
    labels = rng.integers(0, 3, size=n)
    centres = np.array([[10.0, 6000.0], [11.5, 8000.0], [13.5, 11000.0]])
    X = centres[labels] + rng.normal(size=(n, 2)) * [1.5, 2500.0]
    model = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, labels)
    Q = centres[rng.integers(0, 3, size=30)] + rng.normal(size=(30, 2)) * [1.5, 2500.0]
    proba = model.predict_proba(Q)
    scaled = (Q[:, None, :] - X[None, :, :]) / X.std(axis=0)
    nearest = np.argsort((scaled**2).sum(axis=2), axis=1)[:, :5]
    for i, rows in enumerate(nearest):
        present = np.unique(labels[rows])
        assert (proba[i, present] > 0).all(), (i, proba[i], present)


@pytest.mark.parametrize(
    "labels",
    [
        np.array(["x", "y", "z"] * 6, dtype=object),
        np.array([True, False, True] * 6),
        np.array([0.0, 1.0, 2.0] * 6),
        np.array([-3, 7, 2] * 6),
        np.array(["x", "y", "z"] * 6),
    ],
    ids=["object-str", "bool", "float", "int", "str"],
)
def test_every_label_kind_saves_and_predicts_the_same_labels(labels, tmp_path):
    X = np.random.default_rng(0).normal(size=(18, 2))
    model = nbattn.NadarayaWatsonClassifier().fit(X, labels)
    loaded = nbattn.load(nbattn.save(model, tmp_path / "m.npz"))
    pred, pred_loaded = model.predict(X), loaded.predict(X)
    assert pred.tolist() == pred_loaded.tolist()
    assert set(pred.tolist()) <= set(labels.tolist())
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 40),
    d=st.integers(1, 3),
    n_classes=st.integers(2, 4),
    spacing=st.sampled_from([0.0, 0.1, 1.0]),
    far=st.floats(1e2, 1e6),
)
def test_loo_probabilities_are_never_exactly_zero(seed, n, d, n_classes, spacing, far):
    """With a leave-one-out width every class keeps a positive probability at every
    query, near or far from the rows, on tied (spacing 0), gridded and spread data;
    the probabilities sum to 1."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % n_classes
    X = rng.normal(size=(n, d))
    if spacing:
        X = np.round(X / spacing) * spacing
    else:
        X[:] = X[0]
    model = nbattn.NadarayaWatsonClassifier(bandwidth="loo_scale").fit(X, labels)
    Q = np.vstack([X + 0.01, rng.normal(size=(5, d)) * far])
    proba = model.predict_proba(Q)
    assert (proba > 0).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_loo_widths_do_not_depend_on_the_scale_of_the_weights(seed):
    """Weights times a power of two give the same fit to the bit; times any constant,
    the same to rounding (the widths' criterion, the prior in rows and the class
    frequencies are all scale-free in the weights)."""
    X, y = _blobs(seed, n=50)
    w = np.random.default_rng(seed).uniform(0.1, 2.0, size=50)
    Q = np.random.default_rng(seed + 1).normal(size=(10, 2)) * 2
    fits = [
        nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, y, sample_weight=w * c)
        for c in (1.0, 2.0**-40, 2.0**50, 1e-9 / w.sum())
    ]
    for other in fits[1:3]:
        assert np.array_equal(other.bandwidth_, fits[0].bandwidth_)
        assert other.prior_count_ == fits[0].prior_count_
        assert np.array_equal(other.predict_proba(Q), fits[0].predict_proba(Q))
    np.testing.assert_allclose(fits[3].bandwidth_, fits[0].bandwidth_, rtol=1e-6)
    np.testing.assert_allclose(fits[3].predict_proba(Q), fits[0].predict_proba(Q), atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_loo_widths_on_labels_independent_of_x_are_no_worse_than_the_class_frequencies(seed):
    """Labels drawn independently of X: the best probabilities are the class frequencies,
    and held-out rows must score no worse than they do (beyond sampling noise). A prior
    that counted each left-out row's own label would let every width below the data's
    resolution beat ignoring x, and the search would end there, near-certain at and near
    every training row."""
    rng = np.random.default_rng(seed)
    X, y = rng.normal(size=(200, 2)), rng.integers(0, 2, 200)
    Q, yq = rng.normal(size=(2000, 2)), rng.integers(0, 2, 2000)
    pi = np.bincount(y, minlength=2) / y.size
    constant = -np.mean(np.log(pi[yq]))
    for bandwidth in ("loo", "loo_scale"):
        model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth).fit(X, y)
        held_out = -np.mean(np.log(model.predict_proba(Q)[np.arange(yq.size), yq]))
        assert held_out <= constant + 0.02, (bandwidth, model.bandwidth_, model.prior_count_)


def test_a_class_with_a_sliver_of_the_weight_keeps_a_finite_criterion():
    """One row weighing 1e300 against 39 of weight 1: Laplace's frequencies keep the light
    class's prior positive (no log of 0, no warning) and every probability positive."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = np.array([0] + [1] * 39)
    w = np.array([1e300] + [1.0] * 39)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, y, sample_weight=w)
        proba = model.predict_proba(np.vstack([X, X * 100]))
    assert (proba > 0).all() and np.isfinite(model.bandwidth_).all()
