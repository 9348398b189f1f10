"""Where a legend goes: the first spot inside its axes that hides no data point or line
(:func:`place_legend`), else beside the axes. Used by :mod:`nbattn.app.plotting`."""

from __future__ import annotations

import numpy as np

__all__ = ["data_points", "lay_out", "place_legend"]


def lay_out(fig) -> None:
    """Lay the figure out as it will be saved: its layout engine, or tight_layout."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.draw_without_rendering()


def _sampled(xy, step=2.0):
    """Points along a polyline in display coordinates, at most ``step`` pixels apart."""
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) < 2:
        return xy
    parts = [xy[:1]]
    for a, b in zip(xy[:-1], xy[1:]):
        n = int(np.hypot(*(b - a)) // step) + 1
        parts.append(a + (b - a) * (np.arange(1, n + 1) / n)[:, None])
    return np.vstack(parts)


def data_points(ax) -> np.ndarray:
    """(n, 2) display coordinates of what ``ax`` draws as data and that a legend must not
    hide: scatter points, and lines (plot, axvline, error bars) every 2 pixels; only
    those inside the axes."""
    from matplotlib.collections import LineCollection, PathCollection

    parts = [np.empty((0, 2))]
    for line in ax.lines:
        if line.get_visible():
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
            solid = line.get_linestyle() not in ("None", "", " ")
            parts.append(_sampled(xy) if solid else xy)
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):
            parts.append(coll.get_offset_transform().transform(coll.get_offsets()))
        elif isinstance(coll, LineCollection):
            to_display = coll.get_transform()
            for segment in coll.get_segments():
                parts.append(_sampled(to_display.transform(np.asarray(segment, dtype=float))))
    xy = np.vstack(parts)
    xy = xy[np.isfinite(xy).all(axis=1)]
    box = ax.bbox
    inside = (
        (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    )
    return xy[inside]


#: where a legend may go inside its axes, in order of preference
_SPOTS = (
    "upper right",
    "upper left",
    "lower left",
    "lower right",
    "upper center",
    "lower center",
    "center right",
    "center left",
)


def _covers(legend, points) -> bool:
    box = legend.get_window_extent().padded(2)
    return bool(
        (
            (points[:, 0] >= box.x0)
            & (points[:, 0] <= box.x1)
            & (points[:, 1] >= box.y0)
            & (points[:, 1] <= box.y1)
        ).any()
    )


def place_legend(ax, **options):
    """A legend of ``ax`` in the first corner (else the middle of a side) where it hides
    no data point or line (:func:`data_points`), else beside the axes, on the right;
    ``options`` go to ``ax.legend``."""
    fig = ax.figure
    lay_out(fig)
    points = data_points(ax)
    for spot in _SPOTS:
        legend = ax.legend(loc=spot, **options)
        fig.draw_without_rendering()
        if not _covers(legend, points):
            return legend
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **options)
