"""NadarayaWatsonClassifier: attention pooling over one-hot labels."""

import numpy as np
import pytest

import nbattn
from nbattn.smoothing import regression, width_search

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


def test_loo_bandwidth_minimises_the_brier_score():
    X, y = _blobs(2)
    model = nbattn.NadarayaWatsonClassifier(bandwidth="loo").fit(X, y)
    onehot = (y[:, None] == model.classes_[None, :]).astype(float)
    h0 = regression.bandwidth_rule(X)
    chosen = naive.loo_loss(X, onehot, bandwidth=model.bandwidth_)
    for factor in width_search.LOO_GRID:
        assert chosen <= naive.loo_loss(X, onehot, bandwidth=factor * h0) * (1 + 1e-12)
    assert model.score(X, y) > 0.8


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
