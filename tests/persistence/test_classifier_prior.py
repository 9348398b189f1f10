"""A classifier's learned prior (``prior_count_``) in model files: saved, read back by
both readers to the same probabilities, refused when edited to what no fit writes, and
0 for files written before it existed."""

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn.persistence import modelfile
from nbattn.persistence.predictor import read_predictor

from .edited_files import rewrite, split


def _table(seed=0, n=60):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"x": rng.normal(size=n), "town": rng.choice(["a", "b", "c"], n)})
    y = np.where(X["x"] + 0.5 * (X["town"] == "a") + rng.normal(0, 0.7, n) > 0, "yes", "no")
    return X, y


def _saved(tmp_path, bandwidth="loo"):
    X, y = _table()
    model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth, var_type="cu").fit(X, y)
    return nbattn.save(model, tmp_path / "m.npz")


@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
@pytest.mark.parametrize("columns, var_type", [(["x", "town"], "cu"), (["x"], None)])
def test_both_readers_predict_the_fitted_probabilities(tmp_path, bandwidth, columns, var_type):
    """The engine (a categorical column) and the Gaussian fast path; queries near the rows
    and a thousand times farther out (where the prior holds)."""
    X, y = _table()
    X = X[columns]
    model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth, var_type=var_type).fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    Q = pd.concat([X, X.assign(x=X["x"] * 1e3)])
    assert model.prior_count_ > 0
    expected = model.predict_proba(Q)
    assert (expected > 0).all()
    assert np.array_equal(nbattn.load(path).predict_proba(Q), expected)
    assert np.array_equal(read_predictor(path)[0].predict_proba(Q), expected)


@pytest.mark.parametrize(
    "value", [-1.0, float("inf"), "1", True, None, 10**400, 1e308, 6e4 * 60 + 1, 5e-324, 9e-4]
)
def test_an_edited_prior_is_refused(tmp_path, value):
    """Anything but 0 or a prior a fit of these 60 rows could learn, in [1e-3, 1e3 n]."""
    words = r"prior_count_ must be 0 or a number in \[0.001, 60000\]"
    path = _saved(tmp_path)
    meta, arrays = split(path)
    meta["attributes"]["prior_count_"]["value"] = value
    rewrite(path, meta, arrays)
    for read in (nbattn.load, read_predictor):
        with pytest.raises(modelfile.ModelFileError, match=words):
            read(path)


def test_a_prior_beside_a_rule_width_or_missing_is_refused(tmp_path):
    path = _saved(tmp_path, bandwidth="scott")
    meta, arrays = split(path)
    assert meta["attributes"]["prior_count_"]["value"] == 0.0
    meta["attributes"]["prior_count_"]["value"] = 0.5
    rewrite(path, meta, arrays)
    for read in (nbattn.load, read_predictor):
        with pytest.raises(modelfile.ModelFileError, match="learns none"):
            read(path)
    del meta["attributes"]["prior_count_"]
    rewrite(path, meta, arrays)
    for read in (nbattn.load, read_predictor):
        with pytest.raises(modelfile.ModelFileError, match="'prior_count_' is missing"):
            read(path)


def test_a_version_3_classifier_predicts_its_plain_probabilities(tmp_path):
    """A file from before the prior (version 3, no prior_count_) loads with 0: the
    probabilities that nbattn computed when it was written."""
    X, y = _table()
    model = nbattn.NadarayaWatsonClassifier(bandwidth=0.4, var_type="cu").fit(X, y)
    path = nbattn.save(model, tmp_path / "m.npz")
    meta, arrays = split(path)
    meta["format_version"] = 3
    del meta["attributes"]["prior_count_"]
    rewrite(path, meta, arrays)
    loaded = nbattn.load(path)
    assert loaded.prior_count_ == 0.0
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
    assert np.array_equal(read_predictor(path)[0].predict_proba(X), model.predict_proba(X))
