"""Kernel density and joint distribution function of mixed data (statsmodels'
``KDEMultivariate``, R np's ``npudens`` and ``npudist``), as the normaliser of the pooling.

With keys k_j (the training rows), weights w_j and W = sum_j w_j, the density at q is

    f(q) = 1/W sum_j w_j prod_c K((q_c - k_jc) / h_c) / (kappa h_c) prod_k L_k(q_k, k_jk)
         = exp(lse_j s_j(q)) / (W prod_c kappa h_c),

s_j(q) the engine's score of the pair (:mod:`nbattn.local.engine`: log K without its
constant, the logs of the categorical kernels L_k, log w_j) and kappa the constant that
makes K integrate to 1: sqrt(2 pi) for the Gaussian, 4/3 for the Epanechnikov kernel
(1 - u^2), 81/70 for the tricube (1 - |u|^3)^3 (statsmodels' scaling: h is the
half-width of a compact kernel's support). The categorical kernels are Aitchison-Aitken
(unordered: 1 - l if equal, l / (c - 1) otherwise) and Wang-van Ryzin (ordered: 1 - l if
equal, (1 - l) / 2 l^|x - y| otherwise), statsmodels' and np's, so the same widths give
statsmodels' density where the categories are coded alike. nbattn's codes are the ranks
0 .. c - 1 of a column's categories and c counts the categories (a pandas category
dtype's levels, used or not; else the distinct values), where statsmodels measures an
ordered column's distances on its values and counts the levels present: ordered values
with gaps (1, 2, 5) or unused levels give other densities there.

The engine keeps the softmax's running maximum and the log of its normaliser, so log f
is exact where f itself underflows (a query far from every key) and at any magnitude of
the data; ``rtol > 0`` prunes keys whose weight is certified
small, each normaliser then within ``rtol`` of itself (``docs/ARCHITECTURE.md``,
"Tolerances"), so f within ``rtol`` relative.

The joint CDF F(q) = 1/W sum_j w_j prod_c G((q_c - k_jc) / h_c) prod_k C_k(q_k, k_jk)
integrates each continuous kernel (G) and sums each categorical one over the codes up to
q_k (C_k), statsmodels' convention (unordered columns included):
:mod:`nbattn.kernels.density` (or its GPU twin, ``device``) computes it in log space,
exactly (no rtol).

Widths: an array in column order (h for 'c', l for 'u' and 'o'), or a rule:
``"normal_reference"`` (statsmodels' 1.06 sigma n^(-1/(4+d)), sigma the standard deviation
with ddof 0, d all the columns) and ``"silverman"`` (sigma (n (d + 2) / 4)^(-1/(d+4)), the
regressors' rule) for the continuous columns; categorical columns get
``nbattn.local.problem.rule_lambdas`` under either rule (statsmodels applies the continuous
rule to the category codes, which can put l outside its kernel's range).
``"cv_ml"`` (the leave-one-out likelihood) is :mod:`nbattn.distribution.density_widths`.
"""

from __future__ import annotations

import math

import numpy as np

from .._core.local_groups import KERNEL_CODES, ORDERED, UNORDERED
from .._core.threads import serial_below
from .._core.validation import check_choice
from ..dispatch.device import kernels_for
from ..local.engine import fit_problem
from ..local.neighbours import query_log_stretch, refuse_stretched
from ..local.problem import (
    LocalProblem,
    LocalSpec,
    check_columns,
    check_sample_weight,
    check_widths,
    layout,
    rule_lambdas,
)
from ..smoothing.regression import (
    BANDWIDTH_RULES,
    effective_size,
    feature_spread,
    weighted_spread,
)

__all__ = [
    "DENSITY_RULES",
    "KERNEL_LOG_CONSTANTS",
    "density_layout",
    "density_rule_widths",
    "kernel_cdf",
    "kernel_density",
    "log_cdf_of",
    "log_density_of",
    "log_kernel_sums_of",
    "log_weight_sums",
    "sample_rows",
    "score_means",
    "score_means_of",
]

