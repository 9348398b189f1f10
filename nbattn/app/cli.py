"""The ``nbattn`` command: fit, predict, evaluate, cv, plot, demo, info, warmup.

Parsing and thin commands only: files are read, predicted and scored by
:mod:`nbattn.app.batch` (on :mod:`nbattn.app.io` and :mod:`nbattn.app.metrics`), figures
drawn by :mod:`nbattn.plotting`, cluster runs done by :mod:`nbattn.dask`.
``predict`` reads its model with :mod:`nbattn.persistence.predictor`, which predicts what
the estimator predicts without importing scikit-learn, so that a fresh process
starts quickly; the other commands load the estimator.

Exit codes: 0 ok; 1 error, reported as one line ``nbattn: error: ...`` on
stderr whatever went wrong; 2 usage error (argparse); 128 + the signal's
number when interrupted (SIGINT 130, SIGHUP 129, SIGTERM 143), reported as
``nbattn: interrupted``. Outputs are written to a temporary file beside
them and renamed when complete, so a failed or interrupted run leaves an
older output untouched and no partial file; inputs are only read.
"""

from __future__ import annotations

import argparse
import json
import sys

from .._core.progress import running
from .._core.validation import plural
from ..estimators.spec import BANDWIDTH_NAMES, DENSITY_BANDWIDTH_NAMES, DENSITY_SPECS, SPECS
from . import batch, io, plot_commands
from .arguments import (
    alpha_arg,
    bandwidth_arg,
    column_list,
    grid_arg,
    int_arg,
    level_arg,
    levels_arg,
    rtol_arg,
    var_type_arg,
    y_width_arg,
)
from .metrics import fold_summary, grid_table, json_ready
from .process import run_command

#: ``--model`` name -> estimator class name (:data:`nbattn.estimators.spec.SPECS`)
MODELS = {
    "nw": "NadarayaWatsonRegressor",
    "lp": "LocalPolynomialRegressor",
    "plr": "PartiallyLinearRegressor",
    "learned": "LearnedKernelRegressor",
    "classifier": "NadarayaWatsonClassifier",
    "kde": "KernelDensity",
    "cdens": "ConditionalKernelDensity",
    "quantile": "KernelQuantileRegressor",
}
#: the models ``nbattn cv`` cross-validates (those that pool a target)
POOLING_MODELS = tuple(m for m, name in MODELS.items() if name not in DENSITY_SPECS)
#: option names of the estimator parameters that another option sets
_OPTION_OF = {"missing": "--on-nan marginalize"}
_SEED_LIMIT = 2**32  # the seeds numpy's and scikit-learn's splitters accept


# ----------------------------------------------------------------------------- helpers


def make_estimator(model="nw", *, verbose=False, **options):
    """The estimator that ``nbattn fit`` builds: ``options`` are bandwidth, metric,
    max_iter, kernel, degree, rtol, bandwidth_type, loo_subsample, var_type, missing, quantile,
    y_bandwidth and linear_columns (None: the estimator's default), refused where they do
    not apply (an option the model does not take, or a name its parameter does not allow)."""
    from .. import estimators

    spec = SPECS[MODELS[model]]
    cls = getattr(estimators, MODELS[model])
    params = spec.defaults()
    if verbose:
        options["verbose"] = 1
    kwargs = {k: v for k, v in options.items() if v is not None}
    for name, value in kwargs.items():
        option = _OPTION_OF.get(name, "--" + name.replace("_", "-"))
        if name not in params:
            raise ValueError(f"{option} does not apply to --model {model} ({cls.__name__})")
        param = spec.param(name)
        if isinstance(value, str) and name != "var_type" and not param.accepts(value):
            raise ValueError(
                f"{option} {value} does not apply to --model {model} ({cls.__name__}): "
                f"it takes {param.describe()}"
            )
    return cls(**kwargs)


def _print_metrics(metrics: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps({k: json_ready(v) for k, v in metrics.items()}))
        return
    for key, value in metrics.items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:<10}{shown}")


