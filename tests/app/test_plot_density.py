"""The densities' figures (:func:`nbattn.app.density_figures.density_figure`): each kind
builds, saves to PNG and SVG and passes the layout checks of ``test_figure_layout``;
what it draws is the model's own ``pdf`` / ``predict_quantile`` at the figure's grid
(read back from the Axes), a marginal is the density of the chosen columns fitted alone
with the same widths, the quantile curves never cross; bad requests are refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import QuadMesh
from matplotlib.contour import ContourSet

import nbattn
from nbattn.app.density_figures import QUANTILE_LEVELS, density_figure
from nbattn.app.plotting import pyplot, save_figure

from .test_figure_layout import layout_problems

plt = pyplot()

#: fixed widths of x1, x2, colour, grade (the widths are not what these tests are about)
WIDTHS = [0.5, 0.6, 0.3, 0.4]


@pytest.fixture(scope="module")
def data():
    """(X, y, label): 120 rows of two continuous columns, an unordered and an ordered
    categorical one; a continuous response and a categorical one."""
    rng = np.random.default_rng(5)
    n = 120
    x1 = rng.uniform(0, 6, n)
    colour = rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2])
    grade = pd.Categorical(rng.choice(["low", "mid", "high"], n), ["low", "mid", "high"], True)
    X = pd.DataFrame(
        {"x1": x1, "x2": rng.normal(size=n), "colour": pd.Categorical(colour), "grade": grade}
    )
    y = pd.Series(np.sin(x1) + 0.8 * (colour == "red") + rng.normal(0, 0.4, n), name="y")
    label = pd.Series(np.where(y > 0.5, "up", "down"), name="label")
    return X, y, label


@pytest.fixture(scope="module")
def models(data):
    X, y, label = data
    options = {"bandwidth": WIDTHS, "y_bandwidth": 0.3}
    return {
        "kde1": nbattn.KernelDensity(bandwidth=[0.5]).fit(X[["x1"]]),
        "kde": nbattn.KernelDensity(bandwidth=WIDTHS).fit(X),
        "ckd": nbattn.ConditionalKernelDensity(**options).fit(X, y),
        "kqr": nbattn.KernelQuantileRegressor(**options).fit(X, y),
        "classes": nbattn.ConditionalKernelDensity(bandwidth=WIDTHS, y_bandwidth=0.2).fit(X, label),
    }


#: name -> (model, features, which y) of each figure kind
KINDS = {
    "density of one column": ("kde1", None, None),
    "marginal density": ("kde", ["x2"], None),
    "marginal probabilities": ("kde", ["colour"], None),
    "ordered probabilities": ("kde", ["grade"], None),
    "joint contours": ("kde", ["x1", "x2"], None),
    "fan and conditional density": ("ckd", ["x1"], "y"),
    "fan by category": ("ckd", ["colour"], "y"),
    "fan by ordered category": ("kqr", ["grade"], "y"),
    "quantile regressor fan": ("kqr", ["x1"], "y"),
    "class probabilities": ("classes", ["x1"], "label"),
    "class probabilities by category": ("classes", ["grade"], "label"),
}


def _draw(data, models, kind):
    X, y, label = data
    name, features, response = KINDS[kind]
    return density_figure(models[name], X, {"y": y, "label": label, None: None}[response], features)


def _lines(fig):
    return {line.get_gid(): line for ax in fig.axes for line in ax.lines if line.get_gid()}


def _reference(X, feature):
    """The other features at their median or most frequent category."""
    row = {"x1": np.median(X["x1"]), "x2": np.median(X["x2"])}
    row.update({c: X[c].value_counts().idxmax() for c in ("colour", "grade")})
    row.pop(feature)
    return row


def _slice(X, feature, grid):
    rows = pd.DataFrame({c: [v] * len(grid) for c, v in _reference(X, feature).items()})
    rows[feature] = list(grid)
    return rows[list(X.columns)]


# ----------------------------------------------------------------------------- every kind


@pytest.mark.parametrize("kind", KINDS)
def test_each_figure_builds_saves_and_reads_well(data, models, kind, tmp_path):
    fig = _draw(data, models, kind)
    assert layout_problems(fig) == [], kind
    save_figure(fig, tmp_path / "f.svg")
    fig = _draw(data, models, kind)
    save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:400]


def test_a_model_fitted_on_an_array_is_drawn_by_position(data):
    X = data[0][["x1", "x2"]].to_numpy()
    model = nbattn.KernelDensity(bandwidth=[0.5, 0.6]).fit(X)
    fig = density_figure(model, X, features=["x0"])  # an array's columns are x0, x1, ...
    (line,) = [line for line in fig.axes[0].lines if line.get_linestyle() == "-"]
    grid, curve = line.get_data()
    alone = nbattn.KernelDensity(bandwidth=[0.5]).fit(X[:, :1])
    np.testing.assert_allclose(curve, alone.pdf(grid[:, None]), rtol=1e-9)
    assert fig.axes[0].get_xlabel() == "x0"
    plt.close(fig)


# ----------------------------------------------------------------------------- what is drawn


def test_the_curve_is_the_models_pdf_over_the_data_widened_by_three_widths(data, models):
    X = data[0]
    fig = density_figure(models["kde1"], X[["x1"]])
    (line,) = [line for line in fig.axes[0].lines if line.get_linestyle() == "-"]
    grid, curve = line.get_data()
    np.testing.assert_allclose(curve, models["kde1"].pdf(pd.DataFrame({"x1": grid})), rtol=1e-12)
    assert grid[0] == pytest.approx(X["x1"].min() - 1.5)
    assert grid[-1] == pytest.approx(X["x1"].max() + 1.5)
    assert "h = 0.5" in fig.axes[0].get_legend_handles_labels()[1][-1]
    # the histogram is on the density scale: its bars' areas sum to 1
    bars = fig.axes[0].patches
    assert sum(p.get_width() * p.get_height() for p in bars) == pytest.approx(1.0)
    plt.close(fig)


def test_a_marginal_is_the_density_of_the_column_alone_with_its_width(data, models):
    X = data[0]
    fig = density_figure(models["kde"], X, features=["x2"])
    (line,) = [line for line in fig.axes[0].lines if line.get_linestyle() == "-"]
    grid, curve = line.get_data()
    alone = nbattn.KernelDensity(bandwidth=[WIDTHS[1]]).fit(X[["x2"]])
    np.testing.assert_allclose(curve, alone.pdf(pd.DataFrame({"x2": grid})), rtol=1e-9)
    assert "integrated out" in fig.axes[0].get_title()
    plt.close(fig)


@pytest.mark.parametrize(("column", "width"), [("colour", WIDTHS[2]), ("grade", WIDTHS[3])])
def test_category_bars_are_the_marginal_probabilities_and_the_shares(data, models, column, width):
    X = data[0]
    fig = density_figure(models["kde"], X, features=[column])
    ax = fig.axes[0]
    categories = list(X[column].cat.categories)
    estimated = [p.get_height() for p in ax.containers[0]]
    shares = [p.get_height() for p in ax.containers[1]]
    alone = nbattn.KernelDensity(bandwidth=[width]).fit(X[[column]])
    want = alone.pdf(pd.DataFrame({column: pd.Categorical(categories, categories)}))
    # the ordered (Wang-van Ryzin) kernel's masses do not sum to 1: drawn rescaled
    np.testing.assert_allclose(estimated, want / want.sum(), rtol=1e-9)
    rescaled = "rescaled" in ax.get_legend_handles_labels()[1][0]
    assert rescaled == (abs(want.sum() - 1.0) > 1e-9) == (column == "grade")
    observed = X[column].value_counts(normalize=True)
    np.testing.assert_allclose(shares, [observed[c] for c in categories])
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in categories]
    plt.close(fig)
    # a model of that column alone draws the same bars, from its own pdf
    fig = density_figure(alone, X[[column]])
    np.testing.assert_allclose([p.get_height() for p in fig.axes[0].containers[0]], estimated)
    plt.close(fig)


@pytest.mark.parametrize("marginal", [True, False])
def test_contour_lines_lie_on_the_joint_densitys_levels(data, models, marginal):
    X = data[0]
    if marginal:
        fig = density_figure(models["kde"], X, features=["x1", "x2"])
    else:
        model = nbattn.KernelDensity(bandwidth=WIDTHS[:2]).fit(X[["x1", "x2"]])
        fig = density_figure(model, X[["x1", "x2"]])
    assert ("integrated out" in fig.axes[0].get_title()) == marginal
    ax = fig.axes[0]
    (lines,) = [c for c in ax.collections if isinstance(c, ContourSet) and not c.filled]
    alone = nbattn.KernelDensity(bandwidth=WIDTHS[:2]).fit(X[["x1", "x2"]])
    top = max(lines.levels)
    checked = 0
    for level, path in zip(lines.levels, lines.get_paths()):
        if len(path.vertices):
            at = pd.DataFrame(path.vertices, columns=["x1", "x2"])
            # the contour of the grid's linear interpolation: within a small part of the peak
            np.testing.assert_allclose(alone.pdf(at), level, atol=0.02 * top)
            checked += 1
    assert checked >= 5
    assert ax.collections[-1].get_offsets().shape == (len(X), 2)  # the data on top
    plt.close(fig)


def test_fan_curves_are_the_quantiles_at_the_reference_row(data, models):
    X, y, _ = data
    for name in ("ckd", "kqr"):
        model = models[name]
        fig = density_figure(model, X, y, features=["x1"])
        lines = _lines(fig)
        grid = lines["quantile 0.5"].get_xdata()
        assert grid[0] == X["x1"].min() and grid[-1] == X["x1"].max()
        want = model.predict_quantile(_slice(X, "x1", grid), list(QUANTILE_LEVELS))
        drawn = np.column_stack([lines[f"quantile {q:g}"].get_ydata() for q in QUANTILE_LEVELS])
        np.testing.assert_allclose(drawn, want, rtol=1e-12)
        assert np.all(np.diff(drawn, axis=1) >= 0.0)  # never crossing
        title = fig.get_suptitle()
        held = _reference(X, "x1")
        assert f"x2 = {held['x2']:.4g}" in title
        assert f"colour = {held['colour']}" in title and f"grade = {held['grade']}" in title
        plt.close(fig)


def test_fan_by_category_marks_each_categorys_quantiles(data, models):
    X, y, _ = data
    fig = density_figure(models["ckd"], X, y, features=["grade"])
    lines = _lines(fig)
    categories = list(X["grade"].cat.categories)
    want = models["ckd"].predict_quantile(_slice(X, "grade", categories), list(QUANTILE_LEVELS))
    for k, q in enumerate(QUANTILE_LEVELS):
        np.testing.assert_array_equal(lines[f"quantile {q:g}"].get_xdata(), np.arange(3))
        np.testing.assert_allclose(lines[f"quantile {q:g}"].get_ydata(), want[:, k], rtol=1e-12)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == categories
    plt.close(fig)


def test_the_heatmap_is_the_conditional_density_at_its_cells(data, models):
    X, y, _ = data
    model = models["ckd"]
    fig = density_figure(model, X, y, features=["x1"])
    (mesh,) = [
        c for ax in fig.axes for c in ax.collections if isinstance(c, QuadMesh) and c.get_gid()
    ]
    corners = mesh.get_coordinates()  # cell corners, halfway between the cells' centres
    x = (corners[0, 1:, 0] + corners[0, :-1, 0]) / 2
    grid_y = (corners[1:, 0, 1] + corners[:-1, 0, 1]) / 2
    surface = np.asarray(mesh.get_array()).reshape(grid_y.size, x.size)
    rows = _slice(X, "x1", x)
    for i in (0, grid_y.size // 3, grid_y.size - 1):
        want = model.pdf(rows, np.full(x.size, grid_y[i]))
        np.testing.assert_allclose(surface[i], want, rtol=1e-9, atol=1e-12 * want.max())
    h = model.y_bandwidth_
    assert grid_y[0] == pytest.approx(y.min() - 2 * h) and grid_y[-1] == pytest.approx(
        y.max() + 2 * h
    )
    plt.close(fig)


@pytest.mark.parametrize("feature", ["x1", "grade"])
def test_a_categorical_response_shows_each_class_probability(data, models, feature):
    X, _, label = data
    model = models["classes"]
    fig = density_figure(model, X, label, features=[feature])
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1
    lines = _lines(fig)
    total = 0.0
    for cls in model.y_categories_:
        at = lines[f"P({cls})"].get_xdata()
        grid = at if feature == "x1" else list(X[feature].cat.categories)
        want = model.pdf(_slice(X, feature, grid), [cls] * len(grid))
        np.testing.assert_allclose(lines[f"P({cls})"].get_ydata(), want, rtol=1e-12)
        total = total + lines[f"P({cls})"].get_ydata()
    np.testing.assert_allclose(total, 1.0, rtol=1e-9)
    plt.close(fig)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("model", "features", "response", "match"),
    [
        ("kde", ["x9"], None, "features: feature 'x9' not found"),
        ("kde", ["x1", "x2", "colour"], None, "one or two columns; got 3"),
        ("kde", None, None, "name one or two of the 4 columns"),
        ("kde", ["x1", "colour"], None, "colour is categorical"),
        ("kde", ["x1", "x1"], None, "names a column twice"),
        ("ckd", None, "y", "name the one feature"),
        ("ckd", ["x1", "x2"], "y", "along one feature"),
        ("ckd", ["x1"], None, "y is required"),
        ("kqr", ["nope"], "y", "feature 'nope' not found"),
    ],
)
def test_bad_requests_are_refused_by_name(data, models, model, features, response, match):
    X, y, _ = data
    with pytest.raises(ValueError, match=match):
        density_figure(models[model], X, y if response else None, features)


def test_an_ordered_responses_masses_are_drawn_rescaled_to_sum_to_one(data):
    # the Wang-van Ryzin kernel's masses over the categories sum to less than 1
    X, _, label = data
    order = ["down", "up"]
    ordered = pd.Series(pd.Categorical(label, order, ordered=True), name="label")
    model = nbattn.ConditionalKernelDensity(bandwidth=WIDTHS, y_bandwidth=0.3).fit(X, ordered)
    fig = density_figure(model, X, ordered, ["x1"])
    lines = _lines(fig)
    grid = lines["P(up)"].get_xdata()
    rows = _slice(X, "x1", grid)
    masses = np.column_stack([model.pdf(rows, [c] * grid.size) for c in order])
    assert np.all(masses.sum(axis=1) < 1.0 - 1e-3)
    for k, c in enumerate(order):
        want = masses[:, k] / masses.sum(axis=1)
        np.testing.assert_allclose(lines[f"P({c})"].get_ydata(), want, rtol=1e-12)
    assert "rescaled" in fig.axes[0].get_title()
    plt.close(fig)


def test_a_quantile_regressor_of_a_categorical_response_is_refused(data):
    """At fit: there is no such model to draw (a conditional density draws a categorical
    y's class probabilities instead)."""
    X, _, label = data
    with pytest.raises(ValueError, match="needs a continuous y"):
        nbattn.KernelQuantileRegressor(bandwidth=WIDTHS, y_bandwidth=0.2).fit(X, label)


def test_what_is_no_density_model_is_refused(data):
    X, y, _ = data
    with pytest.raises(ValueError, match="not fitted"):
        density_figure(nbattn.KernelDensity(), X)
    regressor = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X[["x1"]], y)
    with pytest.raises(ValueError, match="not NadarayaWatsonRegressor"):
        density_figure(regressor, X[["x1"]])
    with pytest.raises(ValueError, match="X: column 'x2' not found"):
        density_figure(
            nbattn.KernelDensity(bandwidth=WIDTHS).fit(X), X.drop(columns="x2"), None, ["x1"]
        )
