"""The prediction computation of every nbattn model, without scikit-learn.

:class:`PoolingPrediction` holds the one copy of how a fitted model pools its
training targets at checked queries: which engine runs (the streaming
Gaussian kernel, average pooling, or the mixed-type local-polynomial engine),
with which arguments, and how the spread about the prediction is formed. Two
classes use it:

* the scikit-learn estimators (:class:`nbattn.estimators.base._PoolingEstimator`),
  whose parameters and fitted attributes are attributes of ``self``;
* :class:`nbattn.persistence.predictor.Predictor`, which reads them from the dictionaries
  of a model file, so that ``nbattn predict`` never imports scikit-learn.

The regressors' marginal effects and prediction intervals are computed here
too (:meth:`PoolingPrediction._marginal_effects`,
:meth:`PoolingPrediction._interval`), so that ``nbattn predict
--marginal-effects / --interval`` writes what the estimator's methods return.

A class using it answers four questions: :meth:`_param` (a parameter by
name), :meth:`_fitted` (a fitted attribute by name), :meth:`_is_local_polynomial`
(the estimator kind that always runs the engine, with ``degree``), and, when
asked for the effective number of neighbours, ``_attention_weights_checked``.
Everything else (degree, full metric, average kernel) follows from the
parameters. The functional-layer modules are imported when first called, so
importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from .._core import columns
from .._core.numeric import power_of_two_scale
from .._core.validation import check_choice, check_rtol, resolve_dtype
from ..dispatch.device import resolve_device

__all__ = [
    "DensityPrediction",
    "ModelSettings",
    "PoolingPrediction",
    "refuse_dates_and_complex",
    "refuse_missing_targets",
]


class ModelSettings:
    """What every fitted model reads the same way, estimator or model file: its column
    kinds and categories, how it treats missing values, the device of a call and its
    tolerance. A using class provides ``_param`` and ``_fitted``."""

    # ---- what a using class provides

    def _param(self, name: str, default=None):
        """The model's parameter ``name`` (``default`` when the model has none)."""
        raise NotImplementedError

    def _fitted(self, name: str, default=None):
        """The model's fitted attribute ``name`` (``default`` when absent)."""
        raise NotImplementedError

    # ---- how the model reads its columns

    def _bandwidth_type(self) -> str:
        """ "fixed", or a nearest-neighbour type (``bandwidth_`` then holds counts k)."""
        return self._param("bandwidth_type", "fixed")

    def _kinds(self) -> str:
        """The fitted column kinds ("c" for every column of a model from an older file)."""
        kinds = self._fitted("var_type_")
        return kinds if kinds is not None else "c" * self._fitted("n_features_in_")

    def _n_categories(self) -> list:
        categories = self._fitted("categories_") or [None] * self._fitted("n_features_in_")
        return columns.n_categories(categories)

    def _offers(self) -> tuple:
        """The table options this model has, which its input errors may advise."""
        return tuple(name for name in ("missing", "handle_unknown") if self._param(name))

    def _training_offers(self) -> tuple:
        """The options a training table's input errors may advise (:meth:`_offers`)."""
        return self._offers()

    def _missing(self) -> str:
        return self._param("missing", "error")

    def _encodes(self) -> bool:
        """Whether query tables go through :func:`nbattn._core.columns.encode_columns`."""
        return set(self._kinds()) != {"c"} or self._missing() == "marginalize"

    # ---- resolved at every call

    def _device(self) -> str:
        """The device that runs this call ("auto" resolved here, not at fit), for the
        estimators and the Predictor alike (through this module's ``resolve_device``,
        the name tests replace to pretend a GPU machine). With ``rtol > 0`` "auto" stays
        on the CPU (the pruned paths are the CPU's) and "cuda" is refused."""
        device = resolve_device(self._param("device"))
        if device == "cuda" and self._rtol() > 0.0:
            if self._param("device") == "auto":
                return "cpu"
            raise NotImplementedError(
                f"rtol={self._rtol()!r} (the pruned k-d tree paths) runs on the CPU only: set "
                "device='cpu' (or 'auto', which then stays on the CPU), or rtol=0"
            )
        return device

    def _weights(self):
        """The sample weights with the largest brought to [1, 2) (exact), or None: every
        use is scale-free, so weights times a power of two predict the same to the bit,
        and sums of weights near 1e308 or 5e-324 neither overflow nor vanish."""
        sw = self._fitted("sample_weight_")
        return None if sw is None else sw / power_of_two_scale(sw.max())

    def _rtol(self) -> float:
        """The checked ``rtol`` (0 for a model, or a model file, without one)."""
        return check_rtol(self._param("rtol", 0.0))


