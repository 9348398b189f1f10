"""nbattn: Numba-accelerated attention pooling and kernel regression.

The public names below are imported on first use (PEP 562 module
``__getattr__``), so ``import nbattn`` costs almost nothing and
``nbattn.flash_attention`` loads numpy, numba and the flash kernels only:
scikit-learn, pandas, matplotlib and Dask load when a name that needs them is
first used. Submodules (``nbattn.learning``, ``nbattn.dask``, ...) load the
same way.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

#: The one source of the version: pyproject.toml reads it from here.
__version__ = "0.1.0"

#: public name -> the submodule that defines it.
_PUBLIC = {
    "KVCache": "decode",
    "LearnedKernelRegressor": "estimators",
    "LocalPolynomialRegressor": "estimators",
    "MultiHeadAttention": "layers",
    "NadarayaWatsonClassifier": "estimators",
    "NadarayaWatsonRegressor": "estimators",
    "SelfAttention": "layers",
    "attention": "attention",
    "average_pooling": "regression",
    "flash_attention": "flash",
    "flash_attention_backward": "flash",
    "flash_attention_varlen": "varlen",
    "flash_attention_varlen_backward": "varlen",
    "flash_decode": "decode",
    "hierarchical_attention": "attention",
    "load": "modelfile",
    "local_polynomial": "local",
    "log_softmax": "attention",
    "loo_bandwidth": "learning",
    "loo_loss": "learning",
    "loo_loss_and_grad": "learning",
    "masked_softmax": "attention",
    "multi_head_attention": "attention",
    "nadaraya_watson": "regression",
    "save": "modelfile",
    "softmax": "attention",
}

#: The public names above, the public submodules and the version. The same
#: names are imported under TYPE_CHECKING at the end, for type checkers and
#: IDEs; tests/test_packaging.py checks that the three lists agree.
__all__ = [
    "KVCache",
    "LearnedKernelRegressor",
    "LocalPolynomialRegressor",
    "MultiHeadAttention",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "SelfAttention",
    "__version__",
    "attention",
    "average_pooling",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_varlen",
    "flash_attention_varlen_backward",
    "flash_decode",
    "hierarchical_attention",
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
    if not name.startswith("__") and name in _submodule_names():
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _submodule_names() -> set[str]:
    import pkgutil

    return {info.name for info in pkgutil.iter_modules(__path__)}


class _Package(types.ModuleType):
    """The type of the ``nbattn`` module object.

    Importing a submodule binds it as an attribute of its package. For a
    submodule that shares its name with a public function (``nbattn.attention``
    the module defines ``nbattn.attention`` the function), that binding would
    replace the function whenever some other module imports the submodule
    first; this type leaves such a name unbound instead, so it resolves through
    ``__getattr__`` to the function. ``sys.modules`` still holds the submodule.
    """

    def __setattr__(self, name, value):
        if (
            name in _PUBLIC
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:
    from . import positional, scores
    from .attention import (
        attention,
        hierarchical_attention,
        log_softmax,
        masked_softmax,
        multi_head_attention,
        softmax,
    )
    from .decode import KVCache, flash_decode
    from .estimators import (
        LearnedKernelRegressor,
        LocalPolynomialRegressor,
        NadarayaWatsonClassifier,
        NadarayaWatsonRegressor,
    )
    from .flash import flash_attention, flash_attention_backward
    from .layers import MultiHeadAttention, SelfAttention
    from .learning import loo_bandwidth, loo_loss, loo_loss_and_grad
    from .local import local_polynomial
    from .modelfile import load, save
    from .regression import average_pooling, nadaraya_watson
    from .varlen import flash_attention_varlen, flash_attention_varlen_backward
