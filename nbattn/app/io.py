"""Tables read and written in chunks, and outputs that appear only when complete.

Model files live in :mod:`nbattn.persistence.modelfile`, outputs that appear only when
complete in :mod:`nbattn._core.atomic` and column names in :mod:`nbattn.app.names`;
``save``, ``load``, ``read_model_file``, the format constants, ``atomic_output``,
``check_not_input`` and the names' helpers are re-exported here, where ``nbattn.save`` /
``nbattn.load`` have always found them.

Tables
------
:func:`iter_chunks` reads CSV (pandas, in chunks; every row's field count
checked against the header) or Parquet (pyarrow, in record batches),
:func:`read_columns` refuses duplicated names, :func:`numeric_block` turns
chunk columns into float64 with errors that name the row and the column,
:func:`labels_from_text` types class labels independently of the chunking,
:class:`TableWriter` appends chunks to CSV or Parquet, and
:func:`atomic_output` makes the result appear under its name only when
everything was written (keeping an existing file's mode, writing through a
symbolic link).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from .._core.atomic import atomic_output, check_not_input
from .._core.validation import check_choice, plural
from ..persistence.modelfile import (
    FORMAT_NAME,
    FORMAT_VERSION,
    ModelFileError,
    load,
    read_model_file,
    save,
)
from .names import check_columns, clip, column_option, shorten, split_columns

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ModelFileError",
    "TableWriter",
    "atomic_output",
    "check_columns",
    "check_labels",
    "check_not_input",
    "check_output",
    "clip",
    "category_values",
    "column_option",
    "input_format",
    "iter_chunks",
    "feature_block",
    "labels_from_text",
    "load",
    "not_finite",
    "numeric_block",
    "output_format",
    "read_columns",
    "read_model_file",
    "read_table",
    "row_location",
    "save",
    "shorten",
    "split_columns",
    "text_kinds",
]

#: CSV chunks hold at most this many cells (rows x all columns of the file)
CSV_CHUNK_CELLS = 2**22


# ----------------------------------------------------------------------------- tables

_PARQUET = (".parquet", ".pq")


def input_format(path) -> str:
    """Return "parquet" for ``.parquet``/``.pq`` files, "csv" for everything else."""
    return "parquet" if str(path).lower().endswith(_PARQUET) else "csv"


def output_format(path) -> str:
    """Return "csv" or "parquet" from the extension of an output; anything else is an error."""
    lower = str(path).lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith(_PARQUET):
        return "parquet"
    raise ValueError(f"output {str(path)!r} must end in .csv, .parquet or .pq")


def check_output(output, inputs=()) -> None:
    """Refuse, before any work, an output that cannot be written: its folder does not
    exist, it is a folder, or it is (the same file as) one of ``inputs``. (The output
    is written by :func:`atomic_output`, which checks the same when it is too late: after
    a fit or a figure's computation.)"""
    path = Path(output)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"output {str(path)!r} is a folder")
    check_not_input([p for p in inputs if p], output)


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ValueError("Parquet files need pyarrow: pip install 'nbattn[parquet]'") from exc
    return pq


_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _csv_error(path, exc) -> ValueError:
    import pandas as pd

    if isinstance(exc, pd.errors.EmptyDataError):
        return ValueError(f"{path}: the file is empty")
    if isinstance(exc, UnicodeDecodeError):
        return ValueError(f"{path}: {_not_utf8(path)}; save the file as UTF-8")
    fields = _FIELDS.search(str(exc))
    if fields:
        want, line, saw = fields.groups()
        return ValueError(
            f"{path}: line {line} has {plural(int(saw), 'field')}; the header has {want}"
        )
    return ValueError(f"{path}: cannot read as CSV: {clip(' '.join(str(exc).split()), 300)}")


