"""The staged LOO width search on tied tables: a stage between the first and the last
whose criterion streams more than half the distinct rows that all rows' criterion
streams is skipped (``nbattn.local.staged.staged_search``). The tables put x on a grid
(many tied rows) beside a 3-level column; a step of 0 leaves x continuous (no ties)."""

import numpy as np
import pytest

from nbattn import LocalPolynomialRegressor, config
from nbattn.local import widths as local_widths
from nbattn.local.engine import default_widths, local_loo_loss
from nbattn.local.widths import local_loo_widths
from tests._config import config_values
from tests.local.test_local import _BRUTE_FORCE_GRID, _grid_minimum

_KW = dict(var_type="cu", n_categories=[0, 3])


def _tied_table(seed, n, step):
    """(X, y): x uniform on [0, 4] rounded to multiples of ``step`` (0: not rounded), a
    3-level column, y a curve of both with two bumps plus noise."""
    rng = np.random.default_rng(5000 + seed)
    x = rng.uniform(0, 4, n)
    if step:
        x = np.round(x / step) * step
    cat = rng.integers(0, 3, n).astype(float)
    y = 0.5 * x + np.sin(3 * x) + 0.3 * cat + 0.2 * rng.normal(size=n)
    return np.column_stack([x, cat]), y


def _streamed(X):
    """The rows one evaluation of the criterion streams, from the definition: the
    distinct rows where they are at most ``LOCAL_TIE_MAX_SHARE`` percent, else all."""
    distinct = np.unique(X, axis=0).shape[0]
    return distinct if 100 * distinct <= config.LOCAL_TIE_MAX_SHARE * X.shape[0] else X.shape[0]


def _skipped(X, stages):
    """The stages between the first and the last that the rule skips: the staged search
    draws its nested subsamples from one permutation of seed 0."""
    order = np.random.default_rng(0).permutation(X.shape[0])
    everything = _streamed(X)
    return [rows for rows in stages[1:-1] if 2 * _streamed(X[np.sort(order[:rows])]) > everything]


_STAGES = [30, 60, 120, 240, 480]  # subsample 30, growth 2, 480 rows


def _fit(X, y, capsys=None):
    with config_values(LOCAL_LOO_STAGE_GROWTH=2):
        model = LocalPolynomialRegressor(var_type="cu", loo_subsample=30, verbose=2 * bool(capsys))
        widths = model.fit(X, y).bandwidth_
    return widths, (capsys.readouterr().err if capsys else "")


@pytest.mark.parametrize("step", [0.0, 0.05, 0.1, 1.0])
def test_the_stages_skipped_are_those_the_rule_names(step, capsys):
    """Each stage between the first and the last runs, or is said skipped, as the rule
    computed from ``np.unique`` says; tables without ties skip none."""
    for seed in range(2):
        X, y = _tied_table(seed, 480, step)
        expected = _skipped(X, _STAGES)
        _, err = _fit(X, y, capsys)
        said = [rows for rows in _STAGES if f": {rows} rows skipped" in err]
        assert said == expected, (step, seed, said, expected)
        order = np.random.default_rng(0).permutation(X.shape[0])
        for rows in expected:  # the counts it gives: distinct rows only where they are pooled
            streams = _streamed(X[np.sort(order[:rows])])
            reason = f"streams {streams} of them, more than half the {_streamed(X)} that"
            assert f"{rows} rows skipped (an evaluation {reason}" in err, (step, rows, err)
        for k, rows in enumerate(_STAGES[1:-1], start=2):
            ran = f"stage {k} of {len(_STAGES)}: a random subsample of {rows} rows" in err
            assert ran == (rows not in expected), (step, seed, rows, err)
        if step == 0.0:
            assert expected == []


def test_the_rule_is_not_vacuous_on_these_tables():
    """The tables above reach both sides of the rule: the coarse grid skips every stage
    between, the fine one keeps the stage of 60 rows, the untied table keeps all."""
    skipped = {step: _skipped(_tied_table(0, 480, step)[0], _STAGES) for step in (0.0, 0.05, 1.0)}
    assert skipped == {0.0: [], 0.05: [120, 240], 1.0: [60, 120, 240]}


def test_a_skipped_stage_leaves_no_trace(monkeypatch):
    """The search with the rule is bit for bit the search on the ladder without the
    skipped stages: a skipped stage evaluates nothing and carries nothing on."""
    ladder = local_widths.row_ladder
    for step in (0.05, 1.0):
        X, y = _tied_table(3, 480, step)
        expected = _skipped(X, _STAGES)
        assert expected
        ruled, _ = _fit(X, y)

        def without_skipped(*args, skipped=tuple(expected)):
            return [rows for rows in ladder(*args) if rows not in skipped]

        monkeypatch.setattr(local_widths, "row_ladder", without_skipped)
        shorter, _ = _fit(X, y)
        monkeypatch.undo()
        np.testing.assert_array_equal(ruled, shorter)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("step", [0.05, 1.0])
def test_skipping_keeps_the_answer_near_a_brute_force_grid(step, degree):
    """On tied tables where stages are skipped, over several draws: never worse than the
    rule on all rows, within 1 % of a dense brute-force grid of (h, l), the same twice."""
    for seed in range(3):
        X, y = _tied_table(10 + seed, 480, step)
        assert _skipped(X, _STAGES)
        with config_values(LOCAL_LOO_STAGE_GROWTH=2):
            widths = local_loo_widths(X, y, degree, subsample=30, **_KW)
            again = local_loo_widths(X, y, degree, subsample=30, **_KW)
        np.testing.assert_array_equal(widths, again)
        ours = local_loo_loss(X, y, widths, degree, **_KW)
        rule = local_loo_loss(X, y, default_widths(X, "cu", [0, 3]), degree, **_KW)
        grid = _grid_minimum(X, y, degree, "cu", [0, 3], *_BRUTE_FORCE_GRID)
        assert ours <= rule * (1 + 1e-12), (step, seed, ours, rule, widths)
        assert ours <= grid * (1 + 1e-2), (step, seed, ours, grid, widths)
