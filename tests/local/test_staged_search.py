"""The LOO width search of the local fits that starts on a subsample (``subsample=``,
the estimator's ``loo_subsample``): the whole search on the subsample, then short
searches on more rows from its widths rescaled."""

import numpy as np
import pytest

from nbattn._core.numeric import row_ladder
from nbattn.local.engine import default_widths, local_loo_loss
from nbattn.local.problem import check_columns
from nbattn.local.staged import rescaled_widths
from nbattn.local.widths import local_loo_widths
from tests._config import config_values
from tests.local.test_local import _BRUTE_FORCE_GRID, _curve_to_break, _grid_minimum


def test_row_ladder():
    assert row_ladder(10_000, 0, 4) == [10_000]
    assert row_ladder(3_999, 2_000, 4) == [3_999]
    assert row_ladder(4_000, 2_000, 4) == [2_000, 4_000]
    assert row_ladder(10_000, 2_000, 4) == [2_000, 10_000]
    assert row_ladder(100_000, 2_000, 4) == [2_000, 8_000, 32_000, 100_000]
    assert row_ladder(100, 20, 1) == [20, 40, 100]  # a growth below 2 is 2


def test_rescaled_widths_follow_the_rates_and_keep_l_in_range():
    spec, _ = check_columns({"X": np.zeros((4, 4))}, var_type="ccuo", n_categories=[0, 0, 3, 5])
    widths = np.array([0.5, 2.0, 0.3, 0.0])
    down = rescaled_widths(widths, spec, 1_000, 64_000)  # 64x the rows, q = 2
    np.testing.assert_allclose(down[:2], widths[:2] * 64.0 ** (-1 / 6))
    np.testing.assert_allclose(down[2], 0.3 * 64.0 ** (-2 / 6))
    assert down[3] == 0.0  # exact matching stays exact
    np.testing.assert_allclose(rescaled_widths(down, spec, 64_000, 1_000), widths)
    # fewer rows: l grows, but never past its top ((c-1)/c for 'u', 1 for 'o')
    up = rescaled_widths(np.array([0.5, 2.0, 0.6, 0.9]), spec, 64_000, 10)
    assert up[2] == 2.0 / 3.0 and up[3] == 1.0


def _curve(case, seed, n):
    """The brute-force comparisons' curves, other draws."""
    return _curve_to_break(case, seed, n, seed_base=3000)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("case", ["wiggly", "irrelevant category", "pure noise", "ties"])
def test_staged_search_no_worse_than_the_rule_and_near_a_brute_force_grid(case, degree):
    """A quarter of the rows in the first stage (harsher than a fifth of 10,000, the
    benchmark's): over several draws the staged answer is never worse than the rule on all
    rows, within 1 % of a dense brute-force grid (the flat 'pure noise' criterion has
    minima far apart that differ by less), and the same from two identical calls."""
    var_type, counts = "cu", [0, 3]
    kw = dict(var_type=var_type, n_categories=counts)
    for seed in range(3):
        X, y = _curve(case, seed, 240)
        widths = local_loo_widths(X, y, degree, subsample=60, **kw)
        again = local_loo_widths(X, y, degree, subsample=60, **kw)
        np.testing.assert_array_equal(widths, again)
        ours = local_loo_loss(X, y, widths, degree, **kw)
        rule = local_loo_loss(X, y, default_widths(X, var_type, counts), degree, **kw)
        grid = _grid_minimum(X, y, degree, var_type, counts, *_BRUTE_FORCE_GRID)
        assert ours <= rule * (1 + 1e-12), (case, seed, ours, rule, widths)
        assert ours <= grid * (1 + 1e-2), (case, seed, ours, grid, widths)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("case", ["wiggly", "irrelevant category", "pure noise", "ties"])