def _not_utf8(path) -> str:
    """Where a file that is not UTF-8 first is not: its line and the byte."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = line[exc.start : exc.start + 1].hex()
                return f"line {number} is not UTF-8 text (its byte {exc.start + 1} is 0x{byte})"
    return "not UTF-8 text"


def _exact_floats() -> dict:
    """read_csv options that parse floats exactly (pandas 3 does by default; 2.x needs
    ``float_precision="round_trip"``, which pandas 3 deprecates)."""
    import pandas as pd

    major = int(pd.__version__.split(".")[0])
    return {} if major >= 3 else {"float_precision": "round_trip"}


def read_columns(path) -> list[str]:
    """The column names of a CSV or Parquet file (reads the header only).

    A name that appears twice is an error (pandas would rename the second
    ``x.1`` and a command would silently read the first).
    """
    import pandas as pd

    path = Path(path)
    if input_format(path) == "parquet":
        pq = _pyarrow_parquet()
        try:
            names = list(pq.read_schema(path).names)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: cannot read as Parquet: {exc}") from exc
        _check_unique(path, names)
        return names
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        raw = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
        names = [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except (ValueError, pd.errors.ParserError) as exc:
        raise _csv_error(path, exc) from exc
    _check_unique(path, [c for c in raw.iloc[0].tolist() if c != ""])
    return names


def _check_unique(path, names) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{path}: the column name {shorten(name)} appears more than once")
        seen.add(name)


def iter_chunks(path, columns=None, chunksize=100_000, *, text_columns=()):
    """Read a CSV or Parquet file in chunks.

    Returns ``(chunks, total, unit)``: ``chunks`` yields
    ``(frame, first_row, position)`` with ``first_row`` the 0-based data row
    of the chunk's first row and ``position`` the progress so far in
    ``unit`` ("bytes" for CSV, "rows" for Parquet) out of ``total``.
    Only ``columns`` are returned (all when None). CSV columns in
    ``text_columns`` are read as text, so their type does not depend on where
    a chunk starts (pandas infers each chunk's types on its own).

    Every CSV row is checked against the header: a row with more fields than
    the header is an error naming its line (it is not silently cut), and so is a
    row with fewer (pandas would fill it with NaN: :class:`_FieldCounts`).
    """
    import pandas as pd

    path = Path(path)
    if chunksize < 1:
        raise ValueError(f"chunksize must be positive, got {chunksize}")
    if input_format(path) == "parquet":
        pq = _pyarrow_parquet()
        try:
            pf = pq.ParquetFile(path)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: cannot read as Parquet: {exc}") from exc
        total = pf.metadata.num_rows

        def parquet_chunks():
            row = 0
            for batch in pf.iter_batches(batch_size=chunksize, columns=columns):
                frame = batch.to_pandas()
                yield frame, row, row + len(frame)
                row += len(frame)

        return parquet_chunks(), total, "rows"

    total = path.stat().st_size
    if total == 0:
        raise ValueError(f"{path}: the file is empty")
    # All columns are parsed: usecols would turn off pandas' field count check. So
    # that memory stays bounded for wide files, a chunk holds at most CSV_CHUNK_CELLS.
    width = max(1, len(read_columns(path)))
    options = {
        "index_col": False,  # never take the first column as an index when rows are longer
        "chunksize": max(1, min(chunksize, CSV_CHUNK_CELLS // width)),
        "dtype": {c: str for c in text_columns} or None,
        **_exact_floats(),
    }

    def parse(step):
        """``step()`` with pandas' ParserWarning (a first data row longer than the header)
        as an error; the filter is set around each read only, never across a yield."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pd.errors.ParserWarning)
                return step()
        except pd.errors.ParserWarning:
            raise ValueError(f"{path}: line 2 has more fields than the header") from None
        except (ValueError, pd.errors.ParserError) as exc:
            raise _csv_error(path, exc) from exc

    def csv_chunks():
        with (
            open(path, "rb") as fh,
            parse(lambda: pd.read_csv(fh, **options)) as reader,
            _FieldCounts(path, width) as fields,
        ):
            row = 0
            while (frame := parse(lambda: next(reader, None))) is not None:
                fields.check(row, len(frame), frame.iloc[:, -1].isna().to_numpy().any())
                yield (frame if columns is None else frame[columns]), row, fh.tell()
                row += len(frame)

    return csv_chunks(), total, "bytes"


class _FieldCounts:
    """The field count of each CSV row, checked against the header's ``width`` where
    pandas cannot: it fills the missing fields of a row cut short with NaN, so that the
    row would pass for one with missing values (and ``--on-nan drop`` drop it silently).

    :meth:`check` reads a chunk's rows with Python's :mod:`csv` module (blank lines
    skipped, as pandas skips them) when asked to (``needed``: the chunk's last column has
    a missing value, as every short row's has) or once it has begun (to stay on the row
    pandas is on), and raises a ValueError naming the line of the first short row; files
    whose last column has no missing value are never read twice."""

    def __init__(self, path, width):
        self.path, self.width = path, width
        self._fh = self._reader = None
        self._line = 0

    def check(self, first_row, n, needed) -> None:
        """Check data rows ``first_row`` to ``first_row + n - 1`` (0-based)."""
        import csv

        if self.width < 2 or (self._reader is None and not needed):
            return
        if self._reader is None:
            self._fh = open(  # noqa: SIM115
                self.path, newline="", encoding="utf-8-sig", errors="replace"
            )
            self._reader = csv.reader(self._fh)
            self._records(1 + first_row)  # the header and the rows pandas has read
        self._records(n, check=True)

    def _records(self, n, check=False) -> None:
        for _ in range(n):
            while True:
                record = next(self._reader, None)
                start, self._line = self._line + 1, self._reader.line_num
                if record is None:
                    return
                if record and (len(record) > 1 or record[0].strip()):
                    break  # not a blank line
            if check and len(record) < self.width:
                raise ValueError(
                    f"{self.path}: line {start} has {plural(len(record), 'field')}; "
                    f"the header has {self.width}"
                )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._fh is not None:
            self._fh.close()
        return False


def read_table(path, columns=None, *, quiet=True, text_columns=()):
    """The whole file (only ``columns``) as a DataFrame; ValueError if it has no rows.

    ``text_columns`` as for :func:`iter_chunks`. With ``quiet=False`` a
    progress bar is drawn on stderr (when it is a terminal).
    """
    import pandas as pd

    from .._core.progress import Progress

    chunks, total, unit = iter_chunks(path, columns, 200_000, text_columns=text_columns)
    frames = []
    with Progress(total, "read", unit=unit, quiet=quiet) as bar:
        for frame, _, position in chunks:
            frames.append(frame)
            bar.update(position=position)
    frame = pd.concat(frames, ignore_index=True) if frames else None
    if frame is None or len(frame) == 0:
        raise ValueError(f"{path}: no data rows (only a header)")
    return frame


def not_finite(value) -> str:
    """What a cell that reads as NaN or infinity is, in a message: missing (an empty
    cell, NA, nan, ...) or infinite (inf, or a number beyond the float64 range such as
    1e400, which reads as inf)."""
    if np.isnan(value):
        return "is missing (an empty cell, NA or nan)"
    sign = "-" if value < 0 else ""
    return f"is infinite ({sign}inf, or a number beyond ±1.8e308 such as {sign}1e400)"


def row_location(source, fmt, row0: int) -> str:
    """Where 0-based data row ``row0`` is: data rows count from 1 after the header."""
    if fmt == "csv":
        return f"{source}: data row {row0 + 1} (line {row0 + 2} of the file)"
    return f"{source}: row {row0 + 1}"


def numeric_block(frame, columns, *, first_row=0, source="data", fmt="csv", on_nan="error"):
    """The ``columns`` of ``frame`` as a float64 array, and the rows to keep.

    Text in a column raises a ValueError naming the data row (1-based, after
    the header; for CSV also the file line, assuming one line per row) and the
    column. A missing or infinite value raises likewise when
    ``on_nan="error"``; with ``on_nan="drop"`` its row is marked False in
    the returned mask.

    Returns
    -------
    values : ndarray (len(frame), len(columns)), float64
    keep : ndarray of bool (len(frame),)
    """
    import pandas as pd

    check_choice(on_nan, "on_nan", ("error", "drop"))
    out = np.empty((len(frame), len(columns)), dtype=np.float64)
    for j, col in enumerate(columns):
        series = frame[col]
        if series.dtype.kind in "biuf":
            out[:, j] = series.to_numpy(dtype=np.float64, na_value=np.nan)
            continue
        values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        text = np.isnan(values) & series.notna().to_numpy()
        if text.any():
            i = int(np.argmax(text))
            raise ValueError(
                f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} holds "
                f"{shorten(series.iloc[i])}, which is not a number"
            )
        out[:, j] = values
    finite = np.isfinite(out)
    keep = finite.all(axis=1)
    if on_nan == "error" and not keep.all():
        i = int(np.argmin(keep))
        col = columns[int(np.argmin(finite[i]))]
        raise ValueError(
            f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} "
            f"{not_finite(out[i, columns.index(col)])}; use --on-nan drop to skip such rows"
        )
    return out, keep


