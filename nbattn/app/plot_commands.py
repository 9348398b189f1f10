"""What each ``nbattn plot KIND`` draws, from its parsed arguments: the model file and
data read as the other commands read them (:mod:`nbattn.app.batch`), the figure built by
:mod:`nbattn.app.plotting` or :mod:`nbattn.app.density_figures`."""

from __future__ import annotations

import os

from .._core.progress import Progress
from . import batch

__all__ = ["PLOTS", "figure"]


def _fit(args):
    from . import plotting

    model, features, target = batch.read_model(args.model, args.target)
    target = batch.need_target(target, args.model)
    X, y, _, _ = batch.load_xy(
        args.data,
        features,
        target,
        classifier=batch.is_classifier(model),
        on_nan=args.on_nan,
        var_type=batch.model_kinds(model, features),
        categories=batch.model_categories(model, features),
    )
    # --band: the sandwich's normal band ("asymptotic") or the wild bootstrap's
    band = getattr(args, "band", None)
    if band is not None and not hasattr(model, "predict_interval"):
        raise ValueError(
            f"--band {band}: a {type(model).__name__} model has no band of the mean; "
            "leave --band out to draw its fit"
        )
    band = band or "asymptotic"
    return plotting.fit_figure(model, X, y, target, label=os.path.basename(args.data), band=band)


def _density(args):
    import pandas as pd

    from .density_figures import density_figure

    model, features, stored = batch.read_model(args.model)
    name = type(model).__name__
    if name not in ("KernelDensity", "ConditionalKernelDensity", "KernelQuantileRegressor"):
        raise ValueError(
            f"plot density draws a density model (--model kde, cdens or quantile), not {name}"
        )
    conditional = name != "KernelDensity"
    if not conditional and args.target is not None:
        raise ValueError("--target does not apply to a KernelDensity model (it has no y)")
    if conditional and args.target is not None and stored and args.target != stored:
        raise ValueError(f"--target {args.target!r}: the model was fitted on the target {stored!r}")
    target = batch.need_target(args.target or stored, args.model) if conditional else None
    X, y, _, _ = batch.load_xy(
        args.data,
        features,
        target,
        classifier=False,
        response=conditional,
        on_nan=args.on_nan,
        var_type=batch.model_kinds(model, features),
        categories=batch.model_categories(model, features),
    )
    y = pd.Series(y, name=target) if conditional else None  # the target's name on the axis
    return density_figure(model, X, y, features=args.features)


def _heatmap(args):
    from . import plotting

    model, features, _ = batch.read_model(args.model)
    if not hasattr(model, "attention_weights"):
        raise ValueError(f"{type(model).__name__} has no attention weights to plot")
    X = batch.first_rows(
        args.data,
        features,
        args.rows,
        on_nan=args.on_nan,
        kinds=batch.model_kinds(model, features),
        categories=batch.model_categories(model, features),
        refuses=batch.model_refuses(model),
    )
    return plotting.attention_figure(model, X, os.path.basename(args.data))


def _loo(args):
    from . import plotting

    features = batch.command_features(args)
    X, y, _, kinds = batch.load_xy(
        args.data,
        features,
        args.target,
        classifier=False,
        on_nan=args.on_nan,
        var_type=args.var_type,
    )
    with Progress(args.points, "loo", unit="widths", quiet=args.quiet) as bar:
        return plotting.loo_figure(
            X,
            y,
            args.points,
            progress=bar.update,
            var_type=kinds,
            verbose=int(bar.enabled),  # the search for the marked width: a bar like the curve's
        )


def _widths(args):
    from . import plotting

    model, features, _ = batch.read_model(args.model)
    return plotting.widths_figure(model, features)


PLOTS = {
    "fit": _fit,
    "density": _density,
    "heatmap": _heatmap,
    "loo": _loo,
    "widths": _widths,
}


def figure(args):
    """The figure of ``nbattn plot KIND`` (``args.kind``) from its parsed arguments."""
    return PLOTS[args.kind](args)
