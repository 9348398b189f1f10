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