def text_kinds(frame, columns, var_type=None) -> str:
    """The kind of each of ``columns`` in a table read from a file, by the rules the
    estimators apply to a DataFrame's dtypes (:func:`nbattn._core.columns.infer_var_type`):
    a ``category`` column is "o" when its dtype is ordered, else "u"; a bool column
    (or one holding only True and False) and a text column are "u"; a numeric one is
    "c". ``var_type`` (one letter of "cuo" per column) overrides.

    A text column is one where most present values are not numbers. A column
    of numbers with a stray word stays continuous, so that the word is an
    error naming its row (:func:`numeric_block`) rather than turning every
    number of the column into a category.
    """
    import pandas as pd

    from .._core.columns import check_var_type

    if var_type is not None:
        return check_var_type(var_type, len(columns))
    kinds = []
    for col in columns:
        series = frame[col]
        if isinstance(series.dtype, pd.CategoricalDtype):
            kinds.append("o" if series.dtype.ordered else "u")
            continue
        if series.dtype.kind == "b":
            kinds.append("u")
            continue
        if series.dtype.kind in "iuf":
            kinds.append("c")
            continue
        present = series[series.notna()]
        flags = present.map(
            lambda v: isinstance(v, (bool, np.bool_)) or (isinstance(v, str) and v in _BOOLS)
        )
        if len(present) and flags.all():
            kinds.append("u")
            continue
        numbers = pd.to_numeric(present.where(~flags, None), errors="coerce")
        text = int(numbers.isna().sum())
        kinds.append("u" if text * 2 > len(present) else "c")
    return "".join(kinds)