def test_stages_between_first_and_last_keep_the_answer_near_a_brute_force_grid(case, degree):
    """Four stages (30, 60, 120 and 240 rows; the stages between carry the widths
    without probing, the last probes on all rows): over several draws never worse than
    the rule on all rows, within 1 % of a dense brute-force grid, and the same twice."""
    var_type, counts = "cu", [0, 3]
    kw = dict(var_type=var_type, n_categories=counts)
    assert row_ladder(240, 30, 2) == [30, 60, 120, 240]
    for seed in range(3):
        X, y = _curve(case, seed + 10, 240)
        with config_values(LOCAL_LOO_STAGE_GROWTH=2):
            widths = local_loo_widths(X, y, degree, subsample=30, **kw)
            again = local_loo_widths(X, y, degree, subsample=30, **kw)
        np.testing.assert_array_equal(widths, again)
        ours = local_loo_loss(X, y, widths, degree, **kw)
        rule = local_loo_loss(X, y, default_widths(X, var_type, counts), degree, **kw)
        grid = _grid_minimum(X, y, degree, var_type, counts, *_BRUTE_FORCE_GRID)
        assert ours <= rule * (1 + 1e-12), (case, seed, ours, rule, widths)
        assert ours <= grid * (1 + 1e-2), (case, seed, ours, grid, widths)


def test_staged_search_with_rtol_and_weights_never_worse_than_the_rule():
    """The staged search on the pruned criterion with sample weights (carried into the
    subsample): the answer, judged exactly, is never worse than the rule."""
    kw = dict(var_type="cu", n_categories=[0, 3])
    forced = {"LOCAL_LEAF_KEYS": 4, "LOCAL_TREE_MIN_KEYS": 1, "LOCAL_TREE_MAX_SHARE": 100}
    for seed in range(4):
        X, y = _curve(["wiggly", "ties"][seed % 2], seed, 200)
        weights = np.random.default_rng(seed).uniform(0.1, 3.0, 200)
        with config_values(**forced):
            widths = local_loo_widths(X, y, 1, rtol=1e-6, sample_weight=weights, subsample=50, **kw)
        ours = local_loo_loss(X, y, widths, 1, sample_weight=weights, **kw)
        rule = local_loo_loss(X, y, default_widths(X, "cu", [0, 3]), 1, sample_weight=weights, **kw)
        assert ours <= rule * (1 + 1e-12), (seed, ours, rule, widths)


def test_staged_search_says_its_stages(capsys):
    from nbattn import LocalPolynomialRegressor

    X, y = _curve("wiggly", 0, 200)
    with config_values(LOCAL_LOO_STAGE_GROWTH=2):
        LocalPolynomialRegressor(var_type="cu", verbose=2, loo_subsample=50).fit(X, y)
    err = capsys.readouterr().err
    assert "stage 1 of 3: a random subsample of 50 rows" in err
    assert "stage 2 of 3: a random subsample of 100 rows" in err
    assert "stage 3 of 3: all 200 rows" in err


@pytest.mark.parametrize("bad", [9, 0, -5, 2.5, "2000", True])
def test_subsample_refused_with_its_name(bad):
    X, y = _curve("wiggly", 0, 40)
    with pytest.raises(ValueError, match="subsample"):
        local_loo_widths(X, y, 1, var_type="cu", n_categories=[0, 3], subsample=bad)


def test_subsample_below_half_the_rows_is_the_full_search():
    """Fewer than twice the subsample's rows: the search on every row, bit for bit."""
    X, y = _curve("ties", 1, 100)
    kw = dict(var_type="cu", n_categories=[0, 3])
    np.testing.assert_array_equal(
        local_loo_widths(X, y, 1, subsample=51, **kw), local_loo_widths(X, y, 1, **kw)
    )


def test_estimator_saves_loo_subsample(tmp_path):
    """The estimator's parameter reaches the search (another answer than the full search
    on these rows) and survives a model file."""
    import nbattn
    from nbattn import LocalPolynomialRegressor

    X, y = _curve("wiggly", 2, 240)
    staged = LocalPolynomialRegressor(var_type="cu", loo_subsample=60).fit(X, y)
    full = LocalPolynomialRegressor(var_type="cu").fit(X, y)
    assert not np.array_equal(staged.bandwidth_, full.bandwidth_)
    path = tmp_path / "model.nbattn"
    nbattn.save(staged, path)
    loaded = nbattn.load(path)
    assert loaded.get_params()["loo_subsample"] == 60
    np.testing.assert_array_equal(loaded.predict(X[:5]), staged.predict(X[:5]))