#: The width rules of the densities by name (statsmodels' names).
DENSITY_RULES = ("normal_reference", "silverman")

#: log kappa per continuous kernel: K(u) / kappa integrates to 1 (module docstring).
KERNEL_LOG_CONSTANTS = {
    "gaussian": 0.5 * math.log(2.0 * math.pi),
    "epanechnikov": math.log(4.0 / 3.0),
    "tricube": math.log(81.0 / 70.0),
}

#: statsmodels' factor of the normal reference rule (Scott's, for the Gaussian kernel).
_NORMAL_REFERENCE = 1.06


def density_rule_widths(spec: LocalSpec, X, rule: str, sample_weight=None) -> np.ndarray:
    """Per-column widths of a rule on checked data X (n, d) (module docstring). With
    sample weights: the weighted spread and Kish's effective number of rows
    (``nbattn.smoothing.regression.weighted_spread``, ``effective_size``), so that the
    widths do not depend on the weights' total."""
    if rule not in DENSITY_RULES:
        raise ValueError(f"bandwidth rule must be one of {list(DENSITY_RULES)}, got {rule!r}")
    n, d = X.shape
    cont = spec.continuous
    if sample_weight is None:
        n_eff = float(n)
        sigma = feature_spread(X[:, cont], ddof=0, name="X", columns=np.flatnonzero(cont))
    else:
        n_eff = effective_size(sample_weight)
        sample = weighted_spread(X[:, cont], sample_weight)  # ddof 1 in Kish's rows
        sigma = sample * math.sqrt(max(n_eff - 1.0, 0.0) / n_eff)
    rule_name = "scott" if rule == "normal_reference" else rule
    out = rule_lambdas(spec.var_type, spec.n_categories, n_eff, rule_name)
    if cont.any():
        sigma = np.where(sigma > 0, sigma, 1.0)  # a constant column: unit spread
        rows = max(n_eff, 2.0)
        if rule == "normal_reference":
            h = _NORMAL_REFERENCE * sigma * rows ** (-1.0 / (4.0 + d))
        else:
            h = BANDWIDTH_RULES["silverman"](rows, d) * sigma
        tiny = np.flatnonzero(h < np.finfo(np.float64).tiny)
        if tiny.size:
            column = int(np.flatnonzero(cont)[tiny[0]])
            raise ValueError(
                f"X column {column} has a spread of {sigma[tiny[0]]:.3g}: its {rule} width "
                f"{h[tiny[0]]:.3g} is below the smallest normal float64; rescale that column"
            )
        out[cont] = h
    return out


def log_weight_sums(sample_weight, n, exclude_self=False) -> np.ndarray:
    """log W, the keys' total weight (n if unweighted), as a (1,) array; with
    ``exclude_self`` log W₋ᵢ = log sum_{j != i} w_j per row (n,), summed from both ends
    (no cancellation when w_i is most of W) after the largest weight is brought near 1
    (exact: no overflow near 1e308, no underflow near 5e-324). -inf where no weight is
    left."""
    if sample_weight is None:
        total = float(n - 1) if exclude_self else float(n)
        with np.errstate(divide="ignore"):
            return np.full(n if exclude_self else 1, math.log(total) if total > 0 else -math.inf)
    w = np.asarray(sample_weight, dtype=np.float64)
    top = float(w.max())
    unit = w / top
    if not exclude_self:
        return np.array([math.log(top) + math.log(float(unit.sum()))])
    before = np.concatenate(([0.0], np.cumsum(unit)[:-1]))
    after = np.concatenate((np.cumsum(unit[::-1])[::-1][1:], [0.0]))
    with np.errstate(divide="ignore"):
        return math.log(top) + np.log(before + after)


def density_layout(
    spec: LocalSpec, queries, keys, widths, sample_weight=None, exclude_self=False
) -> LocalProblem:
    """The engine's problem of a density (degree 0, no values to pool) on checked data."""
    return layout(
        spec,
        queries,
        keys,
        np.zeros(keys.shape[0]),
        widths,
        0,
        sample_weight=sample_weight,
        exclude_self=exclude_self,
    )


