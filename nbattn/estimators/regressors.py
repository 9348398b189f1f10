"""The regressors: Nadaraya-Watson, the learned kernel metric, the local polynomial.

All three pool float64 targets over the training rows
(:class:`nbattn.estimators.base._PoolingEstimator`) and share
:class:`_PoolingRegressor`: targets as float64 columns, 1-D or 2-D output,
``predict(X, return_std=True)``, :meth:`~_PoolingRegressor.marginal_effects`
and :meth:`~_PoolingRegressor.predict_interval`. They differ in how the
widths are chosen at fit:

* :class:`NadarayaWatsonRegressor`: a rule, a number, an array, or the
  leave-one-out scale of Scott's widths;
* :class:`LearnedKernelRegressor`: the kernel metric learned by minimising
  the leave-one-out MSE (a scale, a width per feature, or a full linear map);
* :class:`LocalPolynomialRegressor`: widths for a local polynomial of degree
  0, 1 or 2, always on the mixed-type engine.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import RegressorMixin

from .._core.validation import as_float_array
from ..local.bands import BandOptions
from ..smoothing import learned_metric
from .base import _nadaraya_watson_regressor_init, _PoolingEstimator
from .significance import SignificanceTests
from .widths import engine_loo_loss, engine_loo_widths, fit_widths

__all__ = ["LearnedKernelRegressor", "LocalPolynomialRegressor", "NadarayaWatsonRegressor"]


class _PoolingRegressor(SignificanceTests, RegressorMixin, _PoolingEstimator):
    """The regressors' share: targets as float64 columns, 1-D or 2-D output, ``return_std``."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _validate_regression_data(self, X, y, sample_weight=None):
        """(X, y as float64 (n, n_outputs), whether y is 2-D, sample weights or None);
        X and y are copies, rows of zero weight dropped."""
        X, y, sw = self._validate_training_X(X, y, sample_weight, multi_output=True, y_numeric=True)
        # a float64 copy, finite: scikit-learn checks object arrays before converting them
        y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
        return X, y.reshape(len(y), -1), y.ndim == 2, sw

    def _store_training_data(self, X, y2, outputs_2d, sample_weight=None):
        self.X_fit_ = X
        self.y_fit_ = y2
        self.n_outputs_ = y2.shape[1]
        self.outputs_2d_ = outputs_2d
        self.sample_weight_ = sample_weight

    def predict(self, X, return_std=False):
        """Attention-pooled targets for the rows of X (float64).

        With ``return_std=True`` also the attention-weighted standard deviation
        of the training targets about the prediction,
        ``std_i = sqrt(sum_j w_ij (y_j - f_i)^2)`` (computed in a second pass
        about f_i, not as E[y^2] - E[y]^2, which cancels), shaped like the
        prediction. It is the spread of the targets the query pools, not a
        confidence interval of f. Both run on ``device``
        (:func:`nbattn.smoothing.regression.nadaraya_watson_spread` for the spread).
        """
        X = self._check_queries(X)
        return self._predictions(X, return_std)

    def marginal_effects(self, X):
        """The slope of the fit along each continuous column at the rows of X.

        ``d f(x) / d x_d`` for every column of kind "c" (in column order),
        shape (n, d_continuous) for a 1-D target, (n, n_outputs, d_continuous)
        for a 2-D one. For the Gaussian kernel at degree 0 (Nadaraya-Watson)
        it is exact: with the attention weights w_j(x),

        .. math::

            \\frac{\\partial f}{\\partial x_d} =
            \\frac{1}{h_d^2} \\sum_j w_j(x)\\,(y_j - f(x))\\,(x_{jd} - x_d),

        the weighted covariance of y and the key's coordinate in units of h_d,
        divided by h_d once (exact at any scale of the data; categorical columns
        do not depend on x_d, so the formula holds in the mixed product kernel
        too). A local polynomial of degree >= 1, the compact kernels and
        ``missing="marginalize"`` return the engine's local slope
        (:func:`nbattn.local.engine.local_polynomial` with ``return_gradient``);
        ``kernel="average"`` predicts one constant, whose slopes are 0.
        """
        return self._marginal_effects(self._check_queries(X))

    def predict_interval(
        self,
        X,
        alpha=0.05,
        kind="mean",
        method="asymptotic",
        n_boot=999,
        resample="wild",
        random_state=None,
    ):
        """A pointwise (1 - alpha) interval at the rows of X: (n, 2), or
        (n, n_outputs, 2) for a 2-D target; column 0 the lower, 1 the upper end.

        ``method="asymptotic"`` (the default) gives the normal intervals below;
        ``method="bootstrap"`` a bootstrap band of the mean (further below).

        From the leave-one-out residuals r_j of the training rows and the
        equivalent-kernel weights l_j(x) of the fit (``f(x) = sum_j l_j(x) y_j``):

        * ``kind="mean"``: the interval for the regression function,
          ``var = sum_j l_j(x)^2 r_j^2`` (the sandwich variance);
        * ``kind="observation"``: for a new observation at x, adding the
          kernel-weighted mean of r^2 around x (the local noise variance).

        The ends are ``f(x) -/+ z sqrt(var)``, z the upper alpha/2 quantile of
        the standard normal (finite for any alpha in (0, 1))
        (:func:`nbattn.local.engine.local_prediction_interval`). The interval is
        centred on f, so it covers the true mean only where the smoothing
        bias is small against the noise (a wide enough width).

        * ``kind="quantile"``: the central interval of a new observation at x, f(x)
          plus the quantiles at alpha/2 and 1 - alpha/2 of the leave-one-out residuals
          r_j = y_j - f_{-j}(x_j) pooled at x: their kernel conditional distribution with
          this model's widths for X and the normal-reference width for r (what
          :class:`nbattn.KernelQuantileRegressor` with ``bandwidth=bandwidth_`` fitted on
          the residuals predicts; :func:`nbattn.distribution.cdf_widths.quantile_interval`).
          Free to be skewed and to widen where the noise does; the residuals' smoothing
          widens it a little. For a 1-D target, on complete rows.

        ``method="bootstrap"`` (``kind="mean"`` only): a band for the estimator's
        expectation E[g(x)] at the fitted widths, like the sandwich: the widths stay at
        ``bandwidth_`` in every replicate (re-choosing them per replicate is not done), so
        it shares the sandwich's blindness to the smoothing bias. ``n_boot`` replicates
        (an int >= 1; a warning when ``n_boot * alpha / 2 < 1``, where an end would be the
        replicates' extreme), drawn from ``random_state`` (None: a fixed seed, so that two
        calls agree to the bit; an int seed; a numpy Generator, advanced, or a RandomState):

        * ``resample="wild"`` (Wu 1986; Mammen 1993, "Bootstrap and wild bootstrap for
          high dimensional linear models"): with Mammen's two-point multipliers v_jb
          (mean 0, variance 1, third moment 1) replicate b deviates from the fit by
          ``d_b(x) = sum_j l_j(x) r_j v_jb``, whose variance is the sandwich's
          ``sum_j l_j(x)^2 r_j^2``; the band is ``[f(x) + q_{alpha/2}(d(x)),
          f(x) + q_{1-alpha/2}(d(x))]``, the replicates' percentiles recentred on
          predict's value f(x). The fit is linear in its values, so all replicates come
          from one pass of the engine over the columns r v_b.
        * ``resample="pairs"`` (Efron 1979, "Bootstrap methods: another look at the
          jackknife"): the rows drawn with replacement (their counts multiply the sample
          weights), the model refitted at the held widths in every replicate (one pass
          each: n_boot times the work of a prediction), and the band the alpha/2 and
          1 - alpha/2 percentiles of the refits g*_b(x). Where no drawn row reaches x (a
          compact kernel) a refit takes the nearest drawn row's target, as a model fitted
          on those rows predicts.

        Percentiles interpolate linearly between order statistics. The Gaussian
        streaming models resample in their score coordinates, as their normal interval
        is computed (:func:`nbattn.local.bands.bootstrap_band`).
        """
        band = BandOptions(method, n_boot, resample, random_state)
        return self._interval(self._check_queries(X), alpha, kind, band)


