"""NadarayaWatsonClassifier: attention pooling over one-hot labels."""

import numpy as np
import pytest

import nbattn
from nbattn import learning

from . import naive


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
    h0 = learning.bandwidth_rule(X)
    chosen = naive.loo_loss(X, onehot, bandwidth=model.bandwidth_)
    for factor in learning.LOO_GRID:
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
