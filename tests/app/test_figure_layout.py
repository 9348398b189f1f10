"""Every figure of ``nbattn plot`` and of the demo, checked as a reader would look at it,
but from matplotlib's renderer extents: no text outside the canvas, no two texts over
each other, no text over another panel, a legend over no data point or line, no "0" on a
log axis, bar colours named, a title, legend entries that say each number once, and a
heatmap that is not nearly all white."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.patches import Rectangle

from nbattn.app import cli
from nbattn.app.plotting import pyplot
from nbattn.app.seed import run_seed

plt = pyplot()  # on the Agg backend

# ----------------------------------------------------------------------------- the figures


def _data(folder):
    rng = np.random.default_rng(7)
    n = 160
    x = rng.uniform(0, 6, n)
    frame = pd.DataFrame({f"x{j}": rng.normal(size=n) for j in range(2, 8)})
    frame.insert(0, "x1", x)
    frame["x5"] *= 1000.0
    colour = rng.choice(["red", "green", "blue"], n)
    y = 2 * np.sin(x) + x**0.8 + 0.5 * (colour == "red") + rng.normal(0, 0.5, n)
    frame["y"] = y
    frame.to_csv(folder / "many.csv", index=False)
    frame.head(30).to_csv(folder / "small.csv", index=False)
    mixed = pd.DataFrame({"x1": x, "x2": frame["x2"], "colour": colour, "y": y})
    mixed.to_csv(folder / "mixed.csv", index=False)
    label = np.where(y > 2.5, "high", np.where(y > 1.0, "mid", "low"))
    mixed.drop(columns="y").assign(label=label).to_csv(folder / "labels.csv", index=False)
    m = 1300
    z = rng.uniform(0, 6, m)
    big = pd.DataFrame({"x1": z, "x2": rng.normal(size=m)})
    big["y"] = np.sin(z) + big["x2"] + rng.normal(0, 0.3, m)
    big.to_csv(folder / "big.csv", index=False)


def _fit(folder, data, target, out, *options):
    args = ["fit", str(folder / data), "--target", target, "-q", "-o", str(folder / out)]
    assert cli.main([*args, *options]) == 0


#: name -> the arguments of ``nbattn plot`` (MODEL and DATA relative to the work folder)
PLOTS = {
    "fit regressor, 7 panels": ["fit", "many.npz", "many.csv"],
    "fit classifier": ["fit", "labels.npz", "labels.csv"],
    "fit mixed regressor": ["fit", "mixed.npz", "mixed.csv"],
    "heatmap small": ["heatmap", "small.npz", "small.csv", "--rows", "20"],
    "heatmap 1,300 keys": ["heatmap", "big.npz", "big.csv"],
    "heatmap 1,300 keys x 700 queries": ["heatmap", "big.npz", "big.csv", "--rows", "700"],
    "loo numeric": ["loo", "many.csv", "--target", "y", "--features", "x1,x2", "--points", "8"],
    "loo mixed": ["loo", "mixed.csv", "--target", "y", "--points", "8"],
    "widths numeric": ["widths", "many.npz"],
    "widths mixed": ["widths", "mixed.npz"],
}


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """{name: figure} of every ``nbattn plot`` figure and every demo figure, as saved."""
    folder = tmp_path_factory.mktemp("figures")
    _data(folder)
    _fit(folder, "many.csv", "y", "many.npz")
    _fit(folder, "small.csv", "y", "small.npz", "--features", "x1,x2")
    _fit(folder, "mixed.csv", "y", "mixed.npz")
    _fit(
        folder, "labels.csv", "label", "labels.npz", "--model", "classifier", "--bandwidth", "scott"
    )
    _fit(folder, "big.csv", "y", "big.npz")
    kept = []
    close = plt.close

    def keep(fig=None):
        # each figure as it was saved, closed to pyplot (so that the module's figures do
        # not count against pyplot's open figures in other tests) on an Agg canvas of its own
        kept.append(fig)
        close(fig)
        FigureCanvasAgg(fig)

    plt.close = keep
    try:
        out = {}
        for name, args in PLOTS.items():
            args = [str(folder / a) if a.endswith((".npz", ".csv")) else a for a in args]
            code = cli.main(["plot", *args, "-q", "-o", str(folder / "f.png")])
            out[name] = kept.pop() if code == 0 else None  # None: the command refused
        run_seed(outdir=folder / "demo")
        for i, fig in enumerate(kept):
            out[f"demo {i}"] = fig
    finally:
        plt.close = close
    yield out


# ----------------------------------------------------------------------------- measures


def _drawn_texts(fig):
    """The texts the renderer draws (non-empty), with the renderer."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn = {}
    original = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if mtext is not None and s.strip():
            drawn[id(mtext)] = mtext
        return original(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        fig.draw(renderer)
    finally:
        del renderer.draw_text
    return list(drawn.values()), renderer


def _corners(text, renderer):
    """The four corners of a (possibly rotated) text box in display coordinates."""
    box = text.get_window_extent(renderer)
    angle = np.deg2rad(text.get_rotation())
    rotation = text.get_rotation()
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(rotation)
    w, h = flat.width / 2, flat.height / 2
    c, s = np.cos(angle), np.sin(angle)
    local = np.array([[-w, -h], [w, -h], [w, h], [-w, h]])
    return local @ np.array([[c, s], [-s, c]]) + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _overlap(a, b, margin=1.0) -> bool:
    """Whether two convex polygons overlap by more than ``margin`` pixels (separating axes)."""
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            normal = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            pa, pb = a @ normal, b @ normal
            if pa.max() - margin <= pb.min() or pb.max() - margin <= pa.min():
                return False
    return True


def _box(bbox):
    return np.array(
        [[bbox.x0, bbox.y0], [bbox.x1, bbox.y0], [bbox.x1, bbox.y1], [bbox.x0, bbox.y1]]
    )


def _along(xy, step=1.0):
    xy = xy[np.isfinite(xy).all(axis=1)]
    out = [xy]
    for a, b in zip(xy[:-1], xy[1:]):
        n = int(np.hypot(*(b - a)) / step) + 1
        out.append(a + (b - a) * np.linspace(0, 1, n + 1)[:, None])
    return np.vstack(out)


def _data_display(ax):
    """Display coordinates of the data points and lines an axes shows."""
    parts = [np.empty((0, 2))]
    for line in ax.lines:
        xy = line.get_transform().transform(line.get_xydata())
        parts.append(xy if line.get_linestyle() in ("None", "") else _along(xy))
    for coll in ax.collections:
        if isinstance(coll, PathCollection):
            parts.append(coll.get_offset_transform().transform(coll.get_offsets()))
        elif isinstance(coll, LineCollection):
            for seg in coll.get_segments():
                parts.append(_along(coll.get_transform().transform(seg)))
    xy = np.vstack(parts)
    b = ax.bbox
    keep = (xy[:, 0] >= b.x0) & (xy[:, 0] <= b.x1) & (xy[:, 1] >= b.y0) & (xy[:, 1] <= b.y1)
    return xy[keep]


def _legends(fig):
    return [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)


# ----------------------------------------------------------------------------- checks


def layout_problems(fig) -> list[str]:
    """What a reader would find wrong with the figure's layout, as sentences."""
    texts, renderer = _drawn_texts(fig)
    problems = []
    canvas = fig.bbox
    axes = [ax for ax in fig.axes if ax.get_visible()]
    polys = [(t, _corners(t, renderer)) for t in texts]
    for t, poly in polys:
        if (
            poly[:, 0].min() < canvas.x0 - 1
            or poly[:, 0].max() > canvas.x1 + 1
            or poly[:, 1].min() < canvas.y0 - 1
            or poly[:, 1].max() > canvas.y1 + 1
        ):
            problems.append(f"text {t.get_text()!r} runs off the canvas")
        for ax in axes:
            if ax is not t.axes and _overlap(poly, _box(ax.bbox), margin=2.0):
                problems.append(f"text {t.get_text()!r} lies over a panel")
                break
    for i, (t, a) in enumerate(polys):
        for u, b in polys[i + 1 :]:
            if _overlap(a, b):
                problems.append(f"texts {t.get_text()!r} and {u.get_text()!r} overlap")
    legends = _legends(fig)
    if len(legends) > 1:
        problems.append(f"{len(legends)} legends (one per figure is enough)")
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in axes:
            xy = _data_display(ax)
            inside = (
                (xy[:, 0] > box.x0)
                & (xy[:, 0] < box.x1)
                & (xy[:, 1] > box.y0)
                & (xy[:, 1] < box.y1)
            )
            if inside.any():
                problems.append(f"the legend hides {inside.sum()} data points or line pixels")
        for t in legend.get_texts():
            numbers = re.findall(r"\d+(?:\.\d+)?", t.get_text())
            if len(numbers) != len(set(numbers)):
                problems.append(f"legend entry {t.get_text()!r} says a number twice")
    drawn = {id(t) for t in texts}
    named = {
        tuple(np.round(h.get_facecolor(), 3))
        for legend in legends
        for h in legend.legend_handles
        if isinstance(h, Rectangle)
    }
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() in ("log", "symlog"):
                for t in axis.get_ticklabels():
                    if id(t) in drawn and re.sub(r"[^0-9.]", "", t.get_text()) == "0":
                        problems.append("a 0 tick on a log axis")
        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        colours = {tuple(np.round(p.get_facecolor(), 3)) for p in bars}
        if len(colours) > 1 and not colours <= named:
            problems.append(f"{len(colours)} bar colours and no legend naming them")
        for p in bars:
            e, b = p.get_window_extent(renderer), ax.bbox
            touching = [
                abs(e.x0 - b.x0) < 2,
                abs(e.x1 - b.x1) < 2,
                abs(e.y0 - b.y0) < 2,
                abs(e.y1 - b.y1) < 2,
            ]
            if sum(touching) > 1:
                problems.append("a bar touches the frame beyond its base")
    titled = fig.get_suptitle() or any(ax.get_title() for ax in axes)
    if not titled:
        problems.append("no title")
    return problems


def coloured_share(fig, image) -> float:
    """Share of the pixels of a heatmap's axes that are not near white."""
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    b = image.axes.bbox
    height = rgba.shape[0]
    cells = rgba[int(height - b.y1) + 2 : int(height - b.y0) - 2, int(b.x0) + 2 : int(b.x1) - 2, :3]
    return float((cells.min(axis=2) < 225).mean())


# ----------------------------------------------------------------------------- tests


def test_every_figure_is_drawn(figures):
    assert set(PLOTS) <= set(figures)
    assert sum(name.startswith("demo") for name in figures) == 7


@pytest.mark.parametrize("name", [*PLOTS, *(f"demo {i}" for i in range(7))])
def test_layout(figures, name):
    assert figures[name] is not None, f"nbattn plot refused the {name} figure"
    assert layout_problems(figures[name]) == [], name


@pytest.mark.parametrize("name", ["heatmap small", "heatmap 1,300 keys", "demo 3", "demo 5"])
def test_heatmaps_show_structure(figures, name):
    # a band of weight that a reader sees, not a white sheet with a few red specks
    fig = figures[name]
    assert fig is not None, f"nbattn plot refused the {name} figure"
    (image,) = [im for ax in fig.axes for im in ax.get_images()]
    share = coloured_share(fig, image)
    print(name, share)
    assert share > 0.08, share


def test_checks_catch_a_crowded_figure():
    # the measures themselves: a legend over a line, a label off the canvas, two texts
    # on each other, a 0 on a symlog axis, two unnamed bar colours, no title
    fig, ax = plt.subplots(figsize=(3, 2))
    x = np.linspace(0, 1, 50)
    ax.plot(x, np.ones_like(x) * 0.9, label="line")
    ax.bar([0.2, 0.6], [0.5, 0.7], width=0.1, color=["tab:blue", "tab:orange"])
    ax.legend(loc="upper right")
    ax.set_ylabel("a label far too long to fit beside an axes two inches tall, surely")
    ax.text(0.5, 0.5, "one", transform=ax.transAxes)
    ax.text(0.5, 0.5, "two", transform=ax.transAxes)
    ax.set_yscale("symlog", linthresh=0.1)
    found = " | ".join(layout_problems(fig))
    plt.close(fig)
    for what in ("hides", "runs off", "overlap", "0 tick", "no legend naming", "no title"):
        assert what in found, what
