"""Leave-one-out widths of a classifier: the log-loss of class probabilities smoothed
towards the class frequencies.

A Nadaraya-Watson classifier's probabilities ``P(c | x) = sum_j p_j(x) [y_j = c]`` are
the class shares of the kernel mass around x, however little mass there is: a query
far from every key, or a left-out row at a width far below the data's resolution, is
given its nearest key's class with probability 1. A width search by the squared error
(the Brier score) is content with that: on a table measured to 0.1 it can choose
widths of 0.005, each left-out row then decided by its one nearest neighbour with
certainty. Here the probabilities are smoothed towards the class frequencies pi by a
prior of ``alpha`` rows' worth of kernel mass (a Dirichlet prior),

    P_alpha(c | x) = (S_c(x) + alpha pi_c) / (S(x) + alpha),
    S_c(x) = sum_j s_j K(x, x_j) [y_j = c],   S(x) = sum_c S_c(x),

with K the product kernel (1 at a key's own point for continuous columns, 1 - lambda
for a categorical column's own level) and s_j the sample weights divided by their
mean (1 without weights), so S counts rows: where a query has many keys near it the
prior is nothing, where it has none the answer is pi. Equivalently
``P_alpha = (1 - m) P + m pi`` with the prior's share ``m = alpha / (S + alpha)``.
The frequencies are Laplace's, ``pi_c = (N_c + 1) / (n + K)`` with N_c the rows (weights
over their mean) of class c among n, K classes: never 0, even for a class whose weight
is 1e-300 of another's.

The widths minimise the leave-one-out **log-loss** of these probabilities, alpha
learned with them (the profile over alpha at each width):

    CV(theta) = min over alpha of  - sum_i u_i log P_alpha,-i(y_i | x_i),

u_i = s_i / sum s the terms' weights and P_-i the fit that leaves row i out: its mass
S_-i and its frequencies ``pi_-i`` too (``(N_c - [y_i = c] r_i + 1) / (n - r_i + K)``,
r_i row i's weight over the mean). The log-loss is a proper scoring rule that punishes
certainty: at widths below the resolution S_-i(x_i) vanishes and every left-out row
gets the others' frequencies pi_-i, exactly what the widest widths give, so a width
below the resolution never scores better than ignoring x (had pi counted row i's own
label, it would, by about K / n, and a search on labels unrelated to x would end there).
alpha stays within ``[ALPHA_LOW, ALPHA_HIGH_PER_ROW * n_eff]`` (n_eff Kish's effective
number of rows), so no probability is ever exactly 0 and the criterion is finite at
every width. alpha at ALPHA_LOW means the data want no more prior than that floor
(the usual case on tables whose rows have neighbours).

The search is the engine's (:func:`nbattn.local.search.search_widths`) without its
gradient descents (the mass S has no gradient pass): the rule, one common factor of
every h (``"loo_scale"`` stops there), then exact matching in the categorical columns
and sweeps of each width alone (``"loo"``), then a Nelder-Mead polish across all the
widths together (:func:`nbattn.local.search.polish_without_gradient`: the sweeps move
one width at a time and stall in a valley across two, as with two nearly collinear
columns), keeping the best point ever evaluated, so the answer is never worse on this
criterion than the rule's widths (with their own best alpha). Two guards against a
search that chooses by chance among hundreds of candidates, each found on labels
unrelated to x:

* **the fence**: widths at which the median left-out row has less than one other row's
  worth of kernel mass (or less than at the rule's widths, where that is less) are not
  searched: there the criterion rests on the few rows that happen to have a neighbour,
  and the search picks the widths at which those few agree;
* **per-column widths must earn their place**: they replace the common factor's only
  when their criterion is lower by ``PER_COLUMN_Z`` standard errors of the rows'
  differences.

On small tables with many columns per-column widths still overfit more often than one
factor does (as R np's do); compare both by cross-validation (``nbattn cv --grid
loo,loo_scale``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import config
from .._core.progress import FitProgress
from .engine import fit_problem, loo_term_weights
from .problem import LocalSpec, rule_widths
from .search import polish_without_gradient
from .widths import (
    LooCriterion,
    _training_problem,
    search_widths,
    theta_to_widths,
    widths_to_theta,
)

__all__ = [
    "ALPHA_HIGH_PER_ROW",
    "ALPHA_LOW",
    "class_counts",
    "class_frequencies",
    "class_loo_widths",
    "log_mean_weight",
    "prior_share",
    "smoothed_probabilities",
]

#: The smallest prior alpha, in rows of kernel mass: no probability is below
#: ``ALPHA_LOW pi_c / (n + ALPHA_LOW)``.
ALPHA_LOW = 1e-3
#: The largest alpha per effective row: there the prior holds every probability at pi.
ALPHA_HIGH_PER_ROW = 1e3
#: Per-column widths replace the common factor's only when their criterion is lower by
#: this many standard errors of the rows' differences.
PER_COLUMN_Z = 2.0
#: Steps of the grid in log alpha before the golden-section refinement.
_LOG_ALPHA_STEP = 0.5
_GOLDEN_STEPS = 30
#: The polish stops once its simplex spans less than this in every log h (1 % of h) and
#: less than ``config.LOO_RTOL`` of the criterion: on scikit-learn's iris and breast
#: cancer tables that keeps nearly all of its gain for a third of its evaluations.
_POLISH_XATOL = 1e-2


def class_counts(Y, sample_weight=None) -> tuple[np.ndarray, np.ndarray]:
    """``(r, N)``: each row's weight over the mean weight r (n,) (ones without weights) and
    the rows of each class ``N_c = sum_i r_i [y_i = c]`` (n_classes,), of one-hot rows Y."""
    Y = np.asarray(Y, dtype=np.float64)
    n = Y.shape[0]
    rows = loo_term_weights(sample_weight, n) * n
    return rows, rows @ Y


def class_frequencies(Y, sample_weight=None) -> np.ndarray:
    """Laplace's class frequencies ``pi_c = (N_c + 1) / (n + K)`` (n_classes,) of one-hot
    rows Y (n, K) (:func:`class_counts`): positive, summing to 1."""
    _, counts = class_counts(Y, sample_weight)
    return (counts + 1.0) / (counts.sum() + counts.size)


def log_mean_weight(sample_weight) -> float:
    """log of the mean sample weight (0 without weights): the unit of the kernel mass."""
    if sample_weight is None:
        return 0.0
    w = np.asarray(sample_weight, dtype=np.float64)
    top = float(w.max())
    return math.log(top) + math.log(float((w / top).mean()))


def prior_share(log_alpha, log_mass) -> np.ndarray:
    """``m = alpha / (S + alpha)``, the prior's share of the probabilities, from log alpha
    and log S (-inf where there is no mass: m = 1), without overflow."""
    x = np.asarray(log_alpha - np.asarray(log_mass, dtype=np.float64))
    e = np.exp(-np.abs(x))  # in (0, 1]: no overflow on either side
    return np.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))


def smoothed_probabilities(proba, log_mass, log_alpha, prior) -> np.ndarray:
    """``(1 - m) P + m pi`` for probabilities P (n, n_classes), log S (n,), log alpha and
    the class frequencies pi (module docstring)."""
    share = prior_share(log_alpha, log_mass)[:, None]
    return (1.0 - share) * proba + share * prior


def _log_loss_curve(own, prior, log_mass, weights, log_alphas) -> np.ndarray:
    """``-sum_i u_i log((1 - m_i) a_i + m_i b_i)`` at each log alpha (k,)."""
    share = prior_share(log_alphas[None, :], log_mass[:, None])
    p = own[:, None] + share * (prior - own)[:, None]
    return -(weights @ np.log(p))


def best_log_alpha(own, prior, log_mass, weights, low, high) -> tuple[float, float]:
    """``(log alpha, loss)`` minimising the smoothed log-loss over log alpha in
    ``[low, high]``: a grid of step ``_LOG_ALPHA_STEP``, then golden-section search
    between the best grid point's neighbours (deterministic; the loss need not be
    convex in alpha, so the grid finds the basin first). ``own`` a_i: each row's
    leave-one-out probability of its class; ``prior`` b_i > 0 its class frequency;
    ``log_mass`` log S_-i(x_i); ``weights`` u_i."""
    grid = np.linspace(low, high, max(3, int(math.ceil((high - low) / _LOG_ALPHA_STEP)) + 1))
    curve = _log_loss_curve(own, prior, log_mass, weights, grid)
    k = int(np.argmin(curve))
    best_t, best_v = float(grid[k]), float(curve[k])
    if k in (0, grid.size - 1):
        return best_t, best_v  # the loss still falls towards an end of the range: stop there

    def at(t):
        return float(_log_loss_curve(own, prior, log_mass, weights, np.array([t]))[0])

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = float(grid[k - 1]), float(grid[k + 1])
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    vc, vd = at(c), at(d)
    for _ in range(_GOLDEN_STEPS):
        if vc <= vd:
            b, d, vd = d, c, vc
            c = b - ratio * (b - a)
            vc = at(c)
        else:
            a, c, vc = c, d, vd
            d = a + ratio * (b - a)
            vd = at(d)
    for t, v in ((c, vc), (d, vd)):
        if v < best_v:
            best_t, best_v = t, v
    return best_t, best_v


def _median_mass(log_mass) -> float:
    return float(np.exp(np.median(log_mass)))


class LogLossCriterion(LooCriterion):
    """The smoothed leave-one-out log-loss of one-hot targets (module docstring) on the
    engine's leave-one-out problem, profiled over alpha; no gradient."""

    pools_ties = False  # its criterion reads the plain pass's fits

    has_gradient = False

    def __init__(self, problem):
        super().__init__(problem)
        codes = np.argmax(self.targets, axis=1)
        self.rows, self.codes = np.arange(codes.size), codes
        # each row's frequency of its own class among the others: pi_-i,y_i
        rows, counts = class_counts(self.targets, problem.sample_weight)
        own = counts[codes] - rows
        self.prior = (np.maximum(own, 0.0) + 1.0) / (counts.sum() - rows + counts.size)
        self.log_unit = log_mean_weight(problem.sample_weight)
        n_eff = 1.0 / float(self.loo_weights @ self.loo_weights)
        self.alpha_range = (math.log(ALPHA_LOW), math.log(ALPHA_HIGH_PER_ROW * n_eff))
        self.best_log_alpha = self.alpha_range[0]
        self.fence = None

    def _fits(self, theta):
        """(a_i, log S_-i(x_i)): each left-out row's probability of its class, its mass."""
        beta, _, shift, log_norm, _, _ = fit_problem(self.problem_at(theta))
        own = np.clip(beta[self.rows, 0, self.codes], 0.0, 1.0)
        with np.errstate(invalid="ignore"):  # -inf + -inf: no key, no mass
            log_mass = np.where(log_norm > -np.inf, shift + log_norm - self.log_unit, -np.inf)
        return own, log_mass

    def profile(self, theta) -> tuple[float, float]:
        """``(CV(theta), log alpha)`` at the widths theta; +inf below the fence."""
        own, log_mass = self._fits(theta)
        if self.fence is not None and _median_mass(log_mass) < self.fence:
            return math.inf, self.alpha_range[0]
        log_alpha, value = best_log_alpha(
            own, self.prior, log_mass, self.loo_weights, *self.alpha_range
        )
        return value, log_alpha

    def row_losses(self, theta) -> np.ndarray:
        """Each left-out row's log-loss at theta and its best alpha (n,)."""
        log_alpha = self.profile(theta)[1]
        own, log_mass = self._fits(theta)
        return -np.log(own + prior_share(log_alpha, log_mass) * (self.prior - own))

    def set_fence(self, theta):
        """The fence: widths whose median left-out mass is below one row, or below the mass
        at ``theta`` (the rule's widths) where that is less, are not searched."""
        self.fence = min(1.0, _median_mass(self._fits(theta)[1]))

    def better_by_a_standard_error(self, theta, other, z=1.0) -> bool:
        """Whether CV(theta) is below CV(other) by more than z standard errors of the
        weighted mean of the rows' differences."""
        d = self.row_losses(theta) - self.row_losses(other)
        u = self.loo_weights
        mean = float(u @ d)
        return mean < -z * math.sqrt(float((u * u) @ ((d - mean) ** 2)))

    def _value(self, theta) -> float:
        """CV(theta) profiled over alpha; a new best point's alpha is kept with it."""
        value, log_alpha = self.profile(theta)
        if math.isfinite(value) and value < self.best[0]:
            self.best_log_alpha = log_alpha
        return value

    def best_detail(self) -> str:
        return f" and prior alpha {math.exp(self.best_log_alpha):.4g} rows"

    def loss_and_grad(self, theta):
        raise NotImplementedError("the smoothed log-loss has no gradient pass")