class NadarayaWatsonRegressor(_PoolingRegressor):
    """Nadaraya-Watson kernel regression: attention pooling over the training set.

    .. math::

        \\hat y(x) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                     \\big(\\tfrac{x_d - x_{jd}}{h_d}\\big)^2\\Big)\\, y_j

    The queries are the rows to predict, the keys and values the training
    rows and targets (the attention-pooling walk-through, section 1.3.2).
    Computed by a streaming online-softmax kernel: exact, stable for queries
    far from the data, and in memory linear in the number of rows.

    Parameters
    ----------
    bandwidth : "scott", "silverman", "loo", "loo_scale", float or array-like (n_features,)
        Kernel widths h_d. Rule names are per feature (see
        :func:`nbattn.smoothing.regression.bandwidth_rule`). "loo" learns one width per
        column (h, or lambda for a categorical one) by the leave-one-out MSE
        (:func:`nbattn.local.widths.local_loo_widths`, as R np's
        ``npregbw(bwmethod="cv.ls")``); "loo_scale" scales Scott's widths by the one
        factor that minimises it (:func:`nbattn.smoothing.width_search.loo_bandwidth`).
    bandwidth_type : "fixed", "generalized_nn" or "adaptive_nn"
        R np's ``bwtype``. With a nearest-neighbour type ``bandwidth`` is ``"loo"`` (the
        counts k, and l per categorical column, of least leave-one-out MSE: every k
        evaluated where n - 1 holds at most ``config.NN_EXHAUSTIVE_COUNTS`` of them, else
        narrowing grids), one integer k for every continuous column, or an array (k per
        continuous column, l per categorical one). Generalised: at a query x a continuous
        column's width is the distance from x to its k-th nearest training value;
        adaptive: training row i carries the distance from x_i to its k-th nearest other
        value, h_i, and weighs K((x - x_i) / h_i) / h_i (:mod:`nbattn.local.neighbours`).
        Exact (``rtol`` 0), complete continuous columns; not with "aicc" or a rule.
    kernel : "gaussian", "epanechnikov", "tricube" or "average"
        The kernel of the continuous columns. "average" is average pooling
        (the walk-through, section 1.3.1): every training target gets the same
        weight, whatever the query. The Gaussian kernel on all-continuous data
        without missing values runs the streaming kernels (CPU or GPU); every
        other case the mixed-type engine :mod:`nbattn.local.engine`.
    rtol : float in [0, 1), default 0
        The relative error allowed on every kernel sum, in the width search and in
        predictions, on the CPU: 0 sums every key exactly; ``rtol > 0`` lets a query skip
        the keys (leaves of a k-d tree) it certifiably cannot weigh, or sum a node of them
        by a Taylor series within a certified error (wide widths, at most three
        features), so that each normaliser S comes out within [(1 - rtol) S,
        (1 + rtol) S] (at least (1 - rtol) S without series) and each prediction moves
        by at most ``rtol / (1 - rtol)`` times the spread of the targets about it
        (:func:`nbattn.smoothing.regression.nadaraya_watson` on the streaming path,
        :func:`nbattn.local.engine.local_polynomial` on the engine). A cost model keeps
        the exact path where the tree would not pay. The ``"loo"`` and ``"loo_scale"``
        searches on the engine evaluate their answer and the rule's widths exactly at the
        end and keep the better, so they are never worse than the rule. Exact whatever
        rtol: ``"loo_scale"`` on the streaming path, predictions on the streaming path
        with sample weights (its tree bounds the kernel mass, not the weighted one),
        ``attention_weights`` and ``effective_n_neighbors``; ``return_std`` pools with
        predict's sums, so its mean is predict's, and ``predict_interval`` is centred on
        predict's value. Device "auto" stays on the CPU; "cuda"
        with ``rtol > 0`` is refused.
    var_type : str of "c", "u", "o", or None
        The kind of each column: continuous, unordered or ordered categorical
        (statsmodels' letters). None: from a DataFrame's dtypes (``category``
        ordered -> "o"; ``category``, bool, object, string -> "u"; numeric ->
        "c"); a NumPy array is all continuous. See :mod:`nbattn._core.columns`.
    missing : "error" or "marginalize"
        A missing value in X (NaN, None, pandas.NA): an error naming the
        column and row, or "marginalize": that column drops out of that row's
        kernel product (no imputation, no rows dropped).
    handle_unknown : "error" or "ignore"
        A category unseen at fit: an error naming the column and value, or
        "ignore": it matches no training row (every row gets the mismatch
        weight lambda / (c - 1) in that column).
    device : "cpu", "cuda" or "auto"
        Where the computation runs, resolved each time a method runs: "auto"
        picks a CUDA GPU when numba sees one, so a saved model predicts on
        machines with or without one.
    dtype : "float64" or "float32"
        Precision of the computation (running sums are float64 always);
        results are float64 either way.
    verbose : int or bool, default 0
        Progress of the ``bandwidth="loo"`` search (passed to
        :func:`nbattn.smoothing.width_search.loo_bandwidth`).

    Attributes
    ----------
    bandwidth_ : ndarray of shape (n_features,)
        The per-feature widths used: h for a continuous column, lambda (in
        [0, 1]) for a categorical one.
    var_type_ : str
        The kind of each column, as used.
    categories_ : list
        Per column: None (continuous) or the list of its categories; code k
        in ``X_fit_`` is ``categories_[j][k]``.
    sample_weight_ : ndarray (n_samples,) or None
        The positive training weights (None: unweighted; rows of weight 0
        are not kept).
    n_features_in_ : int
    feature_names_in_ : ndarray of str, only when fitted on a DataFrame
    n_outputs_ : int
    outputs_2d_ : bool
        Whether ``y`` was 2-D at fit (predictions are then 2-D too).
    X_fit_ : ndarray (n_samples, n_features), a float64 copy of the training rows (keys)
    y_fit_ : ndarray (n_samples, n_outputs), a float64 copy of the targets (values)
    """

    __init__ = _nadaraya_watson_regressor_init

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # average pooling ignores X by design (the walk-through's baseline)
        tags.regressor_tags.poor_score = self.kernel == "average"
        return tags

    def fit(self, X, y, sample_weight=None):
        """Store copies of the training rows as keys and values; resolve the bandwidth.

        ``sample_weight`` (n_samples,), non-negative: a key's weight multiplies
        its kernel weight, ``f(x) = sum_j s_j K_j(x) y_j / sum_j s_j K_j(x)``;
        the rules use the weighted spread and Kish's effective number of rows
        n = (sum s)^2 / sum s^2 (so multiplying every weight by one constant changes
        no width) and "loo" weights each left-out term.
        """
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
        bandwidth = fit_widths(self, self.bandwidth, X, y2, sw)
        self._store_training_data(X, y2, outputs_2d, sw)
        self.bandwidth_ = bandwidth
        return self

    def _attention_weights_checked(self, X):
        if self.kernel == "average":
            sw = self._weights()
            sw = np.ones(self.X_fit_.shape[0]) if sw is None else sw
            return np.broadcast_to(sw / sw.sum(), (X.shape[0], sw.size)).copy()
        return super()._attention_weights_checked(X)


