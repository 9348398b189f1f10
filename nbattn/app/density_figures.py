"""The figures of the densities (``nbattn plot density``): a kernel density's curve or
joint contours, and the fan chart and conditional density of y along one feature.

Every curve is the model's own public method on a grid, one call for all of a panel's
curves: ``pdf`` (``KernelDensity``, ``ConditionalKernelDensity``), ``predict_quantile``
(both conditional models), or, for a kernel density of more columns than are drawn, the
marginal density of the drawn ones: a product kernel's marginal is the kernel density of
those columns with the same widths (:func:`nbattn.distribution.density.kernel_density`
on the model's keys and weights). The conditional figures hold the other features at the
reference row of :func:`nbattn.app.plotting.reference_row` and say so in the title.
"""

from __future__ import annotations

import numpy as np

from .legends import place_legend
from .names import check_columns, column_option
from .plotting import (
    CLASS_COLORS,
    MAX_POINTS,
    class_shares,
    held_at,
    kinds_of,
    pyplot,
    reference_row,
)

__all__ = ["QUANTILE_LEVELS", "density_figure"]

#: the levels of a fan chart: bands between the symmetric pairs, the median a line
QUANTILE_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)

#: points of a curve's grid; cells of a 2-D grid a side
CURVE_POINTS, MAP_POINTS = 400, 150

_BAND_ALPHA = {0.1: 0.15, 0.25: 0.3}


def density_figure(model, X, y=None, features=None):
    """The figure of a fitted density model over the data ``X`` (and ``y``).

    - :class:`nbattn.KernelDensity`, one column (``features=[name]`` or a model of one
      column): the density over the data's range widened by 3 widths, over a
      translucent histogram of the data on the density scale and a rug; a categorical
      column: the estimated probability of each category beside its share of the data.
    - :class:`nbattn.KernelDensity`, two continuous columns: filled contours of their
      joint density, the data as points on top. A model of more columns draws the
      marginal density of the chosen ones (the others integrated out, not held).
    - :class:`nbattn.ConditionalKernelDensity` and :class:`nbattn.KernelQuantileRegressor`,
      one feature: a fan chart, the quantiles 0.1, 0.25, 0.5, 0.75, 0.9 of y along the
      feature (bands between the symmetric pairs, the median a line; per category for a
      categorical feature) with the other features at their median or most frequent
      category, over the data; ``ConditionalKernelDensity`` adds a panel with the
      heatmap of f(y | x) over (feature, y). A categorical y has no quantiles: a
      ``ConditionalKernelDensity``'s panel is the probability of each class along the
      feature (a ``KernelQuantileRegressor`` refuses one at fit).

    An ordered column's masses (the Wang-van Ryzin kernel) do not sum to 1 over its
    categories: its bars and class probabilities are drawn rescaled to, and say so.

    Parameters
    ----------
    model : fitted KernelDensity, ConditionalKernelDensity or KernelQuantileRegressor
    X : DataFrame or array (n, d), the model's features (a DataFrame: by name)
    y : array-like (n,), the response; required for the conditional models (ignored
        for a kernel density)
    features : list of str, optional
        The columns drawn: one or two for a kernel density (default: all its columns,
        when at most two), one for a conditional model (default: its only feature).

    Returns
    -------
    matplotlib Figure
    """
    if getattr(model, "bandwidth_", None) is None or getattr(model, "var_type_", None) is None:
        raise ValueError(f"{type(model).__name__} is not fitted: call fit first")
    conditional = hasattr(model, "y_type_")
    if not conditional and not hasattr(model, "score_samples"):
        raise ValueError(
            f"density_figure draws KernelDensity, ConditionalKernelDensity and "
            f"KernelQuantileRegressor, not {type(model).__name__}"
        )
    frame = _frame(model, X)
    chosen = _chosen(model, list(frame.columns), features, conditional)
    shown = frame
    if len(frame) > MAX_POINTS:
        shown = frame.iloc[np.random.default_rng(0).choice(len(frame), MAX_POINTS, replace=False)]
    if not conditional:
        return _density_figure(model, frame, shown, chosen)
    if y is None:
        raise ValueError(f"y is required: {type(model).__name__} is the distribution of y given X")
    y = _response(y, len(frame))
    return _conditional_figure(model, frame, y, chosen[0])


# ----------------------------------------------------------------------------- the inputs