def log_density_of(problem: LocalProblem, fit=None) -> np.ndarray:
    """log f at the problem's queries (n_q,) (leave-one-out when it excludes self):
    lse_j s_j - log W - sum_c log(kappa h_c) (module docstring); -inf where no key has
    weight (compact kernels out of reach, exact matching of an unseen cell). ``fit``: the
    engine's first pass on the problem, when the caller has it."""
    fit = fit_problem(problem) if fit is None else fit
    n = problem.log_weights.shape[0]
    log_total = log_weight_sums(problem.sample_weight, n, problem.exclude_self)
    constant = (
        float(np.sum(np.log(problem.h)))
        + problem.h.size * KERNEL_LOG_CONSTANTS[problem.spec.kernel]
    )
    reached = (fit.log_norm > -np.inf) & (log_total > -np.inf)
    with np.errstate(invalid="ignore"):
        value = fit.shift + fit.log_norm - log_total - constant
        value = value + query_log_stretch(problem.q_stretch)
    return np.where(reached, value, -np.inf)


def log_kernel_sums_of(problem: LocalProblem, cont_integrated, cat_integrated) -> np.ndarray:
    """log sum_j w_j prod (each column's kernel, or its integral where flagged) at the
    problem's queries (n_q,): :func:`nbattn.kernels.density.log_kernel_sums` (kernels
    without their constants), or its GPU twin on the spec's device."""
    spec = problem.spec
    refuse_stretched(problem, "distribution functions and quantiles")
    kinds, lambdas, counts = _categorical_columns(spec, problem.widths)
    module = kernels_for("density", spec.device)
    n_q, n_k = problem.q_cont.shape[0], problem.log_weights.shape[0]
    with serial_below(n_q * n_k, 20_000):
        return module.log_kernel_sums(
            problem.q_cont,
            problem.keys_cont_t,
            problem.q_cat,
            problem.keys_cat_t,
            np.asarray(cont_integrated, dtype=np.bool_),
            np.asarray(cat_integrated, dtype=np.bool_),
            problem.cat_params,
            kinds,
            lambdas,
            counts,
            problem.log_weights,
            KERNEL_CODES[spec.kernel],
        )


def score_means_of(problem: LocalProblem, cat_dparams, gradient: bool = True):
    """``(log_sums, means)`` at the problem's queries: log sum_j exp(s_j) (n_q,) and the
    softmax mean of the score's derivatives with respect to the widths' parameters
    (n_q, d), continuous columns first (:func:`nbattn.kernels.density.log_sums_and_score_means`;
    ``cat_dparams`` (dk, 3) the derivatives of the categorical terms; ``gradient=False``:
    the sums alone, ``means`` 0). Exact, on the CPU whatever the spec's device (the
    ``"cv_ml"`` search's gradient: no GPU twin)."""
    return score_means(
        problem.q_cont,
        problem.keys_cont_t,
        problem.q_cat,
        problem.keys_cat_t,
        problem.cat_params,
        cat_dparams,
        problem.log_weights,
        problem.spec.kernel,
        problem.exclude_self,
        gradient,
    )


def score_means(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    cat_dparams,
    log_weights,
    kernel: str,
    exclude_self: bool,
    gradient: bool = True,
):
    """:func:`score_means_of` on a layout's arrays (C-contiguous float64 / int64, as a
    :class:`~nbattn.local.problem.LocalProblem` holds them), ``kernel`` by name: the
    ``"cv_ml"`` criterion's evaluations without a problem object each."""
    module = kernels_for("density", "cpu")
    n_q, n_k = q_cont.shape[0], log_weights.shape[0]
    with serial_below(n_q * n_k, 20_000):
        return module.log_sums_and_score_means(
            q_cont,
            keys_cont_t,
            q_cat,
            keys_cat_t,
            cat_params,
            np.ascontiguousarray(cat_dparams, dtype=np.float64).reshape(-1, 3),
            log_weights,
            KERNEL_CODES[kernel],
            bool(exclude_self),
            bool(gradient),
        )


