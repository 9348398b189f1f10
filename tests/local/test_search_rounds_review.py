"""A hostile review of the width search's later rounds of sweeps (``SearchPolicy(
verify_repeats=True)``, the default): synthetic criteria of theta built to break the
shortcut, each searched under the default policy and under full rounds
(``verify_repeats=False``), the default's answer compared with the full rounds' first and
with brute force over a dense grid of theta second.

Positions: a continuous column's parameter is log h; a categorical one's t (l =
lambda_max sigmoid(t), t = -inf exact matching) is placed at ``_SHARE_SPAN`` times
l / lambda_max, so that one step of ``_LAMBDA_SHARES`` is one log-h grid step, the scale
``_moved_since_swept`` compares. The curves are written in positions, so a categorical
column's well lies at a share of its range.

Two defects this review found, fixed since and kept as tests: a continuous column whose
own sweep moved it far (the sweep's window of two decades either side moves with the
column: a deeper well just beyond the first window lies within the second), and exact
matching (t = -inf) taken for the same point as a finite t whose share is near 0 (l = 0
exactly is a valley floor that no finite t reaches). What still fails
(``xfail(strict=True)``): two gains finer than the grid (a plateau's edge, an infinite
wall) that only a re-run of the sweep's Brent refinement finds."""

import math

import numpy as np
import pytest

from nbattn import config
from nbattn.local.search import SearchPolicy, search_widths, share_theta
from tests.local.test_search_rounds import _Curve, _well

_STEP = math.log(config.LOO_GRID[1] / config.LOO_GRID[0])
#: Position of l = lambda_max (share 1): 12 steps of _LAMBDA_SHARES, 12 log-h grid steps.
_SHARE_SPAN = 12.0 * _STEP
#: The default's loss against full rounds that counts as a defect (relative).
_RTOL = 1e-5


def _share(t):
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(np.isneginf(t), 0.0, 1.0 / (1.0 + np.exp(-np.clip(t, -700.0, 700.0))))


def _positions(theta, var_type):
    """Per column: log h, or l / lambda_max scaled by ``_SHARE_SPAN``."""
    return [
        theta[..., j] if kind == "c" else _SHARE_SPAN * _share(theta[..., j])
        for j, kind in enumerate(var_type)
    ]


def _start(var_type, share=0.5):
    """Widths: h = 1 (log h 0) per continuous column, l = ``share`` lambda_max otherwise
    (lambda_max = 2/3 for 'u' with 3 categories, 1 for 'o')."""
    return np.array(
        [1.0 if k == "c" else share * (2.0 / 3.0 if k == "u" else 1.0) for k in var_type]
    )


def _search(function, var_type, start, repeats):
    curve = _Curve(function, var_type)
    theta = search_widths(curve, start, policy=SearchPolicy(verify_repeats=repeats))
    return curve.best[0], theta, curve.evaluations


def _both(function, var_type, start=None):
    """The default policy (twice: bit-identical theta) and full rounds:
    ``(default value, full value, default theta, (default evaluations, full's))``."""
    start = _start(var_type) if start is None else start
    value, theta, count = _search(function, var_type, start, True)
    again = _search(function, var_type, start, True)
    assert theta.tobytes() == again[1].tobytes() and value == again[0], (theta, again)
    full, _, full_count = _search(function, var_type, start, False)
    return value, full, theta, (count, full_count)


def _brute_force(function, var_type, start=None, points=281):
    """The least value over a grid of theta within the search's bounds: log h over
    ``config.WIDTH_BOUNDS`` of the start's, t at ``points`` shares of l / lambda_max in
    [0, 1] (share 0: t = -inf)."""
    start = _start(var_type) if start is None else start
    low, high = (math.log(b) for b in config.WIDTH_BOUNDS)
    shares = np.linspace(0.0, 1.0, points)
    axes = [
        np.linspace(math.log(start[j]) + low, math.log(start[j]) + high, points)
        if kind == "c"
        else np.array([-math.inf] + [share_theta(s) for s in shares[1:]])
        for j, kind in enumerate(var_type)
    ]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    with np.errstate(invalid="ignore"):
        return float(np.min(function(mesh)))


