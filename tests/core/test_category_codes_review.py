"""Hostile review: category codes worked out once per distinct value.

The reference is the previous, row-by-row implementation, kept here as a verbatim copy
of its loops (``_old_fit_categories``, ``_old_codes``); the rest of
``nbattn._core.columns`` (``_plain``, ``category_key``, ``_missing_mask``, ...) is
shared. Every case compares the outcome of the old and
the new code: the categories (values *and* types), the codes (NaN-aware), or the
exception (type and message, which names the row).
"""

from __future__ import annotations

import datetime
import decimal
import random

import numpy as np
import pandas as pd
import pytest

import nbattn
from nbattn._core import columns
from nbattn._core.columns import (
    UNKNOWN_CODE,
    _column,
    _missing_mask,
    _plain,
    _preview,
    _where,
    as_table,
    category_key,
    category_sort_key,
    check_categories,
    column_names,
    is_dataframe,
    shown,
)

# ----------------------------------------------------------------------------- the old code


def _old_fit_categories(X, var_type: str, table: str = "X") -> list:
    """fit_categories as it was, row by row."""
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
            for v in values[~_missing_mask(values)]:
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


def _old_codes(values, gone, cats, name, handle_unknown, features=True) -> np.ndarray:
    """_codes as it was, row by row."""
    lookup = {category_key(c): k for k, c in enumerate(cats)}
    col = np.full(values.shape, np.nan)
    for i, v in enumerate(values):
        if gone[i]:
            continue
        key = category_key(v)
        code = None if key is None else lookup.get(key)
        if code is None:
            if handle_unknown != "ignore":
                hint = (
                    "; pass handle_unknown='ignore' (command line: --handle-unknown ignore) to "
                    "give it the mismatch weight"
                    if features
                    else ""
                )
                raise ValueError(
                    f"{name} holds the category {shown(v)} (row {i}, counting from 0) "
                    f"that was not seen at fit (known: {_preview(cats)}){hint}"
                )
            code = UNKNOWN_CODE
        col[i] = code
    return col


def _old_encode_columns(X, var_type, categories, **kwargs):
    """encode_columns with the old _codes (encode_columns itself is unchanged)."""
    new = columns._codes
    columns._codes = _old_codes
    try:
        return columns.encode_columns(X, var_type, categories, **kwargs)
    finally:
        columns._codes = new


# ----------------------------------------------------------------------------- comparing