def log_cdf_of(problem: LocalProblem) -> np.ndarray:
    """log F, the joint CDF, at the problem's queries (n_q,): every column integrated
    (:func:`log_kernel_sums_of`), less log W."""
    dc, dk = problem.keys_cont_t.shape[0], problem.keys_cat_t.shape[0]
    log_sum = log_kernel_sums_of(problem, np.ones(dc, bool), np.ones(dk, bool))
    log_total = log_weight_sums(problem.sample_weight, problem.log_weights.shape[0])[0]
    return np.minimum(log_sum - log_total, 0.0)  # F <= 1 (rounding may put it a hair above)


def _categorical_columns(spec: LocalSpec, widths):
    """(kinds, lambdas, counts) of the categorical columns, the CDF kernel's arguments."""
    cat = [p for p, kind in enumerate(spec.var_type) if kind != "c"]
    kinds = np.array(
        [UNORDERED if spec.var_type[p] == "u" else ORDERED for p in cat], dtype=np.int64
    )
    lambdas = np.array([float(widths[p]) for p in cat], dtype=np.float64)
    counts = np.array([float(spec.n_categories[p]) for p in cat], dtype=np.float64)
    return kinds, lambdas, counts


def resolve_density_widths(spec: LocalSpec, keys, bandwidth, sample_weight=None) -> np.ndarray:
    """A rule's widths on the checked keys (:func:`density_rule_widths`), or checked
    widths (one per column, or one number for every column)."""
    if isinstance(bandwidth, str):
        if spec.nearest_neighbour:
            raise ValueError(
                f"bandwidth={bandwidth!r}: with bandwidth_type={spec.bandwidth_type!r} the "
                "widths are an integer k per continuous column"
            )
        return density_rule_widths(spec, keys, bandwidth, sample_weight)
    return check_widths(bandwidth, spec.var_type, spec.counts, bandwidth_type=spec.bandwidth_type)


def _prepare(queries, keys, bandwidth, sample_weight, **options):
    check_choice(options.get("device", "cpu"), "device", ("cpu", "cuda", "auto"))
    spec, (keys, queries) = check_columns({"keys": keys, "queries": queries}, **options)
    if keys.shape[0] == 0:
        raise ValueError("keys has no rows: a density needs at least one")
    sample_weight = check_sample_weight(sample_weight, keys.shape[0])
    widths = resolve_density_widths(spec, keys, bandwidth, sample_weight)
    return density_layout(spec, queries, keys, widths, sample_weight)


def kernel_density(
    queries,
    keys,
    bandwidth="normal_reference",
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    log=False,
    rtol=0.0,
    device="cpu",
    bandwidth_type="fixed",
):
    """The kernel density of ``keys`` (n, d) at ``queries`` (n_q, d) (module docstring).

    ``bandwidth``: ``"normal_reference"``, ``"silverman"``, one number for every column or
    an array in column order (h for 'c' columns, l for 'u' and 'o'); ``var_type`` one
    letter per column ('c' continuous, 'u' unordered, 'o' ordered; categorical columns
    hold integer codes 0 .. c - 1, ``n_categories`` c per column, else counted from the
    keys); ``kernel`` the continuous kernel; ``sample_weight`` (n,) non-negative key
    weights; ``log`` returns log f (exact where f underflows); ``rtol`` the relative
    error allowed on every kernel sum (CPU); ``bandwidth_type`` "fixed" or a
    nearest-neighbour type, R np's ``bwtype`` (``bandwidth`` then holds an integer k per
    continuous column: :mod:`nbattn.local.neighbours`; exact). Returns float64 (n_q,).
    """
    problem = _prepare(
        queries,
        keys,
        bandwidth,
        sample_weight,
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        rtol=rtol,
        device=device,
        bandwidth_type=bandwidth_type,
    )
    out = log_density_of(problem)
    return out if log else np.exp(out)