def _noisy(function, relative=1e-7):
    """``function`` times 1 + ``relative`` h(theta), h a deterministic hash of theta in
    [-1, 1] (float32 sums' rounding: the same theta, the same value)."""

    def noisy(theta):
        finite = np.where(np.isneginf(theta), -99.0, theta)
        weights = 1.7 + np.arange(theta.shape[-1])
        return function(theta) * (1.0 + relative * np.sin(1e3 * np.sum(finite * weights, axis=-1)))

    return noisy


def _hidden_pair(var_type, first, second, depths=(0.5, 1.0), wide=0.5, narrow=0.2):
    """The hidden well of ``tests/local/test_search_rounds.py`` in positions: x of column
    ``first``, y of ``second``; a shallow bowl at the start; a well in y (at ``y1``) open
    while x stays near its start, and a deeper one in x (at ``x2``) open only while y is
    near ``y1``. Continuous: start 0, y1 = 3, x2 = -3. Categorical: start at share 0.5,
    y1 at share 11/12, x2 at share 1/12 (both on the sweep's shares)."""
    x0 = 0.0 if var_type[first] == "c" else 0.5 * _SHARE_SPAN
    y0 = 0.0 if var_type[second] == "c" else 0.5 * _SHARE_SPAN
    y1 = 3.0 if var_type[second] == "c" else _SHARE_SPAN * 11.0 / 12.0
    x2 = -3.0 if var_type[first] == "c" else _SHARE_SPAN / 12.0

    def f(theta):
        p = _positions(theta, var_type)
        x, y = p[first], p[second]
        bowl = 1.0 + 0.01 * ((x - x0) ** 2 + (y - y0) ** 2)
        for j in range(len(var_type)):
            if j not in (first, second):
                bowl = bowl + 0.02 * (p[j] - 0.5) ** 2
        one = depths[0] * _well(y, y1, narrow) * _well(x, x0, wide)
        two = depths[1] * _well(x, x2, narrow) * _well(y, y1, wide)
        return bowl - one - two

    return f


def _assert_default_as_full(value, full, label=""):
    assert value <= full + _RTOL * abs(full), (label, value, full)


# ---- categorical columns: a hidden well opened by another column's far move (passes)

_PAIRS = [
    ("cu", 0, 1),
    ("cu", 1, 0),
    ("uc", 0, 1),
    ("co", 1, 0),
    ("co", 0, 1),
    ("cuo", 1, 2),
    ("cuo", 2, 0),
    ("uo", 0, 1),
]


@pytest.mark.parametrize(("var_type", "first", "second"), _PAIRS)
def test_hidden_well_with_categorical_columns(var_type, first, second):
    """The hidden well in a categorical column (or opened by one): the default lands in it
    as full rounds do, and within 1e-3 of brute force."""
    function = _hidden_pair(var_type, first, second)
    value, full, theta, _ = _both(function, var_type)
    _assert_default_as_full(value, full, var_type)
    brute = _brute_force(function, var_type, points=121 if len(var_type) == 2 else 41)
    assert value <= brute + 1e-3, (value, brute, theta)


@pytest.mark.parametrize(("var_type", "first", "second"), [("cc", 0, 1), ("cu", 1, 0)])
def test_hidden_well_under_float32_noise(var_type, first, second):
    """1e-7 relative noise (below ``config.LOO_RTOL``) changes no choice of the shortcut."""
    function = _noisy(_hidden_pair(var_type, first, second))
    value, full, _, _ = _both(function, var_type)
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, var_type, points=121) + 1e-3


@pytest.mark.parametrize(("var_type", "first", "second"), [("cc", 0, 1), ("cu", 1, 0)])
def test_hidden_well_on_plateaus(var_type, first, second):
    """The criterion quantised to 1e-3 (tied values: L-BFGS-B sees a zero gradient)."""
    base = _hidden_pair(var_type, first, second)

    def function(theta):
        return np.floor(base(theta) / 1e-3) * 1e-3

    value, full, _, _ = _both(function, var_type)
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, var_type, points=121) + 2e-3


