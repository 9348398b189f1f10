"""matplotlib figures: the seed's fit curves and attention heatmaps."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# The seed's colours: green average pooling, black attention pooling, then others.
_CURVE_COLORS = ["tab:green", "black", "tab:orange", "tab:purple", "tab:brown", "tab:cyan"]


def plot_fit(x_train, y_train, x_test, y_true, curves=None, ax=None, title=None):
    """Training points, the true function, and fitted curves {label: y_pred on x_test}."""
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(x_train, y_train, color="tab:red", s=14, label="train_data")
    ax.plot(x_test, y_true, color="tab:blue", label="true function")
    for (label, y_pred), color in zip((curves or {}).items(), _CURVE_COLORS * 4):
        ax.plot(x_test, y_pred, label=label, color=color)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)
    ax.legend(loc="best")
    return ax


def plot_heatmap(weights, xlabel="keys", ylabel="queries", ax=None, title=None):
    """One attention map (n_queries, n_keys) as an image with a colour bar."""
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    image = ax.imshow(np.asarray(weights), cmap="Reds", aspect="auto")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.figure.colorbar(image, ax=ax)
    return ax


def save(ax, path) -> Path:
    """Save the figure holding ``ax`` and close it."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=100)
    plt.close(ax.figure)
    return path


def plot_loss_curve(bandwidths, losses, marks=None, ax=None, title=None):
    """A loss against the kernel width on a log axis; ``marks`` = {label: width} as lines."""
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ax.plot(bandwidths, losses, color="tab:blue", label="leave-one-out MSE")
    for (label, width), color in zip((marks or {}).items(), ["tab:red", "tab:green", "tab:gray"]):
        ax.axvline(width, color=color, linestyle="--", label=f"{label} ({width:.3g})")
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth h")
    ax.set_ylabel("LOO MSE")
    if title:
        ax.set_title(title)
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
    plt = _pyplot()
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
