"""The regressors' significance tests: which columns matter (``significance_test``)."""

from __future__ import annotations

import warnings

import numpy as np

from .._core.validation import as_float_array, check_choice, check_positive_int
from ..local.problem import check_sample_weight, check_widths
from ..local.resampling import bootstrap_generator
from ..local.significance import significance_tests

__all__ = ["SignificanceTests"]

#: ``method`` -> the wild bootstrap's multipliers (R np's names for them)
METHODS = {"wild": "mammen", "wild_rademacher": "rademacher"}


class SignificanceTests:
    """``significance_test`` of the regressors (a mix-in of
    :class:`nbattn.estimators.regressors._PoolingRegressor`)."""

    def significance_test(
        self,
        X,
        y,
        columns=None,
        joint=None,
        n_boot=399,
        method="wild",
        random_state=None,
        sample_weight=None,
    ):
        """Test whether columns of X matter to the fitted regression, by the wild bootstrap.

        For each column c tested (and for the group ``joint``, tested together) the
        statistic is the mean over the rows of X of the squared slope ``d g / d x_c``
        (a continuous column: Racine 1997, "Consistent significance testing for
        nonparametric regression") or of ``sum_{l > l_0} (g(x; x_c = l) - g(x; x_c =
        l_0))^2`` over the levels present (a categorical column: Racine, Hart and Li 2006,
        "Testing the significance of categorical predictor variables in nonparametric
        regression models"), summed over a joint group; g is this model's fit to (X, y)
        at its fitted widths ``bandwidth_``, which are held throughout. Under the null
        hypothesis that the column(s) do not enter E[y | x], replicates
        ``y* = g_r(x) + e v`` come from the restricted fit g_r (the model without the
        tested columns, same widths for the others), its residuals e brought to the spread
        of the full model's leave-one-out residuals, and the wild bootstrap's multipliers
        v (R np's ``npsigtest(boot.method="wild", pivot=FALSE)``; the module
        :mod:`nbattn.local.significance` says where it differs); the p-value is
        ``(1 + #{I* >= I}) / (n_boot + 1)``. All replicates are fitted in one pass of the
        engine per group (:mod:`nbattn.local.significance`).

        Parameters
        ----------
        X : array-like or DataFrame (n, n_features)
            The rows to test on, read like the training rows (usually the training set).
        y : array-like (n,)
            Their targets (one output).
        columns : list of column names or positions, optional
            The columns tested one by one; None: every column (with ``joint`` given:
            none, unless listed).
        joint : list of column names or positions, optional
            A group of columns tested together, reported as one more row.
        n_boot : int >= 1, default 399
        method : "wild" or "wild_rademacher"
            The multipliers: Mammen's two-point law (E v^3 = 1) or +-1.
        random_state : None, int, numpy Generator or RandomState
            The bootstrap's draws; None is a fixed seed, so two identical calls give the
            same p-values.
        sample_weight : array-like (n,), optional
            Weights of the rows of X, in the fits and in the mean over rows.

        Returns
        -------
        pandas.DataFrame indexed by column name (``"joint: a, b"`` for the group), with
        columns ``statistic`` and ``p_value``; also kept as ``significance_`` (shown by
        ``summary()``). The statistic is in y's units squared (per unit of x squared for
        a continuous column); where that lies beyond float64's range it is reported as 0
        or inf with a RuntimeWarning, and the p-values, computed in scaled units, are
        exact at any scale.
        """
        import pandas as pd

        X = self._check_queries(X)
        self._refuse_untestable(X)
        y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
        if y.ndim == 2:
            if y.shape[1] != 1:
                raise ValueError(f"significance_test needs one target, y has {y.shape[1]} columns")
            y = y[:, 0]
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"y has {y.shape[0]} rows but X has {X.shape[0]}")
        if X.shape[0] < 2:
            raise ValueError(f"significance_test needs at least 2 rows, X has {X.shape[0]}")
        n_boot = check_positive_int(n_boot, "n_boot")
        method = check_choice(method, "method", tuple(METHODS))
        rng = bootstrap_generator(random_state)
        sample_weight = check_sample_weight(sample_weight, X.shape[0])
        names = self._column_names()
        if columns is None:
            columns = [] if joint is not None else list(range(len(names)))
        tested = [[p] for p in sorted(self._column_positions(columns, "columns"))]
        labels = [names[group[0]] for group in tested]
        if joint is not None:
            group = sorted(self._column_positions(joint, "joint"))
            if not group:
                raise ValueError("joint must list at least one column")
            tested.append(group)
            labels.append("joint: " + ", ".join(names[p] for p in group))
        spec = self._local_spec(X)
        widths = check_widths(
            self._fitted("bandwidth_"), spec.var_type, spec.counts, name="bandwidth_"
        )
        results = significance_tests(
            spec,
            X,
            y,
            widths,
            self._degree(),
            tested,
            rng,
            sample_weight=sample_weight,
            n_boot=n_boot,
            multipliers=METHODS[method],
        )
        lost = [label for label, r in zip(labels, results) if r.out_of_range]
        if lost:
            warnings.warn(
                f"the statistic of {lost} lies beyond float64's range in the units of y and "
                "X and is reported as 0 or inf (rescale y or X to see it); the p-values do "
                "not depend on the scale and are exact",
                RuntimeWarning,
                stacklevel=2,
            )
        table = pd.DataFrame(
            {
                "statistic": [r.statistic for r in results],
                "p_value": [r.p_value for r in results],
            },
            index=pd.Index(labels, name="column"),
        )
        table.attrs.update(n_boot=n_boot, method=method)
        self.significance_ = table
        return table

    def _refuse_untestable(self, X) -> None:
        """The models the test does not cover, refused by name; unseen categories."""
        if self._average():
            raise ValueError("significance_test needs a kernel; kernel='average' has none")
        if self._param("metric") == "full":
            raise ValueError(
                "significance_test needs a width per column; metric='full' learns a linear map"
            )
        if self._bandwidth_type() != "fixed":  # its calibration is measured at fixed widths
            raise NotImplementedError(
                "significance_test holds fixed widths; nearest-neighbour widths "
                f"(bandwidth_type={self._bandwidth_type()!r}) are not available there"
            )
        kinds = self._kinds()
        if self._missing() != "marginalize":
            for position, kind in enumerate(kinds):
                if kind != "c" and np.isnan(X[:, position]).any():
                    row = int(np.flatnonzero(np.isnan(X[:, position]))[0])
                    raise ValueError(
                        f"column {self._column_names()[position]!r} holds a category the model "
                        f"was not fitted on (first at row {row})"
                    )