def _frame(model, X):
    """X as a DataFrame with the model's column names, in its order."""
    import pandas as pd

    given = getattr(model, "feature_names_in_", None)
    d = len(model.var_type_)
    if isinstance(X, pd.DataFrame):
        if given is not None:
            check_columns("X", list(X.columns), [str(n) for n in given])
            return X[list(given)]
        if X.shape[1] != d:
            raise ValueError(f"X has {X.shape[1]} columns but the model has {d}")
        return X.set_axis([f"x{j}" for j in range(d)], axis=1)
    arr = np.asarray(X)
    arr = arr.reshape(-1, 1) if arr.ndim == 1 else arr
    if arr.ndim != 2 or arr.shape[1] != d:
        raise ValueError(f"X must have the model's {d} columns; got shape {arr.shape}")
    names = [str(n) for n in given] if given is not None else [f"x{j}" for j in range(d)]
    return pd.DataFrame(arr, columns=names)


def _chosen(model, names, features, conditional) -> list:
    """The names of the columns drawn, checked."""
    kind = type(model).__name__
    if features is None:
        if conditional and len(names) > 1:
            raise ValueError(
                f"features: name the one feature to draw y along ({kind} has "
                f"{len(names)}: {', '.join(column_option(n) for n in names)})"
            )
        if not conditional and len(names) > 2:
            raise ValueError(
                f"features: name one or two of the {len(names)} columns of the "
                f"{kind} (their marginal density is drawn)"
            )
        return names
    features = [features] if isinstance(features, str) else list(features)
    check_columns("features", names, features, what="feature")
    if len(set(features)) != len(features):
        raise ValueError(f"features names a column twice: {features}")
    if conditional and len(features) != 1:
        raise ValueError(
            f"features: a conditional model is drawn along one feature; got {features}"
        )
    if not conditional and len(features) > 2:
        raise ValueError(f"features: a density is drawn on one or two columns; got {len(features)}")
    return features


def _response(y, n):
    import pandas as pd

    if isinstance(y, pd.DataFrame):
        if y.shape[1] != 1:
            raise ValueError(f"y must be one column; got {y.shape[1]}")
        y = y.iloc[:, 0]
    y = y if isinstance(y, pd.Series) else pd.Series(np.asarray(y).reshape(-1), name="y")
    if len(y) != n:
        raise ValueError(f"X has {n} rows but y has {len(y)}")
    return y.reset_index(drop=True)


def _queries(model, table):
    """Rows for the model's methods: the table, or its values for a model fitted on an array."""
    return table if getattr(model, "feature_names_in_", None) is not None else table.to_numpy()


def _categories(model, j) -> list:
    return list((getattr(model, "categories_", None) or [None] * (j + 1))[j] or [])


# ----------------------------------------------------------------------------- kernel density


def _density_at(model, idx, columns):
    """The density of the model's columns ``idx`` at the rows ``columns`` (one array of
    values per column): the model's ``pdf`` when they are all its columns, else their
    marginal density, the kernel density of those columns with the same widths."""
    import pandas as pd

    if len(idx) == len(model.var_type_):
        names = [f"x{j}" for j in idx]
        given = getattr(model, "feature_names_in_", None)
        names = names if given is None else [str(given[j]) for j in idx]
        return np.asarray(model.pdf(_queries(model, pd.DataFrame(dict(zip(names, columns))))))
    from ..distribution.density import kernel_density

    codes = []
    for j, values in zip(idx, columns):
        if model.var_type_[j] == "c":
            codes.append(np.asarray(values, dtype=np.float64))
        else:
            position = {v: k for k, v in enumerate(_categories(model, j))}
            codes.append(np.array([position[v] for v in values], dtype=np.float64))
    return kernel_density(
        np.column_stack(codes),
        np.asarray(model.X_fit_)[:, idx],
        np.asarray(model.bandwidth_, dtype=np.float64)[idx],
        var_type="".join(model.var_type_[j] for j in idx),
        n_categories=[len(_categories(model, j)) or 1 for j in idx],
        kernel=model.kernel,
        sample_weight=model.sample_weight_,
        rtol=model.rtol,
        device=model.device,
    )