def kernel_cdf(
    queries,
    keys,
    bandwidth="normal_reference",
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    log=False,
    device="cpu",
):
    """The kernel estimate of the joint CDF of ``keys`` at ``queries`` (module docstring;
    the arguments are :func:`kernel_density`'s). Exact, on ``device``. Returns float64
    (n_q,), log F with ``log``."""
    problem = _prepare(
        queries,
        keys,
        bandwidth,
        sample_weight,
        var_type=var_type,
        n_categories=n_categories,
        kernel=kernel,
        device=device,
    )
    out = log_cdf_of(problem)
    return out if log else np.exp(out)


def sample_rows(spec: LocalSpec, keys, widths, sample_weight, n_samples, rng) -> np.ndarray:
    """``n_samples`` draws (n_samples, d) from the density of checked ``keys`` at ``widths``:
    a key drawn with probability proportional to w_j times its ordered kernels' mass on the
    codes, then each column from its kernel around the key's value: k_jc + h_c u (u from
    K / kappa) for a continuous column; for an unordered one the key's code with
    probability 1 - l, else one of the other c - 1 uniformly; for an ordered one code v
    with probability L(v, x_j) over that mass (the Wang-van Ryzin kernel sums to less than
    1 on a finite set of codes, by an amount that depends on x_j: the draws follow the
    density normalised over the codes, pdf(x) / sum over the codes of pdf). ``rng`` a NumPy
    Generator; the draws depend on it alone (the same seed, the same rows)."""
    n = keys.shape[0]
    p = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    p = p / p.max()
    for position, kind in enumerate(spec.var_type):
        if kind == "o":  # the key's kernel mass on the codes: the pdf's share of the key
            mass = _ordered_kernels(int(spec.n_categories[position]), float(widths[position]))
            p = p * mass.sum(axis=1)[keys[:, position].astype(np.int64)]
    rows = rng.choice(n, size=n_samples, p=p / p.sum())
    out = keys[rows].copy()
    for position, kind in enumerate(spec.var_type):
        if kind == "c":
            out[:, position] += widths[position] * _kernel_draws(spec.kernel, n_samples, rng)
            continue
        count = int(spec.n_categories[position])
        codes = out[:, position].astype(np.int64)
        lam = float(widths[position])
        if kind == "u":
            move = rng.random(n_samples) < lam
            shift = rng.integers(1, max(count, 2), size=n_samples)
            out[:, position] = np.where(move & (count > 1), (codes + shift) % count, codes)
            continue
        table = _ordered_kernels(count, lam)
        cumulative = np.cumsum(table / table.sum(axis=1, keepdims=True), axis=1)[codes]
        u = rng.random(n_samples)[:, None]
        out[:, position] = np.minimum((cumulative < u).sum(axis=1), count - 1)
    return out


def _ordered_kernels(count: int, lam: float) -> np.ndarray:
    """The Wang-van Ryzin kernel L(v, x) (count, count), row x, column v."""
    codes = np.arange(count)
    distance = np.abs(codes[None, :] - codes[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(distance == 0, 1.0 - lam, 0.5 * (1.0 - lam) * lam**distance)


def _kernel_draws(kernel: str, size: int, rng) -> np.ndarray:
    """Draws of u from the continuous kernel K(u) / kappa."""
    if kernel == "gaussian":
        return rng.standard_normal(size)
    if kernel == "epanechnikov":
        # Devroye's rule: of three uniforms on [-1, 1], the second when the third is the
        # largest in magnitude, else the third, has density 3/4 (1 - u^2)
        u1, u2, u3 = (rng.uniform(-1.0, 1.0, size) for _ in range(3))
        pick_second = (np.abs(u3) >= np.abs(u2)) & (np.abs(u3) >= np.abs(u1))
        return np.where(pick_second, u2, u3)
    # tricube: rejection from the uniform on [-1, 1] (accepts 81/140 of the proposals)
    out = np.empty(0)
    while out.size < size:
        u = rng.uniform(-1.0, 1.0, 2 * size + 16)
        accept = rng.random(u.size) < (1.0 - np.abs(u) ** 3) ** 3
        out = np.concatenate((out, u[accept]))
    return out[:size]
