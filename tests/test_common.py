"""scikit-learn's estimator checks for every nbattn estimator and its main options."""

import numpy as np
from sklearn.utils.estimator_checks import parametrize_with_checks

from nbattn import LearnedKernelRegressor, NadarayaWatsonClassifier, NadarayaWatsonRegressor


class _SeededRandomState(np.random.RandomState):
    """A RandomState whose repr names its seed, not its address, so the test ids are the same
    in every process (pytest-xdist's workers must collect identical ids)."""

    def __init__(self, seed):
        super().__init__(seed)
        self._seed = seed

    def __repr__(self):
        return f"RandomState({self._seed})"


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
            metric="full", init="random", max_iter=5, random_state=_SeededRandomState(0)
        ),
        NadarayaWatsonClassifier(),
        NadarayaWatsonClassifier(bandwidth="loo"),
        NadarayaWatsonClassifier(bandwidth=[1.0], dtype="float32", device="auto"),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