#: how pandas' CSV reader writes bools, and how a categorical column's text reads as one
_BOOLS = {"True": True, "False": False, "TRUE": True, "FALSE": False, "true": True, "false": False}


def category_values(series, categories=None):
    """A categorical column of a table read from a file, as the values the estimator
    encodes: typed as ``pandas.read_csv`` types a whole column, whatever the chunking.

    A ``category`` column is returned as it is (its dtype's categories in their
    order). Values that are not text (Parquet columns carry their type) are kept.
    Text (a CSV column read as text) is typed by one rule: without
    ``categories`` (fitting, the whole column at once) numbers when every text
    is one (integers stay integers, so 1..12 keep their numeric order), else
    bools when every text is True or False, else the text; with the fitted
    model's ``categories`` of the column (predicting a chunk) each text becomes
    the category it spells: the text itself, else a number, else a bool (text
    that spells none stays text, and is reported as an unseen category).
    Missing values become None.
    """
    import pandas as pd

    if isinstance(series.dtype, pd.CategoricalDtype):
        return series
    missing = series.isna().to_numpy()
    values = np.empty(len(series), dtype=object)
    values[:] = list(series.astype(object))
    values[missing] = None
    texts = pd.unique(np.array([v for v in values if isinstance(v, str)], dtype=object))
    if not len(texts):
        return _object_series(values, series)
    numbers = pd.to_numeric(pd.Series(texts, dtype=object), errors="coerce")
    integer = [bool(_INTEGER.fullmatch(t.strip())) for t in texts]
    as_number = {
        t: (int(t) if i else float(n)) for t, n, i in zip(texts, numbers, integer) if i or n == n
    }
    if categories is None:
        if len(as_number) == len(texts):
            typed = as_number
        elif all(t in _BOOLS for t in texts):
            typed = {t: _BOOLS[t] for t in texts}
        else:
            return _object_series(values, series)
    else:
        text_cats = {c for c in categories if isinstance(c, str)}
        has_number = any(not isinstance(c, (str, bool)) for c in categories)
        has_bool = any(isinstance(c, bool) for c in categories)
        typed = {}
        for t in texts:
            if t in text_cats:
                continue
            if has_number and t in as_number:
                typed[t] = as_number[t]
            elif has_bool and t in _BOOLS:
                typed[t] = _BOOLS[t]
        if not typed:
            return _object_series(values, series)
    for i, v in enumerate(values):
        if isinstance(v, str):
            values[i] = typed.get(v, v)
    return _object_series(values, series)