class LearnedKernelRegressor(_PoolingRegressor):
    """Nadaraya-Watson regression whose kernel metric is learned from the data.

    The attention-pooling walk-through, section 1.3.3: the width is a
    parameter, fitted by minimising the leave-one-out mean squared error

    .. math::

        L = \\frac{1}{n p} \\sum_i \\| f_{-i}(x_i) - y_i \\|^2, \\qquad
        f_{-i}(x_i) = \\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij})\\, y_j

    with scipy's L-BFGS-B on the exact gradient, streamed in O(n d) memory
    (:func:`nbattn.smoothing.learned_metric.fit_learned_kernel`). Prediction is attention
    pooling with the learned score.

    Parameters
    ----------
    metric : "scalar", "diagonal" or "full"
        * "scalar": ``s = -1/2 sum_d ((x_d - x'_d) / (c h_d))^2`` with h Scott's
          widths and one factor c learned (the walk-through's single w = 1/(c h) in 1-D);
        * "diagonal": one width h_d per feature, learned on the log scale; the
          width of an irrelevant feature grows (up to 1e4 x Scott), switching it off;
        * "full": ``s = -1/2 ||L (x - x')||^2`` with L (n_components, d) learned:
          metric learning for kernel regression (MLKR).
    n_components : int or None
        Rows of L for metric="full" (default: n_features). Ignored otherwise.
    init : "scott" or "random" (full only)
        Starting point: Scott's widths (full: ``L = diag(1/h_scott)``, or the
        leading principal directions when n_components < n_features).
    max_iter : int
        L-BFGS-B iterations; stopping at it raises a ``ConvergenceWarning``.
    tol : float
        L-BFGS-B tolerance on the loss divided by the variance of y.
    random_state : int, numpy.random.Generator, numpy.random.RandomState or None
        Randomness of init="random" and of the row subsamples the fit starts on
        (from 4,096 rows by default; None: a fixed seed, so every fit repeats to the bit).
        A Generator or RandomState is used (and
        advanced) as given; model files store such a parameter as None, since
        a fitted model's predictions do not depend on it.
    rtol : float in [0, 1), default 0
        A relative tolerance on the kernel sums, on the CPU (0: exact). The fit's
        criterion and gradient come from the pruned leave-one-out tiles (each
        left-out fit within ``rtol / (1 - rtol)`` times the spread of the targets
        about it; :func:`nbattn.smoothing.loo.loo_loss_and_grad`), and the answer is
        checked exactly against the start, so it is never worse than Scott's widths;
        ``loss_`` is exact. Predictions take the pruned paths of
        :class:`NadarayaWatsonRegressor`. ``device="cuda"`` with ``rtol > 0`` is refused.
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`).
        Categorical columns, missing values or sample weights need
        ``metric="diagonal"``: the engine (:func:`nbattn.local.widths.local_loo_widths`)
        then learns each h and lambda together by the weighted LOO MSE.
    device : "cpu", "cuda" or "auto"
        Where the fit and the predictions run, resolved each time (see
        :class:`NadarayaWatsonRegressor`).
    dtype : "float64" or "float32"
        Precision of the computation; results are float64 either way.
    verbose : int or bool, default 0
        Progress of the optimisation (passed to
        :func:`nbattn.smoothing.learned_metric.fit_learned_kernel`): iteration, loss, change.

    Attributes
    ----------
    bandwidth_ : ndarray (n_features,), metrics "scalar" and "diagonal"
    components_ : ndarray (n_components, n_features), metric "full"
    loss_ : float, the final LOO MSE
    loss_curve_ : ndarray, LOO MSE at the start and after each iteration
    n_iter_ : int
    n_features_in_, feature_names_in_, n_outputs_, outputs_2d_, X_fit_, y_fit_
        As for :class:`NadarayaWatsonRegressor`.

    Notes
    -----
    A constant feature has zero differences, so its width (or L's column)
    gets zero gradient and keeps its initial value: it adds nothing to any
    score. Widths are measured in the feature's units; features are
    standardised internally for the optimisation.
    """

    def __init__(
        self,
        metric="diagonal",
        n_components=None,
        init="scott",
        max_iter=200,
        tol=1e-6,
        random_state=None,
        rtol=0.0,
        var_type=None,
        missing="error",
        handle_unknown="error",
        device="cpu",
        dtype="float64",
        verbose=0,
    ):
        self._set_params_from(locals())

    def _seed(self):
        """random_state for ``fit_learned_kernel`` (numpy's default_rng)."""
        if isinstance(self.random_state, np.random.RandomState):
            return int(self.random_state.randint(np.iinfo(np.int32).max))
        return self.random_state  # None, an int or a Generator: default_rng takes them

    def fit(self, X, y, sample_weight=None):
        """Learn the metric by minimising the leave-one-out MSE (L-BFGS-B).

        With ``sample_weight``, categorical columns or missing values (metric
        "diagonal" only) the engine learns the widths: each key's weight
        multiplies its kernel weight and each left-out term of the criterion.
        """
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
        if X.shape[0] < 2:
            raise ValueError(
                "LearnedKernelRegressor needs at least 2 samples (leave-one-out), "
                f"got n_samples={X.shape[0]}"
            )
        if self.metric == "full" and self.n_components is not None:
            if self.n_components > X.shape[1]:
                raise ValueError(
                    f"n_components={self.n_components} exceeds n_features={X.shape[1]}"
                )
        if self.init == "random" and self.metric != "full":
            raise ValueError("init='random' is only for metric='full'")
        if sw is not None and self.metric != "diagonal" and np.all(sw == sw[0]):
            sw = None  # one weight for every row changes neither the softmax nor the LOO mean
        if self._uses_engine() or sw is not None:
            if self.metric != "diagonal":
                raise ValueError(
                    f"metric={self.metric!r} learns on continuous, complete, unweighted data; "
                    "categorical columns, missing='marginalize' and sample_weight need "
                    "metric='diagonal'"
                )
            widths = engine_loo_widths(self, X, y2, sw, degree=0)
            # the engine sums the outputs' squared errors; loss_ is their mean, as on the
            # L-BFGS path (the class docstring's 1 / (n p))
            loss = engine_loo_loss(self, X, y2, widths, sw, degree=0) / y2.shape[1]
            self._store_training_data(X, y2, outputs_2d, sw)
            self.bandwidth_ = widths
            self.loss_ = loss
            self.loss_curve_ = np.array([loss])
            self.n_iter_ = 0
            return self
        result = learned_metric.fit_learned_kernel(
            X,
            y2,
            metric=self.metric,
            n_components=self.n_components,
            init=self.init,
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=self._seed(),
            dtype=self._dtype(),
            device=self._device(),
            verbose=self.verbose,
            rtol=self._rtol(),
        )
        self._store_training_data(X, y2, outputs_2d)
        if self.metric == "full":
            self.components_ = np.asarray(result["components"], dtype=np.float64)
        else:
            self.bandwidth_ = np.asarray(result["bandwidth"], dtype=np.float64)
        self.loss_ = float(result["loss"])
        self.loss_curve_ = np.asarray(result["loss_curve"], dtype=np.float64)
        self.n_iter_ = int(result["n_iter"])
        return self