def test_two_equal_hidden_wells_tie_the_same_way():
    """Two hidden wells of the same depth (at x = -3 and x = 3): several minima, the
    default picks the full rounds' value and repeats its own theta to the bit."""
    var_type = "cc"

    def function(theta):
        x, y = theta[..., 0], theta[..., 1]
        bowl = 1.0 + 0.01 * (x**2 + y**2)
        one = 0.5 * _well(y, 3.0, 0.2) * _well(x, 0.0, 0.5)
        two = (_well(x, -3.0, 0.2) + _well(x, 3.0, 0.2)) * _well(y, 3.0, 0.5)
        return bowl - one - two

    value, full, theta, _ = _both(function, var_type)
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, var_type) + 1e-3


# ---- infinite regions


def test_infinite_region_at_small_widths():
    """The criterion infinite below log h = -2.5 in the hidden column (no neighbours at
    small h), the hidden well at its edge: finite answers, the default as full rounds."""
    base = _hidden_pair("cc", 0, 1)

    def function(theta):
        return np.where(theta[..., 0] < -2.5, np.inf, base(theta))

    with np.errstate(invalid="ignore"):
        value, full, theta, _ = _both(function, "cc")
    assert math.isfinite(value) and theta[0] >= -2.5
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, "cc") + 1e-3


def test_infinite_wall_at_the_minimum():
    """A bowl whose floor lies beyond an infinite wall (log h > 2): the answer is at the
    wall, the default's within ``_RTOL`` of full rounds'."""

    def function(theta):
        x, y = theta[..., 0], theta[..., 1]
        value = 1.0 + 0.1 * (x - 3.0) ** 2 + 0.05 * y**2 - 0.2 * _well(y, 2.0, 0.4)
        return np.where(x > 2.0, np.inf, value)

    with np.errstate(invalid="ignore"):
        value, full, theta, _ = _both(function, "cc")
    _assert_default_as_full(value, full)
    assert theta[0] <= 2.0 and math.isclose(theta[0], 2.0, abs_tol=2e-3), theta


def test_infinite_band_in_a_categorical_column():
    """Shares of l / lambda_max in (0.3, 0.45) infinite: the hidden well in the
    categorical column is still found, the default as full rounds."""
    base = _hidden_pair("cu", 1, 0)

    def function(theta):
        share = _share(theta[..., 1])
        return np.where((share > 0.3) & (share < 0.45), np.inf, base(theta))

    with np.errstate(invalid="ignore"):
        value, full, _, _ = _both(function, "cu")
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, "cu", points=121) + 1e-3


# ---- the categorical ends: share 1 (t = 30) and exact matching (t = -inf)


def test_hidden_well_opened_at_the_top_of_a_categorical_range():
    """A continuous column's deep well opens only at l = lambda_max (t = 30, an
    irrelevant category), which the first round's categorical sweep reaches after the
    continuous column was swept: the default sweeps it again."""
    var_type = "cu"

    def function(theta):
        x, s = theta[..., 0], _share(theta[..., 1])
        return (
            1.0 + 0.01 * x**2 + 0.05 * (1.0 - s) - 1.0 * _well(x, -3.0, 0.2) * _well(s, 1.0, 0.02)
        )

    value, full, theta, _ = _both(function, var_type, _start(var_type, 0.3))
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, var_type, _start(var_type, 0.3), points=201) + 1e-3


def _exact_matching_curve(theta):
    """Columns (z, x, t), 'ccu': a well in z at 3; exact matching (t = -inf) gains 1e-2
    there (and costs 1e-3 elsewhere), and there only it opens a deep well in x at -3
    (the valley of ``_exact_match_subsets``: small h with l = 0 exactly, which no finite
    t reaches). A slope in l drives the descent's t down, to a share near 0 but finite."""
    z, x, t = theta[..., 0], theta[..., 1], theta[..., 2]
    exact = np.isneginf(t).astype(np.float64)
    in_z = _well(z, 3.0, 0.5)
    value = 1.0 + 0.001 * exact * (1.0 - in_z) + 0.01 * z**2 + 0.05 * x**2 + 0.01 * _share(t)
    return value - 0.3 * in_z - exact * in_z * (0.01 + _well(x, -3.0, 0.3))