def _density_figure(model, frame, shown, chosen):
    names = list(frame.columns)
    idx = [names.index(c) for c in chosen]
    kinds = [model.var_type_[j] for j in idx]
    if len(idx) == 2 and kinds != ["c", "c"]:
        categorical = [column_option(c) for c, k in zip(chosen, kinds) if k != "c"]
        verb = "is" if len(categorical) == 1 else "are"
        raise ValueError(
            f"features: the joint figure needs two continuous columns; "
            f"{', '.join(categorical)} {verb} categorical (draw each alone)"
        )
    widths = np.asarray(model.bandwidth_, dtype=np.float64)[idx]
    grids = [_widened(frame[c], h) for c, h, k in zip(chosen, widths, kinds) if k == "c"]
    marginal = len(idx) < len(names)
    if len(idx) == 2:
        fig, ax = pyplot().subplots(figsize=(6.4, 5.0), layout="constrained")
        _joint_panel(ax, model, idx, grids, shown[chosen])
        title = f"{type(model).__name__}: joint density of {chosen[0]} and {chosen[1]}"
        title += ",\nthe other columns integrated out" if marginal else ""
        ax.set_title(f"{title}\n(h = {widths[0]:.3g}, {widths[1]:.3g}; points: the data)")
        return fig
    fig, ax = pyplot().subplots(figsize=(6.4, 4.2), layout="constrained")
    data = shown[chosen[0]]
    if kinds[0] == "c":
        _curve_panel(ax, model, idx, grids[0], data.to_numpy(dtype=np.float64), widths[0])
        what = "density"
    else:
        _bars_panel(ax, model, idx, data.to_numpy(), widths[0])
        what = "probabilities"
    ax.set_xlabel(chosen[0])
    title = f"{type(model).__name__}: {'marginal ' if marginal else ''}{what} of {chosen[0]}"
    ax.set_title(title + ("\n(the other columns integrated out)" if marginal else ""))
    place_legend(ax, fontsize="small")
    return fig


