"""Column kinds and category codes: how a table becomes the engine's float array.

The mixed-type product kernel (:mod:`nbattn.local.engine`) reads one float array
whose continuous columns hold numbers and whose categorical columns hold
integer codes ``0 .. c-1``, plus a kind per column, statsmodels' spelling:

* ``"c"`` continuous: numbers;
* ``"u"`` unordered categorical (Aitchison-Aitken kernel: the same category
  weighs ``1 - lambda``, any other ``lambda / (c - 1)``);
* ``"o"`` ordered categorical (codes in the categories' order, so distance
  between codes means something).

This module decides the kinds and the codes. Kinds come from a DataFrame's
dtypes unless ``var_type`` says otherwise:

==========================================  =====
pandas dtype                                kind
==========================================  =====
``category`` (ordered)                      "o"
``category`` (unordered), bool, object, str "u"
numeric                                     "c"
==========================================  =====

A NumPy array is all continuous unless ``var_type`` is given. The
categories are found at fit (a ``category`` dtype's own categories, in its
order; otherwise the sorted distinct values) and kept as plain Python lists
(``None`` for a continuous column), so that a model file stores them as JSON.

Missing values (None, NaN, pandas.NA) become NaN codes when the caller
allows them (``missing="marginalize"``) and are an error naming the column
and the row otherwise. A category not seen at fit is an error naming the
column and the value, or with ``handle_unknown="ignore"`` the code
:data:`UNKNOWN_CODE` (NaN). An unseen category matches no training row, so
in that column every row would get the same mismatch weight (lambda / (c-1)
in an unordered column); a factor common to every key cancels in the
softmax, so this is exactly leaving the column out of that query's kernel
product, which is what the engine does with a missing entry.
"""

from __future__ import annotations

import numbers

import numpy as np

from .validation import plural, shown

__all__ = [
    "CONTINUOUS_KERNELS",
    "KINDS",
    "UNKNOWN_CODE",
    "all_numeric",
    "as_table",
    "is_dataframe",
    "category_key",
    "category_sort_key",
    "check_categories",
    "check_var_type",
    "column_names",
    "encode_columns",
    "fit_categories",
    "infer_var_type",
    "n_categories",
    "refuse_no_columns",
    "resolve_var_type",
]

#: the column kinds, statsmodels' letters
KINDS = "cuo"
#: the kernels a continuous column can take, in the order of the engine's kernel codes
#: (:mod:`nbattn.local.engine`); categorical columns take Aitchison-Aitken's or the ordered one
CONTINUOUS_KERNELS = ("gaussian", "epanechnikov", "tricube")
#: the code of a category unseen at fit (``handle_unknown="ignore"``): the column drops
#: out of that row's kernel product, as for a missing value (module docstring)
UNKNOWN_CODE = float("nan")


# ----------------------------------------------------------------------------- helpers


def is_dataframe(X) -> bool:
    return hasattr(X, "dtypes") and hasattr(X, "columns") and hasattr(X, "iloc")


def refuse_no_columns(X) -> None:
    """A ValueError for a DataFrame without columns, which NumPy's and scikit-learn's
    conversions report as "at least one array or dtype is required" (an array of
    shape (n, 0) gets scikit-learn's own "0 feature(s)" message)."""
    if is_dataframe(X) and len(X.columns) == 0:
        shape = X.shape
        raise ValueError(
            f"X is a DataFrame without columns (shape {tuple(shape)}): pass the feature columns "
            "(a DataFrame with at least one column)"
        )


def as_table(X):
    """X itself when it is a DataFrame, else a 2-D NumPy array (object dtype allowed)."""
    refuse_no_columns(X)
    if is_dataframe(X):
        return X
    if hasattr(X, "tocsr") or hasattr(X, "tocoo"):  # scipy.sparse, without importing it
        raise TypeError(
            "Sparse data was passed, but dense data is required; convert it with X.toarray()"
        )
    arr = np.asarray(X) if not hasattr(X, "to_numpy") else X.to_numpy()
    if arr.ndim != 2:
        raise ValueError(
            f"Expected a 2D array, got an array of shape {arr.shape}: reshape your data "
            "with array.reshape(-1, 1) for a single feature or array.reshape(1, -1) "
            "for a single sample"
        )
    return arr


def all_numeric(X) -> bool:
    """Whether every column of X has a numeric (or bool) dtype; True for non-DataFrames."""
    if not is_dataframe(X):
        return True
    from pandas.api.types import is_numeric_dtype

    return all(is_numeric_dtype(dtype) for dtype in X.dtypes)