def test_exact_matching_opens_a_well_that_a_finite_t_hides():
    var_type, start = "ccu", np.array([1.0, 1.0, 0.2])
    value, full, _, _ = _both(_exact_matching_curve, var_type, start)
    brute = _brute_force(_exact_matching_curve, var_type, start, points=57)
    assert full <= brute + 1e-3  # full rounds find the well
    _assert_default_as_full(value, full)


# ---- a continuous column's own move: its sweep's window moved with it


def _own_shift_curve(near, far):
    """Columns (x, y), 'cc': a steep bowl in y (so the common factor stays near 0), a
    well in x at ``near`` (within two decades of the start, where the first sweep of x
    lands) and a deeper one at ``far`` (beyond two decades of the start, within two
    decades of ``near``; the bounds reach it)."""

    def f(theta):
        x, y = theta[..., 0], theta[..., 1]
        return (
            1.0 + 0.5 * y**2 + 0.002 * x**2 - 0.3 * _well(x, near, 0.5) - 0.6 * _well(x, far, 0.3)
        )

    return f


@pytest.mark.parametrize(("near", "far"), [(3.0, 7.2), (-3.0, -6.5)])
def test_a_column_moved_by_its_own_sweep_is_swept_again(near, far):
    function = _own_shift_curve(near, far)
    value, full, _, _ = _both(function, "cc")
    assert full <= _brute_force(function, "cc", points=1611) + 1e-3
    _assert_default_as_full(value, full)


def test_an_isolated_well_beyond_every_window_is_missed_alike():
    """A well at log h = 8.5 that nothing leads to (no well on the way): beyond two
    decades of any base, both policies miss it the same way (the sweeps' design, not
    the shortcut's), and both keep the interior minimum."""
    function = _own_shift_curve(0.5, 8.5)

    def lone(theta):
        return function(theta) + 0.3 * _well(theta[..., 0], 0.5, 0.5)  # no near well

    value, full, theta, _ = _both(lone, "cc")
    _assert_default_as_full(value, full)
    assert full <= lone(np.array([0.0, 0.0]))
    assert _brute_force(lone, "cc", points=1611) < full - 0.1  # the missed well


# ---- chains of wells over three and four columns


def _chain(var_type, order, depth=1.0, wide=0.5, narrow=0.2):
    """Wells that open one after another: the well of column ``order[-1]`` is open from
    the start; each earlier column's well opens only while the next column of
    ``order`` sits in its well, each deeper than the last. Continuous wells at log h = 3
    or -3 (alternately), categorical ones at share 1/12 or 11/12."""
    centres, starts = {}, {}
    for rank, column in enumerate(order):
        if var_type[column] == "c":
            starts[column], centres[column] = 0.0, 3.0 if rank % 2 else -3.0
        else:
            starts[column] = 0.5 * _SHARE_SPAN
            centres[column] = _SHARE_SPAN * (11.0 if rank % 2 else 1.0) / 12.0

    def f(theta):
        p = _positions(theta, var_type)
        value = 1.0 + sum(0.01 * (p[j] - starts[j]) ** 2 for j in range(len(var_type)))
        for rank, column in enumerate(order):
            gate = 1.0
            if rank + 1 < len(order):
                gate = _well(p[order[rank + 1]], centres[order[rank + 1]], wide)
            value = (
                value
                - depth * (len(order) - rank) * _well(p[column], centres[column], narrow) * gate
            )
        return value

    return f


@pytest.mark.parametrize(
    ("var_type", "order"),
    [("ccc", (0, 1, 2)), ("cuc", (0, 1, 2)), ("ccu", (0, 1, 2)), ("cuo", (0, 2, 1))],
)
def test_a_chain_of_three_wells_in_three_rounds(var_type, order):
    """Three wells that open one after another in the columns' sweep order reversed: each
    round opens one, and the third round reaches the deepest (the design's limit,
    ``_SWEEPS = 3``); the default as full rounds, and at brute force's value."""
    function = _chain(var_type, order)
    value, full, _, _ = _both(function, var_type)
    _assert_default_as_full(value, full)
    assert value <= _brute_force(function, var_type, points=57) + 1e-2


