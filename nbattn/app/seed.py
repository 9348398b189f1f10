"""The attention-pooling walk-through, section 1.3, as code: average pooling,
Nadaraya-Watson and a learned width.

``run_seed(outdir)`` fits each model, returns a metrics table and writes the
walk-through's figures. Used by ``nbattn demo`` and ``scripts/reproduce_seed.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..estimators import LearnedKernelRegressor, NadarayaWatsonRegressor
from ..smoothing.loo import loo_loss
from . import plotting
from .datasets import seed_data

#: The walk-through's models: name -> estimator. "nadaraya_watson" is the walk-through's own
#: kernel, exp(-(x - x_i)^2 / 2), i.e. bandwidth 1.
SEED_MODELS = {
    "average_pooling": lambda: NadarayaWatsonRegressor(kernel="average"),
    "nadaraya_watson": lambda: NadarayaWatsonRegressor(bandwidth=1.0),
    "nadaraya_watson_scott": lambda: NadarayaWatsonRegressor(bandwidth="scott"),
    # section 1.3.3: the width w learned by minimising the leave-one-out MSE
    "learned_width": lambda: LearnedKernelRegressor(metric="scalar"),
}


def _metrics(y_true, y_pred):
    err = np.asarray(y_pred) - np.asarray(y_true)
    ss_tot = np.sum((y_true - np.mean(y_true)) ** 2)
    return {
        "mse": float(np.mean(err**2)),
        "mae": float(np.mean(np.abs(err))),
        "r2": float(1.0 - np.sum(err**2) / ss_tot),
    }


def run_seed(outdir=None, random_state=None):
    """Fit the walk-through's models; write its figures to ``outdir`` when given.

    Returns a DataFrame indexed by model with the test-grid MSE, MAE and R²
    against the true function, and the training MSE.
    """
    data = seed_data() if random_state is None else seed_data(random_state=random_state)
    X_train = data.x_train[:, None]
    X_test = data.x_test[:, None]
    rows, curves, fitted = {}, {}, {}
    for name, make in SEED_MODELS.items():
        model = make().fit(X_train, data.y_train)
        y_pred = model.predict(X_test)
        row = _metrics(data.y_test, y_pred)
        row["train_mse"] = float(np.mean((model.predict(X_train) - data.y_train) ** 2))
        row["bandwidth"] = float(model.bandwidth_[0]) if name != "average_pooling" else np.nan
        rows[name], curves[name], fitted[name] = row, y_pred, model
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    if outdir is not None:
        write_seed_figures(Path(outdir), data, curves, fitted)
    return table


def write_seed_figures(outdir: Path, data, curves, fitted) -> list[Path]:
    """The figures of the attention-pooling walk-through, sections 1.3.1-1.3.2."""
    args = (data.x_train, data.y_train, data.x_test, data.y_test)
    written = [
        plotting.save(plotting.plot_fit(*args, title="training data"), outdir / "data.png"),
        plotting.save(
            plotting.plot_fit(
                *args,
                {"average pooling": curves["average_pooling"]},
                title="average pooling: every query gets the mean of y",
            ),
            outdir / "average_pooling.png",
        ),
        plotting.save(
            plotting.plot_fit(
                *args,
                {
                    "average pooling": curves["average_pooling"],
                    "Nadaraya-Watson (h = 1)": curves["nadaraya_watson"],
                    "Nadaraya-Watson (Scott)": curves["nadaraya_watson_scott"],
                },
                title="Nadaraya-Watson attention pooling",
            ),
            outdir / "nadaraya_watson.png",
        ),
    ]
    weights = fitted["nadaraya_watson"].attention_weights(data.x_test[:, None])
    heat = plotting.plot_heatmap(
        weights,
        xlabel="x_train (keys)",
        ylabel="x_test (queries)",
        title="attention weights, h = 1",
    )
    written.append(plotting.save(heat, outdir / "heatmap_nadaraya_watson.png"))
    if "learned_width" in fitted:
        written += write_learned_width_figures(outdir, data, curves, fitted)
    return written


def write_learned_width_figures(outdir: Path, data, curves, fitted) -> list[Path]:
    """The walk-through's section 1.3.3: the learned-w fit, its sharper heatmap and the
    leave-one-out MSE against the width."""
    args = (data.x_train, data.y_train, data.x_test, data.y_test)
    learned = fitted["learned_width"]
    h_learned = float(learned.bandwidth_[0])
    w = 1.0 / h_learned  # the walk-through's parameter: exp(-((x - x_i) w)^2 / 2)
    fit = plotting.plot_fit(
        *args,
        {
            "Nadaraya-Watson (h = 1)": curves["nadaraya_watson"],
            f"learned w = {w:.3g} (h = {h_learned:.3g})": curves["learned_width"],
        },
        title="parametric attention pooling (learned w)",
    )
    written = [plotting.save(fit, outdir / "learned_width.png")]
    heat = plotting.plot_heatmap(
        learned.attention_weights(data.x_test[:, None]),
        xlabel="x_train (keys)",
        ylabel="x_test (queries)",
        title=f"attention weights, learned w = {w:.3g}",
    )
    written.append(plotting.save(heat, outdir / "heatmap_learned_width.png"))
    x_train = data.x_train[:, None]
    widths = np.logspace(-2, 1, 61)
    losses = [loo_loss(x_train, data.y_train, h) for h in widths]
    h_scott = float(fitted["nadaraya_watson_scott"].bandwidth_[0])
    marks = {
        f"learned: h = {h_learned:.3g}": h_learned,
        f"Scott's rule: h = {h_scott:.3g}": h_scott,
        "the walk-through's h = 1": 1.0,
    }
    ax = plotting.plot_loss_curve(widths, losses, marks, title="leave-one-out MSE vs width")
    written.append(plotting.save(ax, outdir / "loo_curve.png"))
    return written
