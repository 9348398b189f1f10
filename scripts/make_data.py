"""Regenerate the CSV files under data/ (see data/README.md for their sources).

Usage: python scripts/make_data.py   (needs the test extra: statsmodels, scikit-learn)
"""

from pathlib import Path

import pandas as pd

from nbattn.app.datasets import seed_data

DATA = Path(__file__).resolve().parent.parent / "data"


def main():
    seed = seed_data()
    pd.DataFrame({"x": seed.x_train, "y": seed.y_train}).to_csv(
        DATA / "seed_pooling.csv", index=False, float_format="%.17g"
    )

    import statsmodels.datasets.engel

    statsmodels.datasets.engel.load_pandas().data.to_csv(DATA / "engel.csv", index=False)

    from sklearn.datasets import load_diabetes

    diabetes = load_diabetes(as_frame=True, scaled=False).frame
    diabetes.to_csv(DATA / "diabetes.csv", index=False)


if __name__ == "__main__":
    main()