@pytest.mark.parametrize("length", [4, 5])
def test_longer_chains(length):
    """Four and five wells in a chain: the descents before the sweeps open the first link
    (the common factor lands in the last column's well), so four links fit in three
    rounds; five do not, for either policy. The default stops where full rounds stop;
    the chain's floor (every column in its well) is known."""
    var_type = "c" * length
    function = _chain(var_type, tuple(range(length)))
    value, full, _, _ = _both(function, var_type)
    _assert_default_as_full(value, full)
    assert full <= value + _RTOL * abs(value)  # the same value either way
    floor = 1.0 + 0.09 * length - sum(range(1, length + 1))
    assert math.isclose(function(np.array([3.0 if k % 2 else -3.0 for k in range(length)])), floor)
    if length == 4:
        assert value <= floor + 1e-3
    else:
        assert value > floor + 1.0  # the fifth link is beyond _SWEEPS rounds


# ---- random curves: sums of wells, some wide in some columns


def _random_curve(seed, var_type, wells=4, quantum=0.0, noise=0.0, wall=False):
    rng = np.random.default_rng(seed)
    d = len(var_type)
    terms = []
    for _ in range(wells):
        centre = np.array(
            [rng.uniform(-6, 8) if k == "c" else rng.uniform(0, _SHARE_SPAN) for k in var_type]
        )
        width = rng.uniform(0.2, 1.0, d)
        width[rng.random(d) < 0.4] = 50.0
        terms.append((rng.uniform(0.2, 1.0), centre, width))
    bowl = rng.uniform(0.001, 0.02, d)
    middle = np.array(
        [rng.uniform(-1, 1) if k == "c" else rng.uniform(0, _SHARE_SPAN) for k in var_type]
    )

    def f(theta):
        p = _positions(theta, var_type)
        value = 2.0 + sum(bowl[j] * (p[j] - middle[j]) ** 2 for j in range(d))
        for depth, centre, width in terms:
            value = value - depth * np.exp(
                -sum((p[j] - centre[j]) ** 2 / (2 * width[j] ** 2) for j in range(d))
            )
        if quantum:
            value = np.floor(value / quantum) * quantum
        if wall:
            value = np.where(p[0] > 2.0, np.inf, value)
        return value

    return _noisy(f, noise) if noise else f


_RANDOM_SEEDS = 12


@pytest.mark.parametrize("var_type", ["cu", "uc", "co", "cuo", "ccu"])
def test_random_curves_with_categorical_columns(var_type):
    """Random sums of wells: the default never above full rounds by more than ``_RTOL``
    (it gained nothing on 100 seeds each in review; here a few)."""
    start = _start(var_type, 0.3)
    for seed in range(_RANDOM_SEEDS):
        value, full, _, _ = _both(_random_curve(seed, var_type), var_type, start)
        _assert_default_as_full(value, full, seed)


def test_random_curves_with_noise_and_six_wells():
    for var_type, seed in [("cuo", 1), ("ccc", 2), ("cccu", 3), ("ccc", 5)]:
        function = _random_curve(seed, var_type, wells=6, noise=1e-7)
        value, full, _, _ = _both(function, var_type, _start(var_type, 0.3))
        _assert_default_as_full(value, full, (var_type, seed))


@pytest.mark.parametrize("seed", [3, 11, 46])
def test_random_two_continuous_columns(seed):
    value, full, _, _ = _both(_random_curve(seed, "cc"), "cc", _start("cc"))
    _assert_default_as_full(value, full, seed)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a gain finer than one grid step that only a re-run of the sweep's Brent "
        "refinement finds: one step either side gains nothing, the other column moved "
        "0.6 of a step; quantum 0.01 'cu' seed 42: default 1.00 (142 evaluations) vs full "
        "rounds 0.99 (244), x moved 0.09; an infinite wall 'cu' seed 45: 0.6988063 (151) "
        "vs 0.6987098 (260), 1.4e-4 relative, x 3e-4 nearer the wall. Beyond what "
        "one-step probes can see"
    ),
)
@pytest.mark.parametrize(("seed", "options"), [(42, {"quantum": 0.01}), (45, {"wall": True})])
def test_random_gains_finer_than_the_grid(seed, options):
    function = _random_curve(seed, "cu", **options)
    with np.errstate(invalid="ignore"):
        value, full, _, _ = _both(function, "cu", _start("cu", 0.3))
    _assert_default_as_full(value, full, seed)
