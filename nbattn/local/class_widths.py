"""Leave-one-out widths of a classifier: the log-loss of class probabilities smoothed
towards the class frequencies.

A Nadaraya-Watson classifier's probabilities ``P(c | x) = sum_j p_j(x) [y_j = c]`` are
the class shares of the kernel mass around x, however little mass there is: a query
far from every key, or a left-out row at a width far below the data's resolution, is
given its nearest key's class with probability 1. A width search by the squared error
(the Brier score) is content with that: on a table measured to 0.1 it can choose
widths of 0.005, each left-out row then decided by its one nearest neighbour with
certainty. Here the probabilities are smoothed towards the (weighted) class
frequencies pi by a prior of ``alpha`` rows' worth of kernel mass (a Dirichlet prior),

    P_alpha(c | x) = (S_c(x) + alpha pi_c) / (S(x) + alpha),
    S_c(x) = sum_j s_j K(x, x_j) [y_j = c],   S(x) = sum_c S_c(x),

with K the product kernel (1 at a key's own point for continuous columns, 1 - lambda
for a categorical column's own level) and s_j the sample weights divided by their
mean (1 without weights), so S counts rows: where a query has many keys near it the
prior is nothing, where it has none the answer is pi. Equivalently
``P_alpha = (1 - m) P + m pi`` with the prior's share ``m = alpha / (S + alpha)``.

The widths minimise the leave-one-out **log-loss** of these probabilities, alpha
learned with them (the profile over alpha at each width):

    CV(theta) = min over alpha of  - sum_i u_i log P_alpha,-i(y_i | x_i),

u_i = s_i / sum s the terms' weights and P_-i the fit that leaves row i out (its
mass S_-i too). The log-loss is a proper scoring rule that punishes certainty: at
widths below the resolution S_-i(x_i) vanishes, every left-out row gets pi, and the
criterion is the entropy of the classes, not near 0. alpha stays within
``[ALPHA_LOW, ALPHA_HIGH_PER_ROW * n_eff]`` (n_eff Kish's effective number of rows), so
no probability is ever exactly 0 and the criterion is finite at every width. pi
includes row i itself (a prior; leaving it out would make a class of one row
impossible), a difference of order alpha / n.

The search is the engine's (:func:`nbattn.local.widths.search_widths`) without its
gradient descents (the mass S has no gradient pass): the rule, one common factor of
every h, exact matching in the categorical columns, then sweeps of each width alone,
keeping the best point ever evaluated, so the answer is never worse on this criterion
than the rule's widths (with their own best alpha).
"""

from __future__ import annotations

import math

import numpy as np

from .._core.progress import FitProgress
from .engine import fit_problem, loo_term_weights
from .problem import LocalSpec, rule_widths
from .widths import _Criterion, _training_problem, search_widths, theta_to_widths

__all__ = [
    "ALPHA_HIGH_PER_ROW",
    "ALPHA_LOW",
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
#: Steps of the grid in log alpha before the golden-section refinement.
_LOG_ALPHA_STEP = 0.5
_GOLDEN_STEPS = 30


def class_frequencies(Y, sample_weight=None) -> np.ndarray:
    """The (weighted) class frequencies pi (n_classes,) of one-hot rows Y (n, n_classes):
    ``pi_c = sum_i w_i [y_i = c] / sum_i w_i``, each row's weight as in the criterion
    (:func:`nbattn.local.engine.loo_term_weights`)."""
    Y = np.asarray(Y, dtype=np.float64)
    return loo_term_weights(sample_weight, Y.shape[0]) @ Y


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


class LogLossCriterion(_Criterion):
    """The smoothed leave-one-out log-loss of one-hot targets (module docstring) on the
    engine's leave-one-out problem, profiled over alpha; no gradient."""

    has_gradient = False

    def __init__(self, problem):
        super().__init__(problem)
        codes = np.argmax(self.targets, axis=1)
        self.rows, self.codes = np.arange(codes.size), codes
        self.prior = (self.loo_weights @ self.targets)[codes]  # pi_{y_i}: class_frequencies
        self.log_unit = log_mean_weight(problem.sample_weight)
        n_eff = 1.0 / float(self.loo_weights @ self.loo_weights)
        self.alpha_range = (math.log(ALPHA_LOW), math.log(ALPHA_HIGH_PER_ROW * n_eff))

    def profile(self, theta) -> tuple[float, float]:
        """``(CV(theta), log alpha)`` at the widths theta."""
        beta, _, shift, log_norm, _, _ = fit_problem(self.problem_at(theta))
        own = np.clip(beta[self.rows, 0, self.codes], 0.0, 1.0)
        with np.errstate(invalid="ignore"):  # -inf + -inf: no key, no mass
            log_mass = np.where(log_norm > -np.inf, shift + log_norm - self.log_unit, -np.inf)
        log_alpha, value = best_log_alpha(
            own, self.prior, log_mass, self.loo_weights, *self.alpha_range
        )
        return value, log_alpha

    def loss(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        key = theta.tobytes()
        if key in self.cache:
            return self.cache[key]
        self.n_loss += 1
        value = self.profile(theta)[0]
        value = value if math.isfinite(value) else math.inf
        self.cache[key] = value
        self._record(value, theta)
        return value

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
    with FitProgress(verbose, "class_loo_widths", unit="evaluation") as criterion.log:
        theta = search_widths(criterion, start, per_column=per_column)
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    return widths, math.exp(criterion.profile(theta)[1])
