"""Sphinx configuration of nbattn's API reference (built from the docstrings).

Build it with ``python -m sphinx -W --keep-going -b html docs OUTDIR`` after
``pip install -e '.[docs]'``; ``scripts/test`` does so into a temporary folder.
"""

import importlib.util
import inspect

from nbattn import __version__

project = "nbattn"
author = "nbattn developers"
copyright = "nbattn developers"
release = version = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.mathjax", "numpydoc"]

# The Markdown map of the code and its picture are read on GitHub, not built here.
exclude_patterns = ["_build", "ARCHITECTURE.md", "house.png"]
root_doc = "index"

# Members are listed by hand on each page (the classes' own methods through
# autodoc), so numpydoc adds no autosummary tables of its own.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# A class's page lists the methods it inherits from nbattn's own bases too
# (predict, attention_weights, ... live on the shared base).
autodoc_default_options = {"member-order": "bysource", "inherited-members": True}
autodoc_typehints = "none"
# nbattn.torch needs torch, an optional extra: where it is missing, autodoc reads the
# module with torch mocked (its docstrings are all the pages need).
autodoc_mock_imports = [] if importlib.util.find_spec("torch") else ["torch"]

html_theme = "alabaster"
html_static_path: list[str] = []


def _skip_scikit_learn_members(app, what, name, obj, skip, options):
    """Methods the estimators inherit from scikit-learn (``get_params``, ``score``, the
    generated ``set_*_request`` of metadata routing) are scikit-learn's to document,
    with cross-references into its own pages; so are the methods of Python's own types
    (an exception's ``add_note``, a named tuple's ``count``)."""
    module = getattr(obj, "__module__", None) or ""
    if (
        module.split(".")[0] == "sklearn"
        or inspect.ismethoddescriptor(obj)
        or (name.startswith("set_") and name.endswith("_request"))
    ):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_scikit_learn_members)
