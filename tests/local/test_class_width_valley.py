"""The classifier's width search in a valley across two widths.

The smoothed leave-one-out log-loss (``nbattn.local.class_widths``) is searched without
a gradient: the common factor, then sweeps of one width at a time, which stall where
the criterion's valley runs across two widths (two nearly collinear columns whose
labels follow their sum). A Nelder-Mead polish follows that valley
(:func:`nbattn.local.search.polish_without_gradient`); the answer must then be a local
minimum across both widths, not only along each alone.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nbattn.local import class_widths
from nbattn.local.class_widths import LogLossCriterion, class_loo_widths
from nbattn.local.problem import rule_widths
from nbattn.local.search import widths_to_theta
from nbattn.local.widths import _training_problem, check_training
from tests import naive


def _valley(seed, n=120):
    """Two near-collinear columns, the label's probability a function of their sum."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=n)
    x2 = x1 + 0.3 * rng.normal(size=n)
    p = 1.0 / (1.0 + np.exp(-3.0 * np.sin(2.0 * (x1 + x2))))
    labels = (rng.random(n) < p).astype(int)
    return np.column_stack([x1, x2]), np.eye(2)[labels]


@pytest.fixture
def without_guard(monkeypatch):
    """Per-column widths kept whenever they score lower than the common factor's (z = 0),
    so that the answer is the per-column search's."""
    monkeypatch.setattr(class_widths, "PER_COLUMN_Z", 0.0)


@pytest.mark.usefixtures("without_guard")
def test_answer_is_a_local_minimum_across_two_widths():
    """No point of a small 2-D grid about the answer (factors 10**(k/48), k in -2..2, on
    each h: an eighth of the search's grid step and less) that the search may visit
    (above its fence) scores lower by more than 1e-6."""
    steps = 10.0 ** (np.arange(-2, 3) / 48.0)
    for seed in range(6):
        X, Y = _valley(seed)
        before = (X.copy(), Y.copy())
        spec, X, Y, _, _ = check_training(X, Y, 0, None, var_type="cc")
        widths, alpha = class_loo_widths(spec, X, Y)
        again = class_loo_widths(spec, X, Y)
        assert widths.tobytes() == again[0].tobytes() and alpha == again[1]
        assert np.array_equal(X, before[0]) and np.array_equal(Y, before[1])
        start = rule_widths(spec, X)
        criterion = LogLossCriterion(_training_problem(spec, X, Y, 0, None, start))
        criterion.set_fence(widths_to_theta(start, "cc", spec.n_categories))
        found, log_alpha = criterion.profile(np.log(widths))
        assert np.isclose(log_alpha, np.log(alpha), rtol=0, atol=1e-12)
        reference = naive.smoothed_class_loo_log_loss(X, Y, widths, "cc", [0, 0], alpha)
        assert found == pytest.approx(reference, rel=1e-10)
        near = min(
            criterion.profile(np.log(widths * np.array([a, b])))[0]
            for a, b in itertools.product(steps, steps)
        )
        assert found <= near + 1e-6, (seed, found, near, widths)