class PoolingPrediction(ModelSettings):
    """Predictions of attention pooling over a fitted training set.

    The model pools ``y_fit_`` (n_train, m) over the keys ``X_fit_`` (n_train, d)
    with the softmax of the Gaussian score ``-1/2 sum_d ((q_d - k_d) / h_d)^2``
    (widths ``bandwidth_``; the full learned metric maps x to Lx with unit
    widths), through the engine for categorical columns, marginalised missing
    values, compact kernels and local polynomials, or as the (weighted) mean
    for ``kernel="average"``. Results are float64 whatever ``dtype`` is.
    """

    def _is_local_polynomial(self) -> bool:
        """Whether the model is a local polynomial (always the engine, at ``degree``)."""
        return False

    # ---- how the model pools

    def _kernel(self) -> str:
        """The engine's kernel ("average" pools with the Gaussian where a kernel is needed)."""
        kernel = self._param("kernel", "gaussian")
        return "gaussian" if kernel == "average" else kernel

    def _average(self) -> bool:
        """Whether the model is average pooling (``kernel="average"``)."""
        return self._param("kernel") == "average"

    def _uses_engine(self) -> bool:
        """Whether the mixed-type engine (:mod:`nbattn.local.engine`) computes this model.

        All-continuous data with the Gaussian kernel and no missing values
        stays on the streaming Nadaraya-Watson kernels (CPU and GPU).
        """
        if self._is_local_polynomial() or self._bandwidth_type() != "fixed":
            return True
        return self._encodes() or self._kernel() != "gaussian"

    def _degree(self) -> int:
        """Degree of the local polynomial (0: Nadaraya-Watson)."""
        return int(self._param("degree")) if self._is_local_polynomial() else 0

    def _dtype(self):
        return resolve_dtype(self._param("dtype"))

    def _shape_output(self, out):
        """Columns of (n_queries, n_outputs) → 1-D when the model was fitted on a 1-D y."""
        return out if self._fitted("outputs_2d_") else out[:, 0]

    # ---- the computation, for checked float64 queries X (n, d)

    def _score_coordinates(self, X):
        """(queries, keys, widths) of the Gaussian score; metric "full" maps x to Lx,
        where the score is the unit-width Gaussian."""
        X_fit = self._fitted("X_fit_")
        if self._param("metric") == "full":
            L = self._fitted("components_")
            return X @ L.T, X_fit @ L.T, 1.0
        return X, X_fit, self._fitted("bandwidth_")

    def _local_spec(self, X=None):
        """The engine's options (``LocalSpec``) at the checked queries X (None at fit)."""
        from ..local.problem import LocalSpec

        # NaN where missing values are refused is an unseen category: its term left out
        missing = self._missing() == "marginalize" or (X is not None and np.isnan(X).any())
        return LocalSpec(
            var_type=self._kinds(),
            n_categories=tuple(self._n_categories()),
            kernel=self._kernel(),
            missing=bool(missing),
            device=self._device(),
            rtol=self._rtol(),
            bandwidth_type=self._bandwidth_type(),
        )

    def _local_problem(self, spec, X, values, degree):
        """The engine's problem of pooling ``values`` (n_train, m) over ``X_fit_`` at the
        checked queries X (``bandwidth_`` checked here: it may come from an edited file)."""
        from ..local.problem import check_widths, layout

        widths = check_widths(
            self._fitted("bandwidth_"), spec.var_type, spec.counts, name="bandwidth_"
        )
        keys = self._fitted("X_fit_")
        return layout(spec, X, keys, values, widths, degree, sample_weight=self._weights())

    def _local_fit(self, X, values, return_gradient=False, degree=None):
        """The engine's local fit of ``values`` (n_train, m) at the checked queries X:
        (n, m) float64, and with ``return_gradient`` the slopes (n, m, d_continuous);
        rounded to the model's dtype first, as :func:`nbattn.local_polynomial` returns it."""
        from ..local.engine import fit_values

        degree = self._degree() if degree is None else degree
        problem = self._local_problem(self._local_spec(X), X, values, degree)
        out = fit_values(problem, return_gradient)
        dtype = self._dtype()
        if return_gradient:
            grad = np.asarray(out[1], dtype=dtype).astype(np.float64)  # (n, d_c, m)
            return np.asarray(out[0], dtype=dtype).astype(np.float64), np.transpose(grad, (0, 2, 1))
        return np.asarray(out, dtype=dtype).astype(np.float64)

    def _pooled_values(self, X, values):
        """``sum_j w_ij v_j`` for any values (n_train, m) at the checked queries X: the
        (weighted) mean for average pooling, the engine's degree-0 fit, or the streaming
        kernel (weights: pooled as ``[w v, w]`` and divided, which is the weighted
        softmax exactly)."""
        from ..smoothing import regression

        sw = self._weights()
        if self._average():
            if sw is None:
                return regression.average_pooling(X, values)
            mean = (sw @ values) / sw.sum()
            return np.broadcast_to(mean, (X.shape[0], values.shape[1])).copy()
        if self._uses_engine():
            return self._local_fit(X, values, degree=0)
        return self._gaussian_pooled(X, values)[0]

    def _gaussian_pooled(self, X, values):
        """``(sum_j w_ij v_j, log sum_j s_j K(x_i, x_j))`` on the Gaussian fast path, s_j
        the weights of :meth:`_weights` (pooled as ``[s v, s]`` and divided)."""
        from ..smoothing import regression

        sw = self._weights()
        q, k, h = self._score_coordinates(X)
        if sw is not None:
            values = np.column_stack([sw[:, None] * values, sw])
        h = regression.resolve_bandwidth(h, k)  # checked: it may come from an edited file
        # the tree certifies the kernel mass, not the weighted mass the values carry here:
        # with sample weights this path stays exact (the engine's bounds include them)
        rtol = self._rtol() if sw is None else 0.0
        out, lse = regression.gaussian_pool(
            q, k, values, h, dtype=self._dtype(), device=self._device(), rtol=rtol
        )
        out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
        if sw is None:
            return out, lse
        with np.errstate(divide="ignore"):
            return out[:, :-1] / out[:, -1:], lse + np.log(out[:, -1])

    def _pooled_with_mass(self, X):
        """``(pooled y_fit_, log S)`` at the checked queries X, S(x) = sum_j s_j K(x, x_j)
        the kernel mass in rows (weights divided by their mean; -inf where no key
        weighs), on the engine or the Gaussian fast path."""
        from ..local.class_widths import log_mean_weight

        y = self._fitted("y_fit_")
        if self._uses_engine():
            from ..local.engine import fit_problem

            problem = self._local_problem(self._local_spec(X), X, y, self._degree())
            beta, _, shift, log_norm, _, _ = fit_problem(problem)
            pooled = np.asarray(beta[:, 0, :], dtype=self._dtype()).astype(np.float64)
            with np.errstate(invalid="ignore"):
                log_mass = np.where(log_norm > -np.inf, shift + log_norm, -np.inf)
        else:
            pooled, log_mass = self._gaussian_pooled(X, y)
        return pooled, log_mass - log_mean_weight(self._weights())  # scale-free

    def _pooled(self, X):
        """Predictions (n_queries, m) as float64, on ``device``."""
        y = self._fitted("y_fit_")
        if not self._average() and self._uses_engine():
            return self._local_fit(X, y)
        return self._pooled_values(X, y)

    def _pooled_spread(self, X, effective_n=True):
        """(predictions, weighted std of the targets about them, effective n or None) for
        the checked queries X, on ``device``.

        Unweighted average pooling: the mean and the targets' population std.
        The unweighted Gaussian fast path runs
        :func:`nbattn.smoothing.regression.nadaraya_watson_spread` (a second pass about f,
        exact), unless ``rtol > 0`` and only (f, std) are asked for: then, as otherwise,
        f is :meth:`_pooled` (predict's, pruned alike). Otherwise the spread about f comes
        from pooled moments of the targets centred on their midrange c (in units of a
        power of two near their largest |y - c|, so that squares near 1.7e308 stay finite),
        ``sum_j w_ij (y_j - f)^2 = E[(y-c)^2] - 2 (f-c) E[y-c] + (f-c)^2``, and the
        effective n ``1 / sum_j w_ij^2`` from ``_attention_weights_checked`` (only when
        ``effective_n``).
        """
        y = self._fitted("y_fit_")
        if self._average() and self._weights() is None:
            from ..smoothing.regression import average_pooling, feature_spread

            mean = average_pooling(X, y)
            std = np.broadcast_to(feature_spread(y, ddof=0, name="y"), mean.shape).copy()
            n_train = float(self._fitted("X_fit_").shape[0])
            return mean, std, np.full(X.shape[0], n_train)
        if (
            not self._uses_engine()
            and self._weights() is None
            and (effective_n or not self._rtol())
        ):
            from ..smoothing.regression import gaussian_pool_spread, resolve_bandwidth

            q, k, h = self._score_coordinates(X)
            h = resolve_bandwidth(h, k)
            mean, std, n_eff = gaussian_pool_spread(
                q, k, y, h, dtype=self._dtype(), device=self._device()
            )
            return (
                np.asarray(mean, dtype=np.float64),
                np.asarray(std, dtype=np.float64),
                np.asarray(n_eff, dtype=np.float64),
            )
        f = self._pooled(X)
        m = y.shape[1]
        # centred on the midrange (no sum to overflow) and divided by a power of two near
        # each output's largest |y - c| (exact), so that the squares of targets near
        # 1.7e308 stay finite; the std is multiplied back
        centre = y.max(axis=0) / 2.0 + y.min(axis=0) / 2.0
        unit = power_of_two_scale(np.max(np.abs(y - centre), axis=0))
        dy = (y - centre) / unit
        moments = self._pooled_values(X, np.column_stack([dy, dy * dy]))
        first, second = moments[:, :m], moments[:, m:]
        fc = (f - centre) / unit
        var = np.maximum(second - 2.0 * fc * first + fc * fc, 0.0)
        n_eff = None
        if effective_n:
            weights = self._attention_weights_checked(X)
            n_eff = 1.0 / np.sum(weights * weights, axis=1)
        with np.errstate(over="ignore"):  # a spread beyond float64 is inf
            return f, np.sqrt(var) * unit, n_eff

    # ---- what predict and predict_proba return for checked queries X

    def _predictions(self, X, return_std=False):
        """A regressor's predictions, shaped like its targets, and with ``return_std``
        the spread of the targets about them (:meth:`_pooled_spread`)."""
        if return_std:
            out, std, _ = self._pooled_spread(X, effective_n=False)
            return self._shape_output(out), self._shape_output(std)
        return self._shape_output(self._pooled(X))

    def _probabilities(self, X):
        """A classifier's probabilities: the pooled one-hot labels clipped at 0 and
        normalised, ``p_ic = max(f_ic, 0) / sum_c' max(f_ic', 0)``; with a prior of
        alpha = ``prior_count_`` > 0 rows (learned by a leave-one-out width) smoothed
        towards the class frequencies pi, ``(1 - m_i) p_ic + m_i pi_c`` with
        ``m_i = alpha / (S(x_i) + alpha)`` (:mod:`nbattn.local.class_widths`)."""
        alpha = float(self._fitted("prior_count_", 0.0))
        if alpha > 0.0:
            pooled, log_mass = self._pooled_with_mass(X)
        else:
            pooled = self._pooled(X)
        proba = np.clip(pooled, 0.0, None)
        proba /= proba.sum(axis=1, keepdims=True)
        if alpha > 0.0:
            from ..local.class_widths import class_frequencies, smoothed_probabilities

            prior = class_frequencies(self._fitted("y_fit_"), self._weights())
            proba = smoothed_probabilities(proba, log_mass, np.log(alpha), prior)
        return proba

    # ---- a regressor's slopes and intervals, for checked queries X

    def _continuous(self) -> np.ndarray:
        """Which columns are continuous (kind "c"), as a boolean mask."""
        return np.array([k == "c" for k in self._kinds()])

    def _marginal_effects(self, X):
        """``d f / d x_d`` at the checked queries X for every continuous column, (n, d_c),
        or (n, m, d_c) for a 2-D target.

        Average pooling does not depend on x: its slopes are 0. The Gaussian kernel at
        degree 0 without marginalised values takes the exact slopes of the pooling
        (:meth:`_gaussian_slopes`); every other model the engine's local slope.
        """
        continuous = self._continuous()
        if not continuous.any():
            raise ValueError("marginal_effects needs a continuous column; this model has none")
        m = self._fitted("y_fit_").shape[1]
        if self._average():
            grad = np.zeros((X.shape[0], m, int(continuous.sum())))
        elif self._degree() == 0 and not self._uses_engine():
            grad = self._gaussian_slopes(X)[:, :, continuous]
        else:
            _, grad = self._local_fit(X, self._fitted("y_fit_"), return_gradient=True)
        return grad if self._fitted("outputs_2d_") else grad[:, 0, :]

    def _gaussian_slopes(self, X):
        """(n, m, d) exact slopes of the Gaussian pooling in the score's coordinates,
        mapped back to X's columns (``components_`` for the full metric)."""
        q, k, h = self._score_coordinates(X)
        y = self._fitted("y_fit_")
        m, e = y.shape[1], k.shape[1]
        h = np.broadcast_to(np.asarray(h, dtype=np.float64), (e,))
        # the keys' coordinates in units of h, so that h enters once (cov / h), never as
        # h * h: that overflows beyond h ~ 1e154 and underflows below 1e-154
        centre = k.mean(axis=0)
        dk = (k - centre) / h
        values = np.column_stack([y, dk, (y[:, :, None] * dk[:, None, :]).reshape(len(y), -1)])
        pooled = self._pooled_values(X, values)
        ey, ek = pooled[:, :m], pooled[:, m : m + e]
        eyk = pooled[:, m + e :].reshape(-1, m, e)
        grad = (eyk - ey[:, :, None] * ek[:, None, :]) / h
        if self._param("metric") == "full":
            grad = grad @ self._fitted("components_")
        return grad

    def _interval(self, X, alpha=0.05, kind="mean", band=None):
        """The pointwise (1 - alpha) normal interval at the checked queries X: (n, 2), or
        (n, m, 2) for a 2-D target, column 0 the lower end
        (:func:`nbattn.local.engine.prediction_interval`: leave-one-out residuals and the
        equivalent-kernel weights; the Gaussian fast path's models in their score
        coordinates, the full metric's as Lx with unit widths). With ``rtol > 0`` on the
        fast path the interval is moved to centre on predict's value (those predictions
        come from another pruned walk than the engine's fit here). ``band``: a
        :class:`nbattn.local.bands.BandOptions` (None: the normal interval); with
        ``method="bootstrap"`` :func:`nbattn.local.bands.bootstrap_band` on the same
        layout, centred on predict's value."""
        from ..local.bands import BandOptions, bootstrap_band, check_band
        from ..local.engine import prediction_interval
        from ..local.problem import check_widths

        kind = check_choice(kind, "kind", ("mean", "observation", "quantile"))
        band = check_band(BandOptions() if band is None else band, kind)
        if self._average():
            raise ValueError("predict_interval needs a kernel; kernel='average' has none")
        spec = self._local_spec(X)
        if self._uses_engine():
            q, k, widths = X, self._fitted("X_fit_"), self._fitted("bandwidth_")
        else:
            q, k, h = self._score_coordinates(X)
            widths = np.broadcast_to(np.asarray(h, dtype=np.float64), (k.shape[1],)).copy()
            spec = dataclasses.replace(
                spec, var_type="c" * k.shape[1], n_categories=(0,) * k.shape[1]
            )
        if kind == "quantile":
            return self._quantile_interval(X, spec, q, k, widths, alpha)
        args = (spec, k, self._fitted("y_fit_"), q)
        args += (check_widths(widths, spec.var_type, spec.counts, name="bandwidth_"),)
        if band.method == "bootstrap":
            ends = bootstrap_band(
                *args,
                self._degree(),
                sample_weight=self._weights(),
                alpha=alpha,
                n_boot=band.n_boot,
                resample=band.resample,
                random_state=band.random_state,
                centre=self._pooled(X),
            )
            out = np.stack(ends, axis=-1)
            return out if self._fitted("outputs_2d_") else out[:, 0, :]
        fit, lower, upper = prediction_interval(
            *args, self._degree(), sample_weight=self._weights(), alpha=alpha, kind=kind
        )
        out = np.stack([np.asarray(lower), np.asarray(upper)], axis=-1).astype(np.float64)
        if self._rtol() > 0.0 and not self._uses_engine():
            shift = self._pooled(X) - np.asarray(fit, dtype=np.float64).reshape(out.shape[:-1])
            out += shift[..., None]
        return out if self._fitted("outputs_2d_") else out[:, 0, :]

    def _quantile_interval(self, X, spec, queries, keys, widths, alpha):
        """``kind="quantile"``: predict's value plus the quantiles at alpha/2 and
        1 - alpha/2 of the training rows' leave-one-out residuals pooled at x with this
        model's widths (their conditional distribution given x,
        :func:`nbattn.distribution.cdf_widths.quantile_interval`), for a 1-D target on
        complete rows. (n, 2)."""
        from ..distribution.cdf_widths import quantile_interval
        from ..local.engine import loo_residuals

        y = self._fitted("y_fit_")
        if y.shape[1] != 1:
            raise ValueError("kind='quantile' needs a model of one target; this one has several")
        if np.isnan(queries).any():
            raise ValueError("kind='quantile' needs complete rows: X has missing values")
        spec = dataclasses.replace(spec, missing=False)
        weights = self._fitted("sample_weight_")
        degree = self._degree()
        residuals = loo_residuals(spec, keys, y, widths, degree, sample_weight=weights)[:, 0]
        band = quantile_interval(spec, queries, keys, residuals, widths, alpha, weights)
        return band + np.asarray(self._predictions(X), dtype=np.float64).reshape(-1, 1)


