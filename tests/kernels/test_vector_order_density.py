"""The least-squares density kernels' bits do not depend on where their arrays lie
(tests/_vector_order.py): no sum behind a distance check, and the same criterion for the
same table in one process whatever was allocated before it."""

import numpy as np
import pytest

from nbattn.distribution.density import density_layout
from nbattn.distribution.ls_widths import LeastSquaresCriterion
from nbattn.kernels import density_ls
from nbattn.local.problem import check_columns
from nbattn.local.search import widths_to_theta
from tests._vector_order import address_dependent_sums, fresh_ir
from tests.distribution.test_cv_ls import table, widths_for

# six continuous columns: enough for LLVM to vectorise the loops over columns
VAR_TYPE = "ccuccco"


def _criterion(n_response, kernel, seed=0):
    rng = np.random.default_rng(seed)
    X = table(seed, VAR_TYPE, 12)
    spec, (X,) = check_columns({"X": X}, var_type=VAR_TYPE, kernel=kernel)
    widths = widths_for(VAR_TYPE, rng)
    criterion = LeastSquaresCriterion(
        density_layout(spec, X, X, widths, rng.uniform(0.2, 2.0, 12)), n_response
    )
    theta = widths_to_theta(widths, VAR_TYPE, spec.n_categories)
    return criterion, theta


def _kernel_arguments(n_response, kernel, monkeypatch):
    """The arguments one criterion evaluation hands its row kernel."""
    seen = {}

    def record(items, *args):
        seen[items] = args
        return calls(items, *args)

    calls = density_ls.run_items
    monkeypatch.setattr(density_ls, "run_items", record)
    criterion, theta = _criterion(n_response, kernel)
    criterion.loss_and_grad(theta)
    return seen


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
@pytest.mark.parametrize("n_response", [0, 1])
def test_no_sum_behind_a_distance_check(kernel, n_response, monkeypatch):
    seen = _kernel_arguments(n_response, kernel, monkeypatch)
    assert seen, "the criterion did not reach the least-squares kernels"
    for items, args in seen.items():
        rows_cont, rows_cat, cat_params, cat_dparams, conv_params, conv_sums, *rest = args
        row = density_ls._ls_row
        if items is density_ls._ls_conditional_terms_items:
            row = density_ls._ls_conditional_row
        conv = (conv_params, conv_sums)
        ir = fresh_ir(row, np.int64(0), rows_cont, rows_cat, cat_params, cat_dparams, conv, *rest)
        assert address_dependent_sums(ir) == []


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_criterion_repeats_after_other_allocations(kernel):
    criterion, theta = _criterion(1, kernel, seed=3)
    first = criterion.loss_and_grad(theta)
    rng = np.random.default_rng(0)
    for _ in range(5):
        junk = [np.empty(int(rng.integers(1, 5000))) for _ in range(20)]  # noqa: F841
        again = criterion.loss_and_grad(theta)
        assert again[0] == first[0]
        assert np.array_equal(again[1], first[1])
