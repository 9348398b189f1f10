"""Robinson's partially linear model: some columns enter linearly, the rest through a
kernel regression.

Robinson (1988), "Root-N-consistent semiparametric regression" (Econometrica 56),
estimates

.. math::

    y = x^\\top \\beta + g(z) + e, \\qquad E[e \\mid x, z] = 0,

with x the columns named in ``linear_columns`` and z every other column (continuous,
unordered or ordered), g unknown and smooth, by the double residual: since
``y - E[y|z] = (x - E[x|z])^\\top \\beta + e``, beta is the least-squares slope of
``y - E[y|z]`` on ``x - E[x|z]``, each conditional mean a kernel regression on z. R np's
``npplreg`` is the same estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._core.numeric import power_of_two_scale
from .._core.threads import blas_one_thread
from .._core.validation import as_float_array
from .base import SpecEstimator
from .partially_linear_prediction import linear_offset, partially_linear_predict, smooth_part
from .widths import fit_widths

__all__ = ["PartiallyLinearRegressor", "PartiallyLinearSummary"]

#: the bandwidth names that search the widths of each regression on its own target
_SEARCHES = ("loo", "loo_scale", "aicc")


class PartiallyLinearRegressor(RegressorMixin, SpecEstimator):
    """Robinson's (1988) partially linear regression, ``y = x . beta + g(z) + e``.

    The columns named in ``linear_columns`` (x, p of them, continuous) enter linearly; the
    other columns (z: continuous, unordered or ordered categorical, read as every
    estimator here reads them) enter through an unknown function g. The fit is Robinson's
    double residual, as R np's ``npplreg`` (which takes in-sample fits in step 2):

    1. kernel regressions on z of y and of each linear column, ``m_y(z) = E[y|z]`` and
       ``m_k(z) = E[x_k|z]``: local polynomials of degree ``degree`` on the training rows
       (:class:`nbattn.LocalPolynomialRegressor`'s fit, at the widths below);
    2. the leave-one-out residuals at the training rows, ``y~_i = y_i - m_y,-i(z_i)`` and
       ``x~_ik = x_ik - m_k,-i(z_i)``, each row's fit from the other rows (Robinson's
       leave-one-out estimates, without his trimming): a row's own noise never enters its
       fit, so small widths cannot make x~ vanish by interpolating x, and the residuals are
       not shrunk by the row's own weight;
    3. beta the (weighted) least-squares slope of y~ on x~ without an intercept,
       ``beta = (X~' S X~)^{-1} X~' S y~`` (S the sample weights, I without them), with
       White's heteroskedasticity-robust sandwich (HC0)

       .. math::

           \\widehat{V}(\\beta) = (X~' S X~)^{-1} \\Big(\\sum_i s_i^2 \\hat e_i^2
           \\tilde x_i \\tilde x_i^\\top\\Big) (X~' S X~)^{-1}, \\qquad
           \\hat e_i = \\tilde y_i - \\tilde x_i^\\top \\beta,

       ``coef_se_`` the square roots of its diagonal (HC0 needs no count of parameters,
       which a smoother does not have; it is what statsmodels' WLS ``cov_type="HC0"``
       computes on the residuals);
    4. g the kernel regression on z of the partial residuals ``y - x . beta``, at the
       widths of y's regression; ``predict(X) = x . beta + g(z)``. g holds the intercept.

    Parameters
    ----------
    linear_columns : list of int or list of str
        The columns of X that enter linearly: positions (0-based) or, for a DataFrame,
        column names; at least one, not every column, each continuous and without missing
        values. ``coef_`` follows this order. Required (None is refused at fit).
    degree : 0, 1 or 2
        Degree of every local polynomial on z.
    bandwidth : "loo", "loo_scale", "aicc", "scott", "silverman", float or array-like (q,)
        The widths on z. A search ("loo": every h and lambda by the leave-one-out MSE,
        "loo_scale", "aicc"; see :class:`nbattn.LocalPolynomialRegressor`) runs for each of
        the 1 + p regressions on its own target, as ``npplreg`` selects a bandwidth per
        regression; g reuses y's widths. A rule, a number (h of z's continuous columns) or
        an array (one width per z column, in column order) gives all regressions the same
        widths.
    kernel : "gaussian", "epanechnikov" or "tricube"
        The kernel of z's continuous columns.
    rtol, loo_subsample, var_type, missing, handle_unknown, device, dtype, verbose
        As for :class:`nbattn.LocalPolynomialRegressor`. ``missing="marginalize"``
        applies to z's columns; a missing value in a linear column is an error.

    Attributes
    ----------
    coef_ : ndarray (p,)
        beta, in the order of ``linear_columns``.
    coef_se_ : ndarray (p,)
        The HC0 standard errors of ``coef_``.
    linear_columns_ : ndarray of int (p,)
        The positions of the linear columns in X.
    bandwidth_ : ndarray (q,)
        The widths on z (h, or lambda for a categorical column) of y's regression and of g.
    linear_bandwidths_ : ndarray (p, q)
        The widths of each linear column's regression on z.
    var_type_, categories_, sample_weight_, n_features_in_, feature_names_in_, X_fit_
        As for :class:`nbattn.LocalPolynomialRegressor` (every column of X).
    y_fit_ : ndarray (n_samples, 1)
        The targets.
    n_outputs_ : int
        1: a 2-D y is refused.
    outputs_2d_ : bool
        False.

    Notes
    -----
    ``sample_weight`` s_i weighs row i in every kernel regression (as in
    :class:`nbattn.LocalPolynomialRegressor`) and in the least squares of step 3; the
    sandwich is then invariant to multiplying every weight by one constant (weights are
    precision weights, not repetitions). A linear column must vary given z (beta is
    identified by ``E[(x - E[x|z])(x - E[x|z])']`` being nonsingular): a column whose
    residual x~ is below the square root of the precision times its spread (a constant,
    a copy of a z column at degree >= 1) is refused, as are linear columns collinear
    after the residuals; a column that is a nonlinear function of z leaves residuals made
    of smoothing bias, and ``coef_se_`` is large.
    """

    def __init__(
        self,
        linear_columns=None,
        degree=1,
        bandwidth="loo",
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

    # ---- fit

    def fit(self, X, y, sample_weight=None):
        """Robinson's double residual (the class docstring's steps 1 to 4)."""
        self._validate_params()
        if self.linear_columns is None:
            raise ValueError(
                "PartiallyLinearRegressor needs linear_columns: the positions or names of the "
                "columns of X that enter linearly"
            )
        X, y, sw = self._validate_training_X(X, y, sample_weight, y_numeric=True)
        y = as_float_array(y, "y", ndim=(1,), dtype="float64")
        lin = self._linear_positions(X)
        if X.shape[0] < lin.size + 2:
            # leave-one-out residuals nearly sum to 0 (one dimension fewer than the rows),
            # so with p coefficients and p + 1 rows or fewer the least squares fits them
            # exactly (two rows: each row's leave-one-out fit is the other row, so
            # (y~, x~) = +-(y_1 - y_2, x_1 - x_2)) and the standard errors are 0
            raise ValueError(
                f"PartiallyLinearRegressor needs at least {lin.size + 2} samples for "
                f"{lin.size} linear column(s) (with fewer the least squares fits the "
                f"leave-one-out residuals exactly and the standard errors are 0), got "
                f"n_samples={X.shape[0]} (rows of weight 0 are left out)"
            )
        params = self.get_params(deep=False)
        state = {
            "X_fit_": X,
            "linear_columns_": lin,
            "var_type_": self.var_type_,
            "categories_": self.categories_,
            "sample_weight_": sw,
        }
        view = smooth_part(params, state, with_target=False)
        Z = view._fitted("X_fit_")
        targets = np.column_stack([y, X[:, lin]])
        widths = self._widths(view, Z, targets, sw, lin)
        # every column in units of a power of two near its largest |value| (exact), so that
        # the residuals and the sandwich's products neither overflow nor vanish
        unit = power_of_two_scale(np.max(np.abs(targets), axis=0))
        resid = _loo_residuals(view, Z, targets / unit, widths)
        self._refuse_unidentified(targets / unit, resid[:, 1:], lin, view)
        beta, se = _sandwich(resid[:, 0], resid[:, 1:], view._weights())
        beta, se = self._rescale(beta, se, unit, lin)
        linear_offset(X[:, lin], beta)  # g's values y - x . beta must be finite
        self.linear_columns_ = lin
        self.X_fit_ = X
        self.y_fit_ = y[:, None]
        self.n_outputs_ = 1
        self.outputs_2d_ = False
        self.sample_weight_ = sw
        self.coef_ = beta
        self.coef_se_ = se
        self.bandwidth_ = widths[0].copy()
        self.linear_bandwidths_ = widths[1:].copy()
        return self

    def _linear_positions(self, X) -> np.ndarray:
        """``linear_columns`` as positions in X (int64, in the order given), checked."""
        d = X.shape[1]
        if isinstance(self.linear_columns, (list, tuple, np.ndarray)) and not len(
            self.linear_columns
        ):
            raise ValueError(
                "linear_columns is empty: name at least one column of X that enters linearly"
            )
        positions = self._column_positions(self.linear_columns, "linear_columns")
        if len(positions) == d:
            raise ValueError(
                f"linear_columns names every column of X (n_features = {d}): at least one "
                "column must stay in z, the nonparametric part g(z)"
            )
        for j in positions:
            kind = self.var_type_[j]
            if kind != "c":
                raise ValueError(
                    f"linear column {self._label(j)} is categorical (kind {kind!r}): the "
                    "linear part takes continuous columns; give its indicator columns as "
                    "numbers, or leave it in z"
                )
            missing = np.flatnonzero(np.isnan(X[:, j]))
            if missing.size:
                raise ValueError(
                    f"linear column {self._label(j)} holds a missing value at row "
                    f"{int(missing[0])}: missing='marginalize' applies to z's columns only"
                )
        return np.array(positions, dtype=np.int64)

    def _label(self, j) -> str:
        """Column j by name (a DataFrame's, else x0, x1, ...), quoted."""
        return repr(self._column_names()[j])

    def _widths(self, view, Z, targets, sample_weight, lin) -> np.ndarray:
        """(1 + p, q) widths on z: a search per target (y, then each linear column), or
        one set of widths for all (:func:`nbattn.estimators.widths.fit_widths`)."""
        degree = view._degree()
        bandwidth = self.bandwidth
        if isinstance(bandwidth, str) and bandwidth in _SEARCHES:
            rows = [
                fit_widths(view, bandwidth, Z, targets[:, k : k + 1], sample_weight, degree)
                for k in range(targets.shape[1])
            ]
            return np.array(rows, dtype=np.float64)
        if not isinstance(bandwidth, str) and np.ndim(bandwidth) > 0:
            self._check_width_count(bandwidth, lin, Z.shape[1])
        widths = fit_widths(view, bandwidth, Z, targets, sample_weight, degree)
        return np.tile(np.asarray(widths, dtype=np.float64), (targets.shape[1], 1))

    def _rescale(self, beta, se, unit, lin):
        """beta and se from the columns' units back to the data's: times
        ``2**(e_y - e_k)`` (``unit`` = 2**e per column, y first), one exact ``ldexp`` per
        entry (no intermediate ratio of units to overflow or vanish); a ValueError where a
        coefficient or its standard error leaves float64's range, above (inf) or below (a
        nonzero value that would read 0)."""
        exponent = np.frexp(unit)[1] - 1
        shift = exponent[0] - exponent[1:]
        with np.errstate(over="ignore", under="ignore"):
            out_beta, out_se = np.ldexp(beta, shift), np.ldexp(se, shift)
        lost = ((out_beta == 0) & (beta != 0)) | ((out_se == 0) & (se != 0))
        bad = ~(np.isfinite(out_beta) & np.isfinite(out_se)) | lost
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            side = "below" if lost[k] else "beyond"
            raise ValueError(
                f"the coefficient of linear column {self._label(lin[k])} (or its standard "
                f"error) is {side} float64's range (y's scale over the column's, about "
                f"2**{int(shift[k])})"
            )
        return out_beta, out_se

    def _check_width_count(self, bandwidth, lin, q) -> None:
        """A ValueError unless an array ``bandwidth`` holds one width per z column (the
        columns of X not in ``linear_columns``, in column order), not one per column of X."""
        size = int(np.size(bandwidth))
        if size != q:
            z = np.setdiff1d(np.arange(self.n_features_in_), lin)
            names = ", ".join(self._label(j) for j in z)
            raise ValueError(
                f"bandwidth holds {size} widths but z has {q} (X's column"
                f"{'s' if q > 1 else ''} {names}, those not in linear_columns); give one "
                "width per z column, in column order"
            )

    def _refuse_unidentified(self, scaled, x_resid, lin, view) -> None:
        """A ValueError for a linear column that does not vary given z (constant, or its
        residual x~ below sqrt(precision) times its spread), or for linear columns whose
        residuals are collinear (the smallest singular value of x~ with unit-norm columns
        below sqrt(precision))."""
        tol = float(np.sqrt(np.finfo(view._dtype()).eps))
        s = view._weights()
        s = np.ones(len(x_resid)) if s is None else s
        for k, j in enumerate(lin):
            x = scaled[:, 1 + k]
            if np.all(x == x[0]):
                raise ValueError(
                    f"linear column {self._label(j)} is constant: g(z) holds the intercept, "
                    "so a constant column has no coefficient"
                )
            centred = x - np.sum(s * x) / np.sum(s)
            spread = np.sqrt(np.sum(s * centred**2))
            if not np.sqrt(np.sum(s * x_resid[:, k] ** 2)) > tol * spread:
                raise ValueError(
                    f"linear column {self._label(j)} is (up to rounding) a function of z "
                    "that the kernel regression reproduces: x - E[x|z] vanishes, so its "
                    "effect cannot be told from g(z)"
                )
        if x_resid.shape[1] > 1:
            root = np.sqrt(s)[:, None]
            unit = x_resid * root
            unit = unit / np.sqrt(np.sum(unit**2, axis=0))
            with blas_one_thread():
                singular = np.linalg.svd(unit, compute_uv=False)
            if not singular[-1] > tol * singular[0]:
                names = ", ".join(self._label(j) for j in lin)
                raise ValueError(
                    f"the linear columns {names} are collinear once E[x|z] is removed: their "
                    "coefficients are not identified; drop one"
                )

    # ---- predict

    def predict(self, X):
        """``x . coef_ + g(z)`` at the rows of X (float64, (n,)): g the local polynomial of
        the partial residuals ``y - x . coef_`` on z at the widths ``bandwidth_``."""
        X = self._check_queries(X)
        return partially_linear_predict(self.get_params(deep=False), vars(self), X)

    def summary(self):
        """The fit in brief: :class:`PartiallyLinearSummary`, with the coefficients, their
        HC0 standard errors, ``t = coef / se`` and the two-sided normal p-values
        ``2 (1 - Phi(|t|))``, and the widths of each regression on z;
        ``print(model.summary())``. Raises scikit-learn's ``NotFittedError`` before fit."""
        import pandas as pd
        from scipy import special

        check_is_fitted(self)
        lin = self.linear_columns_
        names = [_name(self, j) for j in range(self.n_features_in_)]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(self.coef_se_ > 0, self.coef_ / self.coef_se_, np.nan)
        coefficients = pd.DataFrame(
            {
                "name": [names[j] for j in lin],
                "coef": self.coef_,
                "se": self.coef_se_,
                "t": t,
                "p_value": 2.0 * special.ndtr(-np.abs(t)),
            }
        )
        z = np.setdiff1d(np.arange(self.n_features_in_), lin)
        widths = pd.DataFrame(
            np.vstack([self.bandwidth_, self.linear_bandwidths_]),
            index=["y and g", *(names[j] for j in lin)],
            columns=[names[j] for j in z],
        )
        options = {k: getattr(self, k) for k in ("degree", "kernel", "bandwidth")}
        sw = self.sample_weight_
        return PartiallyLinearSummary(
            n_samples=int(self.X_fit_.shape[0]),
            weight_sum=None if sw is None else float(np.sum(sw)),
            options=options,
            coefficients=coefficients,
            widths=widths,
        )


def _name(model, j) -> str:
    names = getattr(model, "feature_names_in_", None)
    return str(names[j]) if names is not None else f"x{j}"


def _loo_residuals(view, Z, targets, widths) -> np.ndarray:
    """The leave-one-out residuals (n, 1 + p) of every target column on z,
    ``t_i - m_{-i}(z_i)`` (:func:`nbattn.local.engine.loo_residuals`), the columns that
    share their widths in one pass of the engine."""
    from ..local.engine import loo_residuals

    out = np.empty_like(targets)
    done = np.zeros(targets.shape[1], dtype=bool)
    spec, degree, weights = view._local_spec(), view._degree(), view._weights()
    for k in range(targets.shape[1]):
        if done[k]:
            continue
        group = np.flatnonzero(np.all(widths == widths[k], axis=1) & ~done)
        values = np.ascontiguousarray(targets[:, group])
        out[:, group] = loo_residuals(spec, Z, values, widths[k], degree, sample_weight=weights)
        done[group] = True
    return out


def _sandwich(y_resid, x_resid, sample_weight):
    """(beta, HC0 standard errors) of the weighted least squares of y~ on x~ without an
    intercept, through the QR factors of ``S^(1/2) X~ = Q R``:
    ``beta = R^{-1} Q' S^(1/2) y~`` and ``V = (X~'SX~)^{-1} (sum_i s_i^2 e_i^2 x~_i x~_i')
    (X~'SX~)^{-1} = G'G`` with rows ``G_i = s_i e_i x~_i' (R'R)^{-1}``."""
    root = np.ones(len(y_resid)) if sample_weight is None else np.sqrt(sample_weight)
    A = x_resid * root[:, None]
    b = y_resid * root
    with blas_one_thread():
        Q, R = np.linalg.qr(A)
        beta = np.linalg.solve(R, Q.T @ b)
        e = b - A @ beta  # s^(1/2) times the residuals
        R_inv = np.linalg.solve(R, np.eye(R.shape[0]))
        G = (A * e[:, None]) @ (R_inv @ R_inv.T)
    return beta, np.sqrt(np.sum(G * G, axis=0))


@dataclass
class PartiallyLinearSummary:
    """The summary of a fitted :class:`PartiallyLinearRegressor`; ``str()`` is the report.

    Attributes
    ----------
    n_samples : int
        Training rows (rows of weight 0 are not kept).
    weight_sum : float or None
        The sum of the sample weights, with weights.
    options : dict
        degree, kernel and bandwidth.
    coefficients : pandas.DataFrame
        One row per linear column: ``name``, ``coef``, ``se`` (HC0), ``t`` and
        ``p_value`` (two-sided, standard normal).
    widths : pandas.DataFrame
        The widths on z (columns) of y's regression and g ("y and g") and of each linear
        column's regression (rows).
    """

    n_samples: int
    weight_sum: float | None
    options: dict
    coefficients: object
    widths: object

    def __str__(self) -> str:
        lines = [
            "Partially linear regression (Robinson 1988)",
            f"rows: {self.n_samples}"
            + ("" if self.weight_sum is None else f", sum of weights {self.weight_sum:.6g}"),
            ", ".join(f"{k}: {v}" for k, v in self.options.items()),
            "",
            f"{'':<16}{'coef':>13}{'se (HC0)':>13}{'t':>9}{'p':>11}",
        ]
        for row in self.coefficients.itertuples(index=False):
            lines.append(
                f"{row.name[:15]:<16}{row.coef:>13.6g}{row.se:>13.6g}{row.t:>9.3f}"
                f"{row.p_value:>11.3g}"
            )
        lines += ["", "widths on z (h, or lambda for a categorical column):"]
        lines += self.widths.to_string(float_format=lambda v: f"{v:.4g}").splitlines()
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)