# ----------------------------------------------------------------------------- commands


def _load_for(estimator, args, features, target):
    """(estimator with the data's column kinds, X, y, rows dropped) for fit and cv."""
    X, y, dropped, kinds = batch.load_xy(
        args.data,
        features,
        target,
        classifier=batch.is_classifier(estimator),
        response=MODELS[args.model] in DENSITY_SPECS,
        on_nan=args.on_nan,
        var_type=args.var_type,
    )
    if set(kinds) != {"c"} or args.var_type is not None:
        estimator.set_params(var_type=kinds)
    return estimator, X, y, dropped


def _cmd_fit(args) -> int:
    estimator = make_estimator(args.model, verbose=args.verbose, **_model_options(args))
    features = batch.command_features(args)
    io.check_output(args.output, [args.data])
    estimator, X, y, dropped = _load_for(estimator, args, features, args.target)
    batch.warn_row_ids(X, estimator.get_params()["var_type"] or "c" * len(features))
    with running(f"fit {type(estimator).__name__}", quiet=args.quiet or args.verbose):
        estimator.fit(X, y)
    io.save(estimator, args.output, metadata={"target": args.target, "features": features})
    if not args.quiet:
        extra = f" (dropped {plural(dropped, 'row')} with missing values)" if dropped else ""
        print(
            f"fitted {type(estimator).__name__} on {plural(len(X), 'row')} x "
            f"{plural(len(features), 'feature')}"
            f"{extra} -> {args.output}"
        )
        _print_fitted(estimator, features)
        if hasattr(estimator, "y_bandwidth_"):
            lam = "" if estimator.y_type_ == "c" else " (lambda)"
            print(f"y bandwidth: {io.column_option(args.target)}={estimator.y_bandwidth_:.6g}{lam}")
    if args.summary:
        print(estimator.summary())
    return 0


def _print_fitted(estimator, features) -> None:
    """The fitted widths per feature (h, or lambda of a categorical one); for a partially
    linear model, its coefficients with their HC0 standard errors first, and the widths
    of the features in z (the others) only."""
    linear = hasattr(estimator, "linear_columns_")
    if linear:
        coefs = ", ".join(
            f"{io.column_option(features[j])}={b:.6g} (se {se:.3g})"
            for j, b, se in zip(estimator.linear_columns_, estimator.coef_, estimator.coef_se_)
        )
        print(f"coefficients: {coefs}")
    if hasattr(estimator, "bandwidth_"):
        kinds = batch.model_kinds(estimator, features)
        count = getattr(estimator, "bandwidth_type", "fixed") != "fixed"  # k neighbours
        widths = ", ".join(
            f"{io.column_option(features[j])}={h:.6g}"
            + (" (lambda)" if kinds[j] != "c" else " (k)" if count else "")
            for j, h in zip(batch.smoothed_columns(estimator), estimator.bandwidth_)
        )
        print(f"bandwidth{' (z)' if linear else ''}: {widths}")


def _model_options(args, bandwidth=None) -> dict:
    return {
        "bandwidth": args.bandwidth if bandwidth is None else bandwidth,
        "metric": args.metric,
        "max_iter": args.max_iter,
        "kernel": args.kernel,
        "degree": args.degree,
        "rtol": args.rtol,
        "bandwidth_type": args.bandwidth_type,
        "loo_subsample": args.loo_subsample,
        "missing": "marginalize" if args.on_nan == "marginalize" else None,
        "handle_unknown": args.handle_unknown,
        "quantile": getattr(args, "quantile", None),  # fit's options (cv has none)
        "y_bandwidth": getattr(args, "y_bandwidth", None),
        "linear_columns": args.linear_columns,
    }


