"""What the plot figures draw, against references: the mixed LOO curve against the naive
product kernel, a classifier's curves against predict_proba, binned heatmaps against
plain sums, the widths panels against the model's widths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.app import plotting

from .. import naive

plt = plotting.pyplot()


def _mixed(rng, n=60):
    x = rng.uniform(0, 6, n)
    colour = rng.choice(["red", "green", "blue"], n)
    y = np.sin(x) + 0.8 * (colour == "red") + rng.normal(0, 0.3, n)
    return pd.DataFrame({"x": x, "colour": colour}), y


def test_mixed_loo_curve_is_the_product_kernel_criterion(rng):
    X, y = _mixed(rng)
    fig = plotting.loo_figure(X, y, points=5, var_type="cu")
    try:
        scales, losses = fig.axes[0].lines[0].get_data()
        model = nbattn.NadarayaWatsonRegressor(var_type="cu", bandwidth="scott").fit(X, y)
        codes, base = np.asarray(model.X_fit_), np.asarray(model.bandwidth_)
        for s, loss in zip(scales, losses):
            widths = np.array([base[0] * s, base[1]])
            want = naive.local_loo_loss_exact(codes, y, widths, "cu", [3, 3], 0)
            np.testing.assert_allclose(loss, want, rtol=1e-9)
        # the marked factor is loo_scale's, and no grid width beats it
        chosen = nbattn.NadarayaWatsonRegressor(var_type="cu", bandwidth="loo_scale").fit(X, y)
        factor = chosen.bandwidth_[0] / base[0]
        texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert f"bandwidth='loo_scale': {factor:.3g} x Scott" in texts
        at = naive.local_loo_loss_exact(codes, y, [base[0] * factor, base[1]], "cu", [3, 3], 0)
        assert at <= losses.min() * (1 + 1e-9)
    finally:
        plt.close(fig)


def test_loo_refuses_only_categorical_columns(rng):
    X, y = _mixed(rng)
    with pytest.raises(ValueError, match="no continuous column"):
        plotting.loo_figure(X[["colour"]], y, points=3, var_type="u")


def test_classifier_panels_draw_predict_proba(rng):
    X, y = _mixed(rng)
    labels = np.where(y > 0.5, "hi", "lo")
    model = nbattn.NadarayaWatsonClassifier(var_type="cu", bandwidth="scott").fit(X, labels)
    figs = [plotting.fit_figure(model, X, labels, "label") for _ in range(2)]
    try:
        ax = figs[0].axes[0]
        reference = X["colour"].mode().iloc[0]
        for k, cls in enumerate(model.classes_):
            (line,) = [ln for ln in ax.lines if ln.get_label() == f"P({cls})"]
            grid, curve = line.get_data()
            queries = pd.DataFrame({"x": grid, "colour": [reference] * len(grid)})
            np.testing.assert_allclose(curve, model.predict_proba(queries)[:, k], rtol=1e-12)
        # drawn twice, the same to the bit
        for a, b in zip(figs[0].axes, figs[1].axes):
            for la, lb in zip(a.lines, b.lines):
                np.testing.assert_array_equal(la.get_xydata(), lb.get_xydata())
    finally:
        for fig in figs:
            plt.close(fig)


def test_widths_of_mixed_columns_show_h_and_lambda(rng):
    X, y = _mixed(rng)
    model = nbattn.NadarayaWatsonRegressor(var_type="cu", bandwidth=[0.4, 0.25]).fit(X, y)
    fig = plotting.widths_figure(model, ["x", "colour"])
    try:
        cont, cat = fig.axes
        assert cont.get_xscale() == "log" and cat.get_xscale() == "linear"
        assert [t.get_text() for t in cont.get_yticklabels()] == ["x  (h = 0.4)"]
        assert [t.get_text() for t in cat.get_yticklabels()] == ["colour  (λ = 0.25 of 0.667)"]
        (bar,) = cat.patches
        assert bar.get_width() == pytest.approx(0.25 / (2 / 3), rel=1e-12)
        ratio = cont.lines[0].get_xdata()[0]
        assert ratio == pytest.approx(0.4 / np.std(X["x"], ddof=1), rel=1e-12)
    finally:
        plt.close(fig)


@settings(max_examples=40)
@given(
    st.integers(1, 30),
    st.integers(1, 300),
    st.integers(1, 7),
    st.integers(1, 40),
    st.integers(0, 2**32 - 1),
)
def test_binned_weights_keep_each_row_sum(n_q, n_k, rows, cols, seed):
    w = np.random.default_rng(seed).dirichlet(np.ones(n_k), size=n_q)
    got = plotting.binned(w, rows, cols)
    starts_q, starts_k = range(0, n_q, rows), range(0, n_k, cols)
    want = np.array(
        [[w[i : i + rows, j : j + cols].sum(axis=1).mean() for j in starts_k] for i in starts_q]
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)


def test_each_partial_dependence_panel_states_where_the_others_are_held(rng):
    """Panel f's title gives every other feature's reference value (a continuous column's
    median, a categorical one's most frequent category) and not its own."""
    n = 60
    X = pd.DataFrame(
        {
            "x1": rng.uniform(0, 6, n),
            "x2": rng.normal(size=n),
            "colour": rng.choice(["red", "red", "blue"], n),
        }
    )
    y = np.sin(X.x1) + X.x2 + (X.colour == "red")
    model = nbattn.NadarayaWatsonRegressor(bandwidth=1.0).fit(X, y)
    fig = plotting.fit_figure(model, X, y, "y")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()][:3]
    held = {
        "x1": f"x1 = {np.median(X.x1):.4g}",
        "x2": f"x2 = {np.median(X.x2):.4g}",
        "colour": f"colour = {X.colour.mode()[0]}",
    }
    for title, name in zip(titles, X.columns):
        flat = " ".join(title.split())
        assert flat.startswith("others held at"), title
        for other, text in held.items():
            assert (text in flat) == (other != name), (name, title)
    assert "median" in fig.get_suptitle() and "most frequent" in fig.get_suptitle()
