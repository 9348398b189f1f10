"""scikit-learn's estimator checks for every nbattn estimator and its main options."""

import numpy as np
from sklearn.utils.estimator_checks import parametrize_with_checks

from nbattn import LearnedKernelRegressor, NadarayaWatsonClassifier, NadarayaWatsonRegressor


@parametrize_with_checks(
    [
        NadarayaWatsonRegressor(),
        NadarayaWatsonRegressor(bandwidth=0.5, dtype="float32"),
        NadarayaWatsonRegressor(kernel="average"),
        NadarayaWatsonRegressor(bandwidth="loo"),
        NadarayaWatsonRegressor(device="auto"),
        LearnedKernelRegressor(metric="scalar"),
        LearnedKernelRegressor(metric="diagonal", max_iter=10, dtype="float32"),
        LearnedKernelRegressor(metric="full", max_iter=10),
        LearnedKernelRegressor(metric="full", init="random", max_iter=5, random_state=0),
        LearnedKernelRegressor(
            metric="full", init="random", max_iter=5, random_state=np.random.RandomState(0)
        ),
        NadarayaWatsonClassifier(),
        NadarayaWatsonClassifier(bandwidth="loo"),
        NadarayaWatsonClassifier(bandwidth=[1.0], dtype="float32", device="auto"),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
