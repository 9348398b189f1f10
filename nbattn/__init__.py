"""nbattn: Numba-accelerated attention pooling and kernel regression.

The public names below are imported on first use (PEP 562 module
``__getattr__``), so ``import nbattn`` costs almost nothing and
``nbattn.flash_attention`` loads numpy, numba and the flash kernels only:
scikit-learn, pandas, matplotlib and Dask load when a name that needs them is
first used. Subpackages (``nbattn.smoothing``, ``nbattn.app``, ...) and the
documented aliases of :data:`ALIASES` (``nbattn.scores``, ``nbattn.dask``, ...)
load the same way.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING

from ._core.version import __version__

#: public name -> the submodule that defines it.
_PUBLIC = {
    "ConditionalKernelDensity": "estimators.conditional",
    "KVCache": "attn.decode",
    "KernelDensity": "estimators.density",
    "KernelQuantileRegressor": "estimators.conditional",
    "LearnedKernelRegressor": "estimators.regressors",
    "LocalPolynomialRegressor": "estimators.regressors",
    "MultiHeadAttention": "attn.layers",
    "NadarayaWatsonClassifier": "estimators.classifier",
    "NadarayaWatsonRegressor": "estimators.regressors",
    "PartiallyLinearRegressor": "estimators.partially_linear",
    "SelfAttention": "attn.layers",
    "attention": "attn.attention",
    "average_pooling": "smoothing.regression",
    "create_block_mask": "attn.flex",
    "flash_attention": "attn.flash",
    "flash_attention_backward": "attn.flash",
    "flash_attention_varlen": "attn.varlen",
    "flash_attention_varlen_backward": "attn.varlen",
    "flash_decode": "attn.decode",
    "flex_tanh": "attn.flex",
    "hierarchical_attention": "attn.hierarchical",
    "kernel_cdf": "distribution.density",
    "kernel_density": "distribution.density",
    "load": "persistence.modelfile",
    "local_polynomial": "local.engine",
    "log_softmax": "attn.softmax",
    "loo_bandwidth": "smoothing.width_search",
    "loo_loss": "smoothing.loo",
    "loo_loss_and_grad": "smoothing.loo",
    "masked_softmax": "attn.softmax",
    "multi_head_attention": "attn.multihead",
    "nadaraya_watson": "smoothing.regression",
    "save": "persistence.modelfile",
    "softmax": "attn.softmax",
}

#: The public names above, the public submodules and the version. The same
#: names are imported under TYPE_CHECKING at the end, for type checkers and
#: IDEs; tests/test_packaging.py checks that the three lists agree.
__all__ = [
    "ConditionalKernelDensity",
    "KVCache",
    "KernelDensity",
    "KernelQuantileRegressor",
    "LearnedKernelRegressor",
    "LocalPolynomialRegressor",
    "MultiHeadAttention",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "PartiallyLinearRegressor",
    "SelfAttention",
    "__version__",
    "attention",
    "average_pooling",
    "create_block_mask",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_varlen",
    "flash_attention_varlen_backward",
    "flash_decode",
    "flex_tanh",
    "hierarchical_attention",
    "kernel_cdf",
    "kernel_density",
    "load",
    "local_polynomial",
    "log_softmax",
    "loo_bandwidth",
    "loo_loss",
    "loo_loss_and_grad",
    "masked_softmax",
    "multi_head_attention",
    "nadaraya_watson",
    "positional",
    "save",
    "scores",
    "softmax",
]


def __getattr__(name: str):
    module_name = _PUBLIC.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if not name.startswith("__") and (name in ALIASES or name in _submodule_names()):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _submodule_names() -> set[str]:
    import pkgutil

    return {info.name for info in pkgutil.iter_modules(__path__)}


#: Documented paths kept as aliases of their homes: ``import nbattn.scores`` and
#: ``nbattn.scores`` give the module ``nbattn.attn.scores`` itself (one module
#: object, loaded on first use).
ALIASES = {
    "dask": "app.dask",
    "datasets": "app.datasets",
    "flash": "attn.flash",
    "plotting": "app.plotting",
    "positional": "attn.positional",
    "scores": "attn.scores",
    "search": "smoothing.search",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``nbattn.<alias>`` as the module it names in :data:`ALIASES`."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        home = importlib.import_module(f"{__name__}.{ALIASES[spec.name.rpartition('.')[2]]}")
        spec.loader_state = home.__spec__
        return home

    def exec_module(self, module):
        # The home module is loaded already; the import system has just set its
        # __spec__ to the alias's: give it its own back (its __name__ is untouched).
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


if TYPE_CHECKING:
    from .attn import positional, scores
    from .attn.attention import attention
    from .attn.decode import KVCache, flash_decode
    from .attn.flash import flash_attention, flash_attention_backward
    from .attn.flex import create_block_mask, flex_tanh
    from .attn.hierarchical import hierarchical_attention
    from .attn.layers import MultiHeadAttention, SelfAttention
    from .attn.multihead import multi_head_attention
    from .attn.softmax import log_softmax, masked_softmax, softmax
    from .attn.varlen import flash_attention_varlen, flash_attention_varlen_backward
    from .distribution.density import kernel_cdf, kernel_density
    from .estimators.classifier import NadarayaWatsonClassifier
    from .estimators.conditional import ConditionalKernelDensity, KernelQuantileRegressor
    from .estimators.density import KernelDensity
    from .estimators.partially_linear import PartiallyLinearRegressor
    from .estimators.regressors import (
        LearnedKernelRegressor,
        LocalPolynomialRegressor,
        NadarayaWatsonRegressor,
    )
    from .local.engine import local_polynomial
    from .persistence.modelfile import load, save
    from .smoothing.loo import loo_loss, loo_loss_and_grad
    from .smoothing.regression import average_pooling, nadaraya_watson
    from .smoothing.width_search import loo_bandwidth