def _unknown_categories_as(model, handle_unknown):
    """The model, its ``handle_unknown`` replaced by the command's option where given
    (refused for a model without that parameter: the densities)."""
    name = getattr(model, "estimator", type(model).__name__)
    if handle_unknown is not None and name in DENSITY_SPECS:
        raise ValueError(f"--handle-unknown does not apply to a {name} model")
    if handle_unknown is not None:
        if hasattr(model, "set_params"):  # an estimator
            model.set_params(handle_unknown=handle_unknown)
        else:  # a Predictor
            model.params = {**model.params, "handle_unknown": handle_unknown}
    return model


def _read_predictor(path):
    """(predictor, feature names, target column or None) of a model file, without
    scikit-learn (see :mod:`nbattn.persistence.predictor`): ``nbattn predict`` starts in a
    fraction of the time."""
    from ..persistence.predictor import read_predictor

    model, meta = read_predictor(path)
    names = meta.get("feature_names")
    if not names:
        raise ValueError(f"{path}: the model has no feature names (fit it on a table)")
    target = (meta.get("user") or {}).get("target")
    return model, list(names), target if isinstance(target, str) and target else None


#: the ``nbattn predict`` options a model offers no output for, and what it offers
_NOT_OFFERED = {
    "PartiallyLinearRegressor": (
        ("--std", "--interval", "--marginal-effects"),
        "it writes its predictions x . beta + g(z) only (nbattn fit prints the coefficients "
        "beta with their standard errors)",
    )
}


def _refuse_not_offered(args, model) -> None:
    """A ValueError naming the option and the model for an output option the model does
    not offer (:data:`_NOT_OFFERED`)."""
    options, offered = _NOT_OFFERED.get(model.estimator, ((), ""))
    for option in options:
        if getattr(args, option[2:].replace("-", "_")) not in (None, False):
            raise ValueError(f"{option} does not apply to a {model.estimator} model: {offered}")


def _regressor_outputs(args, model, features) -> dict:
    """The interval and marginal-effect options of ``predict_file``, checked against the
    model: refused for classifiers, for a one-constant model (``--interval``) and for a
    model without continuous features (``--marginal-effects``)."""
    if args.kind is not None and args.interval is None:
        raise ValueError("--kind chooses the kind of interval; it needs --interval ALPHA")
    for option, wanted in (
        ("--interval", args.interval is not None),
        ("--marginal-effects", args.marginal_effects),
    ):
        if wanted and model.is_classifier:
            raise ValueError(f"{option} is for regressors; this model is a classifier")
    if model.state["y_fit_"].shape[1] != 1 and (args.interval is not None or args.marginal_effects):
        raise ValueError("--interval and --marginal-effects need a model of one target")
    if args.interval is not None and model.params.get("kernel") == "average":
        raise ValueError(
            "--interval needs a kernel; this model is average pooling (--kernel average)"
        )
    effects = None
    if args.marginal_effects:
        effects = [f for f, k in zip(features, model.var_type_) if k == "c"]
        if not effects:
            raise ValueError("--marginal-effects needs a continuous feature; this model has none")
    return {"interval": args.interval, "kind": args.kind or "mean", "effects": effects}


def _density_outputs(args, model, target) -> dict:
    """The output options of ``predict_file`` for a density model, checked against it:
    ``--quantiles`` for the conditional models, ``--interval`` for a quantile regressor,
    and the observed response (``response``) where DATA holds the target column of a
    conditional density; the pooling regressors' and classifiers' options refused."""
    name = model.estimator
    for option, given in (
        ("--std", args.std),
        ("--proba", args.proba),
        ("--marginal-effects", args.marginal_effects),
        ("--kind", args.kind is not None),
    ):
        if given:
            raise ValueError(f"{option} does not apply to a {name} model")
    if args.interval is not None and name != "KernelQuantileRegressor":
        raise ValueError(f"--interval is for a quantile model (--model quantile), not {name}")
    if args.quantiles is not None and not model.is_conditional:
        raise ValueError(
            f"--quantiles is for a conditional model (--model cdens or quantile), not {name}"
        )
    if args.quantiles is not None and model.state["y_type_"] != "c":
        raise ValueError(f"--quantiles needs a continuous y; this {name}'s y is categorical")
    response = None
    if name == "ConditionalKernelDensity" and target in io.read_columns(args.data):
        response = target
    if name == "ConditionalKernelDensity" and response is None and args.quantiles is None:
        column = io.shorten(target) if target else "its target"
        raise ValueError(
            f"a {name} model writes the log density of the observed {column} (a column DATA "
            "lacks) or the quantiles of --quantiles; give either"
        )
    return {"quantiles": args.quantiles, "interval": args.interval, "response": response}


