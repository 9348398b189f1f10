"""scikit-learn's estimator checks on every nbattn estimator."""

from sklearn.utils.estimator_checks import parametrize_with_checks

import nbattn

ESTIMATORS = [
    nbattn.NadarayaWatsonRegressor(),
    nbattn.NadarayaWatsonRegressor(bandwidth=0.5, dtype="float32"),
    nbattn.NadarayaWatsonRegressor(kernel="average"),
]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible(estimator, check):
    check(estimator)