def column_names(X) -> list[str]:
    """How errors name the columns of X: ``'name'`` for a DataFrame, else the index."""
    if is_dataframe(X):
        return [repr(str(c)) for c in X.columns]
    return [str(j) for j in range(as_table(X).shape[1])]


def _column(table, j):
    """Column j as a 1-D NumPy array (object dtype for text and pandas extension types)."""
    if is_dataframe(table):
        col = table.iloc[:, j]
        dtype = col.dtype
        if getattr(dtype, "kind", "O") in "biuf" and isinstance(dtype, np.dtype):
            return col.to_numpy()
        return col.to_numpy(dtype=object)
    return table[:, j]


def _is_missing(value) -> bool:
    """None, pandas.NA/NaT (without importing pandas) or a float NaN."""
    return (
        value is None
        or type(value).__name__ in ("NAType", "NaTType")
        or (isinstance(value, numbers.Real) and value != value)
    )


def _missing_mask(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "O":
        return np.frompyfunc(_is_missing, 1, 1)(values).astype(bool)
    return np.zeros(values.shape, dtype=bool)


def _plain(value):
    """A category as a plain Python value (str, int, float, bool), what JSON can hold."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(
        f"category {shown(value)} of type {type(value).__name__} is not a string, number or bool"
    )


def category_key(value):
    """The identity of a category, one rule for fit and predict: text by itself, numbers by
    value (``1``, ``1.0`` and ``np.int64(1)`` are one category), bools apart from numbers
    (``True`` is not ``1``, ``False`` is not ``0``). None for a value that is not a
    string, number or bool (it matches no category)."""
    try:
        p = _plain(value)
    except ValueError:
        return None
    if isinstance(p, bool):
        return ("bool", p)
    return ("text", p) if isinstance(p, str) else ("number", p)


def category_sort_key(value):
    """Numbers (and bools) in numeric order, a bool before the number it equals; text
    after them in code-point order. A total order, so the categories' order does not
    depend on the order of the rows."""
    p = _plain(value)
    if isinstance(p, str):
        return (1, p, 0)
    return (0, p, 0 if isinstance(p, bool) else 1)


def check_categories(cats, name: str) -> None:
    """Refuse categories that two rows could not tell apart, or that mix text and numbers.

    Raises ValueError naming ``name`` (the column) for a category that is not
    a string, number or bool, a NaN, two categories with one
    :func:`category_key`, or text beside numbers (their order means nothing).
    """
    seen = {}
    for k, c in enumerate(cats):
        if not isinstance(c, (bool, int, float, str)):
            raise ValueError(
                f"{name}: category {shown(c)} of type {type(c).__name__} is not a string, "
                "number or bool"
            )
        if isinstance(c, float) and c != c:
            raise ValueError(f"{name}: category {k} is NaN (a missing value is no category)")
        key = category_key(c)
        if key in seen:
            raise ValueError(
                f"{name}: categories {seen[key]} ({shown(cats[seen[key]])}) and {k} "
                f"({shown(c)}) are the same category"
            )
        seen[key] = k
    text = [c for c in cats if isinstance(c, str)]
    if text and len(text) != len(cats):
        number = next(c for c in cats if not isinstance(c, str))
        raise ValueError(
            f"{name} holds both text ({shown(text[0])}) and numbers ({shown(number)}); convert the "
            "column to one type"
        )


# ----------------------------------------------------------------------------- kinds


def check_var_type(var_type, n_columns: int) -> str:
    """``var_type`` as a string of ``n_columns`` letters from "cuo" (None: all continuous).

    Raises ValueError for something else than a string, a letter outside "cuo"
    (naming its position) or a length other than ``n_columns``.
    """
    if var_type is None:
        return "c" * n_columns
    if not isinstance(var_type, str):
        raise ValueError(f"var_type must be a string of letters c, u, o; got {var_type!r}")
    for position, kind in enumerate(var_type):
        if kind not in KINDS:
            raise ValueError(
                f"var_type letter {position} holds {kind!r} (var_type={var_type!r}): use "
                "'c' (continuous), 'u' (unordered categorical) or 'o' (ordered categorical)"
            )
    if len(var_type) != n_columns:
        raise ValueError(
            f"var_type has {plural(len(var_type), 'letter')} but X has "
            f"{plural(n_columns, 'column')} "
            f"(var_type={var_type!r})"
        )
    return var_type


def infer_var_type(X) -> str:
    """The kind of each column of X from its dtype (all "c" for a NumPy array)."""
    table = as_table(X)
    if not is_dataframe(table):
        return "c" * table.shape[1]
    from pandas.api.types import (
        is_bool_dtype,
        is_numeric_dtype,
    )

    kinds = []
    for dtype in table.dtypes:
        if getattr(dtype, "name", "") == "category":
            kinds.append("o" if dtype.ordered else "u")
        elif is_bool_dtype(dtype):
            kinds.append("u")
        elif is_numeric_dtype(dtype):
            kinds.append("c")
        else:  # object, string: text
            kinds.append("u")
    return "".join(kinds)


def resolve_var_type(X, var_type=None) -> str:
    """``var_type`` checked against X's columns, or the kinds inferred from X's dtypes."""
    if var_type is None:
        return infer_var_type(X)
    return check_var_type(var_type, as_table(X).shape[1])


def n_categories(categories) -> list[int]:
    """Categories per column (0 for a continuous column) from ``fit_categories``' list."""
    return [0 if c is None else len(c) for c in categories]


# ----------------------------------------------------------------------------- codes


def fit_categories(X, var_type: str, table: str = "X") -> list:
    """The categories of each categorical column (None for continuous ones).

    A pandas ``category`` column keeps its dtype's categories in their order
    (including levels absent from the data); any other categorical column gets
    its sorted distinct non-missing values. Raises ValueError naming a
    categorical column that holds no value at all (every value missing); ``table``
    as :func:`encode_columns`.
    """
    frame = as_table(X)
    names = column_names(frame)
    out = []
    for j, kind in enumerate(var_type):
        if kind == "c":
            out.append(None)
            continue
        dtype = frame.dtypes.iloc[j] if is_dataframe(frame) else None
        where = _where(table, names[j])
        if dtype is not None and getattr(dtype, "name", "") == "category":
            try:
                cats = [_plain(v) for v in dtype.categories]
            except ValueError as exc:
                raise ValueError(
                    f"{where}: {exc}; nbattn keeps categories as text, numbers or bools "
                    f"({f'X[{names[j]}]' if table == 'X' else table}.cat.rename_categories(str) "
                    "keeps the dtype's order)"
                ) from exc
        else:
            values = _column(frame, j)
            distinct = {}
            for v in _distinct(values[~_missing_mask(values)])[0]:
                try:
                    p = _plain(v)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from exc
                distinct.setdefault(category_key(p), p)
            cats = sorted(distinct.values(), key=category_sort_key)
        check_categories(cats, where)
        if not cats:
            raise ValueError(f"{where} is categorical but holds no value")
        out.append(cats)
    return out


def encode_columns(
    X,
    var_type: str,
    categories: list,
    *,
    missing: str = "error",
    handle_unknown: str = "error",
    table: str = "X",
    offers=("missing", "handle_unknown"),
) -> np.ndarray:
    """X as the engine's float64 array (n, d): numbers, category codes, NaN where missing.

    Parameters
    ----------
    X : DataFrame or array-like (n, d)
    var_type : str of "cuo", one letter per column
    categories : list from :func:`fit_categories`
    missing : "error" or "marginalize"
        "error": a missing value is a ValueError naming the column and row;
        "marginalize": it becomes NaN (the engine leaves that column out of
        that row's kernel product).
    handle_unknown : "error" or "ignore"
        What a category absent from ``categories`` does: a ValueError naming
        the column and the value, or the code :data:`UNKNOWN_CODE`.
    table : str
        What errors call the table: "X" names its columns; another name (a conditional
        model's response "y") is the one column it stands for.
    offers : tuple of str
        The options of the model that the errors may advise ("missing",
        "handle_unknown"); a model without them is not told to set them.

    Returns
    -------
    ndarray (n, d) float64, a new array (X is never modified).
    """
    frame = as_table(X)
    names = [_where(table, name) for name in column_names(frame)]
    n, d = frame.shape
    if d != len(var_type):
        raise ValueError(
            f"{table} has shape {frame.shape}; the model expects {plural(len(var_type), 'column')}"
        )
    out = np.empty((n, d), dtype=np.float64)
    for j, kind in enumerate(var_type):
        values = _column(frame, j)
        gone = _missing_mask(values)
        if gone.any() and missing != "marginalize":
            row = int(np.argmax(gone))
            advice = (
                "fill it, drop the row, or fit with missing='marginalize' (command line: "
                "--on-nan drop, or fit and predict with --on-nan marginalize)"
                if "missing" in offers and table == "X"
                else "fill it or drop the row (command line: --on-nan drop)"
            )
            raise ValueError(
                f"{names[j]} has a missing value ({shown(values[row])}) in row {row} "
                f"(counting from 0); {advice}"
            )
        if kind == "c":
            out[:, j] = _numbers(values, gone, names[j])
        else:
            advise = table == "X" and "handle_unknown" in offers
            out[:, j] = _codes(values, gone, categories[j], names[j], handle_unknown, advise)
    return out


def _where(table: str, name: str) -> str:
    """How an error names a column: "X column 'age'", or the response's own name."""
    return f"X column {name}" if table == "X" else table


def _numbers(values, gone, name) -> np.ndarray:
    if values.dtype.kind in "biuf":
        col = values.astype(np.float64)
        col[gone] = np.nan
        return col
    col = np.full(values.shape, np.nan)
    for i, v in enumerate(values):
        if gone[i]:
            continue
        if isinstance(v, (str, bytes)) or not isinstance(v, numbers.Real):
            raise ValueError(
                f"{name} holds text or objects ({shown(v)} in row {i}, counting from "
                "0) but is continuous; declare it categorical (var_type 'u' or 'o', or a "
                "pandas category) or convert it to numbers"
            )
        col[i] = float(v)
    return col


def _codes(values, gone, cats, name, handle_unknown, features=True) -> np.ndarray:
    lookup = {category_key(c): k for k, c in enumerate(cats)}
    col = np.full(values.shape, np.nan)
    rows = np.flatnonzero(~gone)
    distinct, inverse = _distinct(values[rows])
    codes = np.full(len(distinct), UNKNOWN_CODE)
    unknown = np.zeros(len(distinct), dtype=np.bool_)  # not seen at fit
    for t, v in enumerate(distinct):
        key = category_key(v)
        code = None if key is None else lookup.get(key)
        if code is None:
            unknown[t] = True
        else:
            codes[t] = code
    if unknown.any():
        if handle_unknown != "ignore":
            i = int(rows[np.argmax(unknown[inverse])])  # the first such row
            hint = (
                "; pass handle_unknown='ignore' (command line: --handle-unknown ignore) to "
                "give it the mismatch weight"
                if features
                else ""
            )
            raise ValueError(
                f"{name} holds the category {shown(values[i])} (row {i}, counting from 0) "
                f"that was not seen at fit (known: {_preview(cats)}){hint}"
            )
    col[rows] = codes[inverse]
    return col


def _distinct(values) -> tuple[list, np.ndarray]:
    """``(distinct, inverse)``: one value of each kind in ``values`` (the first of its kind, in
    order of first appearance; numbers of a numeric array in increasing order) and each
    value's index into them, so that a column's categories are worked out once per
    distinct value, not once per row. Of a kind: equal, of one type, and a plain text,
    number or bool (:func:`_groupable`; so ``True`` and ``1`` stay apart, as
    ``category_key`` keeps them); any other value is a kind of its own, and meets the
    row-by-row rule's checks as it always did."""
    if values.dtype.kind in "biuf" and values.dtype.itemsize <= 8:
        _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
        return list(values[first]), inverse.reshape(-1).astype(np.int64)
    index: dict = {}
    distinct: list = []
    inverse = np.empty(values.shape[0], dtype=np.int64)
    for i, v in enumerate(values):
        key = (type(v), v) if _groupable(v) else None
        t = None if key is None else index.get(key)
        if t is None:
            t = len(distinct)
            distinct.append(v)
            if key is not None:
                index[key] = t
        inverse[i] = t
    return distinct, inverse


def _groupable(value) -> bool:
    """Whether rows holding ``value`` may share its category work: a str, int, float or bool,
    or a NumPy number or bool of at most 8 bytes (equal values of one such type are one
    category; a datetime's or timedelta's value depends on its unit, a long double's on
    more bits)."""
    if isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, np.timedelta64):  # a NumPy integer, whose value depends on its unit
        return False
    return isinstance(value, (np.bool_, np.integer, np.floating)) and value.dtype.itemsize <= 8


def _preview(cats, k: int = 8) -> str:
    listed = ", ".join(shown(c) for c in cats[:k])
    return listed + (f", ... ({len(cats)} in all)" if len(cats) > k else "")
