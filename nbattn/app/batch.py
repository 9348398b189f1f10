"""Models over files: load a labelled table, predict or score a file in chunks, and
cross-validate: the work behind ``nbattn fit / predict / evaluate / cv``.

Files are read through :mod:`nbattn.app.io` (errors name the row and the column)
and written through :func:`nbattn._core.atomic.atomic_output`, so a failed or
interrupted run leaves no partial output. Memory is bounded by the chunk size,
not by the file.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import shlex
import warnings

import numpy as np

from .._core.atomic import atomic_output, check_not_input
from .._core.progress import FitProgress, Progress
from .._core.validation import plural
from . import io
from .arguments import quantile_column
from .metrics import Metrics, score_chunk

__all__ = [
    "ROW_ID_MIN_ROWS",
    "RowIdWarning",
    "cross_validate",
    "density_columns",
    "evaluate_density_file",
    "evaluate_file",
    "feature_columns",
    "first_rows",
    "load_xy",
    "model_categories",
    "model_kinds",
    "model_refuses",
    "predict_columns",
    "predict_file",
    "read_model",
    "response_block",
    "row_id_columns",
    "smoothed_columns",
    "warn_row_ids",
]

#: the fewest rows on which a column with a different value on every row is called a row id
ROW_ID_MIN_ROWS = 10


class RowIdWarning(UserWarning):
    """A feature column looks like a row id (see :func:`row_id_columns`)."""


def feature_columns(path, target, features=None, drop=None) -> list:
    """The feature columns of a labelled file: ``features`` (checked), or every column
    but the target (None: a density's, every column is a feature), less the columns in
    ``drop``; a missing column is an error that lists the file's columns, and so is a
    feature named twice, the target among the features, and a ``drop`` that leaves no
    feature."""
    columns = io.read_columns(path)
    if target is not None:
        io.check_columns(path, columns, [target], "target column", spell=str)
    if features:
        io.check_columns(path, columns, features, "feature column")
        twice = [c for k, c in enumerate(features) if c in features[:k]]
        if twice:
            raise ValueError(f"--features names the column {io.shorten(twice[0])} twice")
        if target in features:
            raise ValueError(
                f"--features names the target column {io.shorten(target)}; a column cannot be both"
            )
        features = list(features)
    else:
        features = [c for c in columns if c != target]
    if drop:
        io.check_columns(path, columns, drop, "--drop column")
        if target in drop:
            raise ValueError(
                f"--drop names the target column {io.shorten(target)}, which is never a feature"
            )
        outside = [c for c in drop if c not in features]
        if outside:
            raise ValueError(
                f"--drop {io.shorten(outside[0])} is not one of the features given by --features"
            )
        kept = [c for c in features if c not in drop]
        if not kept:
            raise ValueError(
                f"{path}: --drop leaves no feature columns (it names all "
                f"{plural(len(features), 'feature')})"
            )
        features = kept
    if not features:
        if target is None:
            raise ValueError(f"{path}: no feature columns")
        raise ValueError(f"{path}: no feature columns besides the target {io.shorten(target)}")
    return features


def _check_columns(path, features, **others) -> None:
    """Every feature column, and each of ``others`` (what -> column or None), is in the file."""
    columns = io.read_columns(path)
    for what, column in others.items():
        if column is not None:
            io.check_columns(path, columns, [column], f"{what.replace('_', ' ')} column", spell=str)
    io.check_columns(path, columns, features, "feature column")


def command_features(args) -> list:
    """The feature columns of ``args.data`` (``--target``, ``--features``, ``--drop``), and
    the options that give one value per feature (``--var-type``, ``--bandwidth H1,H2,...``)
    checked against them, naming the features: before the file is read."""
    drop = getattr(args, "drop", None)
    features = feature_columns(args.data, args.target, args.features, drop)
    linear = getattr(args, "linear_columns", None) or []
    _check_linear_columns(linear, features, args.target, drop)
    bandwidth = getattr(args, "bandwidth", None)
    z = [f for f in features if f not in linear]
    per_feature = {
        "--var-type": (getattr(args, "var_type", None), "letter", features),
        "--bandwidth": (bandwidth if isinstance(bandwidth, list) else None, "width", z),
    }
    for option, (values, unit, columns) in per_feature.items():
        if values is not None and len(values) != len(columns):
            names = io.clip(", ".join(io.column_option(f) for f in columns), 300)
            each, are = "feature", "is" if len(columns) == 1 else "are"
            if columns is z and linear:
                each = "feature not in --linear-columns"
            raise ValueError(
                f"{option} gives {plural(len(values), unit)}, one per {each}, but there "
                f"{are} {plural(len(columns), 'feature')}: {names}"
            )
    return features


def _check_linear_columns(linear, features, target, drop) -> None:
    """A ValueError naming the column for a ``--linear-columns`` name that is not one of
    the features (the target, a ``--drop`` column, or not given by ``--features``),
    named twice, or that leaves no feature for the nonparametric part z."""
    for k, column in enumerate(linear):
        shown = io.shorten(column)
        if column in linear[:k]:
            raise ValueError(f"--linear-columns names the column {shown} twice")
        if column in features:
            continue
        if column == target:
            why = "is the target column"
        elif drop and column in drop:
            why = "is left out by --drop"
        else:
            why = "is not one of the features"
        names = io.clip(", ".join(io.column_option(f) for f in features), 300)
        raise ValueError(f"--linear-columns {shown} {why}; the features are: {names}")
    if linear and len(set(linear)) == len(features):
        raise ValueError(
            "--linear-columns names every feature; at least one must stay in z, the "
            "nonparametric part g(z)"
        )


def is_classifier(model) -> bool:
    """Whether an estimator is a scikit-learn classifier (scikit-learn imported here)."""
    from sklearn.base import is_classifier as sklearn_is_classifier

    return bool(sklearn_is_classifier(model))


def need_target(target, path):
    """``target``, or an error naming the model file that does not name its target."""
    if not target:
        raise ValueError(f"{path}: the model does not name its target; pass --target")
    return target


def read_model(path, target=None):
    """(model, feature names, target column) of a model file; the target is ``target``
    when given, else the one saved by ``nbattn fit`` (None if neither)."""
    model, meta = io.read_model_file(path)
    names = meta.get("feature_names")
    if not names:
        raise ValueError(f"{path}: the model has no feature names (fit it on a table)")
    return model, list(names), target or meta.get("user", {}).get("target")


def _labels(frame, target, fmt, classes=None):
    values = frame[target].to_numpy()
    return io.labels_from_text(values, classes) if fmt == "csv" else values


def load_xy(
    path,
    features,
    target,
    *,
    classifier,
    response=False,
    on_nan="error",
    quiet=True,
    var_type=None,
    categories=None,
    refuses=None,
):
    """The whole file: features, target, the number of rows dropped and the column kinds.

    Feature columns holding text are categorical ("u"); ``var_type`` (one
    letter of "cuo" per feature) overrides. Categorical columns are read as
    text and typed as one whole column (:func:`nbattn.app.io.category_values`: "7" is
    the number 7 when the column holds only numbers, whatever the chunking; with a
    fitted model's ``categories``, the category each text spells), continuous ones as
    float64 (:func:`nbattn.app.io.feature_block`). A
    classifier's labels are typed by :func:`nbattn.app.io.labels_from_text`
    (integers when every label is one, else text), whatever the chunking.
    ``on_nan``: "error", "drop" or "marginalize" (missing features kept; a
    missing target is still an error or dropped). ``target`` None: no target (a
    density's data; y is None). ``response``: the target is a conditional model's
    response, categorical when it holds text (typed as a categorical feature is, by
    :func:`nbattn.app.io.category_values`), else continuous.

    Returns
    -------
    X : DataFrame, y : ndarray or None, dropped : int, kinds : str
    """
    _check_columns(path, features, target=target)
    fmt = io.input_format(path)
    targets = [] if target is None else [target]
    columns = list(dict.fromkeys([*features, *targets]))
    labels = targets if classifier else []
    frame = io.read_table(path, columns, quiet=quiet, text_columns=labels)
    kinds = io.text_kinds(frame, features, var_type)
    y_kind = io.text_kinds(frame, targets) if response else "c" * len(targets)
    categorical = [f for f, k in zip([*features, *targets], kinds + y_kind) if k != "c"]
    if categorical and io.input_format(path) == "csv":
        frame = io.read_table(path, columns, quiet=True, text_columns=[*labels, *categorical])
    where = {"source": path, "fmt": fmt}
    X, keep = io.feature_block(
        frame, features, kinds, categories=categories, **where, on_nan=on_nan, **(refuses or {})
    )
    target_nan = "drop" if on_nan == "drop" else "error"
    if target is None:
        y = None
    elif classifier:
        keep &= io.check_labels(frame, target, **where, on_nan=target_nan)
    else:
        y, keep_y = io.feature_block(frame, [target], y_kind, **where, on_nan=target_nan)
        keep &= keep_y
    if not keep.all():
        frame, X = frame[keep], X[keep]
        if len(X) == 0:
            raise ValueError(f"{path}: no rows left after dropping rows with missing values")
    if classifier:
        y = _labels(frame, target, fmt)
    elif y is not None:
        y = y[target].to_numpy()[keep]
    return X.reset_index(drop=True), y, int((~keep).sum()), kinds


def row_id_columns(X, kinds) -> list:
    """``(column, description)`` for each column of the table X (as :func:`load_xy` makes
    it, ``kinds`` one letter per column) that looks like a row id rather than a feature:
    on at least :data:`ROW_ID_MIN_ROWS` rows, none missing, a different value on every
    row, and either categorical (each category then matches no other row), or whole
    numbers that are sorted or are n consecutive integers in any order."""
    n = len(X)
    found = []
    if n < ROW_ID_MIN_ROWS:
        return found
    for column, kind in zip(X.columns, kinds):
        series = X[column]
        if series.isna().any() or series.nunique() != n:
            continue
        if kind != "c":
            what = f"a different value on each of the {n} rows: as a category it matches no other"
            found.append((column, what))
            continue
        values = series.to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(values)) or not np.array_equal(values, np.round(values)):
            continue
        steps = np.diff(values)
        low, high = values.min(), values.max()
        if np.all(steps > 0) or np.all(steps < 0):
            found.append((column, f"a different whole number on each of the {n} rows, in order"))
        elif high - low == n - 1:
            found.append((column, f"the {n} whole numbers {low:.0f} to {high:.0f}, one per row"))
    return found


def warn_row_ids(X, kinds) -> None:
    """One :class:`RowIdWarning` per feature column of X that looks like a row id
    (:func:`row_id_columns`), naming it and the option that leaves it out."""
    for column, description in row_id_columns(X, kinds):
        name = io.shorten(column)
        warnings.warn(
            f"feature {name} looks like a row id ({description}); if it is not a feature, "
            f"leave it out with --drop {shlex.quote(io.column_option(column))}",
            RowIdWarning,
            stacklevel=2,
        )


def model_kinds(model, features) -> str:
    """The column kinds a fitted model reads its features with (all "c" for old models)."""
    kinds = getattr(model, "var_type_", None)
    return kinds if isinstance(kinds, str) else "c" * len(features)


def smoothed_columns(model) -> list:
    """The positions of a fitted model's columns with a kernel width (``bandwidth_``, in
    this order): all, but a partially linear model's z only (not in ``linear_columns_``)."""
    linear = np.asarray(getattr(model, "linear_columns_", ()), dtype=np.int64)
    return [j for j in range(np.asarray(model.X_fit_).shape[1]) if j not in linear]


def model_categories(model, features) -> list:
    """The categories a fitted model encodes each feature with (None: continuous)."""
    cats = getattr(model, "categories_", None)
    return cats if isinstance(cats, list) else [None] * len(features)


def model_refuses(model) -> dict:
    """What a fitted model (an estimator or a Predictor) refuses in its queries, as the
    keywords of :func:`nbattn.app.io.feature_block` that refuse it first, naming the data
    row: ``model_missing`` (its ``missing``) and ``handle_unknown``."""
    params = getattr(model, "params", None)

    def param(name):
        if isinstance(params, dict):  # a Predictor
            return params.get(name, "error")
        return getattr(model, name, "error")

    return {"model_missing": param("missing"), "handle_unknown": param("handle_unknown")}


def _text_columns(features, kinds) -> list:
    return [f for f, k in zip(features, kinds) if k != "c"]


def first_rows(path, features, n, *, on_nan="error", kinds=None, categories=None, refuses=None):
    """The ``features`` of the first ``n`` rows of a file (a DataFrame as
    :func:`nbattn.app.io.feature_block` makes it: ``kinds`` per feature, all "c" by
    default, categorical text typed after a fitted model's ``categories``, what it
    ``refuses`` (:func:`model_refuses`) refused naming the row); with
    ``on_nan="drop"`` rows with a missing value are left out."""
    kinds = "c" * len(features) if kinds is None else kinds
    _check_columns(path, features)
    chunks, _, _ = io.iter_chunks(path, features, n, text_columns=_text_columns(features, kinds))
    frame = next(chunks, (None,))[0]
    if frame is None or len(frame) == 0:
        raise ValueError(f"{path}: no data rows (only a header)")
    fmt = io.input_format(path)
    X, keep = io.feature_block(
        frame,
        features,
        kinds,
        categories=categories,
        source=path,
        fmt=fmt,
        on_nan=on_nan,
        **(refuses or {}),
    )
    return X[keep].reset_index(drop=True)


def predict_columns(
    model,
    X,
    std=False,
    proba=False,
    interval=None,
    kind="mean",
    effects=None,
    name="prediction",
    quantiles=None,
    y=None,
) -> dict:
    """The output columns for one chunk: ``prediction``, [``std``] (``prediction_k``,
    [``std_k``] for each target k of a model of several), with ``interval`` (an
    alpha) [``<name>_lower``, ``<name>_upper``] (``model.predict_interval(X, interval,
    kind)``), with ``effects`` (the continuous features' names) [``d_<name>_d_<feature>``
    for each] (``model.marginal_effects``), [``proba_<class>`` for each class].

    A density model's (:func:`density_columns`): ``log_density``; the conditional
    quantiles at ``quantiles`` and the conditional log density of the observed ``y``."""
    if getattr(model, "is_density", False):
        return density_columns(model, X, quantiles, interval, name, y)
    out = {}
    if std:
        out["prediction"], out["std"] = model.predict(X, return_std=True)
    else:
        out["prediction"] = model.predict(X)
    for column in ("prediction", "std"):  # a model of several targets: a column for each
        values = out.pop(column, None)
        if values is not None and np.ndim(values) == 2:
            out.update({f"{column}_{k}": values[:, k] for k in range(values.shape[1])})
        elif values is not None:
            out[column] = values
    if interval is not None:
        band = model.predict_interval(X, alpha=interval, kind=kind)
        out[f"{name}_lower"], out[f"{name}_upper"] = band[:, 0], band[:, 1]
    if effects:
        slopes = model.marginal_effects(X)
        for k, feature in enumerate(effects):
            out[f"d_{name}_d_{feature}"] = slopes[:, k]
    if proba:
        probabilities = model.predict_proba(X)
        for k, label in enumerate(model.classes_):
            out[f"proba_{label}"] = probabilities[:, k]
    return out


def density_columns(model, X, quantiles=None, interval=None, name="prediction", y=None) -> dict:
    """The output columns of a density model (a :class:`nbattn.persistence.predictor.Predictor`
    of one) for one chunk:

    * KernelDensity: ``log_density``, log f(x) (the log: f underflows in many dimensions;
      exp of it is the density);
    * a conditional model with ``quantiles`` (levels): ``q<level>`` for each
      (:func:`nbattn.app.arguments.quantile_column`), the conditional quantiles; a
      KernelQuantileRegressor without: ``prediction``, the quantile at its fitted level;
    * ConditionalKernelDensity with the observed response ``y``: ``log_density``,
      log f(y | x);
    * a KernelQuantileRegressor with ``interval`` (an alpha): ``<name>_lower``,
      ``<name>_upper``, its quantiles at alpha/2 and 1 - alpha/2.
    """
    if model.estimator == "KernelDensity":
        return {"log_density": model.score_samples(X)}
    out = {}
    if quantiles is not None:
        values = model.predict_quantile(X, list(quantiles))
        out.update({quantile_column(q): values[:, k] for k, q in enumerate(quantiles)})
    elif model.estimator == "KernelQuantileRegressor":
        out["prediction"] = model.predict(X)
    if y is not None:
        out["log_density"] = model.score_samples(X, y)
    if interval is not None:
        band = model.predict_interval(X, interval)
        out[f"{name}_lower"], out[f"{name}_upper"] = band[:, 0], band[:, 1]
    return out


def response_block(model, frame, response, where, on_nan):
    """The observed response of a conditional model in ``frame`` (its column ``response``)
    as :func:`load_xy` reads it at fit, typed after the model's categories, and the rows
    that have one (``on_nan`` "drop": the others are False; else a missing one is an error
    naming its row, as is a category the model has not seen)."""
    kind, categories = model._fitted("y_type_"), model._fitted("y_categories_")
    block, keep = io.feature_block(
        frame,
        [response],
        kind,
        categories=None if kind == "c" else [categories],
        **where,
        on_nan="drop" if on_nan == "drop" else "error",
        model_missing="error",
        handle_unknown="error",
    )
    return block[response].to_numpy(), keep


def predict_file(
    model,
    features,
    data,
    output,
    *,
    chunksize=100_000,
    id_column=None,
    on_nan="error",
    scheduler=None,
    quiet=True,
    response=None,
    **outputs,
):
    """Predict every row of ``data`` into ``output`` (CSV or Parquet) chunk by chunk.

    The columns are ``[id_column]`` and those of :func:`predict_columns`, which
    ``outputs`` (its keywords: ``std``, ``proba``, ``interval``, ``kind``, ``effects``,
    ``name``, ``quantiles``) choose; with ``scheduler`` (a ``dask.distributed`` address)
    the chunks are predicted on that cluster and written in input order. ``response``: the
    column of a conditional model's observed y (:func:`response_block`), passed on as
    ``y``. Returns (rows written, rows dropped).
    """
    import pandas as pd

    inspect.signature(predict_columns).bind(model, None, **outputs)  # unknown: TypeError
    columns_of = functools.partial(predict_columns, **outputs)
    _check_columns(data, features, id=id_column, response=response)
    check_not_input([data], output)
    out_fmt = io.output_format(output)
    in_fmt = io.input_format(data)
    extra = [c for c in (id_column, response) if c]
    wanted = list(dict.fromkeys([*features, *extra]))
    kinds = model_kinds(model, features)
    cats = model_categories(model, features)
    refuses = model_refuses(model)
    text = _text_columns(features, kinds)
    if response and model._fitted("y_type_") != "c":
        text.append(response)
    chunks, total, unit = io.iter_chunks(data, wanted, chunksize, text_columns=text)
    n_in = dropped = 0
    with (
        atomic_output(output) as tmp,
        io.TableWriter(tmp, out_fmt) as writer,
        Progress(total, "predict", unit=unit, quiet=quiet) as bar,
        contextlib.ExitStack() as stack,
    ):

        def write(columns, ids):
            if ids is not None and id_column in columns:
                raise ValueError(
                    f"--id-column {io.shorten(id_column)} has the name of an output column"
                )
            writer.write(pd.DataFrame({**({} if ids is None else {id_column: ids}), **columns}))

        runner = None
        if scheduler:
            from .dask import ClusterChunkRunner

            runner = stack.enter_context(ClusterChunkRunner(scheduler, model, write, columns_of))
        for frame, first_row, position in chunks:
            where = {"first_row": first_row, "source": data, "fmt": in_fmt}
            X, keep = io.feature_block(
                frame, features, kinds, categories=cats, **where, on_nan=on_nan, **refuses
            )
            rows = first_row + np.flatnonzero(keep)  # data rows of the chunk's rows kept
            y = None
            if response:
                y, keep_y = response_block(model, frame, response, where, on_nan)
                keep &= keep_y
            n_in += len(frame)
            if not keep.all():
                dropped += int((~keep).sum())
                frame, X = frame[keep], X[keep]
                y = None if y is None else y[keep]
            bar.update(position=position)
            if len(X) == 0:
                continue
            ids = frame[id_column].to_numpy() if id_column else None
            X = X.reset_index(drop=True)
            given = {} if y is None else {"y": y}
            if runner is not None:
                runner.submit(X, ids, **given)
            else:
                with file_rows(data, in_fmt, rows):
                    columns = columns_of(model, X, **given)
                write(columns, ids)
        if runner is not None:
            runner.finish()
        if n_in == 0:
            raise ValueError(f"{data}: no data rows (only a header)")
        if writer.rows == 0:
            raise ValueError(f"{data}: no rows left after dropping rows with missing values")
    return writer.rows, dropped


#: how an estimator's error names a row of the X it was given ("... at row 3 ...")
_AT_ROW = re.compile(r" at row (\d+)\b")


@contextlib.contextmanager
def file_rows(data, fmt, rows):
    """Re-raise a ValueError of a model on one chunk that names a row of it ("at row i")
    naming that row of the file instead, ``rows[i]`` (its 0-based data row): the chunk's
    own numbering (from 0 in each chunk, after the dropped rows) tells the user nothing."""
    try:
        yield
    except ValueError as exc:
        found = _AT_ROW.search(str(exc))
        if found is None or int(found.group(1)) >= len(rows):
            raise
        where = io.row_location(data, fmt, int(rows[int(found.group(1))]))
        raise ValueError(f"{where}: {_AT_ROW.sub('', str(exc), count=1)}") from None


def evaluate_file(model, features, target, data, *, chunksize=100_000, on_nan="error", quiet=True):
    """Metrics of ``model`` on the labelled file ``data``, read in chunks (a dict, see
    :meth:`nbattn.app.metrics.Metrics.result`). A label the model has not seen is an
    error naming its row."""
    _check_columns(data, features, target=target)
    classifier = is_classifier(model)
    metrics = Metrics(classifier, getattr(model, "classes_", None))
    fmt = io.input_format(data)
    kinds = model_kinds(model, features)
    cats = model_categories(model, features)
    refuses = model_refuses(model)
    chunks, total, unit = io.iter_chunks(
        data,
        list(dict.fromkeys([*features, target])),
        chunksize,
        text_columns=[*([target] if classifier else []), *_text_columns(features, kinds)],
    )
    n_in = 0
    with Progress(total, "evaluate", unit=unit, quiet=quiet) as bar:
        for frame, first_row, position in chunks:
            kw = {"first_row": first_row, "source": data, "fmt": fmt}
            X, keep = io.feature_block(
                frame, features, kinds, categories=cats, **kw, on_nan=on_nan, **refuses
            )
            kw["on_nan"] = "drop" if on_nan == "drop" else "error"
            if classifier:
                keep &= io.check_labels(frame, target, **kw)
            else:
                y, keep_y = io.numeric_block(frame, [target], **kw)
                keep &= keep_y
            n_in += len(frame)
            rows = np.flatnonzero(keep)
            if classifier:
                y = _labels(frame.iloc[rows], target, fmt, metrics.classes)
            else:
                y = y[rows, 0]
            bar.update(position=position)
            if len(y):

                def where(i, first_row=first_row, rows=rows):
                    return io.row_location(data, fmt, first_row + int(rows[i]))

                with file_rows(data, fmt, first_row + rows):
                    score_chunk(model, X.iloc[rows].reset_index(drop=True), y, metrics, where)
    if n_in == 0:
        raise ValueError(f"{data}: no data rows (only a header)")
    if metrics.n == 0:
        raise ValueError(f"{data}: no rows left after dropping rows with missing values")
    return metrics.result()


def evaluate_density_file(
    model, features, target, data, *, alpha=None, chunksize=100_000, on_nan="error", quiet=True
):
    """Metrics of a density model on the file ``data``, read in chunks:

    * KernelDensity (``target`` None): ``log_lik``, the mean log density of the rows;
    * ConditionalKernelDensity: ``log_lik``, the mean log f(y | x) of the observed ``target``;
    * KernelQuantileRegressor: ``pinball``, the mean pinball loss at its level tau,
      mean(max(tau (y - q), (tau - 1) (y - q))), and with ``alpha`` the ``coverage`` of its
      (1 - alpha) interval (the share of rows with y inside it) and the interval's mean
      ``width``.

    Each with ``n``, the rows scored. Returns a dict.
    """
    _check_columns(data, features, target=target)
    fmt = io.input_format(data)
    kinds = model_kinds(model, features)
    cats = model_categories(model, features)
    refuses = model_refuses(model)
    quantile = type(model).__name__ == "KernelQuantileRegressor"
    text = _text_columns(features, kinds)
    if target is not None and model.y_type_ != "c":
        text.append(target)
    wanted = list(dict.fromkeys([*features, *([target] if target else [])]))
    chunks, total, unit = io.iter_chunks(data, wanted, chunksize, text_columns=text)
    n_in = 0
    sums = {"n": 0, "log_lik": 0.0, "pinball": 0.0, "covered": 0, "width": 0.0}
    with Progress(total, "evaluate", unit=unit, quiet=quiet) as bar:
        for frame, first_row, position in chunks:
            where = {"first_row": first_row, "source": data, "fmt": fmt}
            X, keep = io.feature_block(
                frame, features, kinds, categories=cats, **where, on_nan=on_nan, **refuses
            )
            y = None
            if target is not None:
                y, keep_y = response_block(model, frame, target, where, on_nan)
                keep &= keep_y
                y = y[keep]
            n_in += len(frame)
            bar.update(position=position)
            X = X[keep].reset_index(drop=True)
            if len(X) == 0:
                continue
            sums["n"] += len(X)
            if not quantile:
                scores = model.score_samples(X) if y is None else model.score_samples(X, y)
                sums["log_lik"] += float(np.sum(scores))
                continue
            y = y.astype(np.float64)
            residual = y - model.predict(X)
            tau = model.quantile
            sums["pinball"] += float(np.sum(np.maximum(tau * residual, (tau - 1.0) * residual)))
            if alpha is not None:
                lower, upper = model.predict_interval(X, alpha).T
                sums["covered"] += int(np.sum((lower <= y) & (y <= upper)))
                sums["width"] += float(np.sum(upper - lower))
    if n_in == 0:
        raise ValueError(f"{data}: no data rows (only a header)")
    n = sums["n"]
    if n == 0:
        raise ValueError(f"{data}: no rows left after dropping rows with missing values")
    if not quantile:
        return {"n": n, "log_lik": sums["log_lik"] / n}
    result = {"n": n, "pinball": sums["pinball"] / n}
    if alpha is not None:
        result.update(coverage=sums["covered"] / n, width=sums["width"] / n)
    return result


def cross_validate(estimators, X, y, *, folds=5, seed=0, verbose=0, labels=None):
    """K-fold metrics of each estimator on the same folds (stratified for classifiers).

    ``verbose`` (0, 1 or 2, as for the fits: :class:`nbattn._core.progress.FitProgress`)
    reports the folds x estimators fits: a bar on a terminal with the candidate and
    fold under way, else a line per fit with its criterion (MSE, or a classifier's log
    loss), the candidate's mean so far and the elapsed time. ``labels`` names each
    estimator in those lines (default: "candidate k/m" when there are several).

    Returns one DataFrame per estimator: a row per fold (index ``fold``
    from 1), a column per metric.
    """
    import pandas as pd
    from sklearn.base import clone
    from sklearn.model_selection import KFold, StratifiedKFold

    if folds < 2 or folds > len(y):
        raise ValueError(f"--folds must be between 2 and the number of rows ({len(y)})")
    classifier = is_classifier(estimators[0])
    splitter = (StratifiedKFold if classifier else KFold)(
        n_splits=folds, shuffle=True, random_state=seed
    )
    splits = list(splitter.split(X, y))
    labels = _candidate_labels(estimators, labels)
    criterion = "log_loss" if classifier else "mse"
    tables = []
    with FitProgress(verbose, "cv", total=len(splits) * len(estimators), unit="fit") as log:
        if log.enabled:
            log.note(
                f"{plural(len(splits), 'fold')} x {plural(len(estimators), 'candidate')} "
                f"on {plural(len(y), 'row')}"
            )
        for estimator, label in zip(estimators, labels):
            rows = []
            for k, (train, test) in enumerate(splits, start=1):
                where = f"{label}fold {k}/{len(splits)}"
                log.status(f"{where}: fitting on {plural(len(train), 'row')}")
                model = clone(estimator).fit(X.iloc[train], y[train])
                metrics = Metrics(classifier, getattr(model, "classes_", None))
                score_chunk(model, X.iloc[test], y[test], metrics)
                rows.append(metrics.result())
                so_far = float(np.mean([r[criterion] for r in rows]))
                log.step(
                    f"{where}: {criterion} {rows[-1][criterion]:.6g}; mean so far {so_far:.6g}"
                )
            tables.append(pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="fold")))
    return tables


def _candidate_labels(estimators, labels) -> list:
    """The prefix of each estimator's progress lines ("" for a single unnamed one)."""
    if labels is None:
        m = len(estimators)
        return [f"candidate {k}/{m}, " if m > 1 else "" for k in range(1, m + 1)]
    if len(labels) != len(estimators):
        raise ValueError(f"labels must name each of the {len(estimators)} estimators")
    return [f"{label}, " for label in labels]