def _cmd_predict(args) -> int:
    model, features, target = _read_predictor(args.model)
    model = _unknown_categories_as(model, args.handle_unknown)
    io.check_output(args.output, [args.model, args.data])
    classifier = model.is_classifier
    if model.is_density:
        outputs = _density_outputs(args, model, target)
    else:
        if args.quantiles is not None:
            raise ValueError(
                "--quantiles is for a conditional model (--model cdens or quantile), not "
                f"{model.estimator}"
            )
        if args.std and classifier:
            raise ValueError("--std is for regressors; use --proba with a classifier")
        if args.proba and not classifier:
            raise ValueError("--proba is for classifiers")
        _refuse_not_offered(args, model)
        outputs = _regressor_outputs(args, model, features)
    rows, dropped = batch.predict_file(
        model,
        features,
        args.data,
        args.output,
        **outputs,
        name=target or "prediction",
        **_pick(args, "chunksize", "std", "proba", "id_column", "on_nan", "scheduler", "quiet"),
    )
    if not args.quiet:
        extra = f" (dropped {plural(dropped, 'row')} with missing values)" if dropped else ""
        print(f"predicted {plural(rows, 'row')}{extra} -> {args.output}")
    return 0


def _pick(args, *names) -> dict:
    return {name: getattr(args, name) for name in names}


def _cmd_evaluate(args) -> int:
    model, features, target = batch.read_model(args.model, args.target)
    model = _unknown_categories_as(model, args.handle_unknown)
    name = type(model).__name__
    if args.alpha is not None and name != "KernelQuantileRegressor":
        raise ValueError(f"--alpha is for a quantile model (--model quantile), not {name}")
    if name == "KernelDensity" and args.target is not None:
        raise ValueError("--target does not apply to a KernelDensity model (no target)")
    if name in DENSITY_SPECS:
        target = None if name == "KernelDensity" else batch.need_target(target, args.model)
        options = _pick(args, "alpha", "chunksize", "on_nan", "quiet")
        result = batch.evaluate_density_file(model, features, target, args.data, **options)
    else:
        target = batch.need_target(target, args.model)
        result = batch.evaluate_file(
            model, features, target, args.data, **_pick(args, "chunksize", "on_nan", "quiet")
        )
    _print_metrics(result, args.json)
    return 0


def _cmd_cv(args) -> int:
    import pandas as pd

    if args.grid and args.bandwidth is not None:
        raise ValueError("--grid compares bandwidths; it replaces --bandwidth")
    candidates = args.grid or [args.bandwidth]
    estimators = [make_estimator(args.model, **_model_options(args, b)) for b in candidates]
    features = batch.command_features(args)
    classifier = batch.is_classifier(estimators[0])
    X = y = None
    for estimator in estimators:
        _, X, y, _ = _load_for(estimator, args, features, args.target)
    batch.warn_row_ids(X, estimators[0].get_params()["var_type"] or "c" * len(features))
    labels = [f"bandwidth {c}" for c in candidates] if args.grid else None
    tables = batch.cross_validate(
        estimators,
        X,
        y,
        folds=args.folds,
        seed=args.seed,
        verbose=0 if args.quiet else 1,
        labels=labels,
    )
    name = type(estimators[0]).__name__
    if args.grid:
        _print_grid(name, args, candidates, tables, "log_loss" if classifier else "mse")
    elif args.json:
        print(json.dumps({"model": name, **fold_summary(tables[0])}))
    else:
        table = tables[0]
        metrics = table.drop(columns="n")  # the folds' sizes have no mean worth showing
        summary = [metrics.mean().to_frame("mean").T, metrics.std().to_frame("std").T]
        shown = pd.concat([table, *summary])
        print(f"{args.folds}-fold cross-validation of {name}:")
        print(shown.to_string(float_format=lambda v: f"{v:.6g}", na_rep=""))
    return 0


