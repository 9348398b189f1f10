"""The argument types of the ``nbattn`` command: each parses one option's text or
raises argparse's ``ArgumentTypeError`` naming what it expected (argparse then exits
with a usage error, 2)."""

from __future__ import annotations

import argparse
import math

from .._core.columns import KINDS
from ..estimators.spec import DENSITY_BANDWIDTH_NAMES, REGRESSOR_BANDWIDTH_NAMES
from . import io

__all__ = [
    "WIDTH_NAMES",
    "alpha_arg",
    "bandwidth_arg",
    "column_list",
    "grid_arg",
    "int_arg",
    "level_arg",
    "levels_arg",
    "quantile_column",
    "rtol_arg",
    "var_type_arg",
    "width",
    "y_width_arg",
]

#: the width names ``--bandwidth`` takes: the regressors' and the densities' rules and criteria
#: (the regressors' include the classifier's; a name a model does not take is refused
#: when the estimator is built, naming the model)
WIDTH_NAMES = REGRESSOR_BANDWIDTH_NAMES + DENSITY_BANDWIDTH_NAMES


def quantile_column(level) -> str:
    """The output column of the conditional quantile at ``level``: ``q0.1``, ``q0.5``..."""
    return f"q{float(level):g}"


def width(text: str):
    t = text.strip().lower()
    if t in WIDTH_NAMES:
        return t
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {', '.join(WIDTH_NAMES)} or a number, got {io.shorten(text)}"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"widths must be positive and finite, got {text!r}")
    return value


def bandwidth_arg(text: str):
    """One bandwidth: a rule name, one width for every feature, or one width per feature."""
    parts = text.split(",")
    if len(parts) == 1:
        return width(text)
    values = [width(p) for p in parts]
    if any(isinstance(v, str) for v in values):
        raise argparse.ArgumentTypeError(f"per-feature widths must be numbers, got {text!r}")
    return values


def y_width_arg(text: str) -> float | str:
    """The width of a conditional model's y: one positive number, or ``cv_cdf`` (by
    cross-validation of the conditional CDF)."""
    if text == "cv_cdf":
        return text
    value = width(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(f"expected a positive number or cv_cdf, got {text!r}")
    return value


def _strictly_between_0_and_1(text: str, expected: str) -> float:
    """``text`` as a number strictly between 0 and 1, else argparse's error saying
    ``expected``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {io.shorten(text)}")
    return value


def level_arg(text: str) -> float:
    """A quantile level: a number strictly between 0 and 1."""
    return _strictly_between_0_and_1(text, "a level between 0 and 1 (0.5: the median)")


def levels_arg(text: str) -> list:
    """Quantile levels separated by commas, each between 0 and 1, each once."""
    levels = [level_arg(part) for part in text.split(",")]
    names = [quantile_column(q) for q in levels]
    twice = [n for k, n in enumerate(names) if n in names[:k]]
    if twice:
        raise argparse.ArgumentTypeError(f"the level {twice[0][1:]} is given twice")
    return levels


def grid_arg(text: str) -> list:
    """Several bandwidths to compare, each a rule name or one width for every feature."""
    return [width(p) for p in text.split(",")]


def int_arg(low, high=None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value >= high):
            upper = "" if high is None else f" and below {high}"
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}{upper}, got {text!r}")
        return value

    return parse


def rtol_arg(text: str) -> float:
    """A relative tolerance in [0, 1) (``check_rtol``, the library's one rule)."""
    from .._core.validation import check_rtol

    try:
        return check_rtol(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in [0, 1) (0: exact), got {io.shorten(text)}"
        ) from None


def alpha_arg(text: str) -> float:
    """The alpha of a (1 - alpha) interval: a number strictly between 0 and 1."""
    return _strictly_between_0_and_1(text, "a number between 0 and 1 (0.05: a 95% interval)")


def var_type_arg(text: str) -> str:
    t = text.strip().lower()
    if not t or set(t) - set(KINDS):
        raise argparse.ArgumentTypeError(f"expected letters c, u and o, got {text!r}")
    return t


def column_list(text: str) -> list[str]:
    """Column names separated by commas, spaces around each name ignored; a name in double
    quotes is taken as it is (commas, spaces at its ends; "" for a quote inside), so
    ``--drop '"b, c", x1'`` names the columns "b, c" and "x1" (:func:`io.column_option`)."""
    try:
        cols = io.split_columns(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not cols:
        raise argparse.ArgumentTypeError("expected column names separated by commas")
    return cols
