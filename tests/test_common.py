"""scikit-learn's estimator checks for every nbattn estimator."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from nbattn import LearnedKernelRegressor, NadarayaWatsonClassifier, NadarayaWatsonRegressor


@parametrize_with_checks(
    [
        NadarayaWatsonRegressor(),
        NadarayaWatsonRegressor(bandwidth=0.5, dtype="float32"),
        NadarayaWatsonRegressor(kernel="average"),
        NadarayaWatsonRegressor(bandwidth="loo"),
        LearnedKernelRegressor(metric="scalar"),
        LearnedKernelRegressor(metric="diagonal", max_iter=10),
        LearnedKernelRegressor(metric="full", max_iter=10),
        NadarayaWatsonClassifier(),
        NadarayaWatsonClassifier(bandwidth="loo"),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