def _print_grid(name, args, candidates, tables, criterion) -> None:
    table, best = grid_table(candidates, tables, criterion)
    if args.json:
        grid = [{"bandwidth": c, **fold_summary(t)} for c, t in zip(candidates, tables)]
        print(json.dumps({"model": name, "criterion": criterion, "grid": grid, "best": best}))
        return
    print(f"{args.folds}-fold cross-validation of {name}, one row per bandwidth (fold means):")
    print(table.to_string(float_format=lambda v: f"{v:.6g}"))
    print(f"best by mean {criterion}: bandwidth {best}")


def _cmd_plot(args) -> int:
    from . import plotting

    plotting.figure_format(args.output)
    io.check_output(args.output, [getattr(args, "model", None), getattr(args, "data", None)])
    plotting.save_figure(plot_commands.figure(args), args.output)
    if not args.quiet:
        print(f"wrote {args.output}")
    return 0


def _cmd_demo(args) -> int:
    from .seed import run_seed

    table = run_seed(outdir=args.outdir)
    print("The attention-pooling walk-through, section 1.3:")
    print("y = 2 sin x + x^0.8 + N(0, 0.5), 50 training points;")
    print("metrics on the test grid against the true function:\n")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    print(f"\nfigures written to {args.outdir}/")
    return 0


def _cmd_warmup(args) -> int:
    from .warmup import run_warmup

    failed = run_warmup(processes=args.processes, quiet=args.quiet)
    return 1 if failed else 0


def _cmd_info(args) -> int:
    from .sysinfo import info_lines

    for line in info_lines():
        print(line)
    return 0


# ----------------------------------------------------------------------------- parser


def _add_common(p, on_nan=True) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    if on_nan:
        p.add_argument(
            "--on-nan",
            choices=("error", "drop", "marginalize"),
            default="error",
            help="rows with a missing value: stop with an error (default), drop them, or "
            "marginalize (the model leaves that column out of that row's kernel; fit with "
            "it to predict with it)",
        )


def _options(model: str, parameter: str) -> tuple:
    """The strings the parameter of ``--model`` allows (its spec's ``Options``)."""
    (rule,) = SPECS[MODELS[model]].param(parameter).allowed
    return rule.values