def _object_series(values, like):
    import pandas as pd

    return pd.Series(values, index=like.index, name=like.name, dtype=object)


def feature_block(
    frame,
    columns,
    kinds,
    *,
    categories=None,
    first_row=0,
    source="data",
    fmt="csv",
    on_nan="error",
    model_missing="marginalize",
    handle_unknown="ignore",
):
    """The ``columns`` of ``frame`` as a DataFrame for an estimator, and the rows to keep.

    Continuous columns (kind "c") are float64, as :func:`numeric_block` reads
    them; categorical ones ("u", "o") hold their values typed by
    :func:`category_values` (None where missing; ``categories``: the fitted
    model's list, one entry per column, or None when fitting on the whole
    table), which the estimator encodes with the categories it learnt. ``on_nan``:
    "error" (a missing value raises, naming row and column), "drop" (its row
    is marked False), or "marginalize" (kept: NaN / None for the estimator's
    ``missing="marginalize"``; infinity is still an error).

    What a fitted model would refuse is refused here, naming the data row and the
    column (the model can name only the row of the chunk): a missing value that
    ``on_nan="marginalize"`` keeps when the model's ``model_missing`` is "error", and
    a category not in ``categories`` when its ``handle_unknown`` is "error".
    """
    import pandas as pd

    check_choice(on_nan, "on_nan", ("error", "drop", "marginalize"))
    where = {"first_row": first_row, "source": source, "fmt": fmt}
    numeric = [c for c, k in zip(columns, kinds) if k == "c"]
    values, keep = numeric_block(
        frame, numeric, **where, on_nan="error" if on_nan == "error" else "drop"
    )
    if on_nan == "marginalize":
        infinite = np.isinf(values)
        if infinite.any():
            i = int(np.argmax(infinite.any(axis=1)))
            col = numeric[int(np.argmax(infinite[i]))]
            raise ValueError(
                f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} "
                f"{not_finite(values[i, numeric.index(col)])}"
            )
        keep = np.ones(len(frame), dtype=bool)
    out = {}
    for j, (col, kind) in enumerate(zip(columns, kinds)):
        if kind == "c":
            out[col] = values[:, numeric.index(col)]
            continue
        series = frame[col]
        missing = series.isna().to_numpy()
        if missing.any() and on_nan == "error":
            i = int(np.argmax(missing))
            raise ValueError(
                f"{row_location(source, fmt, first_row + i)}: column {shorten(col)} is missing; "
                "use --on-nan drop or --on-nan marginalize"
            )
        if on_nan == "drop":
            keep &= ~missing
        out[col] = category_values(series, None if categories is None else categories[j])
    X = pd.DataFrame(out, index=frame.index)
    refused = []  # (row, what): the first row the model would refuse
    if on_nan == "marginalize" and model_missing != "marginalize":
        gone = X.isna().to_numpy()
        if gone.any():
            i = int(np.argmax(gone.any(axis=1)))
            refused.append(
                (
                    i,
                    f"column {shorten(columns[int(np.argmax(gone[i]))])} is missing, and the "
                    "model was fitted without --on-nan marginalize; use --on-nan drop, or fit "
                    "the model with --on-nan marginalize",
                )
            )
    if categories is not None and handle_unknown == "error":
        for j, (col, kind) in enumerate(zip(columns, kinds)):
            if kind != "c":
                refused += _unseen(X[col], keep, col, categories[j])
    if refused:
        i, what = min(refused, key=lambda r: r[0])
        raise ValueError(f"{row_location(source, fmt, first_row + i)}: {what}")
    return X, keep