def class_loo_widths(
    spec: LocalSpec, X, Y, *, sample_weight=None, init=None, per_column=True, verbose=0
) -> tuple[np.ndarray, float]:
    """``(widths, alpha)`` minimising the smoothed leave-one-out log-loss of the
    Nadaraya-Watson class probabilities of one-hot rows Y (n, n_classes) over checked
    training data X (module docstring).

    ``init``: the starting widths (the rule's by default; the weighted rule's with sample
    weights is the caller's to give). ``per_column=False``: one common factor of every
    continuous h, the categorical lambda at the start's (``bandwidth="loo_scale"``);
    otherwise every width on its own (``"loo"``). ``verbose``: a line per evaluation
    (:class:`nbattn._core.progress.FitProgress`).
    """
    start = rule_widths(spec, X) if init is None else init
    criterion = LogLossCriterion(_training_problem(spec, X, Y, 0, sample_weight, start))
    criterion.set_fence(widths_to_theta(start, spec.var_type, spec.n_categories))
    with FitProgress(verbose, "class_loo_widths", unit="evaluation") as criterion.log:
        theta = search_widths(criterion, start, per_column=False)
        if per_column:
            scaled = theta
            found = search_widths(criterion, start, per_column=True)
            theta = polish_without_gradient(
                criterion,
                widths_to_theta(start, spec.var_type, spec.n_categories),
                xatol=_POLISH_XATOL,
                rtol=config.LOO_RTOL,
                start=found,
            )
            if not criterion.better_by_a_standard_error(theta, scaled, PER_COLUMN_Z):
                theta = scaled
    if spec.rtol > 0.0:
        theta, criterion = _better_exactly(criterion, theta, start, spec)
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    return widths, math.exp(criterion.profile(theta)[1])


def _better_exactly(criterion, found, start, spec):
    """``(theta, exact criterion)``: of the search's point and the start, the one of lower
    smoothed log-loss computed exactly (rtol = 0), so that a search on the pruned
    criterion is never worse than the start; the start wins ties."""
    exact = LogLossCriterion(
        dataclasses.replace(criterion.base, spec=dataclasses.replace(spec, rtol=0.0))
    )
    rule = widths_to_theta(start, spec.var_type, spec.n_categories)
    if exact.profile(found)[0] < exact.profile(rule)[0]:
        return found, exact
    return rule, exact