def _add_model_options(p, models=tuple(MODELS)) -> None:
    _degrees = SPECS[MODELS["lp"]].param("degree").allowed[0]
    _subsample = SPECS[MODELS["lp"]].param("loo_subsample").allowed[0]
    target_help = "the column to predict"
    if "kde" in models:
        target_help += " (--model cdens: the response y; every --model but kde needs one)"
    p.add_argument("--target", help=target_help)
    p.add_argument(
        "--features",
        type=column_list,
        help='A,B,...: default all but the target (a name with a comma: "b, c")',
    )
    p.add_argument(
        "--drop",
        type=column_list,
        action="extend",
        metavar="A,B,...",
        help="columns to leave out of the features (e.g. a row id); may be given again",
    )
    p.add_argument(
        "--linear-columns",
        type=column_list,
        action="extend",
        metavar="A,B,...",
        help="--model plr (required): the features x that enter linearly in y = x . beta + "
        "g(z), each continuous; the other features are z, g a kernel regression on them; "
        "may be given again",
    )
    model_help = "default: nw; plr: partially linear (with --linear-columns)"
    if "kde" in models:
        model_help += (
            "; kde: the density of the features (no --target), cdens: the conditional "
            "density of the target, quantile: its conditional quantile"
        )
    p.add_argument("--model", choices=models, default="nw", help=model_help)
    names = ", ".join(BANDWIDTH_NAMES) + " (nw, lp, plr: also aicc)"
    if "kde" in models:
        names += f" (kde, cdens, quantile: {', '.join(DENSITY_BANDWIDTH_NAMES)})"
    p.add_argument(
        "--bandwidth",
        type=bandwidth_arg,
        help=f"ONE bandwidth: {names}, H (every feature) or H1,H2,... "
        "(one per feature, in order; --model plr: one per feature not in --linear-columns); "
        "default: the model's",
    )
    if "quantile" in models:
        p.add_argument(
            "--quantile",
            type=level_arg,
            metavar="TAU",
            help="--model quantile: the level it predicts, in (0, 1) (default 0.5: the median)",
        )
        p.add_argument(
            "--y-bandwidth",
            type=y_width_arg,
            metavar="H",
            help="--model cdens or quantile: the width of the target y (its lambda when y is "
            "categorical), or cv_cdf (by cross-validation of the conditional CDF, the "
            "quantile model's default); default: the model's",
        )
    p.add_argument("--metric", choices=_options("learned", "metric"), help="--model learned")
    p.add_argument("--max-iter", type=int_arg(1), help="--model learned: optimiser iterations")
    p.add_argument(
        "--kernel",
        choices=_options("nw", "kernel"),
        help="kernel of the continuous columns (default gaussian; average: --model nw)",
    )
    p.add_argument(
        "--bandwidth-type",
        choices=_options("lp", "bandwidth_type"),
        help="--model nw, lp, kde, cdens: fixed widths (default), or R np's nearest-neighbour "
        "widths "
        "(--bandwidth then loo / cv_ml or an integer k per continuous feature)",
    )
    p.add_argument(
        "--degree",
        type=int_arg(_degrees.low, _degrees.high + 1),
        help="--model lp, plr: local polynomial degree (default 1)",
    )
    p.add_argument(
        "--rtol",
        type=rtol_arg,
        help="relative error allowed on every kernel sum, in the width search and "
        "predictions (default 0: exact; 1e-6 skips the keys certifiably too far to count)",
    )
    p.add_argument(
        "--loo-subsample",
        type=int_arg(_subsample.low),
        metavar="ROWS",
        help="--model lp, plr: with --bandwidth loo on at least twice ROWS rows, search a random "
        "subsample of ROWS rows first and finish on all rows: several times faster, never "
        "worse than the rule, but it may stop in another basin (default: every row)",
    )
    _add_handle_unknown(p, "the model's answer to a category not seen at fit (default error)")
    p.add_argument(
        "--var-type",
        type=var_type_arg,
        help="one letter per feature: c continuous, u unordered, o ordered categorical "
        "(default: columns holding text are u, the rest c)",
    )


def _add_handle_unknown(p, help_text) -> None:
    p.add_argument(
        "--handle-unknown",
        choices=_options("nw", "handle_unknown"),
        help=help_text + "; ignore: the column drops out of that row's kernel",
    )


