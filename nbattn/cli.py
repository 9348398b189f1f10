"""The ``nbattn`` command: fit, predict, evaluate, cv, plot, demo, info.

Built on the standard library's argparse: subcommands, typed options and
usage errors (exit code 2) are all it needs, and it adds no dependency.

Exit codes: 0 ok, 1 error (one line ``nbattn: error: ...`` on stderr, no
output file left behind), 2 usage error (argparse), 130 interrupted.
Outputs (models, predictions, figures) are written to a temporary file in
the output's folder and renamed when complete; inputs are only read.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys

import numpy as np

from . import io
from .progress import Progress, running

#: ``--model`` name -> estimator class name in ``nbattn`` (looked up when run,
#: so classes that land later work without changes here).
MODELS = {
    "nw": "NadarayaWatsonRegressor",
    "learned": "LearnedKernelRegressor",
    "classifier": "NadarayaWatsonClassifier",
}

_BANDWIDTH_NAMES = ("scott", "silverman", "loo")


# ----------------------------------------------------------------------------- argument types


def _bandwidth_arg(text: str):
    t = text.strip().lower()
    if t in _BANDWIDTH_NAMES:
        return t
    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected scott, silverman, loo, a number or numbers separated by commas, got {text!r}"
        ) from None
    if not all(math.isfinite(p) and p > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"bandwidths must be positive and finite, got {text!r}")
    return parts[0] if len(parts) == 1 else parts


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _column_list(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError("expected column names separated by commas")
    return cols


# ----------------------------------------------------------------------------- helpers


def _model_class(key: str):
    import nbattn

    name = MODELS[key]
    cls = getattr(nbattn, name, None)
    if cls is None:
        raise ValueError(
            f"--model {key} requires nbattn.{name}, which this version of nbattn does not have"
        )
    return cls


def _accepts_loo(cls) -> bool:
    """Whether ``cls(bandwidth="loo")`` is a valid parameter value."""
    for constraint in getattr(cls, "_parameter_constraints", {}).get("bandwidth", []):
        if "loo" in getattr(constraint, "options", ()):
            return True
    return False


def make_estimator(model="nw", bandwidth=None, metric=None, kernel=None, max_iter=None):
    """The estimator ``nbattn fit`` builds from its options."""
    cls = _model_class(model)
    params = cls().get_params(deep=False)
    kwargs = {}
    if bandwidth is not None:
        if "bandwidth" not in params:
            raise ValueError(f"--bandwidth does not apply to --model {model}: it learns its widths")
        if bandwidth == "loo" and not _accepts_loo(cls):
            raise ValueError(
                f"--bandwidth loo requires leave-one-out bandwidth selection "
                f"(nbattn.{cls.__name__}(bandwidth='loo')), which this version of nbattn "
                "does not have"
            )
        kwargs["bandwidth"] = bandwidth
    if metric is not None:
        if "metric" not in params:
            raise ValueError(f"--metric applies to --model learned, not --model {model}")
        kwargs["metric"] = metric
    if max_iter is not None:
        if "max_iter" not in params:
            raise ValueError(f"--max-iter does not apply to --model {model}")
        kwargs["max_iter"] = max_iter
    if kernel is not None:
        if "kernel" not in params:
            raise ValueError(f"--kernel does not apply to --model {model}")
        kwargs["kernel"] = kernel
    return cls(**kwargs)


def _is_classifier(model) -> bool:
    from sklearn.base import is_classifier

    return bool(is_classifier(model))


def _features_for(args, columns, target):
    if args.features:
        io.check_columns(args.data, columns, args.features, "feature column")
        features = list(args.features)
    else:
        features = [c for c in columns if c != target]
    if target in features:
        raise ValueError(f"the target column {target!r} is also a feature")
    if not features:
        raise ValueError(f"{args.data}: no feature columns besides the target {target!r}")
    return features


def _load_xy(path, features, target, on_nan, classifier, quiet=True):
    """Feature matrix (DataFrame, float64) and target of a whole file."""
    import pandas as pd

    frame = io.read_table(path, columns=list(dict.fromkeys([*features, target])), quiet=quiet)
    fmt = io.input_format(path)
    X, keep = io.numeric_block(frame, features, source=path, fmt=fmt, on_nan=on_nan)
    if classifier:
        keep &= io.check_labels(frame, target, source=path, fmt=fmt, on_nan=on_nan)
        y = frame[target].to_numpy()
    else:
        y, keep_y = io.numeric_block(frame, [target], source=path, fmt=fmt, on_nan=on_nan)
        y = y[:, 0]
        keep &= keep_y
    if not keep.all():
        X, y = X[keep], y[keep]
        if len(y) == 0:
            raise ValueError(f"{path}: no rows left after dropping rows with missing values")
    return pd.DataFrame(X, columns=features), y, int((~keep).sum())


def _check_not_input(inputs, output) -> None:
    for path in inputs:
        if os.path.exists(output) and os.path.exists(path) and os.path.samefile(path, output):
            raise ValueError(f"the output {output!r} is an input file; choose another name")


def _json_value(v):
    if isinstance(v, float | np.floating):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _print_metrics(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps({k: _json_value(v) for k, v in metrics.items()}))
        return
    for key, value in metrics.items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:<10}{shown}")


def _feature_names(meta, model, path):
    names = meta.get("feature_names")
    if names is None and hasattr(model, "feature_names_in_"):
        names = [str(n) for n in model.feature_names_in_]
    if not names:
        raise ValueError(f"{path}: the model has no feature names (fit it on a table)")
    return list(names)


# ----------------------------------------------------------------------------- metrics


class Metrics:
    """Running metrics over chunks: MSE, MAE, R² or accuracy and log-loss."""

    def __init__(self, classifier: bool, classes=None):
        self.classifier = classifier
        self.classes = None if classes is None else np.asarray(classes)
        self.n = 0
        self.sse = self.sae = 0.0
        self.mean = self.m2 = 0.0
        self.correct = 0
        self.nll = 0.0

    def add_regression(self, y, pred) -> None:
        y = np.asarray(y, dtype=np.float64)
        err = np.asarray(pred, dtype=np.float64) - y
        self.sse += float(err @ err)
        self.sae += float(np.abs(err).sum())
        # Chan et al.'s merge of (count, mean, M2) for the total sum of squares
        n_b = len(y)
        mean_b = float(y.mean())
        m2_b = float(((y - mean_b) ** 2).sum())
        delta = mean_b - self.mean
        total = self.n + n_b
        self.mean += delta * n_b / total
        self.m2 += m2_b + delta**2 * self.n * n_b / total
        self.n = total

    def add_classification(self, y, proba, *, where="") -> None:
        y = np.asarray(y)
        try:  # classes_ is sorted (np.unique), so searchsorted finds each label
            idx = np.clip(np.searchsorted(self.classes, y), 0, len(self.classes) - 1)
            known = self.classes[idx] == y
        except TypeError:  # labels of another type than the classes
            known = np.zeros(len(y), dtype=bool)
        if not known.all():
            bad = y[int(np.argmin(known))]
            bad = bad.item() if isinstance(bad, np.generic) else bad
            raise ValueError(f"{where}label {bad!r} is not one of the model's classes")
        pred = self.classes[np.argmax(proba, axis=1)]
        self.correct += int((pred == y).sum())
        p_true = np.clip(proba[np.arange(len(y)), idx], 1e-15, 1.0)
        self.nll -= float(np.log(p_true).sum())
        self.n += len(y)

    def result(self) -> dict:
        if self.classifier:
            return {
                "n": self.n,
                "accuracy": self.correct / self.n,
                "log_loss": self.nll / self.n,
            }
        r2 = 1.0 - self.sse / self.m2 if self.m2 > 0 else float("nan")
        return {"n": self.n, "mse": self.sse / self.n, "mae": self.sae / self.n, "r2": r2}


def _score(model, X, y, classifier, metrics: Metrics, where="") -> None:
    if classifier:
        metrics.add_classification(y, model.predict_proba(X), where=where)
    else:
        metrics.add_regression(y, model.predict(X))


# ----------------------------------------------------------------------------- predict std


def _check_std(model) -> bool:
    """True if the estimator's own ``predict(X, return_std=True)`` is used; raises if
    neither it nor the fallback below applies."""
    from .estimators import NadarayaWatsonRegressor

    if "return_std" in inspect.signature(model.predict).parameters:
        return True
    if not isinstance(model, NadarayaWatsonRegressor) or model.n_outputs_ != 1:
        raise ValueError(f"--std is not available for {type(model).__name__}")
    return False


def predict_std(model, X):
    """(prediction, attention-weighted standard deviation of the targets).

    Uses ``model.predict(X, return_std=True)`` when the estimator has it.
    Otherwise, for a single-output NadarayaWatsonRegressor:
    ``std_i = sqrt(sum_j w_ij (y_j - f_i)^2) = sqrt(E_w[y'^2] - E_w[y']^2)``
    with ``y' = y - mean(y)``, from one streaming pass with two value columns.
    """
    from . import regression

    if _check_std(model):
        return model.predict(X, return_std=True)
    mean = model.predict(X)
    y = model.y_fit_[:, 0]
    if model.kernel == "average":
        return mean, np.full(len(mean), y.std())
    yc = y - y.mean()
    Xq = model._check_queries(X)
    moments = regression.nadaraya_watson(
        Xq, model.X_fit_, np.column_stack([yc, yc * yc]), model.bandwidth_
    )
    var = moments[:, 1] - moments[:, 0] ** 2
    return mean, np.sqrt(np.maximum(var, 0.0))


# ----------------------------------------------------------------------------- commands


def _cmd_fit(args) -> int:
    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, [args.target], "target column")
    features = _features_for(args, columns, args.target)
    estimator = make_estimator(args.model, args.bandwidth, args.metric, args.kernel, args.max_iter)
    _check_not_input([args.data], args.output)
    classifier = _is_classifier(estimator)
    X, y, dropped = _load_xy(
        args.data, features, args.target, args.on_nan, classifier, quiet=args.quiet
    )
    with running(f"fit {type(estimator).__name__}", quiet=args.quiet):
        estimator.fit(X, y)
    io.save(estimator, args.output, metadata={"target": args.target, "features": features})
    if not args.quiet:
        extra = f" (dropped {dropped} rows with missing values)" if dropped else ""
        print(
            f"fitted {type(estimator).__name__} on {len(y)} rows x {len(features)} features"
            f"{extra} -> {args.output}"
        )
        if hasattr(estimator, "bandwidth_"):
            widths = ", ".join(f"{f}={h:.6g}" for f, h in zip(features, estimator.bandwidth_))
            print(f"bandwidth: {widths}")
    return 0


def predict_frame(model, X, std=False, proba=False) -> dict:
    """The output columns for one chunk: prediction, [std], [proba_<class>]."""
    out = {}
    if std:
        out["prediction"], out["std"] = predict_std(model, X)
    else:
        out["prediction"] = model.predict(X)
    if proba:
        probabilities = model.predict_proba(X)
        for k, label in enumerate(model.classes_):
            out[f"proba_{label}"] = probabilities[:, k]
    return out


class _ChunkRunner:
    """Predicts chunks here, or on a dask.distributed cluster with ``--scheduler``.

    On a cluster the model is sent to every worker once and at most
    ``2 x workers`` chunks are in flight; results are written in input order,
    so memory stays bounded and the output is the same as a local run.
    """

    def __init__(self, model, args, writer):
        self.model, self.writer = model, writer
        self.std, self.proba, self.id_column = args.std, args.proba, args.id_column
        self.scheduler = getattr(args, "scheduler", None)
        self.client = None
        self.pending = []

    def __enter__(self):
        if self.scheduler:
            try:
                from distributed import Client
            except ImportError as exc:
                raise ValueError("--scheduler needs dask: pip install 'nbattn[dask]'") from exc
            try:
                self.client = Client(self.scheduler, timeout=30)
            except OSError as exc:
                raise ValueError(
                    f"cannot reach the dask scheduler {self.scheduler}: {exc}"
                ) from exc
            self.remote_model = self.client.scatter(self.model, broadcast=True, hash=False)
            self.window = 2 * max(1, len(self.client.scheduler_info()["workers"]))
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            for future, _ in self.pending:
                future.cancel()
            self.client.close()
        return False

    def _write(self, columns, ids):
        import pandas as pd

        out = {} if ids is None else {self.id_column: ids}
        out.update(columns)
        self.writer.write(pd.DataFrame(out))

    def submit(self, X, ids):
        if self.client is None:
            self._write(predict_frame(self.model, X, self.std, self.proba), ids)
            return
        future = self.client.submit(
            predict_frame, self.remote_model, X, self.std, self.proba, pure=False
        )
        self.pending.append((future, ids))
        while len(self.pending) > self.window:
            self._drain_one()

    def _drain_one(self):
        future, ids = self.pending.pop(0)
        self._write(future.result(), ids)

    def finish(self):
        while self.pending:
            self._drain_one()


def _cmd_predict(args) -> int:
    import pandas as pd

    model, meta = io.read_model_file(args.model)
    features = _feature_names(meta, model, args.model)
    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, features, "feature column")
    wanted = list(features)
    if args.id_column:
        io.check_columns(args.data, columns, [args.id_column], "id column")
        wanted.append(args.id_column)
    out_fmt = io.output_format(args.output)
    _check_not_input([args.data, args.model], args.output)
    classifier = _is_classifier(model)
    if args.std and classifier:
        raise ValueError("--std is for regressors; use --proba with a classifier")
    if args.std:
        _check_std(model)  # fails before any output is started
    if args.proba and not classifier:
        raise ValueError("--proba is for classifiers")
    in_fmt = io.input_format(args.data)
    chunks, total, unit = io.iter_chunks(
        args.data, list(dict.fromkeys(wanted)), chunksize=args.chunksize
    )
    n_in = dropped = 0
    with (
        io.atomic_output(args.output) as tmp,
        io.TableWriter(tmp, out_fmt) as writer,
        Progress(total, "predict", unit=unit, quiet=args.quiet) as bar,
        _ChunkRunner(model, args, writer) as runner,
    ):
        for frame, first_row, position in chunks:
            X, keep = io.numeric_block(
                frame,
                features,
                first_row=first_row,
                source=args.data,
                fmt=in_fmt,
                on_nan=args.on_nan,
            )
            n_in += len(frame)
            if not keep.all():
                dropped += int((~keep).sum())
                frame, X = frame[keep], X[keep]
            bar.update(position=position)
            if len(X) == 0:
                continue
            ids = frame[args.id_column].to_numpy() if args.id_column else None
            runner.submit(pd.DataFrame(X, columns=features), ids)
        runner.finish()
        if n_in == 0:
            raise ValueError(f"{args.data}: no data rows (only a header)")
        if writer.rows == 0:
            raise ValueError(f"{args.data}: no rows left after dropping rows with missing values")
    if not args.quiet:
        extra = f" (dropped {dropped} rows with missing values)" if dropped else ""
        print(f"predicted {writer.rows} rows{extra} -> {args.output}")
    return 0


def _cmd_evaluate(args) -> int:
    import pandas as pd

    model, meta = io.read_model_file(args.model)
    features = _feature_names(meta, model, args.model)
    target = args.target or meta.get("user", {}).get("target")
    if not target:
        raise ValueError(f"{args.model}: the model does not name its target; pass --target")
    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, [target], "target column")
    io.check_columns(args.data, columns, features, "feature column")
    classifier = _is_classifier(model)
    metrics = Metrics(classifier, getattr(model, "classes_", None))
    fmt = io.input_format(args.data)
    chunks, total, unit = io.iter_chunks(
        args.data, list(dict.fromkeys([*features, target])), chunksize=args.chunksize
    )
    n_in = 0
    with Progress(total, "evaluate", unit=unit, quiet=args.quiet) as bar:
        for frame, first_row, position in chunks:
            kw = dict(first_row=first_row, source=args.data, fmt=fmt, on_nan=args.on_nan)
            X, keep = io.numeric_block(frame, features, **kw)
            if classifier:
                keep &= io.check_labels(frame, target, **kw)
                y = frame[target].to_numpy()
            else:
                y, keep_y = io.numeric_block(frame, [target], **kw)
                y = y[:, 0]
                keep &= keep_y
            n_in += len(frame)
            X, y = X[keep], y[keep]
            bar.update(position=position)
            if len(y):
                _score(model, pd.DataFrame(X, columns=features), y, classifier, metrics)
    if n_in == 0:
        raise ValueError(f"{args.data}: no data rows (only a header)")
    if metrics.n == 0:
        raise ValueError(f"{args.data}: no rows left after dropping rows with missing values")
    _print_metrics(metrics.result(), args.json)
    return 0


def _cmd_cv(args) -> int:
    import pandas as pd
    from sklearn.base import clone
    from sklearn.model_selection import KFold, StratifiedKFold

    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, [args.target], "target column")
    features = _features_for(args, columns, args.target)
    estimator = make_estimator(args.model, args.bandwidth, args.metric, args.kernel, args.max_iter)
    classifier = _is_classifier(estimator)
    X, y, _ = _load_xy(args.data, features, args.target, args.on_nan, classifier, args.quiet)
    if args.folds < 2 or args.folds > len(y):
        raise ValueError(f"--folds must be between 2 and the number of rows ({len(y)})")
    splitter = (StratifiedKFold if classifier else KFold)(
        n_splits=args.folds, shuffle=True, random_state=args.seed
    )
    rows = []
    with Progress(args.folds, "cv", unit="folds", quiet=args.quiet) as bar:
        for train, test in splitter.split(X, y):
            model = clone(estimator).fit(X.iloc[train], y[train])
            metrics = Metrics(classifier, getattr(model, "classes_", None))
            _score(model, X.iloc[test], y[test], classifier, metrics)
            rows.append(metrics.result())
            bar.update(1)
    table = pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="fold"))
    mean, std = table.mean(), table.std(ddof=1)
    if args.json:
        print(
            json.dumps(
                {
                    "model": type(estimator).__name__,
                    "folds": [{k: _json_value(v) for k, v in r.items()} for r in rows],
                    "mean": {k: _json_value(v) for k, v in mean.items()},
                    "std": {k: _json_value(v) for k, v in std.items()},
                }
            )
        )
    else:
        shown = pd.concat([table, mean.to_frame("mean").T, std.to_frame("std").T])
        print(f"{args.folds}-fold cross-validation of {type(estimator).__name__}:")
        print(shown.to_string(float_format=lambda v: f"{v:.6g}"))
    return 0


# ----------------------------------------------------------------------------- plots


def _figure_format(path) -> str:
    ext = os.path.splitext(str(path))[1].lower().lstrip(".")
    if ext not in ("png", "svg"):
        raise ValueError(f"figure {str(path)!r} must end in .png or .svg")
    return ext


def _save_figure(fig, path) -> None:
    from .plotting import _pyplot

    fmt = _figure_format(path)
    try:
        with io.atomic_output(path) as tmp:
            fig.tight_layout()
            fig.savefig(tmp, format=fmt, dpi=100)
    finally:
        _pyplot().close(fig)


def _plot_fit(args):
    from .plotting import _pyplot

    model, meta = io.read_model_file(args.model)
    features = _feature_names(meta, model, args.model)
    if len(features) != 1:
        raise ValueError(f"plot fit needs a model with one feature; this one has {len(features)}")
    target = args.target or meta.get("user", {}).get("target")
    if not target:
        raise ValueError(f"{args.model}: the model does not name its target; pass --target")
    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, [target, *features])
    X, y, _ = _load_xy(args.data, features, target, args.on_nan, _is_classifier(model))
    x = X.iloc[:, 0].to_numpy()
    grid = np.linspace(x.min(), x.max(), 400)
    import pandas as pd

    curve = model.predict(pd.DataFrame({features[0]: grid}))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    if len(x) > 5000:
        pick = np.random.default_rng(0).choice(len(x), 5000, replace=False)
        x, y = x[pick], y[pick]
    ax.scatter(x, y, s=8, color="tab:red", alpha=0.6, label=f"{args.data}")
    ax.plot(grid, curve, color="tab:blue", label=type(model).__name__)
    ax.set_xlabel(features[0])
    ax.set_ylabel(target)
    ax.legend(loc="best")
    return fig


def _plot_heatmap(args):
    import pandas as pd

    from .plotting import _pyplot, plot_heatmap

    model, meta = io.read_model_file(args.model)
    features = _feature_names(meta, model, args.model)
    if not hasattr(model, "attention_weights"):
        raise ValueError(f"{type(model).__name__} has no attention weights to plot")
    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, features, "feature column")
    frame = io.read_table(args.data, columns=features)
    X, keep = io.numeric_block(
        frame, features, source=args.data, fmt=io.input_format(args.data), on_nan=args.on_nan
    )
    X = X[keep][: args.rows]
    X = X[np.argsort(X[:, 0], kind="stable")]
    weights = np.asarray(model.attention_weights(pd.DataFrame(X, columns=features)))
    keys = getattr(model, "X_fit_", None)
    if keys is not None and keys.shape[0] == weights.shape[1]:
        weights = weights[:, np.argsort(keys[:, 0], kind="stable")]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    plot_heatmap(
        weights,
        xlabel=f"training rows (keys), by {features[0]}",
        ylabel=f"rows of {os.path.basename(args.data)} (queries), by {features[0]}",
        ax=ax,
        title="attention weights",
    )
    return fig


def loo_curve(X, y, base, scales, quiet=True):
    """Leave-one-out MSE of Nadaraya-Watson at the widths ``base * s`` for s in ``scales``.

    ``L(h) = mean_i (f_{-i}(x_i) - y_i)^2`` with ``f_{-i}`` the prediction at x_i
    without the pair (i, i). Uses ``nbattn.loo_loss`` (a one-pass kernel) when
    this nbattn has it, else ``nadaraya_watson(..., exclude_self=True)``.
    """
    import nbattn

    from . import regression

    loo_loss = getattr(nbattn, "loo_loss", None)
    losses = np.empty(len(scales))
    with Progress(len(scales), "loo", unit="widths", quiet=quiet) as bar:
        for i, s in enumerate(scales):
            if loo_loss is not None:
                losses[i] = loo_loss(X, y, base * s)
            else:
                pred = regression.nadaraya_watson(X, X, y, base * s, exclude_self=True)
                losses[i] = np.mean((pred - y) ** 2)
            bar.update(1)
    return losses


def _plot_loo(args):
    import nbattn

    from . import regression
    from .plotting import _pyplot

    columns = io.read_columns(args.data)
    io.check_columns(args.data, columns, [args.target], "target column")
    features = _features_for(args, columns, args.target)
    X, y, _ = _load_xy(args.data, features, args.target, args.on_nan, classifier=False)
    X = X.to_numpy()
    if len(y) < 2:
        raise ValueError("the leave-one-out loss needs at least 2 rows")
    scott = regression.bandwidth_rule(X, "scott")
    scales = np.logspace(-1.5, 1.0, args.points)
    losses = loo_curve(X, y, scott, scales, quiet=args.quiet)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(scales, losses, color="tab:blue")
    best = int(np.argmin(losses))
    ax.axvline(1.0, color="gray", ls="--", label="Scott's rule")
    loo_bandwidth = getattr(nbattn, "loo_bandwidth", None)
    if loo_bandwidth is not None:  # bandwidth="loo" (issue 3): one factor times Scott's widths
        factor = float(np.asarray(loo_bandwidth(X, y))[0] / scott[0])
        ax.axvline(
            factor, color="tab:green", ls=":", label=f"bandwidth='loo': {factor:.3g} x Scott"
        )
    ax.scatter(
        [scales[best]],
        [losses[best]],
        color="tab:red",
        zorder=3,
        label=f"grid minimum: {scales[best]:.3g} x Scott",
    )
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth / Scott's rule")
    ax.set_ylabel("leave-one-out MSE")
    ax.legend(loc="best")
    return fig


def _plot_widths(args):
    from .plotting import _pyplot

    model, meta = io.read_model_file(args.model)
    features = _feature_names(meta, model, args.model)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(features) + 2), 4))
    if getattr(model, "bandwidth_", None) is not None:
        widths = np.asarray(model.bandwidth_, dtype=np.float64).reshape(-1)
        if widths.size == 1 and len(features) > 1:
            widths = np.full(len(features), widths[0])
        ax.bar(range(len(widths)), widths, color="tab:blue")
        ax.set_xticks(range(len(widths)), features, rotation=45, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("kernel width h")
        ax.set_title(f"{type(model).__name__} widths")
    elif getattr(model, "components_", None) is not None:
        L = np.asarray(model.components_, dtype=np.float64)
        limit = float(np.abs(L).max()) or 1.0
        image = ax.imshow(L, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(len(features)), features, rotation=45, ha="right")
        ax.set_yticks(range(L.shape[0]), [str(i + 1) for i in range(L.shape[0])])
        ax.set_xlabel("features")
        ax.set_ylabel("rows of L")
        ax.set_title("learned metric L")
    else:
        plt.close(fig)
        raise ValueError(f"{type(model).__name__} has no widths (bandwidth_ or components_)")
    return fig


_PLOTS = {"fit": _plot_fit, "heatmap": _plot_heatmap, "loo": _plot_loo, "widths": _plot_widths}


def _cmd_plot(args) -> int:
    _figure_format(args.output)
    inputs = [p for p in (getattr(args, "model", None), getattr(args, "data", None)) if p]
    _check_not_input(inputs, args.output)
    fig = _PLOTS[args.kind](args)
    _save_figure(fig, args.output)
    if not args.quiet:
        print(f"wrote {args.output}")
    return 0


def _cmd_demo(args) -> int:
    from .seed import run_seed

    table = run_seed(outdir=args.outdir)
    print("Seed 002, section 1.3: y = 2 sin x + x^0.8 + N(0, 0.5), 50 training points")
    print("metrics on the test grid against the true function:\n")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    print(f"\nfigures written to {args.outdir}/")
    return 0


def _cmd_info(args) -> int:
    import numba

    from . import __version__, config
    from .device import cuda_available

    print(f"nbattn {__version__}")
    print(f"numpy {np.__version__}, numba {numba.__version__}")
    layer, threads = numba.config.THREADING_LAYER, numba.config.NUMBA_NUM_THREADS
    print(f"threading layer: {layer}, threads: {threads}")
    print(f"key block: {config.KEY_BLOCK}, query block: {config.QUERY_BLOCK}")
    print(f"CUDA usable: {cuda_available()}")
    try:
        import pyarrow

        parquet = f"yes (pyarrow {pyarrow.__version__})"
    except ImportError:
        parquet = "no (pip install 'nbattn[parquet]')"
    print(f"Parquet: {parquet}")
    print(f"model file format: {io.FORMAT_NAME} version {io.FORMAT_VERSION}")
    return 0


# ----------------------------------------------------------------------------- parser


def _add_common(p, on_nan=True) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    if on_nan:
        p.add_argument(
            "--on-nan",
            choices=("error", "drop"),
            default="error",
            help="rows with a missing or infinite value: stop with an error (default) or drop",
        )


def _add_model_options(p) -> None:
    p.add_argument("--target", required=True, help="the column to predict")
    p.add_argument("--features", type=_column_list, help="A,B,...: default all but the target")
    p.add_argument("--model", choices=tuple(MODELS), default="nw", help="default: nw")
    p.add_argument(
        "--bandwidth",
        type=_bandwidth_arg,
        help="scott, silverman, loo, FLOAT or F1,F2,... per feature (default: the model's)",
    )
    p.add_argument("--metric", choices=("scalar", "diagonal", "full"), help="--model learned")
    p.add_argument("--max-iter", type=_positive_int, help="--model learned: optimiser iterations")
    p.add_argument(
        "--kernel", choices=("gaussian", "average"), help="--model nw (default gaussian)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbattn",
        description="Attention pooling and kernel regression with numba.",
        epilog="exit codes: 0 ok, 1 error, 2 usage error",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit = sub.add_parser("fit", help="fit a model on a CSV/Parquet file and save it")
    fit.add_argument("data", metavar="DATA")
    _add_model_options(fit)
    fit.add_argument("-o", "--output", required=True, metavar="MODEL", help="model file (.npz)")
    _add_common(fit)
    fit.set_defaults(func=_cmd_fit)

    pred = sub.add_parser("predict", help="predict a CSV/Parquet file in chunks")
    pred.add_argument("model", metavar="MODEL")
    pred.add_argument("data", metavar="DATA")
    pred.add_argument("-o", "--output", required=True, metavar="OUT", help=".csv or .parquet")
    pred.add_argument("--chunksize", type=_positive_int, default=100_000, help="default 100000")
    pred.add_argument("--std", action="store_true", help="add the attention-weighted std")
    pred.add_argument("--proba", action="store_true", help="classifiers: class probabilities")
    pred.add_argument("--id-column", metavar="COL", help="copy this column to the output")
    pred.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the predictions on a dask.distributed cluster (e.g. tcp://host:8786)",
    )
    _add_common(pred)
    pred.set_defaults(func=_cmd_predict)

    ev = sub.add_parser("evaluate", help="metrics of a model on a labelled file")
    ev.add_argument("model", metavar="MODEL")
    ev.add_argument("data", metavar="DATA")
    ev.add_argument("--target", help="default: the target the model was fitted on")
    ev.add_argument("--chunksize", type=_positive_int, default=100_000)
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    _add_common(ev)
    ev.set_defaults(func=_cmd_evaluate)

    cv = sub.add_parser("cv", help="K-fold cross-validated metrics")
    cv.add_argument("data", metavar="DATA")
    _add_model_options(cv)
    cv.add_argument("--folds", type=_positive_int, default=5, help="default 5")
    cv.add_argument("--seed", type=int, default=0, help="shuffling seed (default 0)")
    cv.add_argument("--json", action="store_true", help="machine-readable output")
    _add_common(cv)
    cv.set_defaults(func=_cmd_cv)

    plot = sub.add_parser("plot", help="figures: fit, heatmap, loo, widths (PNG or SVG)")
    kinds = plot.add_subparsers(dest="kind", required=True, metavar="KIND")
    p = kinds.add_parser("fit", help="the fitted curve over the data (one feature)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("data", metavar="DATA")
    p.add_argument("--target", help="default: the model's target")
    p = kinds.add_parser("heatmap", help="attention weights of the first rows of DATA")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("data", metavar="DATA")
    p.add_argument("--rows", type=_positive_int, default=40, help="queries shown (default 40)")
    p = kinds.add_parser("loo", help="leave-one-out MSE against the bandwidth")
    p.add_argument("data", metavar="DATA")
    p.add_argument("--target", required=True)
    p.add_argument("--features", type=_column_list)
    p.add_argument("--points", type=_positive_int, default=30, help="widths tried (default 30)")
    p = kinds.add_parser("widths", help="the model's kernel widths per feature")
    p.add_argument("model", metavar="MODEL")
    for p in kinds.choices.values():
        p.add_argument("-o", "--output", required=True, metavar="FIG", help=".png or .svg")
        _add_common(p)
        p.set_defaults(func=_cmd_plot)

    demo = sub.add_parser("demo", help="fit the seed's data, print metrics, write its figures")
    demo.add_argument(
        "--outdir", default="figures", help="folder for the figures (default: figures)"
    )
    demo.set_defaults(func=_cmd_demo)
    info = sub.add_parser("info", help="versions, threading and CUDA availability")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv=None) -> int:
    """Run the command; returns the exit code (``sys.exit(main())``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("nbattn: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError, MemoryError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"nbattn: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