class LocalPolynomialRegressor(_PoolingRegressor):
    """Local-polynomial kernel regression over mixed continuous and categorical columns.

    At each query x the fit solves a small weighted least-squares problem in
    the continuous differences ``k - x`` and reads off its constant term:

    .. math::

        \\hat\\beta(x) = \\arg\\min_\\beta \\sum_j s_j K(x, x_j)
            \\big(y_j - \\beta_0 - \\beta_1^\\top (x_j - x)_c - \\dots\\big)^2,
        \\qquad \\hat f(x) = \\hat\\beta_0(x),

    with the product kernel K (Gaussian, Epanechnikov or tricube in each
    continuous column of width h_d; Aitchison-Aitken ``1 - lambda`` /
    ``lambda / (c - 1)`` in an unordered column; the engine's ordered kernel
    in an ordered one) and s_j the sample weights. Degree 0 is Nadaraya-Watson;
    degree 1 (local-linear) removes the boundary bias and the bias from a
    sloped design density; ``beta_1`` is the local slope
    (:meth:`marginal_effects`). The weights are the attention weights of the
    mixed-type score, so the sums stream over the keys as in every other
    estimator here (:func:`nbattn.local.engine.local_polynomial`).

    Parameters
    ----------
    degree : 0, 1 or 2
        Degree of the local polynomial in the continuous columns.
    bandwidth : "loo", "loo_scale", "scott", "silverman", float or array-like (n_features,)
        "loo" learns every h and lambda by the leave-one-out MSE of this
        degree's fit (:func:`nbattn.local.widths.local_loo_widths`); "loo_scale"
        multiplies Scott's h by the one factor minimising it; a rule gives the
        continuous columns its widths and the categorical ones the engine's
        default lambda (:func:`nbattn.local.engine.default_widths`); one number is h
        for every continuous column; an array gives h or lambda per column.
    bandwidth_type : "fixed", "generalized_nn" or "adaptive_nn"
        R np's ``bwtype``, as :class:`nbattn.NadarayaWatsonRegressor` takes it (counts k of
        nearest neighbours in ``bandwidth``; "loo" searches them).
    kernel : "gaussian", "epanechnikov" or "tricube"
        The kernel of the continuous columns.
    rtol : float in [0, 1), default 0
        The relative error allowed on every kernel sum, in the width search and in
        predictions (:func:`nbattn.local.engine.local_polynomial` states the bound):
        0 sums every key exactly; ``rtol > 0`` lets each group of queries skip the
        leaves of keys (in k-d order) that it certifiably cannot weigh, on the CPU
        (device "auto" then stays on the CPU). The search's answer is checked
        exactly against the rule widths, so it is never worse than the rule.
    loo_subsample : int >= 10 or None, default None
        With ``bandwidth="loo"`` on at least twice this many rows, the search runs on a
        random subsample of this many rows first (a fixed seed: the same rows every
        fit), then carries its widths to all rows by the rates of the optimal widths
        and finishes there with a short search (Racine 1993; statsmodels'
        ``EstimatorSettings(efficient=True)`` is the same idea): several times faster on
        10,000 rows, never worse than the rule widths, but it may stop in another basin
        than the search on every row (on the tables tried, within a few percent of its
        criterion). None searches every row from the start.
    var_type, missing, handle_unknown
        How the columns of X are read (see :class:`NadarayaWatsonRegressor`).
    device : "cpu", "cuda" or "auto"
        Resolved each time a method runs.
    dtype : "float64" or "float32"
        Precision of the computation; results are float64 either way.
    verbose : int or bool, default 0
        Accepted for symmetry with the other estimators.

    Attributes
    ----------
    bandwidth_, var_type_, categories_, sample_weight_, n_features_in_,
    feature_names_in_, n_outputs_, outputs_2d_, X_fit_, y_fit_
        As for :class:`NadarayaWatsonRegressor`.
    """

    def __init__(
        self,
        degree=1,
        bandwidth="loo",
        bandwidth_type="fixed",
        kernel="gaussian",
        rtol=0.0,
        loo_subsample=None,
        var_type=None,
        missing="error",
        handle_unknown="error",
        device="cpu",
        dtype="float64",
        verbose=0,
    ):
        self._set_params_from(locals())

    def _is_local_polynomial(self) -> bool:
        return True

    def fit(self, X, y, sample_weight=None):
        """Store the training rows, targets and weights; resolve the widths."""
        self._validate_params()
        X, y2, outputs_2d, sw = self._validate_regression_data(X, y, sample_weight)
        bandwidth = fit_widths(self, self.bandwidth, X, y2, sw, degree=self._degree())
        self._store_training_data(X, y2, outputs_2d, sw)
        self.bandwidth_ = bandwidth
        return self