def _with_data(p, model=True, data=True) -> None:
    if model:
        p.add_argument("model", metavar="MODEL")
    if data:
        p.add_argument("data", metavar="DATA")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbattn",
        description="Attention pooling and kernel regression with numba.",
        epilog="exit codes: 0 ok, 1 error, 2 usage error, 128+N interrupted by signal N",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit = sub.add_parser("fit", help="fit a model on a CSV/Parquet file and save it")
    _with_data(fit, model=False)
    _add_model_options(fit)
    fit.add_argument("-o", "--output", required=True, metavar="MODEL", help="model file (.npz)")
    fit.add_argument("-v", "--verbose", action="store_true", help="one line per fit iteration")
    fit.add_argument(
        "--summary",
        action="store_true",
        help="print the fit's summary: widths per column (h/sd, lambda/lambda_max), the "
        "leave-one-out criterion, the effective number of neighbours (printed with -q too)",
    )
    _add_common(fit)
    fit.set_defaults(func=_cmd_fit)

    pred = sub.add_parser("predict", help="predict a CSV/Parquet file in chunks")
    _with_data(pred)
    pred.add_argument("-o", "--output", required=True, metavar="OUT", help=".csv or .parquet")
    pred.add_argument("--chunksize", type=int_arg(1), default=100_000, help="default 100000")
    pred.add_argument("--std", action="store_true", help="add the attention-weighted std")
    pred.add_argument("--proba", action="store_true", help="classifiers: class probabilities")
    pred.add_argument(
        "--interval",
        type=alpha_arg,
        metavar="ALPHA",
        help="regressors: add the pointwise (1 - ALPHA) interval as <target>_lower and "
        "<target>_upper (0.05: 95%%)",
    )
    pred.add_argument(
        "--kind",
        choices=("mean", "observation", "quantile"),
        help="with --interval: the interval of the regression function (mean, the default), "
        "of a new observation (adds the local noise), or a new observation's quantiles at "
        "ALPHA/2 and 1 - ALPHA/2 (quantile: the prediction plus the residuals' quantiles)",
    )
    pred.add_argument(
        "--marginal-effects",
        action="store_true",
        help="regressors: add the slope of the fit along each continuous feature as "
        "d_<target>_d_<feature>",
    )
    pred.add_argument(
        "--quantiles",
        type=levels_arg,
        metavar="Q1,Q2,...",
        help="--model cdens or quantile: the conditional quantiles at these levels, one column "
        "q<level> each (q0.1, q0.9); default for quantile: its fitted level, as prediction. "
        "kde models write log_density (log f(x)); cdens models the log density of the "
        "observed target, log_density, when DATA holds the target",
    )
    pred.add_argument("--id-column", metavar="COL", help="copy this column to the output")
    pred.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the predictions on a dask.distributed cluster (e.g. tcp://host:8786)",
    )
    _add_handle_unknown(pred, "a category not seen at fit: default the model's (set at fit)")
    _add_common(pred)
    pred.set_defaults(func=_cmd_predict)

    ev = sub.add_parser("evaluate", help="metrics of a model on a labelled file")
    _with_data(ev)
    ev.add_argument("--target", help="default: the target the model was fitted on")
    ev.add_argument("--chunksize", type=int_arg(1), default=100_000, help="default 100000")
    ev.add_argument(
        "--alpha",
        type=alpha_arg,
        metavar="ALPHA",
        help="--model quantile: add the coverage and mean width of its (1 - ALPHA) interval "
        "(quantile models: pinball loss at the fitted level; kde, cdens: mean log-likelihood)",
    )
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    _add_handle_unknown(ev, "a category not seen at fit: default the model's (set at fit)")
    _add_common(ev)
    ev.set_defaults(func=_cmd_evaluate)

    cv = sub.add_parser("cv", help="K-fold cross-validated metrics; --grid compares bandwidths")
    _with_data(cv, model=False)
    _add_model_options(cv, POOLING_MODELS)
    cv.add_argument(
        "--grid",
        type=grid_arg,
        metavar="B1,B2,...",
        help=f"bandwidths to COMPARE, each {', '.join(BANDWIDTH_NAMES)} or H (one width for "
        "every feature); one row of fold means per bandwidth",
    )
    cv.add_argument("--folds", type=int_arg(2), default=5, help="default 5")
    cv.add_argument(
        "--seed", type=int_arg(0, _SEED_LIMIT), default=0, help="shuffling seed (default 0)"
    )
    cv.add_argument("--json", action="store_true", help="machine-readable output")
    _add_common(cv)
    cv.set_defaults(func=_cmd_cv)

    plot = sub.add_parser("plot", help="figures: fit, density, heatmap, loo, widths (PNG or SVG)")
    kinds = plot.add_subparsers(dest="kind", required=True, metavar="KIND")
    p = kinds.add_parser(
        "fit",
        help="the fitted curve (a classifier: each class's probability) over the data; one "
        "panel per feature",
    )
    _with_data(p)
    p.add_argument("--target", help="default: the model's target")
    p.add_argument(
        "--band",
        choices=("asymptotic", "bootstrap"),
        help="a regressor's 95%% band of the mean: the normal interval of the sandwich "
        "variance (default) or the percentiles of 999 wild-bootstrap replicates at the "
        "model's widths (--model plr: no band)",
    )
    p = kinds.add_parser(
        "density",
        help="a density model (--model kde, cdens, quantile): a density's curve or joint "
        "contours; a conditional model's quantile fan (and f(y | x)) along one feature",
    )
    _with_data(p)
    p.add_argument(
        "--features",
        type=column_list,
        help="A,B: the columns drawn (kde: one or two; cdens, quantile: one)",
    )
    p.add_argument("--target", help="cdens, quantile: y's column (default: the model's)")
    p = kinds.add_parser("heatmap", help="attention weights of the first rows of DATA")
    _with_data(p)
    p.add_argument("--rows", type=int_arg(1), default=40, help="queries shown (default 40)")
    p = kinds.add_parser("loo", help="leave-one-out MSE against the bandwidth")
    _with_data(p, model=False)
    p.add_argument("--target", required=True)
    p.add_argument("--features", type=column_list)
    p.add_argument("--points", type=int_arg(2), default=30, help="widths tried (default 30)")
    p.add_argument(
        "--var-type",
        type=var_type_arg,
        help="one letter per feature: c continuous, u unordered, o ordered categorical "
        "(default: columns holding text are u, the rest c); the continuous columns' widths "
        "are scaled together, the categorical ones' held at Scott's rule",
    )
    p = kinds.add_parser("widths", help="the model's kernel widths per feature")
    _with_data(p, data=False)
    for p in kinds.choices.values():
        p.add_argument("-o", "--output", required=True, metavar="FIG", help=".png or .svg")
        _add_common(p)
        p.set_defaults(func=_cmd_plot)

    demo = sub.add_parser("demo", help="fit the walk-through's data, print metrics, draw figures")
    demo.add_argument("--outdir", default="figures", help="folder for the figures")
    demo.set_defaults(func=_cmd_demo)
    info = sub.add_parser("info", help="versions, threading, CUDA libraries found")
    info.set_defaults(func=_cmd_info)
    warmup = sub.add_parser(
        "warmup",
        help="compile the common kernels now (the first calls then load them from the cache)",
        description="Compile the kernels of the estimators, nadaraya_watson, local_polynomial "
        "and flash_attention (float32 and float64) into numba's on-disk cache, in parallel "
        "processes, so that their first calls in later processes load them instead of "
        "compiling. A second run finds them cached and takes seconds.",
    )
    warmup.add_argument(
        "-j",
        "--processes",
        type=int_arg(1),
        help="processes compiling at once (default: one per core)",
    )
    warmup.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    warmup.set_defaults(func=_cmd_warmup)
    return parser


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    """Run the command; returns the exit code (``sys.exit(main())``)."""
    return run_command(lambda: _dispatch(argv))


def _dispatch(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("fit", "cv"):
        if args.model != "kde" and args.target is None:
            parser.error(f"the following arguments are required for --model {args.model}: --target")
        if args.model == "kde" and args.target is not None:
            parser.error("--target does not apply to --model kde (the density of the features)")
        if args.model == "plr" and args.linear_columns is None:
            parser.error(
                "--model plr needs --linear-columns A,B,...: the features that enter linearly"
            )
    if getattr(args, "quiet", False):  # -q: no progress, and no first-compile notice
        from .._core import compiling

        compiling.silence()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