# ----------------------------------------------------------------------------- densities


def refuse_dates_and_complex(X) -> None:
    """Name the DataFrame column (or say X) that holds dates, durations or complex numbers.

    scikit-learn's float conversion of such data fails with a NumPy dtype
    promotion error that names neither the column nor what to do.
    """
    dtypes = getattr(X, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "items"):  # a pandas DataFrame
        described = [(f"X column {name!r}", dtype) for name, dtype in dtypes.items()]
    elif isinstance(X, np.ndarray):
        described = [("X", X.dtype)]
    else:
        return
    for what, dtype in described:
        kind = getattr(dtype, "kind", "O")
        if kind in "mM":
            held, hint = ("dates", "seconds since a reference time")
            if kind == "m":
                held, hint = ("durations", "their length in seconds")
            raise ValueError(
                f"{what} holds {held} (dtype {dtype}); convert it to numbers first, "
                f"for instance {hint}"
            )
        if kind == "c":
            raise ValueError(
                f"{what} holds complex numbers (dtype {dtype}): Complex data not supported; "
                "pass the real and imaginary parts as two columns"
            )


def refuse_missing_targets(y) -> None:
    """Refuse ``y`` holding None, pandas.NA or NaN in an object array, naming the row.

    scikit-learn converts such an array to float only after its finiteness
    check, so None would become a NaN training target (every prediction that
    pools it NaN), or an error about label types for a classifier.
    """
    if y is None:  # scikit-learn's own message: "requires y to be passed"
        return
    arr = np.asarray(y) if not hasattr(y, "to_numpy") else y.to_numpy()
    if arr.dtype.kind != "O" or arr.ndim == 0:
        return
    missing = np.frompyfunc(_is_missing, 1, 1)(arr.reshape(-1)).astype(bool)
    if missing.any():
        index = int(np.argmax(missing))
        row = np.unravel_index(index, arr.shape)[0]
        raise ValueError(
            f"y holds a missing value ({arr.reshape(-1)[index]!r}) at row {int(row)}; "
            "drop or fill the rows without a target before fitting"
        )


