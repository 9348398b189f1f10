"""The data recipe of the attention-pooling walk-through and the shipped CSV datasets.

The walk-through, section 1.3, draws 50 sorted training points on [0, 6),

    y = 2 sin(x) + x**0.8 + eps,   eps ~ N(0, 0.5**2),

and tests on the grid x = 0, 0.12566, ..., < 6.28 with the noise-free targets.

The interval simulation (:func:`interval_coverage`, the coverage the README
quotes) draws data sets of a line, y = 1 + 2 x + eps with x ~ N(0, 1) and
eps ~ N(0, 0.5**2), on which a local-linear fit has no smoothing bias.

The CSV files live in the repository's top-level ``data/`` folder, which the
wheel ships as the package ``nbattn.data``; they are read through
``importlib.resources``, so they are found the same way in a source checkout
and in an installed copy. ``data/README.md`` gives their sources and licences.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

#: The fixed seed of the shipped default data (``seed_pooling.csv``).
DEFAULT_RANDOM_STATE = 2

#: The package that holds the CSV files in an installed nbattn.
DATA_PACKAGE = "nbattn.data"


def seed_function(x):
    """The walk-through's true function f(x) = 2 sin(x) + x**0.8."""
    x = np.asarray(x, dtype=np.float64)
    return 2.0 * np.sin(x) + x**0.8


@dataclass(frozen=True)
class SeedData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def seed_data(n_train: int = 50, noise: float = 0.5, random_state=DEFAULT_RANDOM_STATE) -> SeedData:
    """Training and test data of the attention-pooling walk-through, section 1.3."""
    rng = np.random.default_rng(random_state)
    x_train = np.sort(rng.random(n_train)) * 6.0
    y_train = seed_function(x_train) + rng.normal(0.0, noise, n_train)
    x_test = np.arange(0.0, 6.28, 0.12566)
    return SeedData(x_train, y_train, x_test, seed_function(x_test))


def interval_coverage(kind="mean", draws=300, n=80, alpha=0.1, random_state=11) -> float:
    """The share of ``1 - alpha`` bands of a local-linear fit (width 0.6) that cover the
    true line (``kind="mean"``) or a new observation (``"observation"``) at 7 queries on
    [-1.5, 1.5], over ``draws`` simulated data sets of ``n`` rows of the line (module
    docstring); nominally ``1 - alpha``."""
    from ..estimators import LocalPolynomialRegressor

    rng = np.random.default_rng(random_state)
    queries = np.linspace(-1.5, 1.5, 7)[:, None]
    truth = 1.0 + 2.0 * queries[:, 0]
    hits = []
    for _ in range(draws):
        X = rng.normal(size=(n, 1))
        y = 1.0 + 2.0 * X[:, 0] + rng.normal(0, 0.5, n)
        model = LocalPolynomialRegressor(degree=1, bandwidth=0.6).fit(X, y)
        band = model.predict_interval(queries, alpha=alpha, kind=kind)
        target = truth if kind == "mean" else truth + rng.normal(0, 0.5, truth.size)
        hits.append((band[:, 0] <= target) & (target <= band[:, 1]))
    return float(np.mean(hits))


def data_files():
    """The folder of the shipped datasets, as an ``importlib.resources`` traversable.

    An installed nbattn has them in the package ``nbattn.data``; a source
    checkout used without installing it (``PYTHONPATH`` or the current
    folder) has no such package, and reads the same files from ``data/``
    beside ``nbattn/``.
    """
    try:
        return resources.files(DATA_PACKAGE)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "data"


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_csv`, sorted."""
    return sorted(
        entry.name[: -len(".csv")]
        for entry in data_files().iterdir()
        if entry.name.endswith(".csv") and entry.is_file()
    )


def load_csv(name: str):
    """A shipped dataset as a pandas DataFrame.

    Parameters
    ----------
    name : str
        The file name without ``.csv``: one of :func:`available_datasets`
        (``"engel"``, ``"diabetes"``, ``"seed_pooling"``).
    """
    import pandas as pd

    available = available_datasets()
    if not isinstance(name, str) or name not in available:
        raise ValueError(f"name: no dataset {name!r}; available: {', '.join(available)}")
    with data_files().joinpath(f"{name}.csv").open("rb") as f:
        return pd.read_csv(f)
