"""Metrics accumulated over chunks of a file, so that a file of any length is scored in
bounded memory: MSE, MAE and R² for regressors, accuracy and log-loss for classifiers.

Regression sums are exact merges of per-chunk sums, kept in units of a power of two
near the largest value so far (so R² is exact for targets near 1e300, and an MSE is
inf only where it lies beyond float64); the total sum of squares of the targets uses
Chan et al.'s pairwise update of (count, mean, M2), so R² does not depend on how the
file was split:

    mean = mean_a + δ n_b / n,   M2 = M2_a + M2_b + δ² n_a n_b / n,   δ = mean_b − mean_a
"""

from __future__ import annotations

import math

import numpy as np

from .io import shorten

__all__ = ["Metrics", "fold_summary", "grid_table", "json_ready", "score_chunk"]

#: log-loss clips probabilities to [EPS, 1] as scikit-learn's ``log_loss`` does.
EPS = 1e-15


class Metrics:
    """Running metrics over chunks.

    Parameters
    ----------
    classifier : bool
    classes : array-like, optional
        The model's sorted ``classes_`` (classifiers).
    """

    def __init__(self, classifier: bool, classes=None):
        self.classifier = classifier
        self.classes = None if classes is None else np.asarray(classes)
        self.n = 0
        # the regression sums in units of the power of two ``unit`` (the largest |target|
        # or |prediction| so far, rounded down to a power of two): sums of squares of
        # targets near 1e300 stay finite, so R^2 is exact at any scale and an MSE is inf
        # only where it lies beyond float64 itself
        self.unit = 0.0  # set by the first chunk
        self.sse = self.sae = 0.0
        self.mean = self.m2 = 0.0
        self.correct = 0
        self.nll = 0.0

    def add_regression(self, y, pred) -> None:
        """Add a chunk of targets ``y`` and predictions ``pred`` (1-D)."""
        from .._core.numeric import power_of_two_scale

        y = np.asarray(y, dtype=np.float64)
        pred = np.asarray(pred, dtype=np.float64)
        if y.size == 0:  # an empty chunk adds nothing (its mean would be NaN)
            return
        top = max(np.max(np.abs(y), initial=0.0), np.max(np.abs(pred), initial=0.0))
        unit = max(self.unit, float(power_of_two_scale(top)))
        if unit != self.unit:  # the sums so far into the new unit (exact but for underflow)
            ratio = self.unit / unit  # 0 before the first chunk, whose sums are all 0
            self.sse *= ratio * ratio
            self.m2 *= ratio * ratio
            self.sae *= ratio
            self.mean *= ratio
            self.unit = unit
        y, pred = y / unit, pred / unit
        err = pred - y
        self.sse += float(err @ err)
        self.sae += float(np.abs(err).sum())
        n_b = len(y)
        mean_b = float(y.mean())
        m2_b = float(((y - mean_b) ** 2).sum())
        delta = mean_b - self.mean
        total = self.n + n_b
        self.mean = self.mean + delta * n_b / total
        self.m2 = self.m2 + m2_b + delta * delta * self.n * n_b / total
        self.n = total

    def add_classification(self, y, proba, *, where=None) -> None:
        """Add a chunk of labels ``y`` and class probabilities ``proba`` (n, n_classes).

        A label that is not one of ``classes`` raises a ValueError that starts
        with ``where(i)`` (where row i of the chunk came from) when given.
        """
        y = np.asarray(y, dtype=object)
        idx = self._class_index(y)
        if (idx < 0).any():
            i = int(np.argmax(idx < 0))
            bad = y[i].item() if isinstance(y[i], np.generic) else y[i]
            prefix = f"{where(i)}: " if where is not None else ""
            raise ValueError(f"{prefix}label {shorten(bad)} is not one of the model's classes")
        proba = np.asarray(proba, dtype=np.float64)
        self.correct += int((idx == np.argmax(proba, axis=1)).sum())
        p_true = np.clip(proba[np.arange(len(y)), idx], EPS, 1.0)
        self.nll -= float(np.log(p_true).sum())
        self.n += len(y)

    def _class_index(self, y):
        """The index of each label in ``classes``, -1 for a label that is not one
        (by equality and hash, so labels of another type are simply unknown)."""
        import pandas as pd

        return pd.Index(self.classes, dtype=object).get_indexer(y)

    def result(self) -> dict:
        """``{"n", "accuracy", "log_loss"}`` or ``{"n", "mse", "mae", "r2"}``; R² is NaN
        when the targets are constant (it is undefined)."""
        if self.n == 0:
            raise ValueError("no rows were scored")
        if self.classifier:
            return {"n": self.n, "accuracy": self.correct / self.n, "log_loss": self.nll / self.n}
        r2 = 1.0 - self.sse / self.m2 if self.m2 > 0 else float("nan")
        with np.errstate(over="ignore"):  # an MSE beyond float64 itself is inf
            mse = float(np.float64(self.sse / self.n) * self.unit * self.unit)
        mae = self.sae / self.n * self.unit
        return {"n": self.n, "mse": mse, "mae": mae, "r2": r2}


def score_chunk(model, X, y, metrics: Metrics, where=None) -> None:
    """Predict ``X`` with ``model`` and add the chunk to ``metrics`` (``where`` as for
    :meth:`Metrics.add_classification`)."""
    if metrics.classifier:
        metrics.add_classification(y, model.predict_proba(X), where=where)
    else:
        metrics.add_regression(y, model.predict(X))


# ----------------------------------------------------------------------------- summaries


def json_ready(value):
    """A metric as plain JSON: NumPy numbers as Python ones, NaN and inf as None."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def fold_summary(table) -> dict:
    """``{"fold_sizes": [...], "folds": [...], "mean": {...}, "std": {...}}`` of a table of
    per-fold metrics with their rows ``n``: the rows of each fold, each fold's metrics, and
    the metrics' mean and standard deviation (ddof=1) over the folds (not of ``n``: the
    folds' sizes are a list, not a quantity with an error), JSON-ready."""

    def clean(row):
        return {k: json_ready(v) for k, v in row.items()}

    folds = [clean(r) for r in table.to_dict("records")]
    metrics = table.drop(columns="n")
    return {
        "fold_sizes": [int(n) for n in table["n"]],
        "folds": folds,
        "mean": clean(metrics.mean()),
        "std": clean(metrics.std(ddof=1)),
    }


def grid_table(candidates, tables, criterion):
    """(one row of fold means per candidate plus ``<criterion>_std``, the candidate with
    the lowest mean ``criterion``)."""
    import pandas as pd

    shown = pd.DataFrame(
        [t.mean().drop("n") for t in tables],
        index=pd.Index([str(c) for c in candidates], name="bandwidth"),
    )
    shown[f"{criterion}_std"] = [t[criterion].std(ddof=1) for t in tables]
    best = candidates[int(np.nanargmin(shown[criterion].to_numpy()))]
    return shown, best