def _is_missing(value) -> bool:
    """None, pandas.NA (without importing pandas) or a float NaN."""
    return (
        value is None
        or type(value).__name__ == "NAType"
        or (isinstance(value, numbers.Real) and value != value)
    )


class DensityPrediction(ModelSettings):
    """The densities' computation at checked queries, shared by the density estimators
    (:class:`nbattn.KernelDensity`, :class:`nbattn.ConditionalKernelDensity`,
    :class:`nbattn.KernelQuantileRegressor`) and the Predictor of their model files.

    A density model holds its keys ``X_fit_`` (n, d), their ``sample_weight_`` and its
    widths ``bandwidth_``; a conditional one also ``y_fit_`` (n,), y's kind ``y_type_``,
    its categories ``y_categories_`` and width ``y_bandwidth_``, and lays its joint data
    out y first, then X (statsmodels' order). The computation is
    :mod:`nbattn.distribution`: log f(x) (:func:`~nbattn.distribution.density.log_density_of`),
    log F(x), log f(y | x), log F(y | x) and the conditional quantiles, the root of
    F(q | x) = tau (:mod:`nbattn.distribution.conditional`).
    """

    def _density_spec(self, kinds: str, counts, device=None):
        """The engine's spec of columns ``kinds`` with ``counts`` categories: the model's
        kernel and rtol, on the model's device (``device`` overrides it: ``sample``'s draws
        run on the CPU)."""
        from ..local.problem import LocalSpec

        return LocalSpec(
            var_type=kinds,
            n_categories=tuple(int(c) for c in counts),
            kernel=self._param("kernel"),
            device=self._device() if device is None else device,
            rtol=self._rtol(),
            bandwidth_type=self._bandwidth_type(),
        )

    # ---- missing values

    def _training_offers(self) -> tuple:
        # a density's training rows must be complete: "missing" is no advice there
        return tuple(name for name in self._offers() if name != "missing")

    def _refuse_incomplete_rows(self, X) -> None:
        """A density's training rows must be complete (no kernel measures an unknown
        value): an error naming the first row and column with a missing value."""
        missing = np.isnan(X)
        if missing.any():
            row, column = (int(i) for i in np.argwhere(missing)[0])
            names = self._fitted("feature_names_in_")
            name = repr(str(names[column])) if names is not None else str(column)
            raise ValueError(
                f"X has a missing value at row {row}, column {name}: a density's training "
                "rows must be complete (missing='marginalize' integrates missing values out "
                "of the query rows only); drop the incomplete rows first"
            )

    def _by_observed_columns(self, X, compute, empty):
        """``compute(rows, keep, index)`` for each pattern of observed columns of the
        checked rows X, ``keep`` the observed columns' indices (None: every row complete)
        and ``index`` the rows' positions in X, put back in row order: the marginal over
        the columns a row lacks (with ``missing="marginalize"``). ``empty(n)`` answers
        rows with no observed column (None where a column is always observed: a
        conditional model's y, first)."""
        missing = np.isnan(X)
        if not missing.any():
            return compute(X, None, slice(None))
        patterns, inverse = np.unique(missing, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        out = None
        for index, pattern in enumerate(patterns):
            rows = np.flatnonzero(inverse == index)
            keep = np.flatnonzero(~pattern)
            part = compute(X[np.ix_(rows, keep)], keep, rows) if keep.size else empty(rows.size)
            if out is None:
                out = np.empty((X.shape[0], *np.shape(part)[1:]))
            out[rows] = part
        return out

    # ---- a density of X

    def _marginal_problem(self, X, keep=None):
        """The layout of the density of the fitted rows at the checked queries X (of the
        columns ``keep`` alone when given: their marginal density)."""
        from ..distribution.density import density_layout
        from ..local.problem import check_widths

        kinds, counts = self._kinds(), self._n_categories()
        widths, keys = self._fitted("bandwidth_"), self._fitted("X_fit_")
        if keep is not None:
            kinds = "".join(kinds[i] for i in keep)
            counts = [counts[i] for i in keep]
            widths, keys = np.asarray(widths)[keep], keys[:, keep]
        spec = self._density_spec(kinds, counts)
        widths = check_widths(widths, spec.var_type, spec.counts, "bandwidth_")
        return density_layout(spec, X, keys, widths, self._fitted("sample_weight_"))

    def _log_density(self, X):
        """log f(x) per checked row of X (n,) (of its observed columns: log 1 = 0 for a
        row with none)."""
        from ..distribution.density import log_density_of

        return self._by_observed_columns(
            X, lambda rows, keep, _: log_density_of(self._marginal_problem(rows, keep)), np.zeros
        )

    def _log_cdf(self, X):
        """log F(x) per checked row of X (n,): exact, on the model's device."""
        from ..distribution.density import log_cdf_of

        return self._by_observed_columns(
            X, lambda rows, keep, _: log_cdf_of(self._marginal_problem(rows, keep)), np.zeros
        )

    # ---- y given X

    def _one_column(self, arr):
        """A (n, 1) response as (n,) (the estimators warn as scikit-learn does)."""
        return arr[:, 0]

    def _read_response(self, y, kind=None, categories=None):
        """``(codes, kind, categories)`` of a one-column response y (a conditional model's):
        numbers for a continuous y, codes for a categorical one. Its kind comes from its
        dtype (numbers: 'c'; a pandas category: 'u', or 'o' when ordered; text, bools: 'u')
        and its categories from the data, unless given (a fitted model's)."""
        import pandas as pd

        refuse_dates_and_complex(y if not isinstance(y, pd.Series) else y.to_frame())
        refuse_missing_targets(y)
        if isinstance(y, pd.DataFrame):
            if y.shape[1] != 1:
                raise ValueError(f"y must be one column; got {y.shape[1]}")
            y = y.iloc[:, 0]
        if isinstance(y, pd.Categorical):  # keeps its dtype (ordered or not), as a Series does
            y = pd.Series(y)
        if isinstance(y, pd.Series):
            table = pd.DataFrame({"y": y.reset_index(drop=True)})
        else:
            arr = np.asarray(y)
            if arr.ndim == 2 and arr.shape[1] == 1:
                arr = self._one_column(arr)
            if arr.ndim != 1:
                raise ValueError(f"y must be one column (1-D); got shape {arr.shape}")
            table = pd.DataFrame({"y": arr})
        if kind is None:
            kind = columns.resolve_var_type(table, None)
            categories = columns.fit_categories(table, kind, table="y")[0]
        codes = columns.encode_columns(table, kind, [categories], table="y")[:, 0]
        return codes, kind, categories

    def _joint_spec(self, keep=None):
        """The joint layout's spec: y's column, then X's (those in ``keep`` when given)."""
        categories = self._fitted("y_categories_")
        y_counts = [0 if categories is None else len(categories)]
        kinds, counts = self._kinds(), self._n_categories()
        if keep is not None:
            kinds = "".join(kinds[i] for i in keep)
            counts = [counts[i] for i in keep]
        return self._density_spec(self._fitted("y_type_") + kinds, y_counts + counts)

    def _response_codes(self, X, y):
        """y at the checked rows of X as the joint layout's first column (codes for a
        categorical y; zeros where y is None)."""
        if y is None:
            return np.zeros(X.shape[0])
        y_type, y_categories = self._fitted("y_type_"), self._fitted("y_categories_")
        y_codes = self._read_response(y, y_type, y_categories)[0]
        if y_codes.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y_codes.shape[0]}")
        return y_codes

    def _joint_problem(self, X, y=None, y_codes=None, keep=None):
        """The joint layout at the checked rows of X with y (or its codes ``y_codes``), of
        y and X's columns ``keep`` alone when given (X then holds those columns)."""
        from ..distribution.density import density_layout
        from ..local.problem import check_widths

        if y_codes is None:
            y_codes = self._response_codes(X, y)
        spec = self._joint_spec(keep)
        x_widths, x_keys = np.asarray(self._fitted("bandwidth_")), self._fitted("X_fit_")
        if keep is not None:
            x_widths, x_keys = x_widths[keep], x_keys[:, keep]
        widths = check_widths(
            np.concatenate(([self._fitted("y_bandwidth_")], x_widths)),
            spec.var_type,
            spec.counts,
            "bandwidth_",
        )
        keys = np.column_stack([self._fitted("y_fit_"), x_keys])
        return density_layout(
            spec, np.column_stack([y_codes, X]), keys, widths, self._fitted("sample_weight_")
        )

    def _conditional_log_density(self, X, y):
        """log f(y_i | x_i) per checked row of X (n,)."""
        from ..distribution.conditional import conditional_log_density

        return self._at_finite_y(X, y, conditional_log_density, -np.inf, -np.inf)

    def _conditional_log_cdf(self, X, y, y_codes=None):
        """log F(y_i | x_i) per checked row of X (n,) (y given, or its codes ``y_codes``):
        exact, on the model's device."""
        from ..distribution.conditional import conditional_log_cdf

        return self._at_finite_y(X, y, conditional_log_cdf, -np.inf, 0.0, y_codes)

    def _at_finite_y(self, X, y, function, below, above, y_codes=None):
        """``function`` of the joint problem at the rows whose y is finite; a continuous y
        of -inf or +inf gives ``below`` or ``above`` (the log density's and CDF's limits)."""
        if y_codes is None:
            y_codes = self._response_codes(X, y)
        infinite = np.isinf(y_codes)
        out = np.empty(X.shape[0])
        finite = ~infinite
        if finite.any():
            out[finite] = self._by_observed_columns(
                np.column_stack([y_codes[finite], X[finite]]),
                lambda rows, keep, _: function(self._joint_rows(rows, keep)),
                None,
            )
        out[infinite] = np.where(y_codes[infinite] > 0, above, below)
        return out

    def _quantiles(self, X, levels):
        """The conditional quantiles (n, len(levels)) at the checked rows of X; ``levels``
        (k,) for every row or (n, k) per row."""
        from ..distribution.conditional import conditional_quantiles

        if self._fitted("y_type_") != "c":
            raise ValueError("quantiles need a continuous y; this model's y is categorical")
        levels = np.asarray(levels, dtype=np.float64)
        return self._by_observed_columns(
            np.column_stack([np.zeros(X.shape[0]), X]),
            lambda rows, keep, index: conditional_quantiles(
                self._joint_rows(rows, keep), levels if levels.ndim < 2 else levels[index]
            ),
            None,
        )

    def _joint_rows(self, rows, keep):
        """The joint layout of ``rows`` = (y code, X's observed columns) (one pattern of
        :meth:`_by_observed_columns` with y's column fixed first): ``keep`` indexes the
        joint columns, 0 being y's."""
        x_keep = None if keep is None else keep[1:] - 1
        return self._joint_problem(rows[:, 1:], y_codes=rows[:, 0], keep=x_keep)