def _outcome(f, *args, **kwargs):
    try:
        r = f(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(r, np.ndarray):
        return ("array", r.shape, [repr(x) for x in r.ravel().tolist()])  # nan == nan, -0.0
    return ("cats", [None if c is None else [(type(x), repr(x)) for x in c] for c in r])


def _snapshot(X):
    if is_dataframe(X):
        return X.copy(deep=True), [str(d) for d in X.dtypes]
    return np.array(X, copy=True), X.dtype


def _unchanged(X, snap):
    if is_dataframe(X):
        pd.testing.assert_frame_equal(X, snap[0])
        assert [str(d) for d in X.dtypes] == snap[1]
    else:
        assert X.dtype == snap[1]
        a, b = np.asarray(X).ravel().tolist(), snap[0].ravel().tolist()
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x is y or type(x) is type(y) and repr(x) == repr(y)


def _same_fit(X, var_type):
    snap = _snapshot(X)
    old = _outcome(_old_fit_categories, X, var_type)
    new = _outcome(columns.fit_categories, X, var_type)
    _unchanged(X, snap)
    assert new == old
    return None if old[0] == "raised" else _old_fit_categories(X, var_type)


def _same_codes(X, var_type, cats, **kwargs):
    snap = _snapshot(X)
    old = _outcome(_old_encode_columns, X, var_type, cats, **kwargs)
    new = _outcome(columns.encode_columns, X, var_type, cats, **kwargs)
    _unchanged(X, snap)
    assert new == old


def _all_ways(X, var_type, cats=None):
    """fit on X and encode X with its own (or given) categories, every option."""
    fitted = _same_fit(X, var_type)
    for c in [cats, fitted]:
        if c is None:
            continue
        for missing in ("error", "marginalize"):
            for unknown in ("error", "ignore"):
                _same_codes(X, var_type, c, missing=missing, handle_unknown=unknown)


# ----------------------------------------------------------------------------- pools

_NUMBER_POOL = [
    1, 1.0, np.int64(1), np.int8(1), np.uint64(1), np.float32(1.0), np.float16(1.0),
    True, np.bool_(True), False, np.bool_(False), 0, 0.0, -0.0, np.float64(-0.0),
    np.float32(-0.0), np.float64(0.0), 2.5, np.float64(2.5), np.float32(2.5), -3,
    2**53, 2**53 + 1, float(2**53), np.int64(2**53 + 1), np.uint64(2**64 - 1), 2**64 - 1,
    2**70, float(2**70), float("inf"), -float("inf"), np.float32(0.1), 0.1,
]  # fmt: skip
_TEXT_POOL = ["1", "a", np.str_("a"), "b", "B", "", np.str_(""), "é", "a\x00"]
_MISSING_POOL = [None, float("nan"), np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT]
_ODD_POOL = [
    b"a", np.bytes_(b"a"), decimal.Decimal("1"), decimal.Decimal("1.0"),
    datetime.datetime(2020, 1, 1), datetime.date(2020, 1, 1), pd.Timestamp("2020-01-01"),
    1 + 0j, complex(1, 0), np.complex128(1), [1], [1], {"a": 1}, (1,), (1, 2),
    np.datetime64("NaT"), np.longdouble(1), np.clongdouble(1),
]  # fmt: skip


def _object_column(rng, pools, n):
    pool = [v for p in pools for v in p]
    col = np.empty((n, 1), dtype=object)
    for i in range(n):
        col[i, 0] = pool[rng.randrange(len(pool))]
    return col


@pytest.mark.parametrize(
    "pools",
    [
        [_NUMBER_POOL],
        [_NUMBER_POOL, _MISSING_POOL],
        [_TEXT_POOL, _MISSING_POOL],
        [_TEXT_POOL, _NUMBER_POOL],
        [_NUMBER_POOL, _ODD_POOL, _MISSING_POOL],
        [_TEXT_POOL, _ODD_POOL],
        [_MISSING_POOL],
    ],
    ids=[
        "numbers",
        "numbers+missing",
        "text+missing",
        "text+numbers",
        "odd",
        "text+odd",
        "missing",
    ],  # fmt: skip
)
def test_object_columns_fit_and_encode_as_before(pools):
    rng = random.Random(hash(tuple(len(p) for p in pools)) & 0xFFFF)
    for _ in range(150):
        n = rng.choice([0, 1, 2, 3, 5, 12, 40])
        X = _object_column(rng, pools, n)
        _all_ways(X, "u")
        _all_ways(X, "o")
        # predict with a second draw: unseen categories, first unknown row named
        Y = _object_column(rng, pools, rng.choice([1, 4, 20]))
        cats = _outcome(_old_fit_categories, X, "u")
        if cats[0] != "raised":
            _all_ways(Y, "u", _old_fit_categories(X, "u"))


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.int8, np.int64, np.uint8, np.uint64, np.float16, np.float32, np.float64],
)
def test_numeric_arrays_fit_and_encode_as_before(dtype):
    rng = np.random.default_rng(np.dtype(dtype).num)
    for _ in range(60):
        n = int(rng.choice([0, 1, 2, 7, 50]))
        if np.dtype(dtype).kind == "b":
            X = rng.integers(0, 2, size=(n, 2)).astype(dtype)
        elif np.dtype(dtype).kind in "iu":
            info = np.iinfo(dtype)
            pool = np.array([info.min, info.max, 0, 1, 2, 3, info.max - 1], dtype=dtype)
            X = rng.choice(pool, size=(n, 2))
        else:
            pool = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 0.1, 6e4], dtype)
            X = rng.choice(pool, size=(n, 2))
        _all_ways(X, "uo")
        _all_ways(X, "cu")
        if n:
            cats = _outcome(_old_fit_categories, X[: n // 2 + 1], "uo")
            if cats[0] != "raised":
                _all_ways(X, "uo", _old_fit_categories(X[: n // 2 + 1], "uo"))


def test_signed_zero_keeps_first_rows_representative():
    for first, second in [(-0.0, 0.0), (0.0, -0.0)]:
        for dtype in (np.float64, np.float32, object):
            X = np.array([[first], [second], [1.0]], dtype=dtype)
            _all_ways(X, "u")
    X = np.array([[np.float64(-0.0)], [0.0], [0], [np.float32(0.0)]], dtype=object)
    _all_ways(X, "u")


def test_big_integers_and_float_precision():
    for vals in [
        [2**53 + 1, float(2**53), 2**53],
        [float(2**53), 2**53 + 1],
        [2**70, float(2**70), np.uint64(2**64 - 1), 2**64 - 1, float(2**64)],
        [np.int64(2**53 + 1), np.float64(2**53), 2**53 + 1],
    ]:
        X = np.array([[v] for v in vals], dtype=object)
        _all_ways(X, "u")
    X = np.array([[2**53 + 1], [2**53], [2**53 + 1]], dtype=np.int64)
    _all_ways(X, "o")
    _same_codes(X, "u", [[float(2**53)]], handle_unknown="ignore")
    _same_codes(X, "u", [[float(2**53)]], handle_unknown="error")


def test_unhashable_values_error_at_the_same_row():
    for vals in [
        ["a", ["b"], ["b"], {"c": 1}],
        [1, 2, [1], (1,)],
        [None, [1], 1],
        [np.array([1, 2]), "a"],
        [(1, [2]), 1],
        [bytearray(b"a"), 1],
    ]:
        col = np.empty((len(vals), 1), dtype=object)
        for i, v in enumerate(vals):
            col[i, 0] = v
        _all_ways(col, "u", [["a", "b"]] if isinstance(vals[0], str) else [[1, 2]])


def test_pandas_columns_as_before():
    frames = [
        pd.DataFrame({"a": pd.Categorical(["x", "y", "x", None], categories=["y", "x", "z"])}),
        pd.DataFrame({"a": pd.Categorical([3, 1, 3, 2], ordered=True)}),
        pd.DataFrame({"a": pd.array(["x", None, "y", "x"], dtype="string[python]")}),
        pd.DataFrame({"a": pd.array([1, None, 3, 1], dtype="Int64")}),
        pd.DataFrame({"a": pd.array([True, None, False], dtype="boolean")}),
        pd.DataFrame({"a": pd.array([1.0, None, -0.0, 0.0], dtype="Float64")}),
        pd.DataFrame({"a": [np.int64(1), 1.0, True, np.float32(1), None]}, dtype=object),
        pd.DataFrame({"a": ["a", np.str_("a"), pd.NA, "b"]}, dtype=object),
        pd.DataFrame({"a": [pd.NA, None, np.nan]}, dtype=object),
        pd.DataFrame({"a": pd.Series([], dtype=object)}),
        pd.DataFrame({"a": ["z"]}),
        pd.DataFrame({"a": [1.0, np.nan, 2.0], "b": ["p", "q", "p"], "c": [True, False, True]}),
        pd.DataFrame({"a": pd.to_datetime(["2020-01-01", None])}),
    ]
    try:
        import pyarrow  # noqa: F401

        frames.append(pd.DataFrame({"a": pd.array(["x", None, "y", "x"], dtype="string[pyarrow]")}))
        frames.append(pd.DataFrame({"a": pd.array([1, None, 2], dtype="int64[pyarrow]")}))
    except ImportError:
        pass
    for df in frames:
        vt = "u" * df.shape[1]
        _all_ways(df, vt)
        _all_ways(df, "o" * df.shape[1])
        for cats in ([["x"]], [[1]], [[True]]):
            if df.shape[1] == 1:
                for unknown in ("error", "ignore"):
                    _same_codes(df, vt, cats, missing="marginalize", handle_unknown=unknown)


# ----------------------------------------------------------------------------- estimators


def _predictions(make, X, y, Q, var_type, monkeypatch, use_old):
    with monkeypatch.context() as m:
        if use_old:
            m.setattr(columns, "fit_categories", _old_fit_categories)
            m.setattr(columns, "_codes", _old_codes)
        model = make(var_type=var_type, handle_unknown="ignore").fit(X, y)
        return model.predict(Q)


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: nbattn.NadarayaWatsonRegressor(**k),
        lambda **k: nbattn.LocalPolynomialRegressor(degree=1, **k),
    ],
    ids=["nw", "lpr"],
)
def test_estimators_predict_as_before(make, monkeypatch):
    rng = np.random.default_rng(7)
    n = 40
    X = pd.DataFrame(
        {
            "x": rng.normal(size=n),
            "g": rng.choice(np.array(["a", "b", "c"], dtype=object), size=n),
            "k": rng.choice(np.array([1, 2.0, np.int64(3), -0.0], dtype=object), size=n),
        }
    )
    y = rng.normal(size=n)
    Q = X.iloc[:10].copy()
    Q.loc[Q.index[3], "g"] = "zz"  # unseen, handle_unknown="ignore"
    Q.loc[Q.index[4], "k"] = np.float32(2.0)
    snap = _snapshot(Q), _snapshot(X)
    old = _predictions(make, X, y, Q, "cuo", monkeypatch, True)
    new = _predictions(make, X, y, Q, "cuo", monkeypatch, False)
    _unchanged(Q, snap[0])
    _unchanged(X, snap[1])
    np.testing.assert_array_equal(new, old)


# ------------------------------------------- what the review found (fixed: _groupable)
# Equal datetime64 / timedelta64 values of different units (their values differ by
# unit), a long double column (sorted before its first row's error), and values whose
# hash raises something other than TypeError: each is a kind of its own now.


def test_datetime64_mixed_units_fit():
    D = np.datetime64("2020-01-01", "D")
    N = np.datetime64("2020-01-01T00:00:00.000000000", "ns")
    _same_fit(np.array([[N], [D]], dtype=object), "u")


@pytest.mark.parametrize("unknown", ["error", "ignore"])
def test_datetime64_mixed_units_encode(unknown):
    D = np.datetime64("2020-01-01", "D")
    N = np.datetime64("2020-01-01T00:00:00.000000000", "ns")
    X = np.array([[N], [D]], dtype=object)
    _same_codes(X, "u", [[1577836800000000000]], handle_unknown=unknown)


def test_timedelta64_mixed_units():
    X = np.array([[np.timedelta64(1000, "ns")], [np.timedelta64(1, "us")]], dtype=object)
    _same_fit(X, "u")


def test_longdouble_fit_error_names_first_row():
    _same_fit(np.array([[3.0], [1.0]], dtype=np.longdouble), "u")


@pytest.mark.parametrize("what", ["fit", "encode-error", "encode-ignore"])
def test_unhashable_by_valueerror(what):
    X = np.empty((2, 1), dtype=object)
    X[0, 0], X[1, 0] = 1.0, memoryview(bytearray(b"a"))
    if what == "fit":
        _same_fit(X, "u")
    else:
        _same_codes(X, "u", [[1.0]], handle_unknown=what.split("-")[1])
