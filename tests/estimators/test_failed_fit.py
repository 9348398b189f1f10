"""A fit that raises leaves the estimator as it found it: unfitted stays unfitted (no
n_features_in_ without widths), fitted keeps its previous fit."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

import nbattn
from nbattn.estimators import widths as estimator_widths


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "make",
    [
        lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo_scale"),
        lambda: nbattn.LocalPolynomialRegressor(bandwidth="aicc"),
        lambda: nbattn.NadarayaWatsonClassifier(bandwidth="loo"),
    ],
)
def test_an_interrupted_fit_changes_nothing(make, monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = X[:, 0] + rng.normal(size=30)
    if isinstance(make(), nbattn.NadarayaWatsonClassifier):
        y = (y > 0).astype(int)
    fresh, fitted = make(), make().set_params(bandwidth=0.7).fit(X, y)
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(fitted).items()}
    fitted.set_params(bandwidth=make().bandwidth)
    monkeypatch.setattr(estimator_widths, "fit_widths", _interrupt)
    monkeypatch.setattr(estimator_widths, "fit_class_widths", _interrupt, raising=False)
    for model in (fresh, fitted):
        module = type(model).__module__
        monkeypatch.setattr(f"{module}.fit_widths", _interrupt, raising=False)
        monkeypatch.setattr(f"{module}.fit_class_widths", _interrupt, raising=False)
        with pytest.raises(KeyboardInterrupt):
            model.fit(X, y)
    assert set(vars(fresh)) == set(make().get_params())
    with pytest.raises(NotFittedError):
        fresh.predict(X)
    fitted.set_params(bandwidth=0.7)
    assert set(vars(fitted)) == set(before)
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(fitted, name), value)