def _joint_panel(ax, model, idx, grids, shown):
    """Filled contours of the density of two continuous columns (thin lines on their
    levels) over a grid of :data:`MAP_POINTS` a side, the data as points on top."""
    gx, gy = (g[:: CURVE_POINTS // MAP_POINTS] for g in grids)
    mx, my = np.meshgrid(gx, gy)
    surface = _density_at(model, idx, [mx.ravel(), my.ravel()]).reshape(mx.shape)
    filled = ax.contourf(gx, gy, surface, levels=12, cmap="Blues")
    ax.contour(gx, gy, surface, levels=filled.levels[1:], colors="tab:blue", linewidths=0.5)
    ax.scatter(shown.iloc[:, 0], shown.iloc[:, 1], s=5, color="black", alpha=0.6)
    ax.figure.colorbar(filled, ax=ax, label="density")
    ax.set_xlabel(shown.columns[0])
    ax.set_ylabel(shown.columns[1])


def _curve_panel(ax, model, idx, grid, values, width):
    """The density along ``grid`` over a histogram of the data on the density scale and
    a rug."""
    values = values[np.isfinite(values)]
    edges = np.histogram_bin_edges(values, bins=int(np.clip(np.sqrt(values.size), 5, 40)))
    ax.hist(values, bins=edges, density=True, color="tab:blue", alpha=0.3, label="data (histogram)")
    ax.plot(values, np.zeros_like(values), "|", color="black", ms=8, alpha=0.5, label="data (rug)")
    curve = _density_at(model, idx, [grid])
    ax.plot(grid, curve, color="black", lw=1.8, label=f"kernel density, h = {width:.3g}")
    ax.set_xlim(grid[0], grid[-1])
    ax.set_ylim(bottom=-0.04 * curve.max(), top=1.3 * max(curve.max(), ax.get_ylim()[1]))
    ax.set_ylabel("density")


def _bars_panel(ax, model, idx, values, width):
    """Each category's estimated probability beside its share of the data."""
    categories = _categories(model, idx[0])
    proba = _density_at(model, idx, [categories])
    shares = np.array([np.mean(values == c) for c in categories])
    label = f"estimated, λ = {width:.3g}"
    total = float(proba.sum())
    if abs(total - 1.0) > 1e-9:
        # the ordered (Wang-van Ryzin) kernel's masses do not sum to 1 over the categories
        proba = proba / total
        label += f"\n(masses summing to {total:.3g}, rescaled)"
    at = np.arange(len(categories))
    ax.bar(at - 0.2, proba, width=0.4, color="tab:blue", label=label)
    ax.bar(at + 0.2, shares, width=0.4, color="tab:gray", label="share of the data")
    ax.set_xticks(at, [str(c) for c in categories], **_tick_style(categories))
    ax.set_ylim(0.0, 1.3 * max(proba.max(), shares.max()))
    ax.set_ylabel("probability")


def _widened(column, width):
    """A grid over a column's range widened by 3 widths on each side."""
    values = column.to_numpy(dtype=np.float64)
    low, high = np.nanmin(values) - 3.0 * width, np.nanmax(values) + 3.0 * width
    return np.linspace(low, high, CURVE_POINTS)


# ----------------------------------------------------------------------------- conditional


def _slice(model, frame, feature, grid):
    """Query rows along ``grid`` of ``feature`` with the other features at the reference
    row, and the reference row."""
    import pandas as pd

    names = list(frame.columns)
    kinds = kinds_of(model, len(names))
    reference = reference_row(frame, kinds)
    rows = pd.DataFrame({c: [reference[c]] * len(grid) for c in names})
    rows[feature] = list(grid)
    for c, kind in zip(names, kinds):
        if kind == "c":
            rows[c] = rows[c].astype(np.float64)
    return rows, reference


def _conditional_figure(model, frame, y, feature):
    names = list(frame.columns)
    kinds = kinds_of(model, len(names))
    j = names.index(feature)
    continuous = kinds[j] == "c"
    target = str(y.name) if y.name is not None else "y"
    if continuous:
        values = frame[feature].to_numpy(dtype=np.float64)
        grid = np.linspace(np.nanmin(values), np.nanmax(values), CURVE_POINTS // 2)
        x = values
    else:
        grid = _categories(model, j)
        position = {v: k for k, v in enumerate(grid)}
        x = np.array([position.get(v, np.nan) for v in frame[feature]], dtype=np.float64)
    rows, reference = _slice(model, frame, feature, grid)
    at = grid if continuous else np.arange(len(grid), dtype=np.float64)
    shown = np.arange(len(y))
    if len(y) > MAX_POINTS:
        shown = np.random.default_rng(0).choice(len(y), MAX_POINTS, replace=False)
    x = x[shown]
    jitter = 0.0 if continuous else np.random.default_rng(1).uniform(-0.25, 0.25, x.size)
    numeric = model.y_type_ == "c"
    panels = 2 if numeric and hasattr(model, "pdf") else 1
    fig, axes = pyplot().subplots(
        1, panels, figsize=(5.6 * panels + 0.6, 4.8), squeeze=False, layout="constrained"
    )
    ax = axes[0, 0]
    if numeric:
        response = y.to_numpy(dtype=np.float64)[shown]
        _fan(ax, model, rows, at, continuous)
        ax.scatter(x + jitter, response, s=7, color="tab:red", alpha=0.5, label="data", zorder=1)
        ax.set_ylabel(target)
        levels = ", ".join(f"{level:g}" for level in QUANTILE_LEVELS)
        ax.set_title(f"quantiles {levels} of {target}", fontsize="medium")
    else:
        _class_curves(ax, model, rows, at, x, y.to_numpy()[shown], continuous)
        ax.set_ylabel(f"probability of each {target}")
    if panels == 2:
        _conditional_map(axes[0, 1], model, rows, at, x + jitter, response)
        axes[0, 1].set_ylabel(target)
        axes[0, 1].set_ylim(ax.get_ylim())
        axes[0, 1].set_title(f"conditional density f({target} | {feature})", fontsize="medium")
    for panel in axes.flat:
        panel.set_xlabel(feature)
        if not continuous:
            panel.set_xticks(at, [str(v) for v in grid], **_tick_style(grid))
    title = f"{type(model).__name__}: the distribution of {target} along {feature}"
    if len(names) > 1:
        title += "\n" + held_at(reference, kinds, names, feature, width=80)
    fig.suptitle(title)
    handles, labels = ax.get_legend_handles_labels()
    columns = len(labels) if panels == 2 else -(-len(labels) // 2)
    fig.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize="small")
    return fig


def _tick_style(categories) -> dict:
    """Category tick labels slanted when they would crowd."""
    long = sum(len(str(c)) for c in categories) > 40
    return {"rotation": 30, "ha": "right"} if long else {}


def _fan(ax, model, rows, at, continuous):
    """The quantiles of y along ``at`` (one call of ``predict_quantile``): lines (a
    continuous feature) or marks per category, bands between the symmetric levels."""
    levels = np.array(QUANTILE_LEVELS)
    quantiles = np.asarray(model.predict_quantile(_queries(model, rows), levels))
    for k in range(len(levels) // 2):
        low, high = levels[k], levels[-1 - k]
        label = f"quantiles {low:g} to {high:g}"
        alpha = _BAND_ALPHA.get(float(low), 0.2)
        if continuous:
            ax.fill_between(
                at,
                quantiles[:, k],
                quantiles[:, -1 - k],
                color="tab:blue",
                alpha=alpha,
                lw=0,
                label=label,
            )
        else:
            ax.vlines(
                at,
                quantiles[:, k],
                quantiles[:, -1 - k],
                color="tab:blue",
                alpha=2 * alpha,
                lw=6 + 8 * k,
                label=label,
            )
    for k, level in enumerate(levels):
        median = np.isclose(level, 0.5)
        style = dict(color="tab:blue", gid=f"quantile {level:g}")
        if continuous:
            ax.plot(
                at,
                quantiles[:, k],
                lw=2.0 if median else 0.6,
                label="median" if median else None,
                **style,
            )
        else:
            ax.plot(
                at,
                quantiles[:, k],
                "o" if median else "_",
                ms=8 if median else 14,
                ls="none",
                label="median" if median else None,
                **style,
            )


def _conditional_map(ax, model, rows, at, x, y):
    """f(y | x) over (the feature's grid x a grid of y), one ``pdf`` call, the data on top."""
    import pandas as pd

    h = float(model.y_bandwidth_)
    y_grid = np.linspace(np.nanmin(y) - 2 * h, np.nanmax(y) + 2 * h, MAP_POINTS)
    step = max(1, len(rows) // MAP_POINTS)
    rows, at = rows.iloc[::step], np.asarray(at)[::step]
    queries = pd.DataFrame({c: np.tile(rows[c].to_numpy(), y_grid.size) for c in rows.columns})
    values = np.repeat(y_grid, len(rows))
    surface = np.asarray(model.pdf(_queries(model, queries), values)).reshape(
        y_grid.size, len(rows)
    )
    mesh = ax.pcolormesh(at, y_grid, surface, shading="nearest", cmap="Blues")
    mesh.set_gid("f(y | x)")
    ax.scatter(x, y, s=5, color="tab:red", alpha=0.6)
    ax.figure.colorbar(mesh, ax=ax, label="conditional density")


def _class_curves(ax, model, rows, at, x, y, continuous):
    """P(y = c | x) of each class along ``at``, one ``pdf`` call per class (a categorical
    y's density is its probability; an ordered y's masses, which do not sum to 1 under
    the Wang-van Ryzin kernel, rescaled to), and each class's share of the data (open
    markers: per bin of x, or per category: :func:`nbattn.app.plotting.class_shares`)."""
    import pandas as pd

    queries = _queries(model, rows)
    classes = list(model.y_categories_)
    proba = np.column_stack(
        [np.asarray(model.pdf(queries, pd.Series([c] * len(rows), dtype=object))) for c in classes]
    )
    total = proba.sum(axis=1, keepdims=True)
    rescaled = bool(np.any(np.abs(total - 1.0) > 1e-9))
    proba = proba / total if rescaled else proba
    positions, shares = class_shares(x, y, classes, continuous)
    offsets = np.zeros(len(classes)) if continuous else np.linspace(-0.2, 0.2, len(classes))
    for k, cls in enumerate(classes):
        style = {"color": CLASS_COLORS[k % len(CLASS_COLORS)], "gid": f"P({cls})"}
        if continuous:
            ax.plot(at, proba[:, k], label=f"P({cls})", **style)
        else:
            where = np.asarray(at) + offsets[k]
            ax.plot(where, proba[:, k], "o", ls="none", label=f"P({cls})", **style)
        ax.plot(positions + offsets[k], shares[:, k], "D", mfc="none", ms=5, color=style["color"])
    ax.plot([], [], "D", mfc="none", color="gray", ms=5, label="share of each class in the data")
    ax.set_ylim(-0.06, 1.06)
    if rescaled:
        ax.set_title("the ordered kernel's masses rescaled to sum to 1", fontsize="medium")
