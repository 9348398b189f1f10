"""Every matplotlib figure: the attention-pooling walk-through's fit curves and heatmaps,
and the figures of ``nbattn plot`` (fit, heatmap, loo, widths).

matplotlib is imported when a figure is drawn, with the non-interactive Agg
backend unless a file backend is already selected.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

FIGURE_FORMATS = ("png", "svg")


def pyplot():
    """``matplotlib.pyplot`` on a non-interactive backend."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax, figsize):
    """``ax``, or the axes of a new figure ``figsize`` inches large when it is None."""
    if ax is None:
        _, ax = pyplot().subplots(figsize=figsize)
    return ax


def _label(ax, xlabel, ylabel, title=None):
    """Name the axes, and title them when ``title`` is given."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)


# The seed's colours: green average pooling, black attention pooling, then others.
_CURVE_COLORS = ["tab:green", "black", "tab:orange", "tab:purple", "tab:brown", "tab:cyan"]


def plot_fit(x_train, y_train, x_test, y_true, curves=None, ax=None, title=None):
    """Training points, the true function, and fitted curves {label: y_pred on x_test}."""
    ax = _axes(ax, figsize=(6, 4))
    ax.scatter(x_train, y_train, color="tab:red", s=14, label="train_data")
    ax.plot(x_test, y_true, color="tab:blue", label="true function")
    for (label, y_pred), color in zip((curves or {}).items(), _CURVE_COLORS * 4):
        ax.plot(x_test, y_pred, label=label, color=color)
    _label(ax, "x", "y", title)
    ax.legend(loc="best")
    return ax


def plot_heatmap(weights, xlabel="keys", ylabel="queries", ax=None, title=None):
    """One attention map (n_queries, n_keys) as an image with a colour bar.

    Softmax weights (all >= 0) go from white to red. Weights with negative entries (a
    local polynomial's equivalent kernel, which extrapolates) take a diverging map
    centred on 0, so that a negative weight does not look like a zero one."""
    ax = _axes(ax, figsize=(5, 4))
    weights = np.asarray(weights)
    low = float(weights.min()) if weights.size else 0.0
    if low < 0.0:
        limit = max(-low, float(weights.max()))
        image = ax.imshow(weights, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    else:
        image = ax.imshow(weights, cmap="Reds", aspect="auto")
    _label(ax, xlabel, ylabel, title)
    ax.figure.colorbar(image, ax=ax)
    return ax


def save(ax, path) -> Path:
    """Save the figure holding ``ax`` and close it."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=100)
    plt.close(ax.figure)
    return path


def plot_loss_curve(bandwidths, losses, marks=None, ax=None, title=None):
    """A loss against the kernel width on a log axis; ``marks`` = {label: width} as lines."""
    ax = _axes(ax, figsize=(6, 4))
    ax.plot(bandwidths, losses, color="tab:blue", label="leave-one-out MSE")
    for (label, width), color in zip((marks or {}).items(), ["tab:red", "tab:green", "tab:gray"]):
        ax.axvline(width, color=color, linestyle="--", label=f"{label} ({width:.3g})")
    ax.set_xscale("log")
    _label(ax, "bandwidth h", "LOO MSE", title)
    ax.legend(loc="best")
    return ax


def show_heatmaps(
    weights,
    xlabel="keys",
    ylabel="queries",
    titles=None,
    figsize=(2.5, 2.5),
    cmap="Reds",
    path=None,
):
    """A (rows, cols) grid of attention maps, as d2l's ``show_heatmaps``.

    Parameters
    ----------
    weights : array (rows, cols, n_queries, n_keys)
        A 2-D map is shown alone; a 3-D (cols, queries, keys) stack as one row.
    xlabel, ylabel : str
        Axis labels (x on the bottom row, y on the first column).
    titles : list of str, optional
        One title per column (length cols), or per panel (length rows * cols).
    figsize : (width, height) of one panel, in inches
    cmap : str
    path : str or Path, optional
        Save the figure there (and close it).

    Returns
    -------
    matplotlib Figure (closed when saved to ``path``).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 2:
        w = w[None, None]
    elif w.ndim == 3:
        w = w[None]
    if w.ndim != 4:
        raise ValueError(f"weights must be (rows, cols, queries, keys), got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("weights contains NaN or inf")
    rows, cols = w.shape[:2]
    if titles is not None and len(titles) not in (cols, rows * cols):
        raise ValueError(f"titles must have {cols} or {rows * cols} entries, got {len(titles)}")
    plt = pyplot()
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(figsize[0] * cols, figsize[1] * rows),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    vmax = w.max() if w.max() > 0 else 1.0
    image = None
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            image = ax.imshow(w[r, c], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
            if r == rows - 1:
                ax.set_xlabel(xlabel)
            if c == 0:
                ax.set_ylabel(ylabel)
            if titles is not None:
                ax.set_title(titles[c] if len(titles) == cols else titles[r * cols + c])
    fig.colorbar(image, ax=axes, shrink=0.6)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
    return fig


# ----------------------------------------------------------------------------- nbattn plot


def figure_format(path) -> str:
    """ "png" or "svg" from the extension of ``path``; anything else is a ValueError."""
    ext = os.path.splitext(str(path))[1].lower().lstrip(".")
    if ext not in FIGURE_FORMATS:
        raise ValueError(f"figure {str(path)!r} must end in .png or .svg")
    return ext


def save_figure(fig, path) -> None:
    """Write ``fig`` to ``path`` (PNG or SVG by extension) atomically, and close it."""
    from .._core.atomic import atomic_output

    fmt = figure_format(path)
    try:
        with atomic_output(path) as tmp:
            fig.tight_layout()
            fig.savefig(tmp, format=fmt, dpi=100)
    finally:
        pyplot().close(fig)


#: scatter at most this many points of a data file (a random subset beyond)
MAX_POINTS = 5000


def _kinds_of(model, d) -> str:
    kinds = getattr(model, "var_type_", None)
    return kinds if isinstance(kinds, str) and len(kinds) == d else "c" * d


def _reference_row(X, kinds):
    """The row the partial-dependence slices hold fixed: each continuous column's
    median, each categorical column's most frequent value."""
    row = {}
    for name, kind in zip(X.columns, kinds):
        column = X[name]
        if kind == "c":
            row[name] = float(np.nanmedian(column.to_numpy(dtype=np.float64)))
        else:
            row[name] = column.mode(dropna=True).iloc[0]
    return row


def _band(model, queries):
    """(lower, upper) of the 95% interval of the mean, or None when the model has none."""
    if not hasattr(model, "predict_interval") or getattr(model, "kernel", None) == "average":
        return None
    band = np.asarray(model.predict_interval(queries, alpha=0.05, kind="mean"))
    return band[:, 0], band[:, 1]


def fit_figure(model, X, y, target, label="data"):
    """The fitted curve over the data with its 95% band, one panel per feature.

    With one feature the panel is the model's prediction along the feature.
    With several, panel f is a partial-dependence slice: the prediction along
    feature f with every other feature held at a reference row (continuous
    columns at their median over ``X``, categorical ones at their most
    frequent value), ``g_f(t) = f(x_ref with x_f = t)``, drawn over the
    data's ``(x_f, y)``. A categorical feature's panel shows the prediction
    at each category (with its band as an error bar) over the data points of
    each category. The band is the pointwise 95% interval of the mean
    (``model.predict_interval``), when the model has one.

    Parameters
    ----------
    model : fitted regressor with ``feature_names_in_``
    X : DataFrame (n, d), the model's features in its order
    y : array (n,)
    target : str, the label of the y axis
    label : str, the legend entry of the data points
    """
    import pandas as pd

    plt = pyplot()
    features = list(X.columns)
    d = len(features)
    kinds = _kinds_of(model, d)
    cols = min(d, 3)
    rows = -(-d // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    y = np.asarray(y)
    shown = np.arange(len(y))
    if len(y) > MAX_POINTS:
        shown = np.random.default_rng(0).choice(len(y), MAX_POINTS, replace=False)
    reference = _reference_row(X, kinds)
    for f, name in enumerate(features):
        ax = axes.flat[f]
        column = X[name].iloc[shown]
        if kinds[f] == "c":
            values = X[name].to_numpy(dtype=np.float64)
            grid = np.linspace(np.nanmin(values), np.nanmax(values), 400)
        else:
            cats = getattr(model, "categories_", [None] * d)[f]
            grid = list(cats) if cats else sorted(X[name].dropna().unique().tolist())
        queries = pd.DataFrame({c: [reference[c]] * len(grid) for c in features})
        queries[name] = grid
        for c, kind in zip(features, kinds):
            if kind == "c":
                queries[c] = queries[c].astype(np.float64)
        curve = np.asarray(model.predict(queries))
        band = _band(model, queries)
        curve_label = type(model).__name__ if d == 1 else "others at reference"
        if kinds[f] == "c":
            ax.scatter(column, y[shown], s=8, color="tab:red", alpha=0.6, label=label)
            ax.plot(grid, curve, color="tab:blue", label=curve_label)
            if band is not None:
                ax.fill_between(grid, *band, color="tab:blue", alpha=0.2, label="95% band")
        else:
            position = {v: k for k, v in enumerate(grid)}
            x = np.array([position.get(v, np.nan) for v in column], dtype=np.float64)
            jitter = np.random.default_rng(1).uniform(-0.2, 0.2, x.size)
            ax.scatter(x + jitter, y[shown], s=8, color="tab:red", alpha=0.4, label=label)
            spread = None if band is None else np.vstack([curve - band[0], band[1] - curve])
            ax.errorbar(
                np.arange(len(grid)),
                curve,
                yerr=spread,
                fmt="o",
                color="tab:blue",
                capsize=4,
                label=curve_label,
            )
            ax.set_xticks(range(len(grid)), [str(v) for v in grid], rotation=30, ha="right")
        ax.set_xlabel(name)
        ax.set_ylabel(target)
        ax.legend(loc="best", fontsize="small")
    for ax in list(axes.flat)[d:]:
        ax.set_visible(False)
    if d > 1:
        fig.suptitle(f"{type(model).__name__}: partial dependence on each feature")
    return fig


def _training_table(model):
    """The model's training rows (keys) as the table it was fitted on: category codes
    turned back into their categories, NaN codes into None."""
    import pandas as pd

    keys = np.asarray(model.X_fit_)
    d = keys.shape[1]
    given = getattr(model, "feature_names_in_", None)
    names = [str(n) for n in given] if given is not None else [f"x{j}" for j in range(d)]
    kinds = _kinds_of(model, d)
    cats = getattr(model, "categories_", None) or [None] * d
    out = {}
    for j, (name, kind) in enumerate(zip(names, kinds)):
        if kind == "c":
            out[name] = keys[:, j]
        else:
            out[name] = [None if np.isnan(v) else cats[j][int(v)] for v in keys[:, j]]
    frame = pd.DataFrame(out)
    if given is not None:
        return frame
    return frame.to_numpy(dtype=np.float64 if set(kinds) == {"c"} else object)


def _prediction_order(model, X):
    """Row order of X by the model's prediction (a classifier: by the probability of
    its last class)."""
    if hasattr(model, "predict_proba"):
        score = np.asarray(model.predict_proba(X))[:, -1]
    else:
        score = np.asarray(model.predict(X)).reshape(len(X), -1)[:, 0]
    return np.argsort(score, kind="stable")


def attention_figure(model, X, data_name="data"):
    """Attention weights of the rows of ``X`` (queries) over the training rows (keys).

    With one continuous feature both are sorted by it; otherwise (several
    features, or a categorical one) both are sorted by the model's
    prediction, so that rows which pool alike sit together."""
    features = list(X.columns)
    keys = getattr(model, "X_fit_", None)
    by_feature = len(features) == 1 and _kinds_of(model, 1) == "c"
    if by_feature:
        X = X.iloc[np.argsort(X.iloc[:, 0].to_numpy(), kind="stable")]
        key_order = None if keys is None else np.argsort(keys[:, 0], kind="stable")
        how = f"by {features[0]}"
    else:
        X = X.iloc[_prediction_order(model, X)]
        key_order = None if keys is None else _prediction_order(model, _training_table(model))
        how = "by prediction"
    weights = np.asarray(model.attention_weights(X))
    if key_order is not None and key_order.size == weights.shape[1]:
        weights = weights[:, key_order]
    _, ax = pyplot().subplots(figsize=(6, 4.5))
    plot_heatmap(
        weights,
        xlabel=f"training rows (keys), {how}",
        ylabel=f"rows of {data_name} (queries), {how}",
        ax=ax,
        title="attention weights",
    )
    return ax.figure


def loo_curve(X, y, base, scales, progress=None):
    """Leave-one-out MSE of Nadaraya-Watson at the widths ``base * s`` for s in ``scales``.

    ``L(h) = mean_i (f_{-i}(x_i) - y_i)^2``, ``f_{-i}`` the prediction at x_i
    without the pair (i, i) (``nbattn.smoothing.loo.loo_loss``). ``progress`` is
    called once per width.
    """
    from ..smoothing.loo import loo_loss

    losses = np.empty(len(scales))
    for i, s in enumerate(scales):
        losses[i] = loo_loss(X, y, base * s)
        if progress is not None:
            progress()
    return losses


def loo_figure(X, y, points=30, progress=None):
    """Leave-one-out MSE against the width, in units of Scott's rule, over ``points``
    scales from 10^-1.5 to 10, with Scott's rule, the grid minimum and the width
    ``bandwidth="loo_scale"`` chooses (:func:`nbattn.smoothing.width_search.loo_bandwidth`) marked.
    ``progress`` is called once per width."""
    from ..smoothing.regression import bandwidth_rule
    from ..smoothing.width_search import loo_bandwidth

    X = np.asarray(X, dtype=np.float64)
    if len(y) < 2:
        raise ValueError("the leave-one-out loss needs at least 2 rows")
    scott = bandwidth_rule(X, "scott")
    scales = np.logspace(-1.5, 1.0, points)
    losses = loo_curve(X, y, scott, scales, progress)
    factor = float(np.asarray(loo_bandwidth(X, y))[0] / scott[0])
    _, ax = pyplot().subplots(figsize=(6, 4))
    ax.plot(scales, losses, color="tab:blue")
    ax.axvline(1.0, color="gray", ls="--", label="Scott's rule")
    ax.axvline(factor, color="tab:green", ls=":", label=f"bandwidth='loo': {factor:.3g} x Scott")
    best = int(np.argmin(losses))
    ax.scatter(
        [scales[best]],
        [losses[best]],
        color="tab:red",
        zorder=3,
        label=f"grid minimum: {scales[best]:.3g} x Scott",
    )
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth / Scott's rule")
    ax.set_ylabel("leave-one-out MSE")
    ax.legend(loc="best")
    return ax.figure


def relative_widths(model):
    """Each width relative to its feature: ``h_d / sd_d`` for a continuous column (its
    training spread; 1 when constant), ``lambda / lambda_max`` for a categorical one
    (lambda_max = (c - 1)/c unordered, 1 ordered: 1 means the column is ignored)."""
    widths = np.asarray(model.bandwidth_, dtype=np.float64).reshape(-1)
    keys = np.asarray(model.X_fit_)
    d = keys.shape[1]
    if widths.size == 1 and d > 1:
        widths = np.full(d, widths[0])
    kinds = _kinds_of(model, d)
    cats = getattr(model, "categories_", None) or [None] * d
    out = np.empty(d)
    for j, kind in enumerate(kinds):
        if kind == "c":
            column = keys[:, j][~np.isnan(keys[:, j])]
            sd = float(np.std(column, ddof=1)) if column.size > 1 else 0.0
            out[j] = widths[j] / (sd if sd > 0 else 1.0)
        else:
            c = len(cats[j]) if cats[j] else 2
            top = (c - 1) / c if kind == "u" else 1.0
            out[j] = widths[j] / top if top > 0 else 1.0
    return out


def widths_figure(model, features):
    """The kernel widths per feature relative to the feature's spread
    (:func:`relative_widths`, symmetric-log scale: 0 is drawn, huge ratios fit), or
    the learned metric ``components_`` as an image."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(features) + 2), 4))
    if getattr(model, "bandwidth_", None) is not None:
        ratios = relative_widths(model)
        kinds = _kinds_of(model, ratios.size)
        colours = ["tab:blue" if k == "c" else "tab:orange" for k in kinds]
        ax.bar(range(ratios.size), ratios, color=colours)
        ax.set_xticks(range(ratios.size), features, rotation=45, ha="right")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.axhline(1.0, color="gray", ls="--", lw=0.8)
        ax.set_ylabel("h / feature sd  (categorical: lambda / lambda_max)")
        ax.set_title(f"{type(model).__name__} widths relative to each feature")
    elif getattr(model, "components_", None) is not None:
        L = np.asarray(model.components_, dtype=np.float64)
        limit = float(np.abs(L).max()) or 1.0
        image = ax.imshow(L, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(len(features)), features, rotation=45, ha="right")
        ax.set_yticks(range(L.shape[0]), [str(i + 1) for i in range(L.shape[0])])
        ax.set_xlabel("features")
        ax.set_ylabel("rows of L")
        ax.set_title("learned metric L")
    else:
        plt.close(fig)
        raise ValueError(f"{type(model).__name__} has no widths (bandwidth_ or components_)")
    return fig
