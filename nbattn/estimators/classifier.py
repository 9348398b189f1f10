"""The classifier: Nadaraya-Watson over one-hot labels (:class:`NadarayaWatsonClassifier`)."""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from .base import _nadaraya_watson_init, _PoolingEstimator
from .widths import fit_class_widths

__all__ = ["NadarayaWatsonClassifier"]


class NadarayaWatsonClassifier(ClassifierMixin, _PoolingEstimator):
    """Nadaraya-Watson classification: attention pooling over one-hot labels.

    .. math::

        P(y = c \\mid x) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                          \\big(\\tfrac{x_d - x_{jd}}{h_d}\\big)^2\\Big)\\,
                          [y_j = c]

    The probabilities are the attention-weighted class frequencies around x;
    they are non-negative and sum to 1 by construction. With a leave-one-out
    width they are smoothed towards the training class frequencies pi by a
    prior of ``prior_count_`` = alpha rows,
    ``(S_c(x) + alpha pi_c) / (S(x) + alpha)`` with S_c(x) the kernel mass of
    class c around x (``sum_j w_j K(x, x_j) [y_j = c]``, weights divided by their
    mean): where x has many training rows near it the prior is nothing, far
    from all of them the answer is pi, not the nearest row's class with certainty.

    Parameters
    ----------
    bandwidth : "scott", "silverman", "loo", "loo_scale", float or array-like (n_features,)
        "loo" learns every width (h per continuous column, lambda per categorical
        one), "loo_scale" one factor of Scott's h (the lambdas at the rule's), by
        the leave-one-out **log-loss** of the smoothed probabilities, alpha
        learned with them (:mod:`nbattn.local.class_widths`). The log-loss is a
        proper score that punishes certainty, so widths below the data's
        resolution lose; the search is never worse on it than Scott's widths, and
        no probability is exactly 0. A rule or given widths keep alpha = 0 (the
        plain Nadaraya-Watson probabilities).
    kernel : "gaussian", "epanechnikov" or "tricube"
        The kernel of the continuous columns (see :class:`NadarayaWatsonRegressor`).
    rtol : float in [0, 1), default 0
        The relative error allowed on every kernel sum (see
        :class:`NadarayaWatsonRegressor`): each class probability moves by at most
        ``2 rtol / (1 - rtol)`` (the pooled one-hot rows by ``rtol / (1 - rtol)``, the
        share of the prior by a quarter of that). The ``"loo"`` and ``"loo_scale"``
        searches compare their answer with the rule's widths by the exact log-loss at
        the end and keep the better.
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`).
    device : "cpu", "cuda" or "auto"
        Resolved each time a method runs (see :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; probabilities are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search.

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
    bandwidth_ : ndarray (n_features,), h per continuous column, lambda per categorical one
    prior_count_ : float >= 0, the prior alpha of the class frequencies, in rows of kernel
        mass (0 unless ``bandwidth`` is "loo" or "loo_scale")
    var_type_, categories_, sample_weight_
        As for :class:`NadarayaWatsonRegressor`.
    X_fit_ : ndarray (n_samples, n_features), a float64 copy of the training rows
    y_fit_ : ndarray (n_samples, n_classes), the one-hot training labels (the
        values pooled, ``attention_weights(X) @ y_fit_`` the probabilities before the
        prior; named like the regressors' targets)
    n_features_in_, feature_names_in_
    """

    __init__ = _nadaraya_watson_init

    def fit(self, X, y, sample_weight=None):
        """Store copies of the training rows and one-hot labels; resolve the bandwidth.

        ``sample_weight`` multiplies each key's kernel weight (and its term in
        the "loo" criterion); rows of weight 0 are dropped.
        """
        self._validate_params()
        X, y, sw = self._validate_training_X(X, y, sample_weight)
        check_classification_targets(y)
        classes, codes = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise ValueError(
                "NadarayaWatsonClassifier needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {classes[0]!r}"
            )
        Y = np.zeros((X.shape[0], classes.size))
        Y[np.arange(X.shape[0]), codes] = 1.0
        bandwidth, prior_count = fit_class_widths(self, self.bandwidth, X, Y, sw)
        self.classes_ = classes
        self.X_fit_ = X
        self.y_fit_ = Y
        self.sample_weight_ = sw
        self.bandwidth_ = bandwidth
        self.prior_count_ = prior_count
        return self

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes) as float64, columns in ``classes_`` order."""
        X = self._check_queries(X)
        return self._probabilities(X)

    def predict(self, X):
        """The most probable class of each row (ties go to the first in ``classes_``)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