def _unseen(values, keep, column, categories) -> list:
    """``[(row, what)]`` for the first value of a categorical column (rows kept) that is
    none of the fitted ``categories`` (an empty list when there is none)."""
    from .._core.columns import category_key

    known = {category_key(c) for c in categories}
    for i, (value, kept) in enumerate(zip(values, keep)):
        if kept and value is not None and value == value and category_key(value) not in known:
            listed = ", ".join(shorten(c, 30) for c in categories[:8])
            more = f", ... ({len(categories)} in all)" if len(categories) > 8 else ""
            what = (
                f"column {shorten(column)} holds the category {shorten(value)}, which the "
                f"model did not see at fit (known: {listed}{more}); --handle-unknown ignore "
                "(fit, predict, evaluate) gives it the mismatch weight"
            )
            return [(i, what)]
    return []


def check_labels(frame, column, *, first_row=0, source="data", fmt="csv", on_nan="error"):
    """Rows whose label in ``column`` is present (for classifier targets)."""
    missing = frame[column].isna().to_numpy()
    if on_nan == "error" and missing.any():
        i = int(np.argmax(missing))
        raise ValueError(
            f"{row_location(source, fmt, first_row + i)}: column {shorten(column)} is missing; "
            "use --on-nan drop to skip such rows"
        )
    return ~missing


_INTEGER = re.compile(r"[+-]?\d+")


def labels_from_text(values, classes=None):
    """Class labels read as text (a CSV column read with ``text_columns``), typed by one
    rule that does not depend on how the file was chunked.

    Without ``classes`` (fitting): as ``pandas.read_csv`` types a column,
    integers when every label is written as one, else floats when every label
    is a number (so a continuous target is refused as scikit-learn's classifiers
    refuse it, not taken as one class per distinct text), else the text. With
    the fitted model's ``classes``: integers or floats where the classes are
    (labels that do not parse stay text, and are reported as unknown classes),
    else the text. Values that are not text
    (Parquet columns carry their type) are returned as they are.
    """
    values = np.asarray(values, dtype=object)
    if not all(isinstance(v, str) for v in values):
        return values
    kind = None if classes is None else np.asarray(classes).dtype.kind
    if kind is None:
        if len(values) and all(_INTEGER.fullmatch(v.strip()) for v in values):
            return np.array([int(v) for v in values])
        numbers = [_float_or_text(v) for v in values]
        if len(values) and not any(isinstance(x, str) for x in numbers):
            return np.array(numbers, dtype=np.float64)
        return values
    if kind in "iu":
        return np.array([int(v) if _INTEGER.fullmatch(v.strip()) else v for v in values], object)
    if kind == "f":
        return np.array([_float_or_text(v) for v in values], dtype=object)
    return values


def _float_or_text(text):
    try:
        return float(text)
    except ValueError:
        return text


class TableWriter:
    """Append DataFrames to a CSV or Parquet file (format by ``fmt``).

    CSV: a header, then the rows of every chunk (floats at full precision).
    Parquet: one row group per chunk with the schema of the first chunk.
    """

    def __init__(self, path, fmt):
        self.path = Path(path)
        self.fmt = fmt
        self.rows = 0
        self._fh = None
        self._writer = None
        self._schema = None

    def write(self, frame) -> None:
        if self.fmt == "csv":
            if self._fh is None:
                self._fh = open(self.path, "w", newline="", encoding="utf-8")  # noqa: SIM115
                frame.to_csv(self._fh, index=False)
            else:
                frame.to_csv(self._fh, index=False, header=False)
        else:
            import pyarrow as pa

            pq = _pyarrow_parquet()
            try:
                table = pa.Table.from_pandas(frame, schema=self._schema, preserve_index=False)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise ValueError(
                    f"rows {self.rows + 1}-{self.rows + len(frame)} do not fit the Parquet "
                    f"schema of the first chunk ({exc}); a column changed type between chunks "
                    "- try a larger --chunksize or a CSV output"
                ) from exc
            if self._writer is None:
                self._schema = table.schema
                self._writer = pq.ParquetWriter(self.path, table.schema)
            self._writer.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
