"""Every matplotlib figure: the attention-pooling walk-through's fit curves and heatmaps,
and the figures of ``nbattn plot`` (fit, heatmap, loo, widths); the densities' figures
are :mod:`nbattn.app.density_figures`, drawn with the helpers here.

matplotlib is imported when a figure is drawn, with the non-interactive Agg
backend unless a file backend is already selected. Figures are laid out by
matplotlib's constrained layout; a legend goes to the first corner of its axes
that covers no data point or line, and beside the axes when no corner is free.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .._core.columns import n_categories
from .._core.validation import plural
from ..local.problem import lambda_max
from .batch import smoothed_columns
from .legends import lay_out, place_legend
from .names import column_option

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
        _, ax = pyplot().subplots(figsize=figsize, layout="constrained")
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
    ax = _axes(ax, figsize=(6.4, 4))
    ax.scatter(x_train, y_train, color="tab:red", s=14, label="training data")
    ax.plot(x_test, y_true, color="tab:blue", label="true function")
    for (label, y_pred), color in zip((curves or {}).items(), _CURVE_COLORS * 4):
        ax.plot(x_test, y_pred, label=label, color=color)
    _label(ax, "x", "y", title)
    place_legend(ax, fontsize="small")
    return ax


def plot_heatmap(
    weights, xlabel="keys", ylabel="queries", ax=None, title=None, scale_label=None, gamma=1.0
):
    """One attention map (n_queries, n_keys) as an image with a colour bar.

    Softmax weights (all >= 0) go from white to red, on a power scale ``gamma`` (0.5:
    the square root, which brings out the small weights of a wide kernel). Weights with
    negative entries (a local polynomial's equivalent kernel, which extrapolates) take a
    diverging map centred on 0, so that a negative weight does not look like a zero
    one. ``scale_label`` names the colour bar."""
    from matplotlib.colors import PowerNorm

    ax = _axes(ax, figsize=(5.5, 4))
    weights = np.asarray(weights)
    low = float(weights.min()) if weights.size else 0.0
    if low < 0.0:
        limit = max(-low, float(weights.max()))
        image = ax.imshow(weights, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    elif gamma != 1.0:
        top = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
        norm = PowerNorm(gamma, vmin=0.0, vmax=top)
        image = ax.imshow(weights, cmap="Reds", norm=norm, aspect="auto")
    else:
        image = ax.imshow(weights, cmap="Reds", aspect="auto")
    _label(ax, xlabel, ylabel, title)
    bar = ax.figure.colorbar(image, ax=ax)
    if scale_label:
        bar.set_label(scale_label)
    return ax


def save(ax, path) -> Path:
    """Save the figure holding ``ax`` and close it."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lay_out(ax.figure)
    ax.figure.savefig(path, dpi=100)
    plt.close(ax.figure)
    return path


def plot_loss_curve(
    bandwidths, losses, marks=None, ax=None, title=None, xlabel="bandwidth h", legend=True
):
    """A loss against the kernel width on a log axis. ``marks`` = {legend label: width},
    each a line from the bottom up to a marker on the curve (up to the top beyond the
    curve's widths), so that the space above the curve stays free for the legend."""
    ax = _axes(ax, figsize=(6.4, 4))
    x, y = np.asarray(bandwidths, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    ax.plot(x, y, color="tab:blue", label="leave-one-out MSE")
    ax.set_xscale("log")
    bottom, top = ax.get_ylim()
    styles = [("tab:green", ":", "v"), ("tab:gray", "--", "s"), ("tab:purple", "-.", "D")]
    for (label, width), (color, ls, marker) in zip((marks or {}).items(), styles * 4):
        inside = x.min() <= width <= x.max()
        at = np.interp(np.log(width), np.log(x), y) if inside else top
        ax.plot(
            [width, width],
            [bottom, at],
            color=color,
            ls=ls,
            lw=1.8,
            label=label,
            marker=marker,
            markevery=[1],
            ms=7,
            mfc="none",
            mew=1.5,
        )
    ax.set_ylim(bottom, top)
    _label(ax, xlabel, "leave-one-out MSE", title)
    if legend:
        place_legend(ax, fontsize="small")
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
        raise ValueError(
            f"titles must have {cols} or {plural(rows * cols, 'entry', 'entries')}, got "
            f"{len(titles)}"
        )
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
            lay_out(fig)
            fig.savefig(tmp, format=fmt, dpi=100)
    finally:
        pyplot().close(fig)


#: scatter at most this many points of a data file (a random subset beyond)
MAX_POINTS = 5000

#: a heatmap shows at most this many cells a side; beyond, neighbouring rows are binned
MAX_CELLS = 120


def kinds_of(model, d) -> str:
    """The model's column kinds (``var_type_``), all continuous when it has none."""
    kinds = getattr(model, "var_type_", None)
    return kinds if isinstance(kinds, str) and len(kinds) == d else "c" * d


def reference_row(X, kinds):
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


def held_at(reference, kinds, features, name, width=56) -> str:
    """A panel's title: the value at which each other feature is held (its median, or its
    most frequent category), on lines of about ``width`` characters (a value is never
    split from its name). Names and categories are written as ``--features`` reads
    them (:func:`nbattn.app.io.column_option`): in double quotes when they hold a comma
    or a quote or have spaces at their ends, so that the list reads one way."""
    held = [
        f"{column_option(c)} = {reference[c]:.4g}"
        if kind == "c"
        else f"{column_option(c)} = {column_option(reference[c])}"
        for c, kind in zip(features, kinds)
        if c != name
    ]
    lines = ["others held at"]
    for k, item in enumerate(held):
        item += "," if k < len(held) - 1 else ""
        if len(lines[-1]) + 1 + len(item) > width and lines[-1] != "others held at":
            lines.append(item)
        else:
            lines[-1] += " " + item
    return "\n".join(lines)


#: the legend of each kind of band (``nbattn plot fit --band``)
BAND_LABELS = {
    "asymptotic": "95% band of the mean",
    "bootstrap": "95% wild-bootstrap\nband of the mean",
}


def _band(model, queries, band="asymptotic"):
    """(lower, upper) of the 95% interval of the mean, or None when the model has none:
    the sandwich's normal interval, or with ``band="bootstrap"`` the wild bootstrap's."""
    if not hasattr(model, "predict_interval") or getattr(model, "kernel", None) == "average":
        return None
    out = np.asarray(model.predict_interval(queries, alpha=0.05, kind="mean", method=band))
    return out[:, 0], out[:, 1]


def _regression_panel(ax, model, queries, grid, x, y, continuous, label, curve_label, band):
    """Panel of a regressor: the data (x, y), the prediction at ``queries`` along ``grid``
    with its 95% band of kind ``band`` (a category's prediction and band as a point and an
    error bar)."""
    curve = np.asarray(model.predict(queries))
    band_label, band = BAND_LABELS[band], _band(model, queries, band)
    if continuous:
        ax.scatter(x, y, s=8, color="tab:red", alpha=0.6, label=label)
        ax.plot(grid, curve, color="tab:blue", label=curve_label)
        if band is not None:
            ax.fill_between(grid, *band, color="tab:blue", alpha=0.2, label=band_label)
        return
    jitter = np.random.default_rng(1).uniform(-0.2, 0.2, x.size)
    ax.scatter(x + jitter, y, s=8, color="tab:red", alpha=0.4, label=label)
    spread = None if band is None else np.vstack([curve - band[0], band[1] - curve])
    ax.errorbar(
        np.arange(len(grid)),
        curve,
        yerr=spread,
        fmt="o",
        color="tab:blue",
        capsize=4,
        label=curve_label if band is None else f"{curve_label}, {band_label}",
    )


def class_shares(x, y, classes, continuous):
    """(positions, shares (n_positions, n_classes)) of each class among the data: per
    category, or per bin of about equal counts of a continuous x."""
    x = np.asarray(x, dtype=np.float64)
    keep = np.isfinite(x)
    x, y = x[keep], np.asarray(y)[keep]
    if continuous:
        n_bins = int(np.clip(x.size // 20, 1, 12))
        order = np.argsort(x, kind="stable")
        groups = [g for g in np.array_split(order, n_bins) if g.size]
        positions = np.array([np.median(x[g]) for g in groups])
    else:
        groups = [np.flatnonzero(x == p) for p in np.unique(x)]
        positions = np.unique(x)
    shares = np.array([[np.mean(y[g] == c) for c in classes] for g in groups if g.size])
    return positions, shares


CLASS_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def _class_panel(ax, model, queries, grid, x, y, continuous, label):
    """Panel of a classifier: the probability of each class at ``queries`` along ``grid``
    (lines; a category's as points), and each class's share of the data (open markers:
    per bin of x, or per category)."""
    classes = list(model.classes_)
    proba = np.asarray(model.predict_proba(queries))
    colours = [CLASS_COLORS[k % len(CLASS_COLORS)] for k in range(len(classes))]
    positions, shares = class_shares(x, y, classes, continuous)
    offsets = np.zeros(len(classes)) if continuous else np.linspace(-0.2, 0.2, len(classes))
    for k, (cls, colour) in enumerate(zip(classes, colours)):
        if continuous:
            ax.plot(grid, proba[:, k], color=colour, label=f"P({cls})")
        else:
            ax.plot(
                np.arange(len(grid)) + offsets[k], proba[:, k], "o", color=colour, label=f"P({cls})"
            )
        ax.plot(positions + offsets[k], shares[:, k], "D", mfc="none", color=colour, ms=5)
    ax.plot([], [], "D", mfc="none", color="gray", ms=5, label=f"share of each class in {label}")
    ax.set_ylim(-0.06, 1.06)


def fit_figure(model, X, y, target, label="data", band="asymptotic"):
    """The fitted curve over the data with its 95% band, one panel per feature; for a
    classifier, the probability of each class.

    With one feature the panel is the model's prediction along the feature.
    With several, panel f is a partial-dependence slice: the prediction along
    feature f with every other feature held at a reference row (continuous
    columns at their median over ``X``, categorical ones at their most
    frequent value), ``g_f(t) = f(x_ref with x_f = t)``, drawn over the
    data's ``(x_f, y)``. A categorical feature's panel shows the prediction
    at each category (with its band as an error bar) over the data points of
    each category. The band is the pointwise 95% interval of the mean
    (``model.predict_interval``), when the model has one: the normal interval of the
    sandwich variance (``band="asymptotic"``) or the percentile band of 999 wild-bootstrap
    replicates at the fitted widths (``band="bootstrap"``). A classifier's panels
    show ``P(class | x)`` for each class along the slice, and each class's share of
    the data per bin of the feature (per category).

    Parameters
    ----------
    model : fitted regressor or classifier with ``feature_names_in_``
    X : DataFrame (n, d), the model's features in its order
    y : array (n,), targets or class labels
    target : str, the label of the y axis
    label : str, the name of the data in the legend
    band : "asymptotic" or "bootstrap", the regressors' band
    """
    import pandas as pd

    plt = pyplot()
    classifier = hasattr(model, "predict_proba") and hasattr(model, "classes_")
    features = list(X.columns)
    d = len(features)
    kinds = kinds_of(model, d)
    cols = min(d, 3)
    rows = -(-d // cols)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(5 * cols, 3.6 * rows + 0.8 * (d > 1)),
        squeeze=False,
        layout="constrained",
    )
    y = np.asarray(y)
    shown = np.arange(len(y))
    if len(y) > MAX_POINTS:
        shown = np.random.default_rng(0).choice(len(y), MAX_POINTS, replace=False)
    reference = reference_row(X, kinds)
    curve_label = type(model).__name__ if d == 1 else "others at reference"
    for f, name in enumerate(features):
        ax = axes.flat[f]
        column = X[name].iloc[shown]
        continuous = kinds[f] == "c"
        if continuous:
            values = X[name].to_numpy(dtype=np.float64)
            grid = np.linspace(np.nanmin(values), np.nanmax(values), 400)
            x = column.to_numpy(dtype=np.float64)
        else:
            cats = getattr(model, "categories_", [None] * d)[f]
            grid = list(cats) if cats else sorted(X[name].dropna().unique().tolist())
            position = {v: k for k, v in enumerate(grid)}
            x = np.array([position.get(v, np.nan) for v in column], dtype=np.float64)
        queries = pd.DataFrame({c: [reference[c]] * len(grid) for c in features})
        queries[name] = grid
        for c, kind in zip(features, kinds):
            if kind == "c":
                queries[c] = queries[c].astype(np.float64)
        if classifier:
            _class_panel(ax, model, queries, grid, x, y[shown], continuous, label)
        else:
            panel = (grid, x, y[shown], continuous, label, curve_label, band)
            _regression_panel(ax, model, queries, *panel)
        if not continuous:
            ax.set_xticks(range(len(grid)), [str(v) for v in grid], rotation=30, ha="right")
        ax.set_xlabel(name)
        ax.set_ylabel(f"probability of each {target}" if classifier else target)
        if d > 1:
            ax.set_title(held_at(reference, kinds, features, name), fontsize="small")
    for ax in list(axes.flat)[d:]:
        ax.set_visible(False)
    what = "class probabilities" if classifier else "partial dependence"
    if d == 1:
        axes.flat[0].set_title(f"{type(model).__name__}: fit to {label}")
        place_legend(axes.flat[0], fontsize="small")
        return fig
    handles, labels = {}, []
    for ax in list(axes.flat)[:d]:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            if text not in handles:
                handles[text] = handle
                labels.append(text)
    fig.suptitle(
        f"{type(model).__name__}: {what} on each feature\n(the others held at their "
        "median or their most frequent category)"
    )
    fig.legend(
        [handles[t] for t in labels],
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 4),
        fontsize="small",
    )
    return fig


def _training_table(model):
    """The model's training rows (keys) as the table it was fitted on: category codes
    turned back into their categories, NaN codes into None."""
    import pandas as pd

    keys = np.asarray(model.X_fit_)
    d = keys.shape[1]
    given = getattr(model, "feature_names_in_", None)
    names = [str(n) for n in given] if given is not None else [f"x{j}" for j in range(d)]
    kinds = kinds_of(model, d)
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


def binned(weights, rows, cols):
    """``weights`` (n_queries, n_keys) on a coarser grid: runs of ``cols`` neighbouring
    keys summed and runs of ``rows`` neighbouring queries averaged (the last runs may be
    shorter), so that each row of the result still sums to what a query's row sums to."""
    w = np.asarray(weights, dtype=np.float64)
    w = np.add.reduceat(w, np.arange(0, w.shape[1], cols), axis=1)
    counts = np.diff(np.append(np.arange(0, w.shape[0], rows), w.shape[0]))
    return np.add.reduceat(w, np.arange(0, w.shape[0], rows), axis=0) / counts[:, None]


def attention_figure(model, X, data_name="data"):
    """Attention weights of the rows of ``X`` (queries) over the training rows (keys).

    With one continuous feature both are sorted by it; otherwise (several
    features, or a categorical one) both are sorted by the model's
    prediction, so that rows which pool alike sit together. Beyond
    :data:`MAX_CELLS` keys (queries), neighbouring keys are summed (queries
    averaged) in runs of equal length (:func:`binned`): a cell is then the weight a
    query gives a run of keys, and one key's weight does not vanish in a pixel."""
    from matplotlib.ticker import MaxNLocator

    features = list(X.columns)
    keys = getattr(model, "X_fit_", None)
    by_feature = len(features) == 1 and kinds_of(model, 1) == "c"
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
    n_queries, n_keys = weights.shape
    rows, cols = -(-n_queries // MAX_CELLS), -(-n_keys // MAX_CELLS)
    xlabel = f"training rows (keys), {how}"
    ylabel = f"rows of {data_name} (queries), {how}"
    scale = ["weight"]  # the colour bar's label, a line a part: it runs along the bar
    if cols > 1:
        xlabel = f"training rows (keys), {how}, in runs of {cols}"
        scale = [f"weight on a run of {cols} keys"]
    if rows > 1:
        ylabel = f"rows of {data_name}, {how}, in runs of {rows}"
        scale.append(f"mean over {rows} queries")
    weights = binned(weights, rows, cols)
    _, ax = pyplot().subplots(figsize=(6.5, 4.5), layout="constrained")
    signed = weights.size and weights.min() < 0
    if not signed:
        scale.append("(square-root colour scale)")
    plot_heatmap(
        weights,
        xlabel,
        ylabel,
        ax=ax,
        title="attention weights",
        scale_label="\n".join(scale),
        gamma=0.5,
    )
    # a cell spans its run of rows on the axes (the last run, if shorter, is cut at the end)
    ax.images[0].set_extent(
        (-0.5, weights.shape[1] * cols - 0.5, weights.shape[0] * rows - 0.5, -0.5)
    )
    ax.set_xlim(-0.5, n_keys - 0.5)
    ax.set_ylim(n_queries - 0.5, -0.5)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    return ax.figure


def loo_curve(X, y, base, scales, progress=None, var_type=None, n_categories=None):
    """Leave-one-out MSE of Nadaraya-Watson at the widths ``base * s`` for s in ``scales``
    (with ``var_type``, only the continuous columns' widths are scaled).

    ``L(h) = mean_i (f_{-i}(x_i) - y_i)^2``, ``f_{-i}`` the prediction at x_i
    without the pair (i, i): on continuous columns
    :func:`nbattn.smoothing.loo.loo_loss`; with categorical ones (``var_type`` with
    "u" or "o", X holding category codes, ``n_categories`` per column) the mixed-type
    engine's :func:`nbattn.local.engine.local_loo_loss` of degree 0 (the criterion of
    ``bandwidth="loo_scale"``). ``progress`` is called once per width.
    """
    from ..local.engine import local_loo_loss
    from ..smoothing.loo import loo_loss

    mixed = var_type is not None and set(var_type) != {"c"}
    cont = np.array([k == "c" for k in var_type]) if mixed else None
    missing = "marginalize" if mixed and np.isnan(X).any() else "error"
    losses = np.empty(len(scales))
    for i, s in enumerate(scales):
        if mixed:
            widths = np.where(cont, base * s, base)
            losses[i] = local_loo_loss(
                X, y, widths, 0, var_type=var_type, n_categories=n_categories, missing=missing
            )
        else:
            losses[i] = loo_loss(X, y, base * s)
        if progress is not None:
            progress()
    return losses


def _mixed_loo_setup(X, y, var_type, verbose=0):
    """(codes, Scott's widths, the 'loo_scale' factor, category counts) of a table with
    categorical columns, through NadarayaWatsonRegressor's own encoding and search (its
    progress: ``verbose``)."""
    from ..estimators import NadarayaWatsonRegressor

    if "c" not in var_type:
        raise ValueError(
            "plot loo draws the criterion against a common factor of the continuous "
            "columns' widths; the features hold no continuous column"
        )
    missing = "marginalize" if X.isna().to_numpy().any() else "error"
    options = {"var_type": var_type, "missing": missing}
    scott = NadarayaWatsonRegressor(bandwidth="scott", **options).fit(X, y)
    chosen = NadarayaWatsonRegressor(bandwidth="loo_scale", verbose=verbose, **options).fit(X, y)
    cont = np.array([k == "c" for k in var_type])
    base = np.asarray(scott.bandwidth_, dtype=np.float64)
    factor = float(chosen.bandwidth_[cont][0] / base[cont][0])
    counts = [len(c) if c is not None else 0 for c in chosen.categories_]
    return np.asarray(chosen.X_fit_, dtype=np.float64), base, factor, counts


def loo_figure(X, y, points=30, progress=None, var_type=None, verbose=0):
    """Leave-one-out MSE against the width, in units of Scott's rule, over ``points``
    scales from 10^-1.5 to 10, with Scott's rule, the grid minimum and the width
    ``bandwidth="loo_scale"`` chooses marked.

    On continuous columns the criterion is :func:`nbattn.smoothing.loo.loo_loss` and the
    factor :func:`nbattn.smoothing.width_search.loo_bandwidth`'s. With categorical columns
    (``X`` a DataFrame, ``var_type`` one letter of "cuo" per column) the continuous
    columns' widths are scaled together and the categorical ones' lambda held at the
    rule's: the criterion and the factor of ``NadarayaWatsonRegressor(bandwidth=
    "loo_scale")`` on the mixed-type engine (:func:`loo_curve`). ``progress`` is called
    once per width of the curve; ``verbose`` is the progress of the search for the
    marked width (:class:`nbattn._core.progress.FitProgress`)."""
    if len(y) < 2:
        raise ValueError("the leave-one-out loss needs at least 2 rows")
    scales = np.logspace(-1.5, 1.0, points)
    if var_type is not None and set(var_type) != {"c"}:
        codes, base, factor, counts = _mixed_loo_setup(X, y, var_type, verbose)
        losses = loo_curve(codes, y, base, scales, progress, var_type, counts)
        held = " (categorical λ held at the rule's)"
    else:
        from ..smoothing.regression import bandwidth_rule
        from ..smoothing.width_search import loo_bandwidth

        X = np.asarray(X, dtype=np.float64)
        scott = bandwidth_rule(X, "scott")
        losses = loo_curve(X, y, scott, scales, progress)
        factor = float(np.asarray(loo_bandwidth(X, y, verbose=verbose))[0] / scott[0])
        held = ""
    title = "leave-one-out MSE, continuous widths scaled together"
    marks = {f"bandwidth='loo_scale': {factor:.3g} x Scott": factor, "Scott's rule": 1.0}
    ax = plot_loss_curve(
        scales, losses, marks, title=title, xlabel="bandwidth / Scott's rule" + held, legend=False
    )
    best = int(np.argmin(losses))
    ax.scatter(
        [scales[best]],
        [losses[best]],
        color="tab:red",
        zorder=3,
        label=f"grid minimum: {scales[best]:.3g} x Scott",
    )
    place_legend(ax, fontsize="small")
    return ax.figure


def relative_widths(model):
    """Each width relative to its feature (:func:`nbattn.estimators.summary.scaled_widths`:
    h / sd, lambda / lambda_max), one per column of
    :func:`nbattn.app.batch.smoothed_columns`; a constant column's is h itself, a
    one-category column's 1."""
    from ..estimators.summary import scaled_widths

    if (kind := model._bandwidth_type()) != "fixed":
        raise ValueError(f"the widths figure draws fixed widths, not bandwidth_type={kind!r}")
    widths, keys = _model_widths(model), np.asarray(model.X_fit_)
    columns = smoothed_columns(model)
    kinds = "".join(kinds_of(model, keys.shape[1])[j] for j in columns)
    out = scaled_widths(widths, kinds, _smoothed_counts(model), keys[:, columns])
    return np.where(np.isnan(out), np.where([k == "c" for k in kinds], widths, 1.0), out)


def _model_widths(model):
    widths = np.asarray(model.bandwidth_, dtype=np.float64).reshape(-1)
    d = len(smoothed_columns(model))
    return np.full(d, widths[0]) if widths.size == 1 and d > 1 else widths


def _smoothed_counts(model) -> list:
    """The categories of each column of :func:`nbattn.app.batch.smoothed_columns` (0 for a
    continuous one)."""
    d = np.asarray(model.X_fit_).shape[1]
    counts = n_categories(getattr(model, "categories_", None) or [None] * d)
    return [counts[j] for j in smoothed_columns(model)]


def _plain_log_x(ax):
    """A log x axis labelled by plain numbers at 1, 2 and 5 times powers of 10."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    axis = ax.xaxis
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _continuous_widths(ax, names, widths, ratios):
    """h / sd per continuous column on a log axis: a stem from 1 (one sd) to the ratio."""
    at = np.arange(len(names))
    ax.hlines(at, 1.0, ratios, color="tab:blue", lw=2)
    ax.plot(ratios, at, "o", color="tab:blue")
    ax.axvline(1.0, color="gray", ls="--", lw=0.8)
    _plain_log_x(ax)
    low, high = min(ratios.min(), 1.0), max(ratios.max(), 1.0)
    ax.set_xlim(low / 2.5, high * 2.5)
    ax.set_yticks(at, [f"{n}  (h = {h:.3g})" for n, h in zip(names, widths)])
    ax.set_ylim(len(names) - 0.4, -0.6)
    ax.set_xlabel("h / standard deviation of the feature (log scale)")


def _categorical_widths(ax, names, lambdas, tops):
    """lambda / lambda_max per categorical column on [0, 1]: 0 pools only rows of the same
    category, 1 ignores the column."""
    at = np.arange(len(names))
    ax.barh(at, lambdas / tops, height=0.5, color="tab:orange")
    ax.set_xlim(0.0, 1.12)
    ax.set_yticks(at, [f"{n}  (λ = {v:.3g} of {t:.3g})" for n, v, t in zip(names, lambdas, tops)])
    ax.set_ylim(len(names) - 0.4, -0.6)
    ax.set_xlabel("λ / λ_max   (0: same category only, 1: column ignored)")


def widths_figure(model, features):
    """The kernel widths per feature relative to the feature (:func:`relative_widths`):
    the continuous columns' h / sd on a log axis, the categorical columns' lambda /
    lambda_max on [0, 1] in a second panel; or the learned metric ``components_`` as an
    image."""
    plt = pyplot()
    name = type(model).__name__
    if getattr(model, "bandwidth_", None) is not None:
        widths, ratios = _model_widths(model), relative_widths(model)
        smoothed = smoothed_columns(model)  # a partially linear model's z columns only
        kinds = [kinds_of(model, len(features))[j] for j in smoothed]
        features = [features[j] for j in smoothed]
        cont = [j for j, k in enumerate(kinds) if k == "c"]
        cat = [j for j, k in enumerate(kinds) if k != "c"]
        panels = [p for p in (cont, cat) if p]
        height = 0.35 * max(len(p) for p in panels) + 2.0
        fig, axes = plt.subplots(
            1,
            len(panels),
            figsize=(5.5 * len(panels) + 1.0, height),
            squeeze=False,
            layout="constrained",
        )
        for ax, panel in zip(axes.flat, panels):
            names = [str(features[j]) for j in panel]
            if panel is cont:
                _continuous_widths(ax, names, widths[panel], ratios[panel])
                ax.set_title("continuous columns" if cat else f"{name}: widths")
            else:
                tops = lambda_max("".join(kinds), _smoothed_counts(model))[panel]
                _categorical_widths(ax, names, widths[panel], tops)
                ax.set_title("categorical columns" if cont else f"{name}: widths")
        if cont and cat:
            fig.suptitle(f"{name}: widths relative to each feature")
    elif getattr(model, "components_", None) is not None:
        L = np.asarray(model.components_, dtype=np.float64)
        fig, ax = plt.subplots(
            figsize=(max(4.5, 0.5 * len(features) + 2.5), 4), layout="constrained"
        )
        limit = float(np.abs(L).max()) or 1.0
        image = ax.imshow(L, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(len(features)), features, rotation=45, ha="right")
        ax.set_yticks(range(L.shape[0]), [str(i + 1) for i in range(L.shape[0])])
        ax.set_xlabel("features")
        ax.set_ylabel("rows of L")
        ax.set_title("learned metric L")
    else:
        raise ValueError(f"{name} has no widths (bandwidth_ or components_)")
    return fig
