"""The local width search when no width gives a finite criterion: a clear error, no warning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings

from nbattn.local import widths as local_widths
from nbattn.local.widths import local_loo_widths
from tests.strategies import seeds


@settings(max_examples=5, deadline=None)
@given(seed=seeds)
def test_no_finite_criterion_is_a_clear_error(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    var_type = "".join(rng.choice(["c", "u"], size=int(rng.integers(1, 4))))
    var_type = "c" + var_type[1:]
    X = np.column_stack(
        [rng.normal(size=n) if k == "c" else rng.integers(0, 3, n).astype(float) for k in var_type]
    )
    y = rng.normal(size=n)
    real_fit = local_widths.fit_problem

    def nan_fit(problem, want_mfx=False):
        fit = real_fit(problem, want_mfx)
        return fit._replace(beta=np.full_like(fit.beta, np.nan))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_widths, "fit_problem", nan_fit)
        # Nadaraya-Watson on continuous columns takes its criterion from the LOO tiles
        patch.setattr(
            local_widths._PooledCriterion,
            "_tiles",
            lambda self, theta: (math.nan, np.full(len(theta), math.nan)),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ValueError, match="not finite at any width"):
                local_loo_widths(X, y, degree=int(rng.integers(0, 3)), var_type=var_type)
